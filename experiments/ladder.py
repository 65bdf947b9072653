"""
ladder.py: a scaling law fitted to your own runs (docs/measured.md): an IsoFLOP grid of small runs
(compute budgets x model sizes) on a config's data and recipe, L(N, D) fitted to it (scaling.py),
and held-out runs at a few times its largest compute beside the fit's predictions.

    python experiments/ladder.py --preset=cpu                   # 16 runs, ~30 min on 2 cores
    python experiments/ladder.py --preset=gpu --plan            # the H200 hour's grid, billed
    python ledger.py configs/pystdlib_cpu.py --fit=out/ladder_cpu/fit.json   # the bill with the fit

Stopped, the same command carries on. --plan runs nothing; --out=FOLDER puts the runs and fit.json
elsewhere (default out/ladder_PRESET).
"""

import dataclasses
import os
import sys
import time

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train
from ledgergpt import bill, checkpoint, files, plot, scaling, sums
from ledgergpt.config import ConfigError, UserError, cli, load_config

USAGE = 'usage: python experiments/ladder.py --preset=cpu|gpu [--plan] [--out=FOLDER]'

# A preset: the config every run shares, the overrides each gets, the shapes, the compute budgets in
# model FLOPs (6 N_matmul + 12 L H T per token, times D), and the held-out runs: shapes (indices)
# at held_out_factor x the largest budget. cpu: N 0.32M-1.57M, 102 TFLOPs; gpu: N 104M-309M.
# one eval and one checkpoint, at the end: the final val loss is what the fit reads
ONCE = dict(eval_every=10**9, ckpt_every=10**9, sample_tokens=0)
# fp32, eager: the compile's ~30 s a shape would outweigh the small runs
CPU_RUN = dict(compile=False, dtype='float32', log_every=25)
PRESETS = {
    'cpu': dict(
        config='configs/pystdlib_cpu.py',
        overrides=dict(ONCE, **CPU_RUN, batch_tokens=4096, micro_batch=16, eval_tokens=32_768),
        shapes=[dict(n_layer=2, n_embd=h, n_head=h // 32) for h in (32, 64, 96, 128)],
        budgets=(1.5e12, 3e12, 6e12),
        held_out_shapes=(1, 0, 2, 3),  # H=64 first: the one check, if the others are cut short
        held_out_factor=2.5,
    ),
    'gpu': dict(
        config='configs/h200_1b3.py',
        overrides=dict(
            ONCE, batch_tokens=131_072, micro_batch=32, eval_tokens=2_097_152, hellaswag_every=0
        ),
        shapes=[dict(n_layer=12, n_embd=h, n_head=h // 64) for h in (384, 512, 768, 1024)],
        budgets=(3e16, 6e16, 1.2e17),
        held_out_shapes=(2,),
        held_out_factor=3,
    ),
}


@dataclasses.dataclass
class Rung:
    name: str
    budget: float  # the compute budget it belongs to, model FLOPs
    shape: dict
    held_out: bool
    flags: list  # train.py's arguments: the config's path, then the overrides
    params: dict  # sums.count_params
    tokens: int  # D: whole batches
    flops_per_token: int  # the ledger's model FLOPs per token (6 N_matmul + 12 L H T)
    out_dir: str

    @property
    def n_params(self):
        """N as the fit counts it: scaling.N_CONVENTION (the ledger's 'matmul' parameters)."""
        return self.params['matmul']


def plan(preset, out):
    """The grid's runs, budget by budget (smallest first), then the held-out ones."""
    spec = PRESETS[preset]
    beyond = spec['held_out_factor'] * max(spec['budgets'])
    points = [(budget, shape, False) for budget in spec['budgets'] for shape in spec['shapes']]
    points += [(beyond, spec['shapes'][i], True) for i in spec['held_out_shapes']]
    rungs = []
    for budget, shape, held_out in points:
        flags = [f'--{k}={v}' for k, v in [*spec['overrides'].items(), *shape.items()]]
        model_cfg, train_cfg = load_config(spec['config'], flags)
        per_token = sums.flops_per_token(model_cfg)['matmul']
        # whole batches to the budget, its schedule spanning them: a run cut short is not a smaller
        # run (Hoffmann et al. 2022, section 3.1)
        batch = train_cfg.batch_tokens
        tokens = max(1, round(budget / per_token / batch)) * batch
        prefix = f"{'heldout_' if held_out else ''}c{budget:.2g}".replace('+', '')  # c1.5e12
        name = f'{prefix}_L{model_cfg.n_layer}_H{model_cfg.n_embd}'
        out_dir = os.path.join(out, name)
        flags = [spec['config'], *flags, f'--train_tokens={tokens}', f'--out_dir={out_dir}']
        params = sums.count_params(model_cfg)
        rungs.append(Rung(name, budget, shape, held_out, flags, params, tokens, per_token, out_dir))
    return rungs


def finished(rung):
    """The run's summary.json once its final eval is in (its tokens all seen), else None."""
    summary = scaling.read_summary(rung.out_dir)
    done = summary.get('tokens_seen') == rung.tokens and summary.get('val_loss') is not None
    return summary if done else None


def record(rung, summary):
    """A run as the fit file keeps it: N (and the other counts), D, C, final val loss and bits per
    byte. N_non_embedding: no embedding table, no output projection (Kaplan et al.'s N)."""
    params = rung.params
    outer = params['embedding'] + params['output']
    counts = dict(N=rung.n_params, N_total=params['total'], N_non_embedding=params['total'] - outer)
    run = dict(name=rung.name, held_out=rung.held_out, **rung.shape, **counts, D=rung.tokens)
    run |= dict(flops_per_token=rung.flops_per_token, C=rung.flops_per_token * rung.tokens)
    measured = ('val_loss', 'val_bpb', 'val_bytes_per_token', 'device', 'torch')
    return run | dict(budget=rung.budget) | {key: summary[key] for key in measured}


def plan_bill(rungs):
    """The grid as a table: the ledger's time for each run on the preset's device."""
    rows = [
        '| run | N | N total | D | C, FLOPs | ledger time | done |',
        '| --- | ---: | ---: | ---: | ---: | ---: | --- |',
    ]
    days = [sums.predict(*load_config(rung.flags[0], rung.flags[1:]))['days'] for rung in rungs]
    for rung, run_days in zip(rungs, days):
        rows.append(
            f"| {rung.name} | {bill.si(rung.n_params)} | {bill.si(rung.params['total'])} | "
            f"{bill.si(rung.tokens)} | {rung.flops_per_token * rung.tokens:.3g} | "
            f"{bill.duration(run_days)} | {'yes' if finished(rung) else '-'} |"
        )
    rows.append(f"| all {len(rungs)} | | | | | {bill.duration(sum(days))} | |")
    return rows


def run_all(rungs):
    """Each run not yet finished, one after another (in this process, as overtrain.py runs them)."""
    for rung in (rung for rung in rungs if not finished(rung)):
        resume = ['--resume'] if checkpoint.latest(rung.out_dir) else []
        print(f"\n== {rung.name}: N {rung.n_params:,}, D {rung.tokens:,}", flush=True)
        started = time.perf_counter()
        code = train.main([*rung.flags, *resume])
        if code:
            return code
        print(f"== {rung.name}: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


@cli
def main(argv):
    options = dict(a[2:].split('=', 1) for a in argv if a.startswith('--') and '=' in a)
    known = set(options) <= {'preset', 'out'} and len(options) + argv.count('--plan') == len(argv)
    if not known or options.get('preset') not in PRESETS:
        raise ConfigError(f"{USAGE} (got {' '.join(argv) or 'nothing'})")
    preset = options['preset']
    spec, out = PRESETS[preset], options.get('out', os.path.join('out', f'ladder_{preset}'))
    rungs = plan(preset, out)
    held_out = len(spec['held_out_shapes'])
    print(
        f"ladder {preset}: {len(rungs) - held_out} runs in {len(spec['budgets'])} budgets x "
        f"{len(spec['shapes'])} shapes, and {held_out} held out at {spec['held_out_factor']}x the "
        "largest budget; billed by the ledger:\n" + '\n'.join(plan_bill(rungs)),
        flush=True,
    )
    if '--plan' in argv:
        return 0
    return run_all(rungs) or report(preset, rungs, out)


def report(preset, rungs, out):
    """Fit the grid, write fit.json, set the held-out runs beside the fit's predictions."""
    config = PRESETS[preset]['config']
    train_cfg = load_config(config, rungs[0].flags[1:])[1]
    runs = [record(rung, finished(rung)) for rung in rungs]
    grid = [r for r in runs if not r['held_out']]
    fitted = scaling.fit_law(*([r[key] for r in grid] for key in ('N', 'D', 'val_loss')))
    tokenizer = scaling.tokenizer_of(train_cfg.data)
    recipe = {key: getattr(train_cfg, key) for key in scaling.RECIPE_KEYS}
    fit = scaling.make_fit(fitted, runs, train_cfg.data, tokenizer, recipe, preset)
    path = os.path.join(out, 'fit.json')
    files.save_json(path, fit)
    print('\n' + scaling.format_fit(fit))
    try:
        print(plot.draw_ladder(path, os.path.join(out, 'ladder.png')))
    except UserError as e:  # matplotlib missing: the fit stands without the picture
        print(f"ladder.png not drawn: {e}")
    print(f"\nthe fit: {path}; the bill with it: python ledger.py {config} --fit={path}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
