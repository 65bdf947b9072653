"""
bench.py: measured speed and memory beside the ledger's prediction, for the device at hand.

    python bench.py                                  # the device script: the default cases below, one JSON line each
    python bench.py "configs/h200_1b3.py --micro_batch=8" --steps=20
    python bench.py --tiny                           # the same code at a tiny size, seconds on a CPU (CI runs it)
    python bench.py loop configs/pystdlib_cpu.py     # train.py's loop against a plain PyTorch loop, alternated
    python bench.py loss configs/pystdlib_cpu.py     # train.py's loop with the full loss and the chunked, alternated

The device script. For each case (a config file and its overrides, in quotes) it builds what train.py builds (the
model, its parallel wrapper, the optimizer) on synthetic tokens, runs warm-up steps (torch.compile compiles there), then
times optimizer steps of one micro-step each with train.py's own train_step, the device synchronised around the
clock (and around each optimizer step, timed on its own: Muon's Newton-Schulz against the ledger's FLOPs at the
assumed MFU). One JSON line per case: the device, torch, the SDPA kernel, tokens/s, MFU, the optimizer step's
seconds, peak allocated and reserved
memory and the allocator's retries, each beside the ledger's prediction for this device. `--micro_batch=max` takes
the largest micro-batch the ledger says fits. The cases share a time budget (--budget_s, default 420 s: 7 minutes
on one H200 for the four defaults); each case gets its share, sized by the ledger's predicted step time, and a
case that cannot fit its share is skipped and says so. Lines go to stdout and to $OUT/bench.jsonl when $OUT is set
(the device machine's output folder), with a log in $OUT/bench.log.
"""

import contextlib
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

import train
from ledgergpt import data, live_ledger, optimizers, processes, sums
from ledgergpt.config import PARTS, ConfigError, load_config
from model import GPT

DEFAULT_CASES = [
    'configs/gpt2_124m.py',  # GPT-2 small at its micro-batch, compiled
    'configs/h200_1b3.py',  # the seed's 1.3B run, compiled
    'configs/h200_1b3.py --recompute=True --micro_batch=max',  # with recompute, the largest micro-batch
    'configs/h200_1b3.py --optimizer=muon',  # Muon: its Newton-Schulz step beside the ledger's
    # the full logits' loss at the largest micro-batch it fits, beside the chunked loss (the default) above
    'configs/h200_1b3.py --loss=full --micro_batch=max',
]
TINY = [
    '--n_layer=2',
    '--n_embd=64',
    '--n_head=2',
    '--n_kv_head=2',
    '--ffn_hidden=0',
    '--vocab_size=512',
    '--block_size=32',
    '--micro_batch=2',
    '--compile=False',
]
# --tiny: a tiny model "fits" thousands of sequences in RAM; 8 keep it quick
TINY_MAX_MICRO_BATCH = 8
COMPILE_SECONDS = 90  # a budget for torch.compile's warm-up of one case on a GPU (measured on the CPU: ~60 s tiny)


# -----------------------------------------------------------------------------------------------------
# The device script.


def build(case_args, cluster, tiny):
    """-> (Run of synthetic tokens, prediction) for one case: its config, one micro-step per optimizer step."""
    path, overrides = case_args[0], [a for a in case_args[1:] if a != '--micro_batch=max']
    overrides += ['--data=synthetic', '--gpu=auto'] + (TINY if tiny else [])
    model_cfg, train_cfg = load_config(path, overrides)
    device = live_ledger.live_device(cluster, model_cfg, train_cfg)
    if '--micro_batch=max' in case_args:
        best = sums.max_micro_batch(model_cfg, train_cfg, cluster.world_size, device)
        if best == 0:
            raise ConfigError(
                f"{' '.join(case_args)}: the ledger says not even one sequence fits on {device.name}"
            )
        train_cfg = dataclasses.replace(
            train_cfg, micro_batch=min(best, TINY_MAX_MICRO_BATCH) if tiny else best
        )
    micro_step_tokens = train_cfg.micro_batch * model_cfg.block_size * cluster.world_size
    train_cfg = dataclasses.replace(train_cfg, batch_tokens=micro_step_tokens, batch_ramp_tokens=0)
    prediction = sums.predict(model_cfg, train_cfg, n_gpu=cluster.world_size, device=device)
    dtype = prediction['dtype']
    stream = data.SyntheticStream(
        model_cfg.vocab_size, model_cfg.block_size, train_cfg.seed, split=0
    )
    run = train.build_run(
        model_cfg, train_cfg, cluster, dtype, stream, total_steps=10**9, stop_step=10**9
    )
    return run, prediction, live_ledger.sdpa_backend(model_cfg, cluster.device, dtype)


def synchronize(cluster):
    if cluster.device.type == 'cuda':
        torch.cuda.synchronize(cluster.device)


def time_optimizer_steps(optimizer, cluster):
    """From here each optimizer step is timed, the device synchronised around it (a few microseconds a step
    taken from the overlap of the update with what follows): -> the list the seconds go into."""
    seconds, step = [], optimizer.step

    def timed(*args, **kwargs):
        synchronize(cluster)
        begin = time.perf_counter()
        result = step(*args, **kwargs)
        synchronize(cluster)
        seconds.append(time.perf_counter() - begin)
        return result

    optimizer.step = timed
    return seconds


def bench_case(case, cluster, steps, warmup, seconds, tiny):
    """Warm up, then time up to `steps` optimizer steps within `seconds`: -> one result dict."""
    case_args = case.split()
    run, prediction, attention = build(case_args, cluster, tiny)
    memory = prediction['memory']
    predicted_step = prediction['step_seconds']
    steps = max(1, min(steps, int((seconds - (0 if tiny else COMPILE_SECONDS)) / predicted_step)))
    for _ in range(warmup):
        train.train_step(run)
    optimizer_seconds = time_optimizer_steps(run.optimizer, cluster)
    synchronize(cluster)
    if cluster.device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(cluster.device)
    start = time.perf_counter()
    for _ in range(steps):
        result = train.train_step(run)
    loss = processes.reduce_mean(
        result.loss.detach().clone(), cluster
    ).item()  # also waits for the last step
    synchronize(cluster)
    elapsed = time.perf_counter() - start
    tokens_per_s = steps * run.micro_step_tokens / elapsed
    if cluster.device.type == 'cuda':
        stats = torch.cuda.memory_stats(cluster.device)
        peak, reserved, retries = (
            stats['allocated_bytes.all.peak'],
            stats['reserved_bytes.all.peak'],
            stats['num_alloc_retries'],
        )
        peak_predicted = memory['allocated']
    else:  # the CPU: the process's peak resident memory, against the ledger's total (runtime included)
        peak, reserved, retries = live_ledger.peak_memory(cluster)[0], None, None
        peak_predicted = memory['total']
    peak_flops = cluster.world_size * prediction['gpu']['peak_flops']
    mfu = prediction['flops_per_token']['matmul'] * tokens_per_s / peak_flops
    return {
        'case': case,
        'device': prediction['gpu']['name'],
        'processes': cluster.world_size,
        'torch': torch.__version__,
        'sdpa': attention,
        'dtype': prediction['dtype'],
        'micro_batch': run.train.micro_batch,
        'block_size': run.model_cfg.block_size,
        'compile': run.train.compile,
        'recompute': run.train.recompute,
        'loss_part': run.model_cfg.loss,  # the loss's row of config.PARTS['loss']
        'params': prediction['params']['total'],
        'steps_timed': steps,
        'seconds': elapsed,
        'loss': loss,
        'tokens_per_s': tokens_per_s,
        'tokens_per_s_predicted': prediction['tokens_per_s'],
        'mfu': mfu,
        'mfu_assumed': prediction['mfu_assumed'],
        'optimizer_step_s': sum(optimizer_seconds) / len(optimizer_seconds),
        'optimizer_step_s_predicted': prediction['optimizer_step_seconds'],
        'optimizer_flops_predicted': prediction['optimizer_flops_per_step'],
        'peak_flops': prediction['gpu']['peak_flops'],
        'peak_bytes': peak,
        'peak_bytes_predicted': peak_predicted,
        'reserved_bytes': reserved,
        'reserved_bytes_predicted': memory['total'] if reserved is not None else None,
        'alloc_retries': retries,
        'fits_predicted': memory['fits'],
    }


def release(cluster):
    """Between cases: drop compiled graphs and cached blocks so the next case measures its own memory."""
    torch._dynamo.reset()
    if cluster.device.type == 'cuda':
        torch.cuda.empty_cache()


def run_device_script(cases, steps, warmup, budget_s, tiny):
    cluster = processes.setup_cluster()
    processes.join_process_group(cluster)
    out = os.environ.get('OUT')
    results = []
    deadline = time.perf_counter() + budget_s
    for index, case in enumerate(cases):
        share = (deadline - time.perf_counter()) / (len(cases) - index)
        try:
            result = bench_case(case, cluster, steps, warmup, share, tiny)
        except torch.OutOfMemoryError as e:
            result = {'case': case, 'error': f'out of memory: {str(e).splitlines()[0]}'}
        except ConfigError as e:
            result = {'case': case, 'error': str(e)}
        release(cluster)
        results.append(result)
        if cluster.is_master:
            line = json.dumps(result)
            print(line, flush=True)
            if out:
                os.makedirs(out, exist_ok=True)
                with open(os.path.join(out, 'bench.jsonl'), 'a') as f:
                    f.write(line + '\n')
    if cluster.is_master:
        print(format_results(results), flush=True)
    processes.leave_process_group()  # each case's model is gone already (release)
    return results


def format_results(results):
    """The JSON lines as a table a person reads: measured | predicted for each quantity."""
    rows = [
        '| case | SDPA | tokens/s (predicted) | MFU (assumed) | optimizer step ms (predicted) | peak GiB (predicted) |'
        ' reserved GiB (predicted) | retries |',
        '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    gib = 2**30
    for r in results:
        if 'error' in r:
            rows.append(f"| {r['case']} | {r['error']} | | | | | | |")
            continue
        reserved = (
            f"{r['reserved_bytes'] / gib:.1f} ({r['reserved_bytes_predicted'] / gib:.1f})"
            if r['reserved_bytes'] is not None
            else '-'
        )
        rows.append(
            f"| {r['case']} (micro-batch {r['micro_batch']}) | {r['sdpa']} | {r['tokens_per_s']:,.0f} "
            f"({r['tokens_per_s_predicted']:,.0f}) | {r['mfu']:.1%} ({r['mfu_assumed']:.0%}) | "
            f"{r['optimizer_step_s'] * 1e3:.3g} ({r['optimizer_step_s_predicted'] * 1e3:.3g}) | "
            f"{r['peak_bytes'] / gib:.2f} ({r['peak_bytes_predicted'] / gib:.2f}) | {reserved} | "
            f"{'-' if r['alloc_retries'] is None else r['alloc_retries']} |"
        )
    return '\n'.join(rows)


# -----------------------------------------------------------------------------------------------------
# train.py's loop against a plain PyTorch loop of the same model and batch: nanoGPT's loop (random offsets into
# the first train shard, AdamW, clipping) with none of train.py's checkpoints, ledger, spike guard or data order.
# The two alternate, best of each kept (a busy machine slows whichever runs at the time).


def plain_loop_tokens_per_s(model_cfg, train_cfg, dtype, steps, warmup=3):
    T, B = model_cfg.block_size, train_cfg.micro_batch
    accumulation = train_cfg.batch_tokens // (B * T)
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg)
    if train_cfg.compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), **optimizers.adamw_options(train_cfg, 1))
    autocast = (
        torch.autocast('cpu', dtype=torch.bfloat16)
        if dtype == 'bfloat16'
        else contextlib.nullcontext()
    )
    tokens = data.open_shard(data.list_shards(train_cfg.data, 'train')[0])
    rng = np.random.default_rng(train_cfg.seed)
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
        for _ in range(accumulation):
            starts = rng.integers(0, len(tokens) - T - 1, B)
            sequences = torch.from_numpy(
                np.stack([tokens[s : s + T + 1] for s in starts]).astype(np.int64)
            )
            with autocast:
                _, loss = model(sequences[:, :-1], sequences[:, 1:])
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return steps * train_cfg.batch_tokens / (time.perf_counter() - start)


def train_loop_tokens_per_s(model_cfg, train_cfg, dtype, steps, warmup=3):
    cluster = processes.setup_cluster()
    stream, _, _ = data.open_data(model_cfg, train_cfg)
    run = train.build_run(
        model_cfg, train_cfg, cluster, dtype, stream, warmup + steps, warmup + steps
    )
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
        train.train_step(run)
    return steps * train_cfg.batch_tokens / (time.perf_counter() - start)


def run_loop_bench(config_path, overrides, steps, rounds):
    model_cfg, train_cfg = load_config(config_path, overrides)
    dtype = sums.run_dtype(train_cfg, sums.measure_device('cpu', train_cfg.dtype))
    best = {'train.py': 0.0, 'plain loop': 0.0}
    for _ in range(rounds):
        best['train.py'] = max(
            best['train.py'], train_loop_tokens_per_s(model_cfg, train_cfg, dtype, steps)
        )
        best['plain loop'] = max(
            best['plain loop'], plain_loop_tokens_per_s(model_cfg, train_cfg, dtype, steps)
        )
    print(
        f"{config_path}, {steps} steps x {rounds} alternating rounds, best of each, {dtype}, compile "
        f"{train_cfg.compile}, torch {torch.__version__}, {torch.get_num_threads()} threads:"
    )
    for name, tokens_per_s in best.items():
        print(f"  {name:<10} {tokens_per_s:,.0f} tokens/s")
    print(f"  train.py / plain loop: {best['train.py'] / best['plain loop']:.3f}")
    return best


def run_loss_bench(config_path, overrides, steps, rounds):
    """train.py's loop with each loss of config.PARTS['loss'], alternating in one process, best of each: the
    paired bench that chose losses.CHUNK_ROWS (docs/measured.md)."""
    best = {}
    for _ in range(rounds):
        for loss in PARTS['loss']:
            model_cfg, train_cfg = load_config(config_path, [*overrides, f'--loss={loss}'])
            dtype = sums.run_dtype(train_cfg, sums.measure_device('cpu', train_cfg.dtype))
            tokens_per_s = train_loop_tokens_per_s(model_cfg, train_cfg, dtype, steps)
            best[loss] = max(best.get(loss, 0.0), tokens_per_s)
            torch._dynamo.reset()
    print(
        f"{config_path} {' '.join(overrides)}, {steps} steps x {rounds} alternating rounds, best of each, "
        f"{dtype}, compile {train_cfg.compile}, torch {torch.__version__}, {torch.get_num_threads()} threads:"
    )
    for loss, tokens_per_s in best.items():
        print(f"  {loss:<10} {tokens_per_s:,.0f} tokens/s")
    print(f"  chunked / full: {best['chunked'] / best['full']:.3f}")
    return best


# -----------------------------------------------------------------------------------------------------


def option(argv, name, default, kind=int):
    """--name=value from argv (removed from it), or the default."""
    for arg in list(argv):
        if arg.startswith(f'--{name}='):
            argv.remove(arg)
            try:
                return kind(arg.split('=', 1)[1])
            except ValueError:
                raise ConfigError(f"{arg}: expected a {kind.__name__}") from None
    return default


@processes.cli
def main(argv):
    if argv and argv[0] in ('loop', 'loss'):
        steps, rounds = option(argv, 'steps', 20), option(argv, 'rounds', 2)
        if len(argv) < 2:
            raise ConfigError(
                f'usage: python bench.py {argv[0]} CONFIG [--key=value ...] [--steps=N] [--rounds=N]'
            )
        (run_loop_bench if argv[0] == 'loop' else run_loss_bench)(argv[1], argv[2:], steps, rounds)
        return 0
    steps, warmup = option(argv, 'steps', 30), option(argv, 'warmup', 5)
    budget_s = option(argv, 'budget_s', 420.0, float)
    tiny = '--tiny' in argv
    cases = [a for a in argv if a != '--tiny'] or DEFAULT_CASES
    for case in cases:
        if case.startswith('--'):
            raise ConfigError(
                f"unknown option {case}: options are --steps=N --warmup=N --budget_s=S --tiny; "
                f"a case with overrides goes in quotes: \"configs/h200_1b3.py --micro_batch=8\""
            )
    run_device_script(cases, steps, warmup, budget_s, tiny)
    return 0


if __name__ == '__main__':
    sys.exit(main())
