"""
overtrain.py: the planning note's second experiment, "over-train the 1.3B to 100B+ tokens and watch where the loss
curve flattens relative to the Chinchilla point", as one command. A wsd run to the config's train_tokens; from its
stable phase a cooldown branch for each of its `cooldowns`; for comparison, a cosine run from scratch of every one of
those lengths. Then a table of each run's final val loss in bits per byte, and branches.png (plot.py --branches: the
curves, the Chinchilla point, Hoffmann et al.'s fitted loss beside them).

    python prepare.py pystdlib --tokenizer bpe:512 --out data/pystdlib_bpe512   # ~10 s
    python experiments/overtrain.py configs/pystdlib_overtrain.py            # the miniature: minutes on a CPU
    python experiments/overtrain.py configs/h200_1b3_overtrain.py --plan     # the real one: runs, commands, bill

--lrs=1e-3,3e-3,1e-2 runs the whole experiment at each peak LR (folders OUT_DIR_lr0.001, ...) and compares each
schedule at its best LR for each length, as Hägele et al. do: a single LR tuned for neither favours one of them.
The miniature's sweep: `--lrs=1e-3,3e-3,1e-2` (three times the minutes).

--plan prints the runs, the command of each and the ledger's bill (tokens, days, cost), and runs nothing. Stopped,
the same command carries on: a complete run is found complete, an interrupted one resumes. Overrides (--key=value)
go to every run.
"""

import dataclasses
import json
import os
import shlex
import sys

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train
from ledgergpt import bill, checkpoint, plot, scaling, sums
from ledgergpt.config import ConfigError, UserError, cli, load_config

USAGE = 'usage: python experiments/overtrain.py CONFIG [--key=value ...] [--lrs=LR,LR,...] [--plan]'


# -----------------------------------------------------------------------------------------------------
# Cooldown branches (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
# Durations", sec. 3; MiniCPM, Hu et al. 2024). A cosine run's LR at every step depends on where the run ends, so
# the loss after 1x, 2x and 4x Chinchilla's tokens takes three runs from scratch: 7x in all. A wsd run holds the
# peak LR until its last decay_frac, so a checkpoint from that stable phase, decayed in a short run of its own, is a
# finished run of that length; Hägele et al. find a linear decay over 10-20% of the steps matches cosine of the same
# length. One wsd run to 4x and two branches cost 4 + 0.2 x (1 + 2) = 4.6x.
# train.py knows none of this. It keeps the checkpoints of the steps it is told to (--keep_steps: keep_ckpts prunes
# the others), and it cools down any checkpoint it is given (--cooldown_from, --cooldown_tokens: the weights, AdamW
# states, step and data position, then the LR from the peak to the floor). Here the experiment picks those steps,
# so that each branch decays over decay_frac of its own length as the main run does, checks that a branch starts in
# the stable phase of a wsd run, and names the folders plot.py --branches finds: out/RUN_cooldown_26B, for the
# tokens the branch ends at, and out/RUN_cosine_26B.


def stable_steps(total_steps, train_cfg):
    """wsd: the checkpoints (steps done) a branch may start from: warmup complete, the next step still at the peak.
    h200_1b3_overtrain: steps 572 to 152,587 of 190,735."""
    return range(
        train.warmup_steps(total_steps, train_cfg), train.wsd_decay(total_steps, train_cfg)[0]
    )


def branch_points(train_cfg, micro_step_tokens):
    """A wsd run's `cooldowns` -> {step: length}: the branch of a length starts from the checkpoint after which the
    run has seen (1 - decay_frac) x length tokens, so it decays over decay_frac of its length as the main run does.
    h200_1b3_overtrain: 26B and 52B start at steps 39,673 and 79,346 (20.8B and 41.6B tokens)."""
    if train_cfg.schedule != 'wsd':
        raise ConfigError(
            f"cooldowns need schedule = 'wsd': a {train_cfg.schedule} run's LR falls at every step, so "
            f"no checkpoint of it is a stable point to branch from"
        )
    stable = stable_steps(train.planned_steps(train_cfg, micro_step_tokens), train_cfg)
    points = {}
    for length in train_cfg.cooldowns:
        start = round((1 - train_cfg.decay_frac) * length)
        step = train.planned_steps(
            dataclasses.replace(train_cfg, train_tokens=start), micro_step_tokens
        )
        if step not in stable:
            raise ConfigError(
                f"cooldowns: the branch of {length:,} tokens would start at step {step:,} ({start:,} "
                f"tokens), outside this run's stable phase (steps {stable.start:,} to "
                f"{stable.stop - 1:,}): a length must be shorter than train_tokens "
                f"({train_cfg.train_tokens:,}) and start after the warmup"
            )
        points[step] = length
    return points


def branch_out_dir(main_out_dir, end_tokens, schedule='cooldown'):
    """The folder of a run beside the main one, named for the tokens it ends at: out/h200_1b3_overtrain ->
    out/h200_1b3_overtrain_cooldown_26B (a branch), or _cosine_26B (schedule='cosine'). plot.py finds them so."""
    return f"{os.path.normpath(main_out_dir)}_{schedule}_{bill.si(end_tokens)}"


def check_branch_start(path, model_cfg, train_cfg):
    """A branch starts from a stable-phase checkpoint of a wsd run that is no branch itself: train.py cools down any
    checkpoint, but only these, decayed, are finished runs of the branch's length. The checkpoint's train_state
    (kilobytes) is read before every start and resume of a branch, as train.py reads it too."""
    if not os.path.isfile(os.path.join(path, checkpoint.MANIFEST)):
        raise ConfigError(
            f"{path} is not a complete checkpoint: the main run keeps one at each branch's start "
            f"(--keep_steps) only for the cooldowns it had when it passed that step; a branch added "
            f"later needs the main run again from an earlier checkpoint"
        )
    saved = checkpoint.read_state(checkpoint.verified(path))
    main, step = saved['train_config'], saved['run']['step']
    if main.get('cooldown_from'):
        raise ConfigError(
            f"{path} is a cooldown branch's checkpoint, already decaying: a branch starts from the main "
            f"run's checkpoints ({main['cooldown_from']} is one)"
        )
    if main['schedule'] != 'wsd':
        raise ConfigError(
            f"{path} was written by a {main['schedule']} run: a branch starts from the stable phase of "
            f"a wsd run (a {main['schedule']} run's LR falls at every step)"
        )
    # the main run's schedule as it was written: this config with the checkpoint's own keys (train_tokens, say)
    main_train = dataclasses.replace(
        train_cfg, **{k: v for k, v in main.items() if hasattr(train_cfg, k)}
    )
    total_steps = train.planned_steps(
        main_train, train.tokens_per_micro_step(model_cfg, main_train, 1)
    )
    stable = stable_steps(total_steps, main_train)
    if step not in stable:
        raise ConfigError(
            f"{path} is step {step:,} of a wsd run that holds the peak LR from step {stable.start:,} "
            f"to {stable.stop - 1:,}: at step {step:,} it is "
            f"{'still warming up' if step < stable.start else 'already decaying'}; a branch starts "
            f"from a checkpoint in between"
        )


@dataclasses.dataclass
class Planned:
    """One run of the experiment."""

    schedule: str  # 'wsd' (the main run), 'cooldown' (a branch of it) or 'cosine'
    length: int  # the tokens seen when it ends
    tokens: int  # the tokens it trains (a branch: its decay alone)
    out_dir: str
    flags: list  # train.py's arguments after the config and the overrides
    start: str = ''  # a branch: the main run's checkpoint it cools down


def tokens_after(steps, train_cfg, micro_step_tokens):
    """Tokens seen after `steps` steps, the batch ramp's steps one by one: what the main run's checkpoint at that
    step holds (a rollback restores steps and tokens together)."""
    tokens = 0
    for _ in range(steps):
        tokens += train.batch_tokens_at(tokens, train_cfg, micro_step_tokens)
    return tokens


def plan(model_cfg, train_cfg):
    """The runs, in the order they run: the main one (it writes the branches' starts), its branches, then the cosine
    runs, shortest first."""
    if not train_cfg.cooldowns:
        raise ConfigError(
            f"overtrain.py needs a wsd run with cooldown branches (schedule = 'wsd', cooldowns = "
            f"(26e9, 52e9)): this config has schedule = {train_cfg.schedule!r} and no cooldowns"
        )
    micro_step_tokens = train.tokens_per_micro_step(model_cfg, train_cfg, 1)
    points = branch_points(train_cfg, micro_step_tokens)
    main = train_cfg.out_dir
    keep = sorted(set(train_cfg.keep_steps) | set(points))  # the config's own kept steps stay kept
    runs = [
        Planned(
            'wsd',
            train_cfg.train_tokens,
            train_cfg.train_tokens,
            main,
            [f"--keep_steps={','.join(str(step) for step in keep)}"],
        )
    ]
    for step, length in sorted(points.items()):
        decay = length - tokens_after(step, train_cfg, micro_step_tokens)
        start = os.path.join(checkpoint.root(main), f'step_{step:07d}')
        out_dir = branch_out_dir(main, length)
        flags = [f'--cooldown_from={start}', f'--cooldown_tokens={decay}', f'--out_dir={out_dir}']
        runs.append(Planned('cooldown', length, decay, out_dir, flags, start))
    for length in sorted(train_cfg.cooldowns) + [train_cfg.train_tokens]:
        out_dir = branch_out_dir(main, length, 'cosine')
        runs.append(
            Planned(
                'cosine',
                length,
                length,
                out_dir,
                ['--schedule=cosine', f'--train_tokens={length}', f'--out_dir={out_dir}'],
            )
        )
    return runs


def plan_bill(model_cfg, train_cfg, runs):
    """The ledger's prediction for the config's device, shared out by tokens: -> (rows, prediction)."""
    prediction = sums.predict(model_cfg, train_cfg)
    days_per_token = prediction['days'] / prediction['tokens']
    cost_per_token = prediction['cost_usd'] / prediction['tokens']
    chinchilla = prediction['data']['chinchilla_tokens']
    si, duration = bill.si, bill.duration
    rows = [
        '| run | schedule | trains | ends at | x Chinchilla | time | cost |',
        '| --- | --- | ---: | ---: | ---: | ---: | ---: |',
    ]
    for run in runs:
        rows.append(
            f"| {run.out_dir} | {run.schedule} | {si(run.tokens)} | {si(run.length)} | "
            f"{run.length / chinchilla:.2f} | {duration(run.tokens * days_per_token)} | "
            f"${run.tokens * cost_per_token:,.0f} |"
        )
    for what, kinds in (
        ('wsd and its branches', ('wsd', 'cooldown')),
        ('the cosine runs', ('cosine',)),
    ):
        tokens = sum(run.tokens for run in runs if run.schedule in kinds)
        rows.append(
            f"| {what} | | {si(tokens)} | | | {duration(tokens * days_per_token)} | ${tokens * cost_per_token:,.0f} |"
        )
    return rows, prediction


def final_val_bpb(out_dir):
    """The run's last val loss in bits per byte (summary.json), or None (no eval yet, or no bytes per token)."""
    try:
        with open(os.path.join(out_dir, 'summary.json')) as f:
            return json.load(f)['val_bpb']
    except (OSError, ValueError, KeyError):
        return None


def results(runs, chinchilla):
    """A row per length: the wsd run's (its branch, or the main run itself at the longest) against cosine's."""
    rows = [
        '| tokens | x Chinchilla | wsd + cooldown: val bpb | cosine: val bpb | wsd - cosine |',
        '| ---: | ---: | ---: | ---: | ---: |',
    ]
    for length in sorted({run.length for run in runs}):
        wsd, cosine = (
            next(
                final_val_bpb(run.out_dir)
                for run in runs
                if run.length == length and (run.schedule == 'cosine') == is_cosine
            )
            for is_cosine in (False, True)
        )
        difference = f'{wsd - cosine:+.4f}' if wsd is not None and cosine is not None else '-'
        rows.append(
            f"| {bill.si(length)} | {length / chinchilla:.2f} | "
            + ' | '.join('-' if v is None else f'{v:.4f}' for v in (wsd, cosine))
            + f" | {difference} |"
        )
    return rows


def at_best_lr(sweep, chinchilla):
    """A row per length: each schedule at the best peak LR of the sweep ({lr: runs}) for that length, as Hägele et
    al. compare them (one peak LR, tuned for neither, would favour whichever it happens to suit)."""
    rows = [
        '| tokens | x Chinchilla | wsd + cooldown: best val bpb | at lr | cosine: best val bpb | at lr '
        '| wsd - cosine |',
        '| ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    lengths = sorted({run.length for runs in sweep.values() for run in runs})
    for length in lengths:
        best = []
        for is_cosine in (False, True):
            scores = [
                (final_val_bpb(run.out_dir), lr)
                for lr, runs in sweep.items()
                for run in runs
                if run.length == length and (run.schedule == 'cosine') == is_cosine
            ]
            best.append(
                min(((bpb, lr) for bpb, lr in scores if bpb is not None), default=(None, None))
            )
        (wsd, wsd_lr), (cosine, cosine_lr) = best
        cells = [f'{v:.4f} | {lr:g}' if v is not None else '- | -' for v, lr in best]
        difference = f'{wsd - cosine:+.4f}' if wsd is not None and cosine is not None else '-'
        rows.append(
            f"| {bill.si(length)} | {length / chinchilla:.2f} | {' | '.join(cells)} | {difference} |"
        )
    return rows


def parse_lrs(argv):
    """--lrs=1e-3,3e-3,1e-2: the peak LRs of the sweep (every run of the experiment at each), or () for none."""
    given = [a.split('=', 1)[1] for a in argv if a.startswith('--lrs=')]
    try:
        lrs = tuple(float(v) for v in ','.join(given).split(',') if v)
    except ValueError:
        raise ConfigError(
            f"--lrs={','.join(given)}: expected peak LRs, comma-separated (1e-3,3e-3,1e-2)"
        ) from None
    if any(lr <= 0 for lr in lrs):
        raise ConfigError(f"--lrs: every LR must be positive, got {lrs}")
    return lrs


@cli
def main(argv):
    config_path = argv[0] if argv and not argv[0].startswith('--') else None
    if config_path is None:
        raise ConfigError(f"no config given: {USAGE}")
    lrs = parse_lrs(argv[1:])
    overrides = [a for a in argv[1:] if a != '--plan' and not a.startswith('--lrs=')]
    if not lrs:
        return experiment(config_path, overrides, '--plan' in argv)
    # the sweep: the whole experiment at each peak LR, in folders named for it; then each schedule at its best
    base = load_config(config_path, overrides)[1].out_dir
    sweep = {}
    for lr in lrs:
        swept = [*overrides, f'--lr={lr:g}', f'--out_dir={os.path.normpath(base)}_lr{lr:g}']
        print(f"\n== peak lr {lr:g}", flush=True)
        code = experiment(config_path, swept, '--plan' in argv)
        if code:
            return code
        sweep[lr] = plan(*load_config(config_path, swept))
    if '--plan' not in argv:
        params = sums.count_params(load_config(config_path, overrides)[0])['total']
        chinchilla = sums.CHINCHILLA_TOKENS_PER_PARAM * params
        print(
            '\neach schedule at its best peak LR, final val loss in bits per byte:\n'
            + '\n'.join(at_best_lr(sweep, chinchilla))
        )
    return 0


def experiment(config_path, overrides, planning):
    """The experiment at one peak LR: the plan, its bill and commands; then (unless planning) the runs and the
    table of their final val losses."""
    model_cfg, train_cfg = load_config(config_path, overrides)
    # drawn beside the branches (read first)
    fit = scaling.load_fit(train_cfg.fit) if train_cfg.fit else None
    runs = plan(model_cfg, train_cfg)
    rows, prediction = plan_bill(model_cfg, train_cfg, runs)
    launcher = (
        f"torchrun --nproc_per_node={train_cfg.n_gpu}"
        if prediction['gpu']['kind'] == 'gpu'
        else 'python'
    )
    commands = [
        f"{launcher} {shlex.join(['train.py', config_path, *overrides, *run.flags])}"
        for run in runs
    ]
    print(
        f"the experiment, billed by the ledger for {train_cfg.n_gpu} x {prediction['gpu']['name']} at an assumed "
        f"{train_cfg.mfu:.0%} MFU:\n"
        + '\n'.join(rows)
        + '\n\ncommands, in order (a branch starts from a '
        'checkpoint the main run keeps):\n' + '\n'.join(commands),
        flush=True,
    )
    if planning:
        return 0
    for run in runs:
        if run.start:
            check_branch_start(run.start, model_cfg, train_cfg)
        # a complete run resumes to its end: at once
        resume = ['--resume'] if checkpoint.latest(run.out_dir) else []
        code = train.main([config_path, *overrides, *run.flags, *resume])
        if code:
            return code
    print(
        '\nfinal val loss, bits per byte:\n'
        + '\n'.join(results(runs, prediction['data']['chinchilla_tokens']))
    )
    try:
        print(
            f"\n{plot.draw([train_cfg.out_dir], os.path.join(train_cfg.out_dir, 'branches.png'), True, fit)}"
        )
    except UserError as e:  # matplotlib missing: the table stands without the picture
        print(f"\nbranches.png not drawn: {e}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
