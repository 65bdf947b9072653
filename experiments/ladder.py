"""
ladder.py: a scaling law fitted to your own runs. A grid of small runs on a config's data, tokenizer and recipe
(Chinchilla's IsoFLOP approach: several compute budgets x several model sizes, each run's schedule spanning its own
tokens), held-out runs at a few times the grid's largest compute, then L(N, D) = E + A/N^alpha + B/D^beta fitted
to the grid alone (scaling.fit_law: Chinchilla's approach 3, bootstrap intervals over the runs) and the held-out
runs' measured losses set beside the fit's predictions.

    python prepare.py pystdlib                                  # the default data, ~10 s
    python experiments/ladder.py --preset=cpu                   # 16 runs, ~30 min on 2 cores (docs/measured.md)
    python experiments/ladder.py --preset=gpu --plan            # the H200 hour's grid, billed by the ledger
    python ledger.py configs/pystdlib_cpu.py --fit=out/ladder_cpu/fit.json   # the bill with the fitted loss

Each run is train.py on the preset's config with the preset's overrides (a shape, the batch, the eval size) and
--train_tokens = the budget's tokens for that shape: D = C / (the ledger's model FLOPs per token), rounded to
whole batches, so the LR schedule (warmup, cosine to 10%) spans exactly the run's own tokens: a run cut short is
not a smaller run (Hoffmann et al. 2022, section 3.1). Each run's final val loss and exact bits per byte are read
from its summary.json, beside N and D. Stopped, the same command carries on: a run whose summary.json has its
final eval is done and is not run again; an interrupted one resumes from its checkpoint.

--plan prints the grid (shape, N, D, budget, the ledger's time) and runs nothing; --out=FOLDER puts the runs and
fit.json elsewhere (default out/ladder_PRESET).
"""

import dataclasses
import json
import os
import sys
import time

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ledgergpt import bill, checkpoint, files, scaling, sums
from ledgergpt.config import ConfigError, UserError, cli, load_config

USAGE = 'usage: python experiments/ladder.py --preset=cpu|gpu [--plan] [--out=FOLDER]'

# A preset: the config whose data, tokenizer and recipe (optimizer, LR schedule) every run shares, the overrides
# every run gets, the shapes, the compute budgets in model FLOPs (the ledger's 6 N_matmul + 12 L H T per token,
# times D), and the held-out runs: shapes of the grid (their indices) at `held_out_factor` x the largest budget.
#
# cpu: four Llama shapes of 2 layers x 32 to 128 wide (head size 32) on data/pystdlib's 8192-token BPE. Their
# output projection is most of N (8192 x 64 of H=64's 0.66M), so widening is what grows them: N 0.32M-1.57M.
# Budgets 1.5, 3 and 6 TFLOPs: at H=64's 4.3 MFLOPs per token 6 TFLOPs is 1.4M tokens, 340 steps of 4,096; D
# spans 147K-2.8M (0.09 to 8.9 tokens per parameter). Held out: all four shapes at 15 TFLOPs, 2.5x the grid's
# largest, an IsoFLOP curve the fit never sees (H=64 first); H=32's 7.1M tokens there stay inside one epoch of the
# 7.8M train tokens. The 16 runs are 102 TFLOPs: ~25 min at the 60-110 GFLOP/s these shapes reach on the 2-core
# Xeon with AMX (fp32, eager, 2 threads: the compile's ~30 s a shape would outweigh the small runs), plus a few
# seconds of start-up and eval per run (docs/measured.md).
#
# gpu: the H200 hour. configs/h200_1b3.py's recipe on its data (FineWeb-Edu, GPT-2's tokenizer), 12 layers of
# 384 to 1024 (head size 64): N 104M-309M, the 50304-wide output projection included. Budgets 3e16, 6e16 and
# 1.2e17 FLOPs; the held-out run 3.6e17 at H=768. Sum 1.2e18 FLOPs: `--preset=gpu --plan` bills it at 50 min on
# one H200 at the config's assumed 40% MFU; these small shapes reach less, so about an hour.
PRESETS = {
    'cpu': dict(
        config='configs/pystdlib_cpu.py',
        overrides=dict(
            batch_tokens=4096,
            micro_batch=16,
            compile=False,
            dtype='float32',
            eval_every=10**9,  # one eval, at the end: the final val loss is what the fit reads
            eval_tokens=32_768,
            ckpt_every=10**9,  # one checkpoint, at the end (a stopped run writes its own)
            log_every=25,
            sample_tokens=0,
        ),
        shapes=[dict(n_layer=2, n_embd=h, n_head=h // 32) for h in (32, 64, 96, 128)],
        budgets=(1.5e12, 3e12, 6e12),
        held_out_shapes=(1, 0, 2, 3),  # H=64 first: the one check, if the others are cut short
        held_out_factor=2.5,
    ),
    'gpu': dict(
        config='configs/h200_1b3.py',
        overrides=dict(
            batch_tokens=131_072,
            micro_batch=32,
            eval_every=10**9,
            eval_tokens=2_097_152,
            ckpt_every=10**9,
            hellaswag_every=0,
            sample_tokens=0,
        ),
        shapes=[dict(n_layer=12, n_embd=h, n_head=h // 64) for h in (384, 512, 768, 1024)],
        budgets=(3e16, 6e16, 1.2e17),
        held_out_shapes=(2,),
        held_out_factor=3,
    ),
}


@dataclasses.dataclass
class Rung:
    """One run of the ladder."""

    name: str
    budget: float  # the compute budget it belongs to, model FLOPs
    shape: dict
    held_out: bool
    flags: list  # train.py's overrides, the config's path before them
    n_params: int  # N as the fit counts it: scaling.N_CONVENTION (the ledger's 'matmul' parameters)
    n_total: int  # every parameter, embeddings included
    n_non_embedding: int  # no embedding table, no output projection (Kaplan et al.'s N)
    tokens: int  # D: whole batches
    flops_per_token: int  # the ledger's model FLOPs per token (6 N_matmul + 12 L H T)
    out_dir: str


def plan(preset, out):
    """The grid's runs, budget by budget (smallest first), then the held-out run."""
    spec = PRESETS[preset]
    overrides = [f'--{k}={v}' for k, v in spec['overrides'].items()]
    largest = max(spec['budgets'])
    points = [(budget, shape, False) for budget in spec['budgets'] for shape in spec['shapes']]
    points += [
        (spec['held_out_factor'] * largest, spec['shapes'][i], True)
        for i in spec['held_out_shapes']
    ]
    rungs = []
    for budget, shape, held_out in points:
        flags = overrides + [f'--{k}={v}' for k, v in shape.items()]
        model_cfg, train_cfg = load_config(spec['config'], flags)
        params = sums.count_params(model_cfg)
        per_token = sums.flops_per_token(model_cfg)['matmul']
        steps = max(1, round(budget / per_token / train_cfg.batch_tokens))
        tokens = steps * train_cfg.batch_tokens
        budget_name = f'{budget:.2g}'.replace('+', '')  # 1.5e12, 1.5e13
        name = f"{'heldout_' if held_out else ''}c{budget_name}_L{model_cfg.n_layer}_H{model_cfg.n_embd}"
        out_dir = os.path.join(out, name)
        rungs.append(
            Rung(
                name,
                budget,
                shape,
                held_out,
                [spec['config'], *flags, f'--train_tokens={tokens}', f'--out_dir={out_dir}'],
                params['matmul'],
                params['total'],
                params['total'] - params['embedding'] - params['output'],
                tokens,
                per_token,
                out_dir,
            )
        )
    return rungs


def finished(rung):
    """The run's summary.json once its final eval is in (its tokens all seen), else None."""
    try:
        with open(os.path.join(rung.out_dir, 'summary.json')) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    done = summary.get('tokens_seen') == rung.tokens and summary.get('val_loss') is not None
    return summary if done else None


def record(rung, summary):
    """A run as the fit file keeps it: N (and the other counts), D, C, final val loss and bits per byte."""
    return {
        'name': rung.name,
        'held_out': rung.held_out,
        **rung.shape,
        'N': rung.n_params,
        'N_total': rung.n_total,
        'N_non_embedding': rung.n_non_embedding,
        'D': rung.tokens,
        'flops_per_token': rung.flops_per_token,
        'C': rung.flops_per_token * rung.tokens,
        'budget': rung.budget,
        'val_loss': summary['val_loss'],
        'val_bpb': summary['val_bpb'],
        'val_bytes_per_token': summary['val_bytes_per_token'],
        'device': summary['device'],
        'torch': summary['torch'],
    }


def plan_bill(rungs):
    """The grid as a table: the ledger's time for each run on the preset's device at its assumed MFU."""
    rows = [
        '| run | N | N total | D | C, FLOPs | ledger time | done |',
        '| --- | ---: | ---: | ---: | ---: | ---: | --- |',
    ]
    total_days = 0.0
    for rung in rungs:
        model_cfg, train_cfg = load_config(rung.flags[0], rung.flags[1:])
        days = sums.predict(model_cfg, train_cfg)['days']
        total_days += days
        rows.append(
            f"| {rung.name} | {bill.si(rung.n_params)} | {bill.si(rung.n_total)} | "
            f"{bill.si(rung.tokens)} | {rung.flops_per_token * rung.tokens:.3g} | "
            f"{bill.duration(days)} | {'yes' if finished(rung) else '-'} |"
        )
    rows.append(f"| all {len(rungs)} | | | | | {bill.duration(total_days)} | |")
    return rows


def run_all(rungs):
    """Each run not yet finished, one after another (in this process, as overtrain.py runs them)."""
    import train  # torch: only for running

    for rung in rungs:
        if finished(rung):
            continue
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
    flags = {a for a in argv if a.startswith('--') and '=' not in a}
    if (
        set(options) - {'preset', 'out'}
        or flags - {'--plan'}
        or options.get('preset') not in PRESETS
    ):
        raise ConfigError(f"{USAGE} (got {' '.join(argv) or 'nothing'})")
    preset = options['preset']
    out = options.get('out', os.path.join('out', f'ladder_{preset}'))
    rungs = plan(preset, out)
    spec = PRESETS[preset]
    held_out = len(spec['held_out_shapes'])
    print(
        f"ladder {preset}: {len(rungs) - held_out} runs in {len(spec['budgets'])} budgets x "
        f"{len(spec['shapes'])} shapes, and {held_out} held out at {spec['held_out_factor']}x the largest "
        "budget; billed by the ledger:\n" + '\n'.join(plan_bill(rungs)),
        flush=True,
    )
    if '--plan' in flags:
        return 0
    code = run_all(rungs)
    if code:
        return code
    return report(preset, rungs, out)


def report(preset, rungs, out):
    """Fit the grid, write fit.json, and put the held-out run's measured loss beside the fit's prediction."""
    spec = PRESETS[preset]
    model_cfg, train_cfg = load_config(spec['config'], rungs[0].flags[1:])
    runs = [record(rung, finished(rung)) for rung in rungs]
    grid = [r for r in runs if not r['held_out']]
    fitted = scaling.fit_law(
        [r['N'] for r in grid], [r['D'] for r in grid], [r['val_loss'] for r in grid]
    )
    fit = scaling.make_fit(
        fitted,
        runs,
        data=train_cfg.data,
        tokenizer=scaling.tokenizer_of(train_cfg.data),
        recipe=scaling.recipe_of(train_cfg),
        preset=preset,
    )
    path = os.path.join(out, 'fit.json')
    files.save_json(path, fit)
    print('\n' + scaling.format_fit(fit))
    try:
        from ledgergpt import plot

        print(plot.draw_ladder(path, os.path.join(out, 'ladder.png')))
    except UserError as e:  # matplotlib missing: the fit stands without the picture
        print(f"ladder.png not drawn: {e}")
    print(f"\nthe fit: {path}; the bill with it: python ledger.py {spec['config']} --fit={path}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
