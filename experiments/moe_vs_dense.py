"""
moe_vs_dense.py: a dense model and a mixture of experts with the same active parameters, trained on the CPU for the
same wall-clock, compared on val bits per byte, tokens/s and memory.

    python experiments/moe_vs_dense.py                 # 3 minutes each, on data/pystdlib
    python experiments/moe_vs_dense.py --minutes=1     # a quick look
    python experiments/moe_vs_dense.py --small         # the pair at 128 wide on a 512-token BPE: ~20x the steps

The two: configs/pystdlib_cpu.py (4 layers x 256, dense SwiGLU of 768) and the same model with the MoE keys of
configs/pystdlib_moe.py (the last three FFNs 8 routed experts of 192, 3 per token, + 1 shared: a token uses 768 of
FFN width, as in the dense model, plus a router). Both eager (the MoE's routing breaks a compiled graph) and in the
dtype train.py picks for this CPU. sweep.py's protocol: a short calibration run measures the time to the first step
and per step, each model then trains for the steps that fit the budget (its LR schedule spanning them), and both
are scored by sweep.score on the same fixed val sequences. Memory is the run's peak resident memory (summary.json).
--small shrinks both alike (SMALL: width 128, T 128, a 512-token BPE, experts of 128 so that 3 + 1 of them are the
dense H' of 512), for a machine too slow or too busy to take the full pair far in a few minutes.
"""

import json
import os
import statistics
import sys
import time

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sweep  # experiments/ is on sys.path when this file runs
from ledgergpt import sums
from ledgergpt.config import ConfigError, cli, load_config

ROOT = sweep.ROOT
MOE_KEYS = (
    'n_experts',
    'top_k',
    'expert_hidden',
    'n_shared_experts',
    'n_dense_layers',
    'route_scale',
)
SMALL = dict(
    vocab_size=512, n_embd=128, n_head=2, block_size=128, batch_tokens=4096, micro_batch=16
)


def points(small=False):
    """{name: overrides of configs/pystdlib_cpu.py}: the dense model and configs/pystdlib_moe.py's experts."""
    moe, moe_train = load_config(os.path.join(ROOT, 'configs/pystdlib_moe.py'))
    experts = {key: getattr(moe, key) for key in MOE_KEYS}
    experts.update(
        router_bias_speed=moe_train.router_bias_speed, aux_loss_coef=moe_train.aux_loss_coef
    )
    shrink = SMALL if small else {}
    if small:  # (top_k + shared) x expert_hidden = the dense H' at width 128 (512)
        experts['expert_hidden'] = 512 // (experts['top_k'] + experts['n_shared_experts'])
    return {'dense': {'compile': False, **shrink}, 'moe': {'compile': False, **shrink, **experts}}


def measured(out_dir):
    """(steady tokens/s, peak resident bytes, the last logged load CV per MoE layer or None) of a finished run."""
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        entries = [json.loads(line) for line in f]
    steady = [e['tokens_per_s'] for e in entries if 'tokens_per_s' in e and not e['warmup']]
    with open(os.path.join(out_dir, 'summary.json')) as f:
        summary = json.load(f)
    loads = [e['expert_load_cv'] for e in entries if 'expert_load_cv' in e]
    return statistics.fmean(steady), summary['memory_measured_bytes'], loads[-1] if loads else None


@cli
def main(argv):
    small = '--small' in argv
    argv = [a for a in argv if a != '--small']
    options = dict(a[2:].split('=', 1) for a in argv if a.startswith('--') and '=' in a)
    if set(options) - {'minutes', 'out'} or len(options) != len(argv):
        raise ConfigError(
            'usage: python experiments/moe_vs_dense.py [--minutes=3] [--small] [--out=FOLDER]'
        )
    seconds = 60 * float(options.get('minutes', 3))
    out = os.path.abspath(options.get('out', os.path.join(ROOT, 'out', 'moe_vs_dense')))
    import torch

    print(
        f"moe_vs_dense: {seconds:.0f} s of training each, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    data = sweep.data_folder(512 if small else 8192)
    rows = []
    for name, point in points(small).items():
        folder = os.path.join(out, name)
        # a short run: seconds per step
        _, per_step = sweep.run_ours(point, data, folder + '_calibration')
        steps = max(1, int(seconds / per_step))
        elapsed, val_loss, trained = sweep.run_ours(point, data, folder, steps)
        tokens_per_s, peak_bytes, load_cv = measured(folder)
        model, _ = sweep.point_config(point)
        params = sums.count_params(model)
        row = dict(
            model=name,
            params=params['total'],
            active=params['active'],
            flops_per_token=sums.flops_per_token(model)['matmul'],
            steps=steps,
            tokens=steps * sweep.point_config(point)[1].batch_tokens,
            seconds=round(elapsed, 1),
            train_seconds=round(trained, 1),
            tokens_per_s=round(tokens_per_s),
            peak_mib=round(peak_bytes / 2**20),
            val_loss=round(val_loss, 4),
            val_bpb=round(
                sums.bits_per_byte(val_loss, sweep.val_bytes_per_token(data, model.block_size)), 4
            ),
            load_cv=[round(cv, 3) for cv in load_cv] if load_cv else None,
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(format_table(rows))
    return 0


def format_table(rows):
    lines = [
        '| model | params | active | FLOPs/token | steps | tokens | tokens/s | peak RSS | val bpb | load CV (last) |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |',
    ]
    for r in rows:
        cv = ', '.join(f'{c:.2f}' for c in r['load_cv']) if r['load_cv'] else ''
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['active'] / 1e6:.2f}M | {r['flops_per_token']:.3g} | "
            f"{r['steps']:,} | {r['tokens']:,} | {r['tokens_per_s']:,} | {r['peak_mib']:,} MiB | "
            f"{r['val_bpb']:.4f} | {cv} |"
        )
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
