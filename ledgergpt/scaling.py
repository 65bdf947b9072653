"""
scaling.py: a scaling law fitted to your own runs (experiments/ladder.py runs them, fit_law fits
Hoffmann et al. 2022's L(N, D) = E + A / N^alpha + B / D^beta by their approach 3, with intervals
from a bootstrap over the runs as Besiroglu et al. 2024 redo it), and what it says about a plan:
the fit file, the compute-optimal split, the bill's section (`ledger.py CONFIG --fit=FIT`) and the
run's check at the end (report.md and summary.json: the predicted final loss beside the measured).

N is the ledger's 'matmul' parameters: the output projection in, the embedding lookup out, so that
C = 6 N D holds. At the ladder's scale it matters: the CPU grid's models are mostly embedding, and
counting the lookup (no FLOPs) would bend the IsoFLOP curves (Pearce & Song 2024 trace the
Kaplan-Chinchilla disagreement to such counting), while Kaplan et al.'s non-embedding N drops these
models' largest matmul. Standard library only (ledger.py --fit runs without numpy) but in fit_law.
"""

import itertools
import json
import math
import os
import random
import time

from ledgergpt import sums
from ledgergpt.bill import duration, si
from ledgergpt.config import ConfigError
from ledgergpt.files import load_json

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, section D.2
BOOTSTRAP = 200  # resamples of the runs
INTERVAL = (0.025, 0.975)  # the 95% interval the bill and the check print
KEYS = ('E', 'A', 'B', 'alpha', 'beta')
N_CONVENTION = (
    "N = the ledger's 'matmul' parameters (every weight in a matrix multiply, the output "
    'projection included, the embedding lookup not): the compute per token is 6 N + 12 L H T, so '
    'C = 6 N D holds for this N'
)
# Hoffmann et al.'s grid of starts, as (a, b, e, alpha, beta): a = log A and b = log B in 0..25 by
# 5, e = log E in -1..1 by 0.5, the exponents in 0..2 by 0.5 (4,500). All are scored at once and the
# SCREENED best descend: L-BFGS from every start took ~80 s on one core for the same optimum.
LOGS, EXPONENTS = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0), (0.0, 0.5, 1.0, 1.5, 2.0)
STARTS = list(itertools.product(LOGS, LOGS, (-1.0, -0.5, 0.0, 0.5, 1.0), EXPONENTS, EXPONENTS))
SCREENED = 16
# keeps a bootstrap's refit finite, in theta's order
BOUNDS = [(-10.0, 50.0), (-10.0, 50.0), (-5.0, 5.0), (0.0, 3.0), (0.0, 3.0)]


def law(fit, n_params, n_tokens):
    """L(N, D) in nats per token, for a fit (or any dict with E, A, B, alpha, beta)."""
    return fit['E'] + fit['A'] / n_params ** fit['alpha'] + fit['B'] / n_tokens ** fit['beta']


def fit_law(n_params, n_tokens, losses, bootstrap=BOOTSTRAP):
    """Runs (N, D, final loss) -> {E, A, B, alpha, beta, bootstrap: [[E, A, B, alpha, beta], ...],
    residuals: log L - log law per run, huber: the objective's optimum, at_bounds}."""
    import numpy as np
    from scipy.optimize import minimize

    def huber(theta, log_n, log_d, log_l):
        """The objective and its gradient at theta (..., 5): any leading shape, runs last."""
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
        # by a, b and e; alpha's and beta's are a's and b's times -log N and -log D
        grad = [*(slope * weights).sum(-1), -(slope * weights[0] * log_n).sum(-1)]
        return loss, np.stack([*grad, -(slope * weights[1] * log_d).sum(-1)], -1)

    def best_of(logs, initial=(), screened=SCREENED, tolerance=(1e-15, 1e-12, 2000)):
        """L-BFGS-B from the grid's `screened` best and `initial` to (ftol, gtol, maxiter); a
        bootstrap's refit descends from the fit's optimum and the grid's best 2, more loosely."""
        options = dict(zip(('ftol', 'gtol', 'maxiter'), tolerance))
        chosen = [*initial, *grid[np.argsort(huber(grid, *logs)[0])[:screened]]]
        lbfgs = dict(args=tuple(logs), method='L-BFGS-B', jac=True, bounds=BOUNDS, options=options)
        return min((minimize(huber, x0, **lbfgs) for x0 in chosen), key=lambda result: result.fun)

    def as_law(theta):
        a, b, e, alpha, beta = (float(v) for v in theta)
        return dict(zip(KEYS, (math.exp(e), math.exp(a), math.exp(b), alpha, beta)))

    grid = np.asarray(STARTS, dtype=np.float64)
    logs = [np.log(np.asarray(v, dtype=np.float64)) for v in (n_params, n_tokens, losses)]
    best = best_of(logs)
    fitted = as_law(best.x)
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, len(losses), len(losses)) for _ in range(bootstrap)]
    refits = [best_of([v[pick] for v in logs], [best.x], 2, (1e-12, 1e-8, 200)).x for pick in picks]
    samples = [list(as_law(theta).values()) for theta in refits]
    predicted = np.log([law(fitted, n, d) for n, d in zip(n_params, n_tokens)])
    fitted.update(bootstrap=samples, residuals=[float(v) for v in logs[2] - predicted])
    # a parameter pushed to a bound is not measured by these runs (E at its floor: far from it)
    low, high = np.array(BOUNDS).T
    margins = zip(('A', 'B', 'E', 'alpha', 'beta'), np.minimum(best.x - low, high - best.x))
    fitted['at_bounds'] = [name for name, margin in margins if margin < 1e-6]
    return dict(fitted, huber=float(best.fun))


# -------------------------------------------------------------------------------------------------
# The fit file.


def tokenizer_of(data):
    """The tokenizer a data folder was made with (its meta.json), or None before prepare.py."""
    meta = sums.folder_meta(data) if isinstance(data, str) else None
    return meta.get('tokenizer') if meta else None


# the training recipe a fit's runs shared: a TrainConfig's schedule, batch, precision
RECIPE_KEYS = (
    'lr min_lr_ratio schedule warmup_frac decay_frac batch_tokens weight_decay beta1 beta2 '
    'grad_clip dtype objective'
).split()


def make_fit(fitted, runs, data, tokenizer, recipe, preset):
    """The fit file: the law, its samples, what it was fitted to, the runs (held-out ones too)."""
    grid = [r for r in runs if not r['held_out']]
    # the val set is the same for every run (the first eval_tokens of the val split)
    per_byte = [r['val_bytes_per_token'] for r in grid if r['val_bytes_per_token']]
    # k in C = k N D: the median of the runs' model FLOPs per token per parameter (6 + 12 L H T / N)
    per_param = sorted(r['flops_per_token'] / r['N'] for r in grid)[len(grid) // 2]
    return {
        'law': 'L(N, D) = E + A / N^alpha + B / D^beta (nats per token)',
        'method': "Hoffmann et al. 2022's approach 3: Huber (delta 1e-3) on log L, L-BFGS-B from a "
        f'grid of starts; {len(fitted["bootstrap"])} bootstrap refits over the runs',
        **{k: fitted[k] for k in (*KEYS, 'bootstrap', 'residuals')},
        'at_bounds': fitted.get('at_bounds', []),
        'N_convention': N_CONVENTION,
        'data': data,
        'tokenizer': tokenizer,
        'recipe': recipe,
        'preset': preset,
        'val_bytes_per_token': sum(per_byte) / len(per_byte) if per_byte else None,
        'range': {k: [min(r[k] for r in grid), max(r[k] for r in grid)] for k in ('N', 'D', 'C')},
        'flops_per_param': per_param,
        # the split the fit implies at the grid's largest budget (Chinchilla: ~20 tokens per param)
        'compute_optimal': compute_optimal(fitted, max(r['C'] for r in grid), per_param),
        'written': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
        'runs': runs,
    }


def _number(value, low=0.0, high=math.inf):
    """A finite number (True is none) above low, at most high."""
    return type(value) in (int, float) and low < value <= high and value < math.inf


def _list(value, each, length=None):
    return isinstance(value, list) and all(map(each, value)) and length in (None, len(value))


def _dict(value, keys, each=_number):
    return isinstance(value, dict) and all(each(value.get(k)) for k in keys.split())


def _sample(value):
    """A bootstrap refit [E, A, B, alpha, beta]: an exponent past the fit's bound could overflow."""
    return _list(value, lambda v: _number(v, -math.inf), 5) and max(value[3:]) <= 3


def _span(value):
    return _list(value, _number, 2) and value[0] <= value[1]


def _run(run):
    return _dict(run, 'N D C budget val_loss') and type(run['held_out']) is bool


def _text(value):
    return isinstance(value, str)


# What each key of a fit file holds, checked on loading: a bad file is one line at the start, not a
# traceback after a run's training. OPTIONAL keys may be absent (their readers have a default).
FIT_CHECKS = {
    **dict.fromkeys(('E', 'A', 'B', 'flops_per_param'), (_number, 'a positive number')),
    **dict.fromkeys(('alpha', 'beta'), (lambda v: _number(v, 0, 3), 'a number above 0, at most 3')),
    'bootstrap': (lambda v: v and _list(v, _sample), 'a non-empty list of [E, A, B, alpha, beta]'),
    'range': (lambda v: _dict(v, 'N D C', _span), '{N, D, C: [low, high]} with 0 < low <= high'),
    'runs': (lambda v: _list(v, _run), 'a list of runs (held_out, N, D, C, budget, val_loss)'),
    'compute_optimal': (lambda v: _dict(v, 'N D tokens_per_param'), '{N, D, tokens_per_param}'),
    **dict.fromkeys(('law', 'method', 'data', 'N_convention'), (_text, 'text')),
    'tokenizer': (lambda v: v is None or _text(v), 'text or null'),
    # log(measured / law): exp of a larger one overflows
    'residuals': (lambda v: _list(v, lambda r: _number(r, -10, 10)), 'numbers in -10..10'),
    'val_bytes_per_token': (lambda v: v is None or _number(v), 'a positive number or null'),
    'at_bounds': (lambda v: _list(v, _text), 'a list of names'),
}
OPTIONAL = ('residuals', 'val_bytes_per_token', 'at_bounds')


def load_fit(path):
    """A fit file, checked key by key: one line (ConfigError) if it is missing, bad, or not one."""

    def bad(why, example=''):
        return ConfigError(f"fit {path}: {why}; experiments/ladder.py writes fit files{example}")

    try:
        fit = load_json(path)
    except OSError as e:
        raise bad(f'cannot read it ({e.strerror})', ' (out/ladder_cpu/fit.json)') from None
    except ValueError:
        raise bad('not JSON') from None
    needed = [k for k in FIT_CHECKS if k not in OPTIONAL]
    missing = [k for k in needed if k not in fit] if isinstance(fit, dict) else needed
    if missing:
        raise bad(f"not a fit file (no {', '.join(missing)})")
    for key, (holds, what) in FIT_CHECKS.items():
        if key in fit and not holds(fit[key]):
            shown = json.dumps(fit[key])
            raise bad(f"{key} is {shown if len(shown) <= 40 else shown[:36] + ' ...'}, not {what}")
    fit['path'] = path
    return fit


def read_summary(out_dir):
    """A run's summary.json (train.py writes it at each eval, whole or not at all), or {} before."""
    try:
        return load_json(os.path.join(out_dir, 'summary.json'))
    except (OSError, ValueError):
        return {}


# -------------------------------------------------------------------------------------------------
# What the fit predicts.


def interval(values):
    """INTERVAL's quantiles of values, linearly interpolated (numpy's default): standard library."""
    ordered, last = sorted(values), len(values) - 1
    bounds = []
    for position in (q * last for q in INTERVAL):
        low = math.floor(position)
        high = min(low + 1, last)
        bounds.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return tuple(bounds)


def predict(fit, n_params, n_tokens):
    """-> {loss, low, high, bpb, bpb_low, bpb_high}: the fit's L(N, D) and its 95% interval: the
    bootstrap refits' predictions, each times exp of a residual drawn at random (seeded), so that
    the interval holds a run's own scatter about the law (a seed, the val sample) too."""
    rng = random.Random(0)
    residuals = fit.get('residuals') or [0.0]
    drawn = [
        law(dict(zip(KEYS, sample)), n_params, n_tokens) * math.exp(rng.choice(residuals))
        for sample in fit['bootstrap']
    ]
    loss, (low, high) = law(fit, n_params, n_tokens), interval(drawn)
    bpb = [sums.bits_per_byte(x, fit.get('val_bytes_per_token')) for x in (loss, low, high)]
    return dict(loss=loss, low=low, high=high, bpb=bpb[0], bpb_low=bpb[1], bpb_high=bpb[2])


def compute_optimal(fit, compute, flops_per_param=6.0):
    """The N and D that minimise L(N, D) at compute C = k N D (k: model FLOPs per token per
    parameter, 6 in C = 6ND; the ledger's 6 + 12 L H T / N for a config): Hoffmann et al.'s eq. 4,
    N_opt = G (C/k)^(beta/(alpha+beta)), G = (alpha A / (beta B))^(1/(alpha+beta)), D = C/(k N)."""
    a, b = fit['alpha'], fit['beta']
    g = (a * fit['A'] / (b * fit['B'])) ** (1 / (a + b))
    n_opt = g * (compute / flops_per_param) ** (b / (a + b))
    d_opt = compute / flops_per_param / n_opt
    return dict(N=n_opt, D=d_opt, tokens_per_param=d_opt / n_opt, loss=law(fit, n_opt, d_opt))


def bounds_note(fit, before):
    """`before` and the parameters the fit pushed to a bound, or '' when none is."""
    names = ', '.join(fit.get('at_bounds') or [])
    return f"{before}{names} at the fit's bound: not measured by these runs" if names else ''


def format_fit(fit):
    """The law with its intervals, what it was fitted to, held-out runs beside their predictions."""
    (n_low, n_high), (d_low, d_high), (c_low, c_high) = (fit['range'][k] for k in 'NDC')
    intervals = zip(KEYS, map(interval, zip(*fit['bootstrap'])))
    top, grid = fit['compute_optimal'], sum(not r['held_out'] for r in fit['runs'])
    lines = [
        f"fit: {fit['law']}, {fit['method']}",
        '  ' + ', '.join(f"{k} {fit[k]:.4g} [{lo:.3g}, {hi:.3g}]" for k, (lo, hi) in intervals),
        f"  on {grid} runs of {fit['data']} ({fit['tokenizer']}): N {n_low:,} to {n_high:,}, "
        f"D {d_low:,} to {d_high:,}, C {c_low:.3g} to {c_high:.3g} FLOPs",
        bounds_note(fit, '  '),
        f"  compute-optimal at the grid's largest budget: N {top['N']:,.0f}, D {top['D']:,.0f}, "
        f"{top['tokens_per_param']:.3g} tokens per parameter (Chinchilla: ~20)",
    ]
    for run in (run for run in fit['runs'] if run['held_out']):
        p, measured = predict(fit, run['N'], run['D']), run['val_loss']
        inside = 'inside' if p['low'] <= measured <= p['high'] else 'OUTSIDE'
        lines.append(
            f"  held out {run['name']} (C {run['C']:.3g}, {run['C'] / c_high:.2g}x the grid's "
            f"largest): predicted {p['loss']:.4f} [{p['low']:.4f}, {p['high']:.4f}] nats, measured "
            f"{measured:.4f} ({measured / p['loss'] - 1:+.2%}), {inside} the 95% interval"
        )
    return '\n'.join(line for line in lines if line)


# -------------------------------------------------------------------------------------------------
# The bill's section (ledger.py appends it) and the run's check at the end (live_ledger.py).


def plan_point(prediction):
    """(N by the fit's convention, D, flops per parameter) of a ledger prediction."""
    n_params = prediction['params']['matmul']
    return n_params, prediction['tokens'], prediction['flops_per_token']['matmul'] / n_params


BILL_TITLE = 'Predicted loss: L = E + A/N^alpha + B/D^beta fitted to OUR runs '
BILL_TITLE += "(experiments/ladder.py; Hoffmann et al.'s approach 3)"


def bill_section(fit, prediction):
    """-> (title, [(label, value, note), ...]): the predicted final loss with its interval, the
    compute-optimal split of this plan's compute, and the loss at 0.5x to 4x the planned tokens."""
    n_params, tokens, per_param = plan_point(prediction)
    p = predict(fit, n_params, tokens)
    compute = per_param * n_params * tokens
    best = compute_optimal(fit, compute, per_param)
    bpb = p['bpb'] is not None and (
        f" = {p['bpb']:.4f} bits per byte [{p['bpb_low']:.4f}, {p['bpb_high']:.4f}] at the "
        f"{fit['val_bytes_per_token']:.3f} bytes per token of the fit's val targets"
    )
    grid = sum(not run['held_out'] for run in fit['runs'])
    fitted_on = (
        f"{fit.get('path', '')}: on {fit['data']} ({fit['tokenizer']}), "
        f"{len(fit['runs']) - grid} held out, written {fit.get('written', '?')}"
    )
    constants = (
        f"A {fit['A']:.4g}, B {fit['B']:.4g}, alpha {fit['alpha']:.3f}, beta {fit['beta']:.3f}; "
        f"{fit['N_convention'].split(':')[0]}{bounds_note(fit, '; ')}"
    )
    spread = (
        f"95% interval {p['low']:.3f} to {p['high']:.3f} (bootstrap over the runs, with their "
        f"scatter){bpb or ''}"
    )
    split = (
        f"D {si(best['D'])}, {best['tokens_per_param']:.3g} tokens per parameter (Chinchilla ~20), "
        f"loss {best['loss']:.3f}; this plan: N {si(n_params)}, {tokens / n_params:.3g} tokens per "
        f"parameter, C {compute:.3g} FLOPs"
    )
    rows = [
        ('fit', f"{grid} runs", fitted_on),
        ('law', f"E {fit['E']:.3f}", constants),
        ('predicted final loss', f"{p['loss']:.3f} nats", spread),
        ('compute-optimal for this compute', f"N {si(best['N'])}", split),
    ]
    for multiple in (0.5, 1, 2, 4):
        q = predict(fit, n_params, multiple * tokens)
        bits = f", {q['bpb']:.4f} bpb" if q['bpb'] is not None else ''
        days, usd = multiple * prediction['days'], multiple * prediction['cost_usd']
        note = f"[{q['low']:.3f}, {q['high']:.3f}]{bits}; {duration(days)}, ${usd:,.0f}"
        label = f'{multiple:g}x the tokens: {si(multiple * tokens)}'
        rows.append((label, f"{q['loss']:.3f} nats", note))
    return BILL_TITLE, rows


def warnings(fit, prediction, data=None, tokenizer=None):
    """Why the section may not hold for this plan: its C, N or D outside the fit's range by more
    than the ladder's own span (its largest over its smallest), or other data or tokenizer."""
    n_params, tokens, per_param = plan_point(prediction)
    lines = []
    for what, value in (('C', per_param * n_params * tokens), ('N', n_params), ('D', tokens)):
        low, high = fit['range'][what]
        span = high / low
        if value > high * span or value < low / span:
            lines.append(
                f"warning: this plan's {what} = {value:.3g} is "
                f"{max(value / high, low / value):,.3g}x outside the fit's range ({low:.3g} to "
                f"{high:.3g}), farther than the ladder spans ({span:.3g}x): an extrapolation, its "
                'interval a lower bound'
            )
    if data is not None and os.path.normpath(str(data)) != os.path.normpath(str(fit['data'])):
        lines.append(
            f"warning: the fit was made on {fit['data']}, this plan trains on {data}: its losses "
            'are in nats per token of that data, not this'
        )
    if tokenizer != fit['tokenizer']:
        theirs = f"is {tokenizer}" if tokenizer else "is unknown (its data folder is not made yet)"
        lines.append(
            f"warning: the fit's tokenizer is {fit['tokenizer']}, this plan's {theirs}: nats per "
            'token of two tokenizers do not compare'
        )
    return lines


def check(fit, prediction):
    """The predicted final val loss of a run (its N, D) and its interval, for summary.json."""
    p = predict(fit, *plan_point(prediction)[:2])
    return {
        'fit': fit.get('path'),
        'val_loss_predicted': p['loss'],
        'val_loss_predicted_low': p['low'],
        'val_loss_predicted_high': p['high'],
        'val_bpb_predicted': p['bpb'],
    }


def format_check(summary):
    """report.md's lines: the fit's predicted final val loss beside the measured one."""
    predicted = summary.get('val_loss_predicted')
    if predicted is None:
        return ''
    low, high = summary['val_loss_predicted_low'], summary['val_loss_predicted_high']
    line = (
        f"predicted final val loss (fit {summary['fit']}): {predicted:.4f} nats, 95% interval "
        f"{low:.4f} to {high:.4f}"
    )
    measured = summary.get('val_loss')
    if measured is not None:
        inside = 'inside' if low <= measured <= high else 'outside'
        line += (
            f"; measured {measured:.4f} at step {summary['step']:,} "
            f"({measured / predicted - 1:+.2%}, {inside} the interval)"
        )
    return line
