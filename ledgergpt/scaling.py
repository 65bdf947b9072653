"""
scaling.py: a scaling law fitted to your own runs, and what it says about a plan. experiments/ladder.py runs the
grid and calls fit_law; this file keeps the fit file (JSON: the law's five numbers, their bootstrap samples, the
runs, the data folder, tokenizer and recipe they were trained with), evaluates L(N, D), splits a compute budget
compute-optimally, and renders the bill's section (`python ledger.py CONFIG --fit=FIT`) and the run's check at the
end (a `fit` key: report.md and summary.json set the predicted final loss beside the measured one).

The law is Hoffmann et al. 2022's (Chinchilla), L(N, D) = E + A / N^alpha + B / D^beta, fitted by their approach 3:
the Huber loss (delta 1e-3) between log L and log of the law, minimised by L-BFGS from a grid of starting points,
the best kept. Intervals come from a bootstrap over the runs (Besiroglu et al. 2024, Epoch AI's replication: the
published fit's intervals were too narrow to have come from its 400 runs): the grid's runs drawn with replacement,
refitted, 200 times.

N, the convention: the ledger's 'matmul' parameters (sums.count_params): every weight that takes part in a matrix
multiply, the output projection included, the embedding lookup not. Why: a model's compute per token is 6 x that
N (+ attention's 12 L H T), so C = 6 N D holds for it, and at the ladder's scale the choice matters: with 8192 x 64
embeddings the CPU grid's models are mostly embedding, and counting the lookup (it costs no FLOPs) would bend the
IsoFLOP curves (Pearce & Song 2024 trace the Kaplan-Chinchilla disagreement to such counting at small scale), while
leaving out the projection too (Kaplan et al.'s non-embedding N) drops the largest matmul these models do. Each run
records all three counts; the fit uses this one, and so must whatever it predicts for.

Standard library only: ledger.py's `--fit` reads the fit file and evaluates the law without numpy. fit_law alone
imports numpy and scipy (scipy.optimize's L-BFGS-B), inside it.
"""

import json
import math
import os
import random
import time

from ledgergpt import sums
from ledgergpt.bill import duration, si
from ledgergpt.config import ConfigError

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, section D.2
BOOTSTRAP = 200  # resamples of the runs
INTERVAL = (0.025, 0.975)  # the 95% interval the bill and the check print
KEYS = ('E', 'A', 'B', 'alpha', 'beta')
N_CONVENTION = (
    "N = the ledger's 'matmul' parameters (every weight in a matrix multiply, the output projection included, the "
    'embedding lookup not): the compute per token is 6 N + 12 L H T, so C = 6 N D holds for this N'
)
# The grid of starting points, Hoffmann et al.'s: alpha, beta in 0..2 by 0.5, e = log E in -1..1 by 0.5, a = log A and
# b = log B in 0..25 by 5 (4,500 starts), as (a, b, e, alpha, beta). Each is scored by the objective (one array
# operation for all) and the SCREENED best descend: L-BFGS from every start took ~80 s on one core for the same optimum.
STARTS = [
    (a, b, e, alpha, beta)
    for a in (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
    for b in (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
    for e in (-1.0, -0.5, 0.0, 0.5, 1.0)
    for alpha in (0.0, 0.5, 1.0, 1.5, 2.0)
    for beta in (0.0, 0.5, 1.0, 1.5, 2.0)
]
SCREENED = 16
# keeps a bootstrap's refit finite
BOUNDS = [(-10.0, 50.0), (-10.0, 50.0), (-5.0, 5.0), (0.0, 3.0), (0.0, 3.0)]


def law(fit, n_params, n_tokens):
    """L(N, D) in nats per token, for a fit (or any dict with E, A, B, alpha, beta)."""
    return fit['E'] + fit['A'] / n_params ** fit['alpha'] + fit['B'] / n_tokens ** fit['beta']


def fit_law(n_params, n_tokens, losses, bootstrap=BOOTSTRAP, seed=0, starts=STARTS):
    """Chinchilla's approach 3 on runs (N, D, final loss): -> {E, A, B, alpha, beta, bootstrap: [[E, A, B, alpha,
    beta], ...], residuals: log L - log law per run, huber: the objective at the optimum}. A bootstrap refit
    descends from the fit's optimum and the grid's best 2 for its runs, to a looser tolerance (200 in a minute)."""
    import numpy as np
    from scipy.optimize import minimize

    def huber(theta, log_n, log_d, log_l):
        """The objective and its gradient at parameters theta (..., 5): any leading shape, runs last."""
        a, b, e, alpha, beta = (theta[..., i, None] for i in range(5))
        terms = np.stack(np.broadcast_arrays(a - alpha * log_n, b - beta * log_d, e))
        top = terms.max(0)
        weights = np.exp(terms - top)
        total = weights.sum(0)
        r = top + np.log(total) - log_l  # log-sum-exp of the three terms minus log L
        weights /= total
        small = np.abs(r) <= HUBER_DELTA
        loss = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA)).sum(-1)
        slope = np.where(small, r, HUBER_DELTA * np.sign(r))
        grad = np.stack(
            [
                (slope * weights[0]).sum(-1),
                (slope * weights[1]).sum(-1),
                (slope * weights[2]).sum(-1),
                -(slope * weights[0] * log_n).sum(-1),
                -(slope * weights[1] * log_d).sum(-1),
            ],
            -1,
        )
        return loss, grad

    def best_of(log_n, log_d, log_l, initial=(), screened=SCREENED, tolerance=(1e-15, 1e-12, 2000)):
        """The grid scored at once, L-BFGS-B from its `screened` best (and any `initial`) to (ftol, gtol, maxiter)."""
        grid = np.asarray(starts, dtype=np.float64)
        scored = huber(grid, log_n, log_d, log_l)[0]
        chosen = [*initial, *grid[np.argsort(scored)[:screened]]]
        results = (
            minimize(
                huber,
                np.asarray(x0, dtype=np.float64),
                args=(log_n, log_d, log_l),
                jac=True,
                method='L-BFGS-B',
                bounds=BOUNDS,
                options=dict(zip(('ftol', 'gtol', 'maxiter'), tolerance)),
            )
            for x0 in chosen
        )
        return min(results, key=lambda result: result.fun)

    log_n, log_d, log_l = (
        np.log(np.asarray(v, dtype=np.float64)) for v in (n_params, n_tokens, losses)
    )
    best = best_of(log_n, log_d, log_l)

    def as_law(theta):
        a, b, e, alpha, beta = (float(v) for v in theta)
        return {'E': math.exp(e), 'A': math.exp(a), 'B': math.exp(b), 'alpha': alpha, 'beta': beta}

    fitted = as_law(best.x)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap):
        pick = rng.integers(0, len(log_l), len(log_l))
        refit = best_of(log_n[pick], log_d[pick], log_l[pick], [best.x], 2, (1e-12, 1e-8, 200))
        refit = as_law(refit.x)
        samples.append([refit[k] for k in KEYS])
    predicted = np.log([law(fitted, n, d) for n, d in zip(n_params, n_tokens)])
    names = ('A', 'B', 'E', 'alpha', 'beta')  # theta's order
    return {
        **fitted,
        # a parameter the fit pushed to a bound is not measured by these runs (E at its floor: they are far from it)
        'at_bounds': [
            name
            for name, value, (low, high) in zip(names, best.x, BOUNDS)
            if min(value - low, high - value) < 1e-6
        ],
        'bootstrap': samples,
        'residuals': [float(v) for v in log_l - predicted],
        'huber': float(best.fun),
    }


# -----------------------------------------------------------------------------------------------------
# The fit file.


def tokenizer_of(data):
    """The tokenizer a data folder was made with (its meta.json), or None before prepare.py has made it."""
    meta = sums.folder_meta(data) if isinstance(data, str) else None
    return meta.get('tokenizer') if meta else None


RECIPE_KEYS = (
    'lr',
    'min_lr_ratio',
    'schedule',
    'warmup_frac',
    'decay_frac',
    'batch_tokens',
    'weight_decay',
    'beta1',
    'beta2',
    'grad_clip',
    'dtype',
    'objective',
)


def recipe_of(train):
    """The training recipe a fit's runs shared (a TrainConfig's optimizer, schedule, batch and precision)."""
    return {k: getattr(train, k) for k in RECIPE_KEYS}


def make_fit(fitted, runs, data, tokenizer, recipe, preset):
    """The fit file's contents: the fitted law and its samples, what it was fitted to, and the runs (the held-out
    ones too, marked: the fit did not see them)."""
    grid = [r for r in runs if not r['held_out']]
    bytes_per_token = [r['val_bytes_per_token'] for r in grid if r['val_bytes_per_token']]
    # k in C = k N D: the median of the runs' model FLOPs per token per parameter (6 + attention's 12 L H T / N)
    per_param = sorted(r['flops_per_token'] / r['N'] for r in grid)[len(grid) // 2]
    return {
        'law': 'L(N, D) = E + A / N^alpha + B / D^beta (nats per token)',
        'method': "Hoffmann et al. 2022's approach 3: Huber (delta 1e-3) on log L, L-BFGS-B from a grid of starts; "
        f'{len(fitted["bootstrap"])} bootstrap refits over the runs',
        **{k: fitted[k] for k in KEYS},
        'bootstrap': fitted['bootstrap'],
        'residuals': fitted['residuals'],
        'at_bounds': fitted.get('at_bounds', []),
        'N_convention': N_CONVENTION,
        'data': data,
        'tokenizer': tokenizer,
        'recipe': recipe,
        'preset': preset,
        # the val set is the same for every run (the first eval_tokens of the val split): its bytes per token
        'val_bytes_per_token': sum(bytes_per_token) / len(bytes_per_token)
        if bytes_per_token
        else None,
        'range': {
            key: [min(r[key] for r in grid), max(r[key] for r in grid)] for key in ('N', 'D', 'C')
        },
        'flops_per_param': per_param,
        # the split the fit implies at the grid's largest budget (Chinchilla: ~20 tokens per parameter)
        'compute_optimal': compute_optimal(fitted, max(r['C'] for r in grid), per_param),
        'written': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
        'runs': runs,
    }


def load_fit(path):
    """A fit file (written by files.save_json: whole or not at all), checked: one clear line (ConfigError) when it is
    missing or not one."""
    try:
        with open(path) as f:
            fit = json.load(f)
    except OSError as e:
        raise ConfigError(
            f"fit {path}: cannot read it ({e.strerror}): experiments/ladder.py writes one (out/ladder_cpu/fit.json)"
        ) from None
    except ValueError:
        raise ConfigError(f"fit {path}: not JSON; experiments/ladder.py writes fit files") from None
    needed = (*KEYS, 'bootstrap', 'range', 'runs', 'compute_optimal')
    missing = [k for k in needed if k not in fit] if isinstance(fit, dict) else needed
    if missing:
        raise ConfigError(
            f"fit {path}: not a fit file (no {', '.join(missing)}); experiments/ladder.py writes them"
        )
    fit['path'] = path
    return fit


# -----------------------------------------------------------------------------------------------------
# What the fit predicts.


def percentile(values, q):
    """The q-quantile of values, linearly interpolated (numpy's default), standard library only."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def predict(fit, n_params, n_tokens):
    """-> {loss, low, high, bpb, bpb_low, bpb_high}: the fit's L(N, D) and its 95% interval: the bootstrap refits'
    predictions, each times exp of one of the fit's residuals drawn at random (seeded), so that the interval holds a
    run's own scatter about the law (a seed, the val sample) as well as the law's uncertainty."""
    rng = random.Random(0)
    residuals = fit.get('residuals') or [0.0]
    drawn = [
        law(dict(zip(KEYS, sample)), n_params, n_tokens) * math.exp(rng.choice(residuals))
        for sample in fit['bootstrap']
    ]
    loss = law(fit, n_params, n_tokens)
    low, high = (percentile(drawn, q) for q in INTERVAL)
    per_byte = fit.get('val_bytes_per_token')
    bpb = (lambda x: x / math.log(2) / per_byte) if per_byte else (lambda x: None)
    return {
        'loss': loss,
        'low': low,
        'high': high,
        'bpb': bpb(loss),
        'bpb_low': bpb(low),
        'bpb_high': bpb(high),
    }


def compute_optimal(fit, compute, flops_per_param=6.0):
    """The N and D that minimise L(N, D) at compute C = k N D (k: model FLOPs per token per parameter, 6 in
    Chinchilla's C = 6ND; the ledger's 6 + 12 L H T / N for a config): Hoffmann et al.'s eq. 4,
    N_opt = G (C/k)^(beta/(alpha+beta)), G = (alpha A / (beta B))^(1/(alpha+beta)), D_opt = C / (k N_opt)."""
    a, b = fit['alpha'], fit['beta']
    g = (a * fit['A'] / (b * fit['B'])) ** (1 / (a + b))
    n_opt = g * (compute / flops_per_param) ** (b / (a + b))
    d_opt = compute / flops_per_param / n_opt
    return {
        'N': n_opt,
        'D': d_opt,
        'tokens_per_param': d_opt / n_opt,
        'loss': law(fit, n_opt, d_opt),
    }


def interval(values):
    return tuple(percentile(values, q) for q in INTERVAL)


def format_fit(fit):
    """The fit as a few lines: the law with its bootstrap intervals, what it was fitted to, and each held-out run's
    prediction beside its measured loss."""
    columns = list(zip(*fit['bootstrap']))
    lines = [
        f"fit: {fit['law']}, {fit['method']}",
        '  '
        + ', '.join(
            f"{k} {fit[k]:.4g} [{low:.3g}, {high:.3g}]"
            for k, (low, high) in zip(KEYS, map(interval, columns))
        ),
        f"  on {sum(not r['held_out'] for r in fit['runs'])} runs of {fit['data']} ({fit['tokenizer']}): "
        f"N {fit['range']['N'][0]:,} to {fit['range']['N'][1]:,}, D {fit['range']['D'][0]:,} to "
        f"{fit['range']['D'][1]:,}, C {fit['range']['C'][0]:.3g} to {fit['range']['C'][1]:.3g} FLOPs",
    ]
    if fit.get('at_bounds'):
        lines.append(
            f"  {', '.join(fit['at_bounds'])} at the fit's bound: not measured by these runs"
        )
    top = fit['compute_optimal']
    lines.append(
        f"  compute-optimal at the grid's largest budget: N {top['N']:,.0f}, D {top['D']:,.0f}, "
        f"{top['tokens_per_param']:.3g} tokens per parameter (Chinchilla: ~20)"
    )
    for run in fit['runs']:
        if run['held_out']:
            p = predict(fit, run['N'], run['D'])
            error = run['val_loss'] / p['loss'] - 1
            inside = p['low'] <= run['val_loss'] <= p['high']
            lines.append(
                f"  held out {run['name']} (C {run['C']:.3g}, {run['C'] / fit['range']['C'][1]:.2g}x the grid's "
                f"largest): predicted {p['loss']:.4f} [{p['low']:.4f}, {p['high']:.4f}] nats, measured "
                f"{run['val_loss']:.4f} ({error:+.2%}), {'inside' if inside else 'OUTSIDE'} the 95% interval"
            )
    return '\n'.join(lines)


# -----------------------------------------------------------------------------------------------------
# The bill's section (ledger_report.py appends it) and the run's check at the end (live_ledger.py).


def plan_point(prediction):
    """(N by the fit's convention, D, flops per parameter) of a ledger prediction."""
    n_params = prediction['params']['matmul']
    return n_params, prediction['tokens'], prediction['flops_per_token']['matmul'] / n_params


def bill_section(fit, prediction):
    """-> (title, [(label, value, note), ...]): the predicted final loss and bits per byte with their interval, the
    compute-optimal split of this plan's compute, and the loss at 0.5x, 1x, 2x and 4x the planned tokens with their
    time and cost (the ledger's, which scale with the tokens)."""
    n_params, tokens, per_param = plan_point(prediction)
    p = predict(fit, n_params, tokens)
    compute = per_param * n_params * tokens
    best = compute_optimal(fit, compute, per_param)
    bpb = (
        f" = {p['bpb']:.4f} bits per byte [{p['bpb_low']:.4f}, {p['bpb_high']:.4f}] at the "
        f"{fit['val_bytes_per_token']:.3f} bytes per token of the fit's val targets"
        if p['bpb'] is not None
        else ''
    )
    grid = sum(not run['held_out'] for run in fit['runs'])
    bounds = fit.get('at_bounds') or []
    rows = [
        (
            'fit',
            f"{grid} runs",
            f"{fit.get('path', '')}: on {fit['data']} ({fit['tokenizer']}), "
            f"{len(fit['runs']) - grid} held out, written {fit.get('written', '?')}",
        ),
        (
            'law',
            f"E {fit['E']:.3f}",
            f"A {fit['A']:.4g}, B {fit['B']:.4g}, alpha {fit['alpha']:.3f}, "
            f"beta {fit['beta']:.3f}; {fit['N_convention'].split(':')[0]}"
            + (
                f"; {', '.join(bounds)} at the fit's bound: not measured by these runs"
                if bounds
                else ''
            ),
        ),
        (
            'predicted final loss',
            f"{p['loss']:.3f} nats",
            f"95% interval {p['low']:.3f} to {p['high']:.3f} (bootstrap over the runs, with their scatter){bpb}",
        ),
        (
            'compute-optimal for this compute',
            f"N {si(best['N'])}",
            f"D {si(best['D'])}, {best['tokens_per_param']:.3g} tokens per parameter (Chinchilla ~20), loss "
            f"{best['loss']:.3f}; this plan: N {si(n_params)}, {tokens / n_params:.3g} tokens per parameter, "
            f"C {compute:.3g} FLOPs",
        ),
    ]
    for multiple in (0.5, 1, 2, 4):
        q = predict(fit, n_params, multiple * tokens)
        rows.append(
            (
                f'{multiple:g}x the tokens: {si(multiple * tokens)}',
                f"{q['loss']:.3f} nats",
                f"[{q['low']:.3f}, {q['high']:.3f}]"
                + (f", {q['bpb']:.4f} bpb" if q['bpb'] is not None else '')
                + f"; {duration(multiple * prediction['days'])}, ${multiple * prediction['cost_usd']:,.0f}",
            )
        )
    title = (
        'Predicted loss: L = E + A/N^alpha + B/D^beta fitted to OUR runs (experiments/ladder.py; '
        "Hoffmann et al.'s approach 3)"
    )
    return title, rows


def warnings(fit, prediction, data=None, tokenizer=None):
    """Lines saying why the section's numbers may not hold for this plan: it extrapolates past the fit's compute
    by more than the ladder's own span (the ratio of its largest budget to its smallest), or N or D beyond their
    range by as much; or the plan's data folder or tokenizer are not the fit's."""
    n_params, tokens, per_param = plan_point(prediction)
    compute = per_param * n_params * tokens
    lines = []
    for what, value in (('C', compute), ('N', n_params), ('D', tokens)):
        low, high = fit['range'][what]
        span = high / low
        if value > high * span or value < low / span:
            lines.append(
                f"warning: this plan's {what} = {value:.3g} is {max(value / high, low / value):,.3g}x outside the "
                f"fit's range ({low:.3g} to {high:.3g}), farther than the ladder spans ({span:.3g}x): an "
                f"extrapolation, its interval a lower bound"
            )
    if data is not None and os.path.normpath(str(data)) != os.path.normpath(str(fit['data'])):
        lines.append(
            f"warning: the fit was made on {fit['data']}, this plan trains on {data}: its losses are in "
            f"nats per token of that data, not this"
        )
    if tokenizer != fit['tokenizer']:
        lines.append(
            f"warning: the fit's tokenizer is {fit['tokenizer']}, this plan's "
            + (f"is {tokenizer}" if tokenizer else "is unknown (its data folder is not made yet)")
            + ': nats per token of two tokenizers do not compare'
        )
    return lines


def check(fit, prediction):
    """The predicted final val loss of a run (its N, D) for summary.json: {fit, val_loss_predicted, _low, _high,
    val_bpb_predicted}."""
    n_params, tokens, _ = plan_point(prediction)
    p = predict(fit, n_params, tokens)
    return {
        'fit': fit.get('path'),
        'val_loss_predicted': p['loss'],
        'val_loss_predicted_low': p['low'],
        'val_loss_predicted_high': p['high'],
        'val_bpb_predicted': p['bpb'],
    }


def format_check(summary):
    """report.md's lines: the fit's predicted final val loss beside the measured one."""
    if summary.get('val_loss_predicted') is None:
        return ''
    measured = summary.get('val_loss')
    line = (
        f"predicted final val loss (fit {summary['fit']}): {summary['val_loss_predicted']:.4f} nats, 95% interval "
        f"{summary['val_loss_predicted_low']:.4f} to {summary['val_loss_predicted_high']:.4f}"
    )
    if measured is not None:
        inside = summary['val_loss_predicted_low'] <= measured <= summary['val_loss_predicted_high']
        line += (
            f"; measured {measured:.4f} at step {summary['step']:,} "
            f"({measured / summary['val_loss_predicted'] - 1:+.2%}, {'inside' if inside else 'outside'} the interval)"
        )
    return line
