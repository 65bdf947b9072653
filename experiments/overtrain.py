"""
overtrain.py: the planning note's second experiment (docs/overtraining.md): a wsd run to the
config's train_tokens, a cooldown branch of it for each of its `cooldowns`, cosine runs of each of
those lengths; then their final val bits per byte and branches.png (plot.py --branches).

    python experiments/overtrain.py configs/pystdlib_overtrain.py            # minutes on a CPU
    python experiments/overtrain.py configs/h200_1b3_overtrain.py --plan     # runs, commands, bill
    python experiments/overtrain.py configs/pystdlib_overtrain.py --lrs=1e-3,3e-3,1e-2

--lrs: it all at each peak LR (folders OUT_DIR_lr0.001, ...), each schedule then compared at its
best LR per length; --plan runs nothing. Overrides (--key=value) go to every run.
"""

import dataclasses
import os
import shlex
import sys

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train
from ledgergpt import bill, checkpoint, plot, scaling, schedule, sums
from ledgergpt.config import ConfigError, UserError, cli, load_config

USAGE = 'usage: python experiments/overtrain.py CONFIG [--key=value ...] [--lrs=LR,LR,...] [--plan]'

# Cooldown branches (Hägele et al. 2024, sec. 3; docs/overtraining.md): train.py keeps the
# checkpoints it is told to and cools down any it is given; this file picks the steps, so that a
# branch decays over decay_frac of its own length, and names the folders plot.py --branches finds.


def stable_steps(total_steps, train_cfg):
    """wsd: the checkpoints (steps done) a branch may start from: warmup complete, the next step
    still at the peak. h200_1b3_overtrain: steps 572 to 152,587 of 190,735."""
    return range(
        schedule.warmup_steps(total_steps, train_cfg), schedule.wsd_decay(total_steps, train_cfg)[0]
    )


def branch_points(train_cfg, micro_step_tokens):
    """A wsd run's `cooldowns` -> {step: length}: a branch starts from the checkpoint after
    (1 - decay_frac) x its length. h200_1b3_overtrain: 26B and 52B at steps 39,673 and 79,346."""
    if train_cfg.schedule != 'wsd':
        raise ConfigError(
            f"cooldowns need schedule = 'wsd': a {train_cfg.schedule} run's LR falls at every "
            'step, so no checkpoint of it is a stable point to branch from'
        )
    stable = stable_steps(schedule.planned_steps(train_cfg, micro_step_tokens), train_cfg)
    points = {}
    for length in train_cfg.cooldowns:
        start = round((1 - train_cfg.decay_frac) * length)
        step = schedule.steps_for(train_cfg, start, micro_step_tokens)
        if step not in stable:
            raise ConfigError(
                f'cooldowns: the branch of {length:,} tokens would start at step {step:,} '
                f"({start:,} tokens), outside this run's stable phase (steps {stable.start:,} to "
                f'{stable.stop - 1:,}): a length must be shorter than train_tokens '
                f'({train_cfg.train_tokens:,}) and start after the warmup'
            )
        points[step] = length
    return points


def check_branch_start(path, model_cfg, train_cfg):
    """A branch starts from a stable-phase checkpoint of a wsd run that is no branch itself:
    train.py cools down any checkpoint, but only these make finished runs. Its train_state
    (kilobytes) is read before every start and resume of a branch."""
    if not os.path.isfile(os.path.join(path, checkpoint.MANIFEST)):
        raise ConfigError(
            f"{path} is not a complete checkpoint: the main run keeps one at each branch's start "
            '(--keep_steps) only for the cooldowns it had when it passed that step; a branch '
            'added later needs the main run again from an earlier checkpoint'
        )
    saved = checkpoint.read_state(checkpoint.verified(path))
    main, step = saved['train_config'], saved['run']['step']
    if main.get('cooldown_from'):
        raise ConfigError(
            f"{path} is a cooldown branch's checkpoint, already decaying: a branch starts from the "
            f"main run's checkpoints ({main['cooldown_from']} is one)"
        )
    if main['schedule'] != 'wsd':
        raise ConfigError(
            f"{path} was written by a {main['schedule']} run: a branch starts from the stable "
            f"phase of a wsd run (a {main['schedule']} run's LR falls at every step)"
        )
    # the main run's schedule as it was written: this config with the checkpoint's own keys
    written = {key: value for key, value in main.items() if hasattr(train_cfg, key)}
    main_train = dataclasses.replace(train_cfg, **written)
    micro_step_tokens = train.tokens_per_micro_step(model_cfg, main_train, 1)
    stable = stable_steps(schedule.planned_steps(main_train, micro_step_tokens), main_train)
    if step not in stable:
        where = 'still warming up' if step < stable.start else 'already decaying'
        raise ConfigError(
            f'{path} is step {step:,} of a wsd run that holds the peak LR from step '
            f'{stable.start:,} to {stable.stop - 1:,}: at step {step:,} it is {where}; a branch '
            'starts from a checkpoint in between'
        )


def beside(main, schedule, length):
    """A run's folder beside the main one's, named for the tokens it ends at, as plot.py --branches
    finds them: out/RUN_cooldown_26B, out/RUN_cosine_26B."""
    return f"{os.path.normpath(main)}_{schedule}_{bill.si(length)}"


@dataclasses.dataclass
class Planned:
    schedule: str  # 'wsd' (the main run), 'cooldown' (a branch of it) or 'cosine'
    length: int  # the tokens seen when it ends
    tokens: int  # the tokens it trains (a branch: its decay alone)
    out_dir: str
    flags: list  # train.py's arguments after the config and the overrides
    start: str = ''  # a branch: the main run's checkpoint it cools down


def plan(model_cfg, train_cfg):
    """The runs in order: the main one (it writes the branches' starts), its branches, cosine's."""
    if not train_cfg.cooldowns:
        raise ConfigError(
            f"overtrain.py needs a wsd run with cooldown branches (schedule = 'wsd', cooldowns = "
            f"(26e9, 52e9)): this config has schedule = {train_cfg.schedule!r} and no cooldowns"
        )
    micro_step_tokens = train.tokens_per_micro_step(model_cfg, train_cfg, 1)
    points = branch_points(train_cfg, micro_step_tokens)
    main, total = train_cfg.out_dir, train_cfg.train_tokens
    keep = ','.join(map(str, sorted(set(train_cfg.keep_steps) | set(points))))  # the config's too
    runs = [Planned('wsd', total, total, main, [f'--keep_steps={keep}'])]
    # the tokens after each step, the batch ramp's steps one by one: what its checkpoint holds
    seen = 0
    for step in range(max(points) + 1):
        if step in points:
            start = os.path.join(checkpoint.root(main), f'step_{step:07d}')
            length, decay = points[step], points[step] - seen
            flags = [f'--cooldown_from={start}', f'--cooldown_tokens={decay}']
            out_dir = beside(main, 'cooldown', length)
            runs.append(Planned('cooldown', length, decay, out_dir, flags, start))
        seen += schedule.batch_tokens_at(seen, train_cfg, micro_step_tokens)
    for length in sorted(train_cfg.cooldowns) + [total]:
        flags = ['--schedule=cosine', f'--train_tokens={length}']
        runs.append(Planned('cosine', length, length, beside(main, 'cosine', length), flags))
    for run in runs[1:]:  # each in its own folder
        run.flags.append(f'--out_dir={run.out_dir}')
    return runs


def plan_bill(model_cfg, train_cfg, runs):
    """-> (rows, prediction): the ledger's prediction for the config, shared out by tokens."""
    prediction = sums.predict(model_cfg, train_cfg)
    chinchilla = prediction['data']['chinchilla_tokens']

    def bill_of(tokens):
        days, cost = (tokens / prediction['tokens'] * prediction[k] for k in ('days', 'cost_usd'))
        return f"{bill.duration(days)} | ${cost:,.0f}"

    rows = [
        '| run | schedule | trains | ends at | x Chinchilla | time | cost |',
        '| --- | --- | ---: | ---: | ---: | ---: | ---: |',
    ]
    for run in runs:
        rows.append(
            f"| {run.out_dir} | {run.schedule} | {bill.si(run.tokens)} | {bill.si(run.length)} | "
            f"{run.length / chinchilla:.2f} | {bill_of(run.tokens)} |"
        )
    for what, kinds in (('wsd and its branches', 'wsd cooldown'), ('the cosine runs', 'cosine')):
        tokens = sum(run.tokens for run in runs if run.schedule in kinds.split())
        rows.append(f"| {what} | | {bill.si(tokens)} | | | {bill_of(tokens)} |")
    return rows, prediction


# The comparison's header at one peak LR; a sweep's puts each schedule's best LR beside its loss
COMPARED = '| tokens | x Chinchilla | wsd + cooldown: val bpb | cosine: val bpb | wsd - cosine |'


def at_best_lr(sweep, chinchilla):
    """A row per length: each schedule's final val bits per byte at the best peak LR of the sweep
    ({lr: runs}) for that length, as Hägele et al. compare them (one peak LR, tuned for neither,
    would favour whichever it suits); {None: runs}: the one LR's, without its column."""
    swept = None not in sweep
    header = COMPARED.replace(': val bpb |', ': best val bpb | at lr |') if swept else COMPARED
    rows = [header, '|' + ' ---: |' * (header.count('|') - 1)]
    scores = {}  # (length, cosine?) -> [(val bpb, lr)] of the runs that finished
    for lr, run in ((lr, run) for lr, runs in sweep.items() for run in runs):
        bpb = scaling.read_summary(run.out_dir).get('val_bpb')
        if bpb is not None:
            scores.setdefault((run.length, run.schedule == 'cosine'), []).append((bpb, lr))
    for length in sorted({run.length for runs in sweep.values() for run in runs}):
        best = [min(scores.get((length, c), []), default=(None, None)) for c in (False, True)]
        cells = [f'{v:.4f}' if v is not None else '-' for v, _ in best]
        if swept:  # each loss beside its LR
            cells = [f'{v} | {lr:g}' if lr else '- | -' for v, (_, lr) in zip(cells, best)]
        (wsd, _), (cosine, _) = best
        cells.append(f'{wsd - cosine:+.4f}' if wsd is not None and cosine is not None else '-')
        rows.append(f"| {bill.si(length)} | {length / chinchilla:.2f} | {' | '.join(cells)} |")
    return rows


def parse_lrs(argv):
    """--lrs=1e-3,3e-3,1e-2: the peak LRs to run the whole experiment at, or () for none."""
    given = ','.join(a.split('=', 1)[1] for a in argv if a.startswith('--lrs='))
    try:
        lrs = tuple(float(v) for v in given.split(',') if v)
    except ValueError:
        raise ConfigError(
            f"--lrs={given}: expected peak LRs, comma-separated (1e-3,3e-3,1e-2)"
        ) from None
    if any(lr <= 0 for lr in lrs):
        raise ConfigError(f"--lrs: every LR must be positive, got {lrs}")
    return lrs


@cli
def main(argv):
    if not argv or argv[0].startswith('--'):
        raise ConfigError(f"no config given: {USAGE}")
    config_path, planning, lrs = argv[0], '--plan' in argv, parse_lrs(argv[1:])
    overrides = [a for a in argv[1:] if a != '--plan' and not a.startswith('--lrs=')]
    if not lrs:
        return experiment(config_path, overrides, planning)
    # the whole experiment at each peak LR, in folders named for it; then each schedule at its best
    base = os.path.normpath(load_config(config_path, overrides)[1].out_dir)
    sweep = {}
    for lr in lrs:
        swept = [*overrides, f'--lr={lr:g}', f'--out_dir={base}_lr{lr:g}']
        print(f"\n== peak lr {lr:g}", flush=True)
        code = experiment(config_path, swept, planning)
        if code:
            return code
        sweep[lr] = plan(*load_config(config_path, swept))
    if not planning:
        params = sums.count_params(load_config(config_path, overrides)[0])['total']
        print('\neach schedule at its best peak LR, final val loss in bits per byte:')
        print('\n'.join(at_best_lr(sweep, sums.CHINCHILLA_TOKENS_PER_PARAM * params)))
    return 0


def experiment(config_path, overrides, planning):
    """The experiment at one peak LR: the plan, its bill and commands; then (unless planning) the
    runs, the table of their final val losses, and the picture."""
    model_cfg, train_cfg = load_config(config_path, overrides)
    fit = scaling.load_fit(train_cfg.fit) if train_cfg.fit else None  # drawn beside the branches
    runs = plan(model_cfg, train_cfg)
    rows, prediction = plan_bill(model_cfg, train_cfg, runs)
    gpus, on_gpu = train_cfg.n_gpu, prediction['gpu']['kind'] == 'gpu'
    launcher = f"torchrun --nproc_per_node={gpus}" if on_gpu else 'python'
    commands = [shlex.join(['train.py', config_path, *overrides, *run.flags]) for run in runs]
    print(
        f"the experiment, billed by the ledger for {gpus} x {prediction['gpu']['name']} at an "
        f"assumed {train_cfg.mfu:.0%} MFU:",
        *rows,
        '\ncommands, in order (a branch starts from a checkpoint the main run keeps):',
        *(f'{launcher} {command}' for command in commands),
        sep='\n',
        flush=True,
    )
    if planning:
        return 0
    for run in runs:
        if run.start:
            check_branch_start(run.start, model_cfg, train_cfg)
        resume = ['--resume'] if checkpoint.latest(run.out_dir) else []  # a complete one: at once
        code = train.main([config_path, *overrides, *run.flags, *resume])
        if code:
            return code
    chinchilla = prediction['data']['chinchilla_tokens']
    print('\nfinal val loss, bits per byte:\n' + '\n'.join(at_best_lr({None: runs}, chinchilla)))
    try:
        main = train_cfg.out_dir
        print(f"\n{plot.draw([main], os.path.join(main, 'branches.png'), True, fit)}")
    except UserError as e:  # matplotlib missing: the table stands without the picture
        print(f"\nbranches.png not drawn: {e}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
