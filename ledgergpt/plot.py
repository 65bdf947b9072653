"""
plot.py: the loss curve of one run, or of several overlaid, as a PNG.

    python -m ledgergpt.plot out/pystdlib_cpu                       # -> out/pystdlib_cpu/loss.png
    python -m ledgergpt.plot out/run_a out/run_b --out compare.png  # a colour per run, one legend
    python -m ledgergpt.plot out/pystdlib_overtrain --branches      # -> its branches.png

Against tokens seen: the train loss (faint) and its moving average, the val loss (a mixture's per
source too), rollbacks, Chinchilla's 20 x P, HellaSwag, ARC and MMLU on a second axis. moe.png: a
mixture of experts' load. --branches: overtrain.py's runs (docs/overtraining.md). matplotlib is
imported only here (its Agg backend: no display needed).
"""

import argparse
import glob
import json
import os
import sys

import numpy as np

from ledgergpt import bill, scaling, sums
from ledgergpt.config import EVAL_TASKS, ConfigError, UserError, cli
from ledgergpt.files import atomic_write, load_json

SMOOTHING = 0.02  # the moving average spans 2% of the logged steps (101 of 5,000), and at least 5
# a Chinchilla point past 1.5 x the run's tokens is named, not drawn (it would squash the curve)
FAR_PAST_RUN = 1.5
FIGURE_INCHES, DPI = (10, 6), 100  # 1000 x 600 pixels
FEW = 50  # logged steps below which each is marked with a dot
MIXTURE_MARKERS = 'v^<>dpPX'  # one per source of a mixture, on a dotted line
STEEP_START = 0.05  # the y-axis starts above the smoothed loss at 5% of a long run's tokens (below)
# the scores train.py logs, under these names: what each is (evals.py: ARC's figure is acc_norm,
# MMLU's acc), and its marker
SCORES = {
    'hellaswag': ('HellaSwag', 's'),
    'arc_easy': ('ARC-Easy acc_norm', 'o'),
    'arc_challenge': ('ARC-Challenge acc_norm', 'v'),
    'mmlu': ('MMLU acc', 'D'),
    'mmlu_5shot': ('MMLU 5-shot acc', '^'),
}
assert set(SCORES) == {'hellaswag', *EVAL_TASKS}
# how each kind of line is drawn (a rollback: long dashes)
VAL = dict(linestyle='--', marker='o', markersize=4)
SOURCE = dict(linestyle=':', markersize=4)
ROLLBACK = dict(linestyle=(0, (6, 3)), linewidth=1, alpha=0.8)
CHINCHILLA = dict(linestyle=':', linewidth=1.5)
SCORE = dict(linestyle='-.', markersize=4, capsize=3)
FORECAST_MARKERS = 'v^D'  # the forecasts at 10%, 25% and 50% of the run
FINAL = dict(linestyle='', markersize=12, markeredgecolor='black')
LADDER_N = 'the output projection in, the embedding lookup out'
COOLDOWN, COSINE = dict(linewidth=2, linestyle='-'), dict(linewidth=1, linestyle='--')
LEGEND = dict(loc='outside lower center', ncols=2, fontsize='small', frameon=False)


# --------------------------------------------------------------------------------------------------
# A run's numbers, from out_dir/metrics.jsonl (log steps, evals, rollbacks) and ledger.json.


def logged(path):
    """(train: {step: its log entry}, evals, rollbacks) of metrics.jsonl: a step logged again (after
    a rollback or a resume) replaces what followed it."""
    train, evals, rollbacks, latest = {}, [], [], 0  # latest: the last step kept
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:  # a line train.py is writing this very moment
                continue
            if entry.get('event') == 'rollback':
                rollbacks.append(entry)
                # the steps after the checkpoint it went back to are run again
                since = entry['to_step'] + 1
            elif 'loss' in entry:
                since = entry['step']
            else:
                if {'val_loss', 'val_sources', 'forecast', *SCORES} & entry.keys():
                    evals.append(entry)
                    latest = max(latest, entry['step'])
                continue
            if since <= latest:  # only then: a pass a line took 8 s at 9,500 lines (190K steps / 2)
                train = {step: e for step, e in train.items() if step < since}
                evals = [e for e in evals if e['step'] < since]
                latest = since - 1
            if 'event' not in entry:
                train[entry['step']] = entry
                latest = entry['step']
    return train, evals, rollbacks


def read_run(run_dir):
    """{'name', 'train', 'val', 'rollbacks': (tokens, losses), 'hellaswag' and 'scores' {name in
    SCORES it has}: (tokens, accuracies, standard errors), 'chinchilla': 20 x P tokens or None,
    'sources': a mixture's {source: (tokens, val losses)}}, as numpy arrays."""
    path = os.path.join(run_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        raise ConfigError(f"no metrics.jsonl in {run_dir}: give the out_dir of a train.py run")
    train, evals, rollbacks = logged(path)
    if not train:
        raise UserError(f"{path} has no logged step yet: nothing to draw")
    steps = sorted(train)
    tokens = np.array([train[s]['tokens'] for s in steps], dtype=float)

    def curve(chosen, value):
        """(tokens, value(entry)) of the entries: an eval or a rollback names a step; its tokens
        come from the log steps around it."""
        x = [e['tokens'] if 'tokens' in e else np.interp(e['step'], steps, tokens) for e in chosen]
        return np.array(x), np.array([value(e) for e in chosen])

    def score(name):
        scored = [e for e in evals if name in e]
        stderr = np.array([e.get(f'{name}_stderr', 0.0) for e in scored])
        return *curve(scored, lambda e: e[name]), stderr

    def source(name):  # a mixture's val loss of a source (NaN where an eval has none)
        return curve(mixed, lambda e: e['val_sources'].get(name, {}).get('loss', np.nan))

    mixed = [e for e in evals if 'val_sources' in e]  # a mixture's evals: each source's val loss
    # the forecasts kept (schedule.FORECAST_AT), each at its end: its step's tokens, scaled
    kept = [(e['tokens'], e['forecast']) for e in evals if 'kept' in e.get('forecast', {})]
    scores = {name: score(name) for name in SCORES}
    return {
        'name': os.path.basename(os.path.normpath(run_dir)),
        'train': (tokens, np.array([train[s]['loss'] for s in steps])),
        'val': curve([e for e in evals if 'val_loss' in e], lambda e: e['val_loss']),
        'rollbacks': curve(rollbacks, lambda e: e['loss']),
        'hellaswag': scores['hellaswag'],
        'scores': {name: values for name, values in scores.items() if len(values[0])},
        'chinchilla': chinchilla_tokens(run_dir),
        'sources': {name: source(name) for name in (mixed[-1]['val_sources'] if mixed else ())},
        'forecasts': [
            (f['kept'], tokens * f['end_step'] / f['step'], f['val_loss'], f['low'], f['high'])
            for tokens, f in kept
            if 'val_loss' in f
        ],
    }


def chinchilla_tokens(run_dir):
    """20 x P from the run's ledger.json (the ledger counts P exactly as model.py builds it)."""
    try:
        ledger = load_json(os.path.join(run_dir, 'ledger.json'))
        return sums.CHINCHILLA_TOKENS_PER_PARAM * ledger['params']['total']
    except (OSError, ValueError, KeyError, TypeError):
        return None


def smooth(values):
    """Centered moving average over SMOOTHING x len(values) points (at least 5), the window narrowed
    near both ends so that it stays centered. Not an exponential moving average: an EMA trails a
    falling loss by its window (over a run's steep first tenth, by most of a nat); the price is that
    the last few points are averaged over fewer neighbours."""
    n = len(values)
    i = np.arange(n)
    # points on each side of i
    half = np.minimum(max(2, int(SMOOTHING * n / 2)), np.minimum(i, n - 1 - i))
    sums = np.concatenate([[0.0], np.cumsum(values)])  # sums[j] = values[0] + ... + values[j - 1]
    return (sums[i + half + 1] - sums[i - half]) / (2 * half + 1)


def blank_figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plot.py needs matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=FIGURE_INCHES, dpi=DPI, layout='constrained')
    FigureCanvasAgg(fig)  # Agg draws to memory: PNGs without a display
    return fig


def save(fig, out):
    """Write the figure to `out` as a PNG (a temporary file renamed when complete); -> out."""
    with atomic_write(out, 'wb') as f:
        fig.savefig(f, format='png')
    return out


def si_axis(ax, label='tokens seen', which='major'):
    """The x-axis labelled, its numbers in SI units (26B), a grid behind."""
    ax.set_xlabel(label)
    ax.xaxis.set_major_formatter(lambda x, _: bill.si(x))
    ax.grid(alpha=0.3, which=which)


def train_and_val(ax, run, color, train_label):
    tokens, losses = run['train']
    ax.plot(tokens, losses, color=color, alpha=0.3, linewidth=0.8)
    # a short run's few points, one of them alone, show
    marker = '.' if len(tokens) < FEW else None
    label = f'{train_label} train (moving average)'
    ax.plot(tokens, smooth(losses), color=color, linewidth=2, marker=marker, label=label)
    ax.plot(*run['val'], color=color, label=f"{run['name']} val", **VAL)
    for marker, (at, x, loss, low, high) in zip(FORECAST_MARKERS, run['forecasts']):
        label = f"{run['name']} final val loss, forecast at {at} (95%)"
        ax.errorbar(
            x, loss, [[loss - low], [high - loss]], marker=marker, color=color, label=label, **SCORE
        )


def figure(run_dirs):
    """A matplotlib Figure of the runs (its first axes the losses, a second the scores if any)."""
    fig, runs = blank_figure(), [read_run(run_dir) for run_dir in run_dirs]
    ax = fig.add_subplot()
    scored = [name for name in SCORES if any(name in run['scores'] for run in runs)]
    scores = ax.twinx() if scored else None
    axis_tokens = max(run['train'][0][-1] for run in runs)  # where the x-axis ends
    for i, run in enumerate(runs):
        color, name, chinchilla = f'C{i}', run['name'], run['chinchilla']
        train_and_val(ax, run, color, name)
        for k, (source, curve) in enumerate(run['sources'].items()):
            marker = MIXTURE_MARKERS[k % len(MIXTURE_MARKERS)]
            ax.plot(*curve, color=color, marker=marker, label=f'{name} val {source}', **SOURCE)
        # a line, not a point: a spike's loss may be off the axis, or NaN
        for k, x in enumerate(run['rollbacks'][0]):
            ax.axvline(x, color=color, label=None if k else f'{name} rollback', **ROLLBACK)
        if chinchilla:
            said = f'20 x P = {bill.si(chinchilla)} tokens (Chinchilla)'
            if chinchilla <= FAR_PAST_RUN * axis_tokens:
                ax.axvline(chinchilla, color=color, label=f'{name} {said}', **CHINCHILLA)
            # a legend entry without a line: the point is named, the axis not stretched to it
            else:
                times = f'{chinchilla / run["train"][0][-1]:,.0f} x its tokens'
                ax.plot([], [], ' ', color=color, label=f'{name}: {said}, {times}')
        # a marker per task, a colour per run
        for task, (x, accuracy, stderr) in run['scores'].items():
            title, marker = SCORES[task]
            y, yerr, label = 100 * accuracy, 100 * stderr, f'{name} {title}'
            scores.errorbar(x, y, yerr, color=color, marker=marker, label=label, **SCORE)
    loss_axis(ax, runs)
    if scores is not None:
        only_hellaswag = scored == ['hellaswag']
        scores.set_ylabel('HellaSwag accuracy (%)' if only_hellaswag else 'accuracy (%)')
        chance = 'HellaSwag chance (25%)' if only_hellaswag else 'chance with 4 choices (25%)'
        scores.axhline(25, color='gray', linewidth=0.8, linestyle=':', label=chance)
    fig.legend(**LEGEND)  # of every axes' lines
    ax.set_title(f"loss of {', '.join(run['name'] for run in runs)}")
    return fig


def loss_axis(ax, runs):
    """Labels and the steep start cut: the first few percent of a run fall from ln V (10.8 for
    GPT-2's vocab) to near the final loss; drawn whole they take most of the height and leave the
    hundredths of a nat that matter later flat. A run of 100+ logged steps is drawn from the
    smoothed loss at STEEP_START of its tokens down; what is above runs off the top."""
    long_runs = [run['train'] for run in runs if len(run['train'][0]) >= 100]
    if long_runs:
        top = max(
            smooth(losses)[np.searchsorted(tokens, STEEP_START * tokens[-1])]
            for tokens, losses in long_runs
        )
        bottom = min(np.min(run['train'][1]) for run in runs)
        ax.set_ylim(bottom - 0.05 * (top - bottom), top + 0.05 * (top - bottom))
    ax.set_ylabel('loss (nats per token)')
    si_axis(ax)


# --------------------------------------------------------------------------------------------------
# Over-training (overtrain.py): a wsd run (out/RUN), its cooldown branches (out/RUN_cooldown_26B
# ...) and cosine runs of the same lengths (out/RUN_cosine_26B ...), each one's final val loss
# marked, and on an axis of its own Hoffmann et al.'s fit L(N, D) = E + A/N^0.34 + B/D^0.28 for this
# P: fitted on THEIR data (MassiveText) in nats per THEIR token, its shape compares, not its level.


def beside(main_dir, kind):
    """The runs named after a main run, kind 'cooldown' or 'cosine', in their tokens' order."""
    base = glob.escape(os.path.normpath(main_dir))
    found = [f for f in glob.glob(f'{base}_{kind}_*') if os.path.isfile(f'{f}/metrics.jsonl')]
    return sorted(map(read_run, found), key=lambda run: run['train'][0][-1])


def mark_final(ax, run, color, marker, kind):
    tokens, losses = run['val']
    if len(tokens):
        label = f"{run['name']} ({kind}): final val {losses[-1]:.4f} at {bill.si(tokens[-1])}"
        ax.plot(tokens[-1:], losses[-1:], marker=marker, color=color, label=label, **FINAL)


def branch_figure(main_dir, fit=None):
    """The figure above (their fit's axis when the main run's ledger.json gives P); fit: a scaling
    law fitted to our own runs (scaling.load_fit), drawn by fitted_loss."""
    fig, main = blank_figure(), read_run(main_dir)
    branches, cosines = beside(main_dir, 'cooldown'), beside(main_dir, 'cosine')
    ax = fig.add_subplot()
    train_and_val(ax, main, 'C0', f"{main['name']} (wsd)")
    mark_final(ax, main, 'C0', '*', 'wsd')
    for i, run in enumerate(branches + cosines, 1):
        kind = 'cooldown' if i <= len(branches) else 'cosine'
        line = COOLDOWN if kind == 'cooldown' else COSINE
        label = f"{run['name']} ({kind}) train (moving average)"
        ax.plot(run['train'][0], smooth(run['train'][1]), color=f'C{i}', label=label, **line)
        mark_final(ax, run, f'C{i}', '*' if kind == 'cooldown' else 'X', kind)
    runs = [main] + branches + cosines
    last = max(run['train'][0][-1] for run in runs)
    loss_axis(ax, runs)
    if fit:
        fitted_loss(ax, fit, main_dir, last)
    if chinchilla := main['chinchilla']:
        said = f'20 x P = {bill.si(chinchilla)} tokens (Chinchilla)'
        ax.axvline(chinchilla, color='black', label=said, **CHINCHILLA)
        theirs, seen = ax.twinx(), np.linspace(STEEP_START * last, last, 200)
        loss = sums.chinchilla_loss(chinchilla / sums.CHINCHILLA_TOKENS_PER_PARAM, seen)
        label = "Hoffmann et al. 2022's fit L(P, D): THEIR data (right axis)"
        theirs.plot(seen, loss, color='gray', linestyle='-.', label=label)
        theirs.set_ylabel("their fit's loss (nats per THEIR token)")
    fig.legend(**LEGEND)
    ax.set_title(f"over-training {main['name']}: cooldown branches and cosine runs")
    return fig


def fitted_loss(ax, fit, run_dir, last):
    """Our fit's L(N, D) for the run's N (its ledger.json, the fit's convention) along the tokens:
    the loss a run of each length is predicted to end at, its 95% interval shaded."""
    n_params = load_json(os.path.join(run_dir, 'ledger.json'))['params']['matmul']
    seen = np.linspace(STEEP_START * last, last, 60)
    predicted = [scaling.predict(fit, n_params, d) for d in seen]
    ours = f"our fit ({fit.get('path', '')}, {fit['data']})"
    label = f"{ours}: predicted final val loss at each length"
    ax.plot(seen, [p['loss'] for p in predicted], color='black', linestyle='-.', label=label)
    low, high = ([p[end] for p in predicted] for end in ('low', 'high'))
    ax.fill_between(seen, low, high, color='gray', alpha=0.2)


# --------------------------------------------------------------------------------------------------
# The ladder (experiments/ladder.py), as Hoffmann et al. 2022's figure 3: each compute budget's
# runs, final val loss against N, and the law along that budget (D = C / (k N), k the grid's FLOPs
# per token per parameter), its minimum marked; the held-out run beside the fit's prediction.


def ladder_figure(fit):
    fig = blank_figure()
    ax = fig.add_subplot()
    low, high = fit['range']['N']
    sizes, k = np.geomspace(low / 1.5, high * 1.5, 100), fit['flops_per_param']
    for i, budget in enumerate(sorted({run['budget'] for run in fit['runs']})):
        runs = [run for run in fit['runs'] if run['budget'] == budget]
        held_out, color = runs[0]['held_out'], f'C{i}'
        label = f"C = {budget:.2g} FLOPs: the fit{' (extrapolated)' if held_out else ''}"
        law = scaling.law(fit, sizes, budget / (k * sizes))
        ax.plot(sizes, law, '--' if held_out else '-', color=color, label=label)
        best = scaling.compute_optimal(fit, budget, k)
        ax.plot(best['N'], best['loss'], marker='|', markersize=16, color=color)
        dots = dict(marker='*', markersize=14) if held_out else dict(marker='o', markersize=7)
        label = f'{len(runs)} runs' + (', held out: measured' if held_out else '')
        n, loss = [run['N'] for run in runs], [run['val_loss'] for run in runs]
        ax.plot(n, loss, linestyle='', color=color, markeredgecolor='black', label=label, **dots)
        for j, run in enumerate(runs if held_out else ()):
            p = scaling.predict(fit, run['N'], run['D'])
            label = None if j else "held out: the fit's predictions, 95% intervals"
            x, error = run['N'] * 1.04, [[p['loss'] - p['low']], [p['high'] - p['loss']]]
            ax.errorbar(x, p['loss'], error, color='black', capsize=4, marker='D', label=label)
    ax.set_xscale('log')
    si_axis(ax, f"N (the ledger's matmul parameters: {LADDER_N})", 'both')
    ax.set_ylabel('final val loss (nats per token)')
    ax.legend(fontsize='small')
    fitted = len([run for run in fit['runs'] if not run['held_out']])
    law = '{E:.3g} + {A:.3g}/N^{alpha:.3g} + {B:.3g}/D^{beta:.3g}'.format(**fit)
    on = f"{fit['data']} ({fit['tokenizer']})"
    ax.set_title(f"IsoFLOP ladder on {on}, {fitted} runs fitted: L = {law}")
    return fig


def draw_ladder(fit_path, out):
    return save(ladder_figure(scaling.load_fit(fit_path)), out)


# --------------------------------------------------------------------------------------------------
# Mixture of experts: the experts' load (recorded at log steps: live_ledger.router_stats).


def read_load(run_dir):
    """-> (tokens (steps,), load CV (steps, MoE layers), the last logged load shares (MoE layers,
    n_experts)) from metrics.jsonl's 'expert_load' entries, or None without (a dense model)."""
    with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
        lines = [line for line in f if '"expert_load"' in line and line.endswith('\n')]
    if not lines:
        return None
    # a step logged again after a rollback or resume replaces the first
    by_step = {e['step']: e for e in map(json.loads, lines)}
    steps = sorted(by_step)
    tokens = np.array([by_step[s]['tokens'] for s in steps], dtype=float)
    cv = np.array([by_step[s]['expert_load_cv'] for s in steps])
    return tokens, cv, np.array(by_step[steps[-1]]['expert_load'])


def load_figure(run_dir):
    """Left: each MoE layer's load CV against tokens; right: the last logged share per expert."""
    tokens, cv, shares = read_load(run_dir)
    fig = blank_figure()
    ax, grid = fig.subplots(1, 2, width_ratios=(3, 2))
    marker = '.' if len(tokens) < FEW else None
    for layer in range(cv.shape[1]):
        ax.plot(tokens, cv[:, layer], marker=marker, label=f'MoE layer {layer + 1}')
    si_axis(ax)
    ax.set_ylabel('load CV (std / mean of tokens per expert)')
    ax.legend(fontsize='small')
    image = grid.imshow(shares, aspect='auto', cmap='viridis', vmin=0)
    fig.colorbar(image, ax=grid, label='share of routed tokens x n_experts (1: even)')
    grid.set_xlabel('expert')
    grid.set_yticks(range(len(shares)), [f'MoE layer {i + 1}' for i in range(len(shares))])
    fig.suptitle(f"expert load of {os.path.basename(os.path.normpath(run_dir))}")
    return fig


def draw(run_dirs, out, branches=False, fit=None):
    """The runs' figure (or run_dirs[0]'s branch_figure, with fit) as a PNG at `out`; -> out."""
    return save(branch_figure(run_dirs[0], fit) if branches else figure(run_dirs), out)


# the reasons already said, so that a run evaluated every few minutes says each one once
NOT_DRAWN = set()


def draw_run(out_dir):
    """Redraw out_dir/loss.png (and a mixture of experts' moe.png); -> its path, or None when it
    cannot be drawn (no matplotlib, no metrics yet), the reason printed once on stderr. Never
    raises: a run never stops for it."""
    try:
        path = draw([out_dir], os.path.join(out_dir, 'loss.png'))
        if read_load(out_dir) is not None:
            save(load_figure(out_dir), os.path.join(out_dir, 'moe.png'))
        return path
    except Exception as e:  # noqa: BLE001 (whatever it is, the run goes on)
        reason = str(e) if isinstance(e, UserError) else f'{type(e).__name__}: {e}'
        if reason not in NOT_DRAWN:
            NOT_DRAWN.add(reason)
            print(f"{out_dir}/loss.png not drawn: {reason}", file=sys.stderr, flush=True)
        return None


@cli
def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    add = parser.add_argument
    add('run_dirs', nargs='+', metavar='RUN_DIR', help="a train.py out_dir (several: overlaid)")
    add('--out', help='the PNG (default: RUN_DIR/loss.png for one run, loss.png for several)')
    branches = 'one wsd run and its RUN_DIR_cooldown_* and RUN_DIR_cosine_* (RUN_DIR/branches.png)'
    add('--branches', action='store_true', help=branches)
    args = parser.parse_args(argv)
    runs = len(args.run_dirs)
    if args.branches and runs > 1:
        raise ConfigError(f"--branches draws one run with its branches, not {runs} runs")
    name = 'branches.png' if args.branches else 'loss.png'
    out = args.out or (os.path.join(args.run_dirs[0], name) if runs == 1 else name)
    print(draw(args.run_dirs, out, args.branches))
    return 0


if __name__ == '__main__':
    sys.exit(main())
