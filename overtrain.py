"""
overtrain.py: the planning note's second experiment, "over-train the 1.3B to 100B+ tokens and watch where the loss
curve flattens relative to the Chinchilla point", as one command. A wsd run to the config's train_tokens; from its
stable phase a cooldown branch (train.py) for each of its `cooldowns`; for comparison, a cosine run from scratch of
every one of those lengths. Then a table of each run's final val loss in bits per byte, and branches.png (plot.py
--branches: the curves, the Chinchilla point, Hoffmann et al.'s fitted loss beside them).

    python prepare.py pystdlib --tokenizer bpe:512 --out data/pystdlib_bpe512   # ~10 s
    python overtrain.py configs/pystdlib_overtrain.py                          # the miniature: minutes on a CPU
    python overtrain.py configs/h200_1b3_overtrain.py --plan                   # the real one: runs, commands, bill

--plan prints the runs, the command of each and the ledger's bill (tokens, days, cost), and runs nothing. Stopped,
the same command carries on: a complete run is found complete, an interrupted one resumes. Overrides (--key=value)
go to every run.
"""
import dataclasses
import json
import os
import shlex
import sys

import checkpoint
import ledger
import plot
import train
from config import ConfigError, UserError, cli, load_config

USAGE = 'usage: python overtrain.py CONFIG [--key=value ...] [--plan]'


@dataclasses.dataclass
class Planned:
    """One run of the experiment."""
    schedule: str    # 'wsd' (the main run), 'cooldown' (a branch of it) or 'cosine'
    length: int      # the tokens seen when it ends
    tokens: int      # the tokens it trains (a branch: its decay alone)
    out_dir: str
    flags: list      # train.py's arguments after the config and the overrides


def tokens_after(steps, train_cfg, micro_step_tokens):
    """Tokens seen after `steps` steps, the batch ramp's steps one by one: what the main run's checkpoint at that
    step holds (a rollback restores steps and tokens together)."""
    tokens = 0
    for _ in range(steps):
        tokens += train.batch_tokens_at(tokens, train_cfg, micro_step_tokens)
    return tokens


def plan(model_cfg, train_cfg):
    """The runs, in the order they run: the main one (its branch points must exist before the branches start), its
    branches, then the cosine runs, shortest first."""
    if train_cfg.schedule != 'wsd' or not train_cfg.cooldowns:
        raise ConfigError(f"overtrain.py needs a wsd run with cooldown branches (schedule = 'wsd', cooldowns = "
                          f"(26e9, 52e9)): this config has schedule = {train_cfg.schedule!r}, cooldowns = "
                          f"{train_cfg.cooldowns}")
    micro_step_tokens = train.tokens_per_micro_step(model_cfg, train_cfg, 1)
    main = train_cfg.out_dir
    runs = [Planned('wsd', train_cfg.train_tokens, train_cfg.train_tokens, main, [])]
    for step, length in sorted(train.branch_points(train_cfg, micro_step_tokens).items()):
        decay = length - tokens_after(step, train_cfg, micro_step_tokens)
        runs.append(Planned('cooldown', length, decay, train.branch_out_dir(main, length),
                            train.branch_flags(main, step, decay)))
    for length in sorted(train_cfg.cooldowns) + [train_cfg.train_tokens]:
        out_dir = f"{os.path.normpath(main)}_cosine_{ledger._si(length)}"
        runs.append(Planned('cosine', length, length, out_dir, ['--schedule=cosine', f'--train_tokens={length}',
                                                                '--cooldowns=', f'--out_dir={out_dir}']))
    return runs


def bill(model_cfg, train_cfg, runs):
    """The ledger's prediction for the config's device, shared out by tokens: -> (rows, prediction)."""
    prediction = ledger.predict(model_cfg, train_cfg)
    days_per_token = prediction['days'] / prediction['tokens']
    cost_per_token = prediction['cost_usd'] / prediction['tokens']
    chinchilla = prediction['data']['chinchilla_tokens']
    rows = ['| run | schedule | trains | ends at | x Chinchilla | time | cost |',
            '| --- | --- | ---: | ---: | ---: | ---: | ---: |']
    for run in runs:
        rows.append(f"| {run.out_dir} | {run.schedule} | {ledger._si(run.tokens)} | {ledger._si(run.length)} | "
                    f"{run.length / chinchilla:.2f} | {ledger._duration(run.tokens * days_per_token)} | "
                    f"${run.tokens * cost_per_token:,.0f} |")
    for what, kinds in (('wsd and its branches', ('wsd', 'cooldown')), ('the cosine runs', ('cosine',))):
        tokens = sum(run.tokens for run in runs if run.schedule in kinds)
        rows.append(f"| {what} | | {ledger._si(tokens)} | | | {ledger._duration(tokens * days_per_token)} | "
                    f"${tokens * cost_per_token:,.0f} |")
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
    rows = ['| tokens | x Chinchilla | wsd + cooldown: val bpb | cosine: val bpb | wsd - cosine |',
            '| ---: | ---: | ---: | ---: | ---: |']
    for length in sorted({run.length for run in runs}):
        wsd, cosine = (next(final_val_bpb(run.out_dir) for run in runs if run.length == length and
                            (run.schedule == 'cosine') == is_cosine) for is_cosine in (False, True))
        difference = f'{wsd - cosine:+.4f}' if wsd is not None and cosine is not None else '-'
        rows.append(f"| {ledger._si(length)} | {length / chinchilla:.2f} | "
                    + ' | '.join('-' if v is None else f'{v:.4f}' for v in (wsd, cosine)) + f" | {difference} |")
    return rows


@cli
def main(argv):
    config_path = argv[0] if argv and not argv[0].startswith('--') else None
    if config_path is None:
        raise ConfigError(f"no config given: {USAGE}")
    planning = '--plan' in argv
    overrides = [a for a in argv[1:] if a != '--plan']
    model_cfg, train_cfg = load_config(config_path, overrides)
    runs = plan(model_cfg, train_cfg)
    rows, prediction = bill(model_cfg, train_cfg, runs)
    launcher = f"torchrun --nproc_per_node={train_cfg.n_gpu}" if prediction['gpu']['kind'] == 'gpu' else 'python'
    print(f"the experiment, billed by the ledger for {train_cfg.n_gpu} x {prediction['gpu']['name']} at an assumed "
          f"{train_cfg.mfu:.0%} MFU:\n" + '\n'.join(rows) + '\n\ncommands (a branch after the main run has kept its '
          'start):\n' + '\n'.join(f"{launcher} {shlex.join(['train.py', config_path, *overrides, *run.flags])}"
                                  for run in runs), flush=True)
    if planning:
        return 0
    for run in runs:
        resume = ['--resume'] if checkpoint.latest(run.out_dir) else []  # a complete run resumes to its end: at once
        code = train.main([config_path, *overrides, *run.flags, *resume])
        if code:
            return code
    print('\nfinal val loss, bits per byte:\n'
          + '\n'.join(results(runs, prediction['data']['chinchilla_tokens'])))
    try:
        print(f"\n{plot.draw([train_cfg.out_dir], os.path.join(train_cfg.out_dir, 'branches.png'), branches=True)}")
    except UserError as e:  # matplotlib missing: the table stands without the picture
        print(f"\nbranches.png not drawn: {e}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
