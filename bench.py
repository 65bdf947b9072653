"""
bench.py: measured speed and memory beside the ledger's prediction, for the device at hand (what
it measures; --budget_s, each case's share of it, the skips: docs/measured.md, the device script).

    python bench.py                               # the device script: the default cases
    python bench.py "configs/h200_1b3.py --micro_batch=8" --steps=20
    python bench.py --tiny                        # the same at a tiny size: seconds on a CPU (CI)
    python bench.py loop configs/pystdlib_cpu.py  # train.py's loop against a plain PyTorch loop
    python bench.py loss configs/pystdlib_cpu.py  # train.py's loop with the full and chunked loss

A case is a config and its overrides, in quotes (`--micro_batch=max`: the largest micro-batch the
ledger says fits), built as train.py builds it on synthetic tokens; a JSON line each to stdout, and
to $OUT/bench.jsonl when $OUT (the device machine's output folder) is set.
"""

import dataclasses
import gc
import json
import os
import sys
import time
import traceback

from ledgergpt import config

config.set_cuda_allocator()  # before torch is imported

import numpy as np
import torch

import train
from ledgergpt import data, live_ledger, optimizers, processes, sums
from ledgergpt.config import PARTS, ConfigError, load_config
from model import GPT

DEFAULT_CASES = [  # by value: a budget that runs short still measures the seed's run
    'configs/h200_1b3.py',  # the seed's 1.3B run, compiled
    'configs/h200_1b3.py --optimizer=muon',  # Muon: its Newton-Schulz step beside the ledger's
    'configs/gpt2_124m.py',  # GPT-2 small at its micro-batch, compiled
    # recompute at 64 sequences, which only recompute fits (without it 32 leaves 2.6 GiB)
    'configs/h200_1b3.py --recompute=True --micro_batch=64',
    # the full logits' loss at the largest micro-batch it fits, beside the chunked loss above
    'configs/h200_1b3.py --loss=full --micro_batch=max',
]
TINY = (
    '--n_layer=2 --n_embd=64 --n_head=2 --n_kv_head=2 --ffn_hidden=0 --vocab_size=512 '
    '--block_size=32 --micro_batch=2 --compile=False'
).split()
TINY_MAX_MICRO_BATCH = 8  # --tiny: a tiny model "fits" thousands of sequences in RAM
MIN_TIMED = 3  # timed steps a case takes at least; when they no longer fit, it is skipped
# the budget's clock: every second counts, the builds, compiles and warm-ups too
CLOCK = time.perf_counter


def build(case_args, cluster, tiny):
    """-> (Run of synthetic tokens, prediction, SDPA kernel) for one case: its config, one
    micro-step per optimizer step."""
    path, overrides = case_args[0], [a for a in case_args[1:] if a != '--micro_batch=max']
    overrides += ['--data=synthetic', '--gpu=auto'] + (TINY if tiny else [])
    model_cfg, train_cfg = load_config(path, overrides)
    device = live_ledger.live_device(cluster, model_cfg, train_cfg)
    if '--micro_batch=max' in case_args:
        best = sums.max_micro_batch(model_cfg, train_cfg, cluster.world_size, device)
        if best == 0:
            raise ConfigError(
                f"{' '.join(case_args)}: the ledger says not even one sequence fits on "
                f"{device.name}"
            )
        best = min(best, TINY_MAX_MICRO_BATCH) if tiny else best
        train_cfg = dataclasses.replace(train_cfg, micro_batch=best)
    micro_step_tokens = train_cfg.micro_batch * model_cfg.block_size * cluster.world_size
    train_cfg = dataclasses.replace(train_cfg, batch_tokens=micro_step_tokens, batch_ramp_tokens=0)
    prediction = sums.predict(model_cfg, train_cfg, n_gpu=cluster.world_size, device=device)
    dtype = prediction['dtype']
    run = live_ledger.synthetic_run(model_cfg, train_cfg, cluster, dtype, train.build_run)
    return run, prediction, live_ledger.sdpa_backend(model_cfg, cluster.device, dtype)


def time_optimizer_steps(optimizer, cluster):
    """From here each optimizer step is timed, the device synchronised around it (a few microseconds
    a step taken from its overlap with what follows): -> the list the seconds go into."""
    seconds, step = [], optimizer.step

    def timed(*args, **kwargs):
        live_ledger.synchronize(cluster.device)
        begin = time.perf_counter()
        result = step(*args, **kwargs)
        live_ledger.synchronize(cluster.device)
        seconds.append(time.perf_counter() - begin)
        return result

    optimizer.step = timed
    return seconds


def warm_up(run, cluster, warmup, deadline):
    """Up to `warmup` steps (the first compiles), fewer when MIN_TIMED more would pass `deadline`:
    -> the last one's seconds."""
    for _ in range(warmup):
        begin = CLOCK()
        train.train_step(run)
        live_ledger.synchronize(cluster.device)
        seconds = CLOCK() - begin
        if CLOCK() + (MIN_TIMED + 1) * seconds > deadline:
            break
    return seconds


def bench_case(case, cluster, steps, warmup, share_end, end, tiny):
    """Build and warm up, then time up to `steps` optimizer steps by `share_end`, MIN_TIMED at least
    while they end by `end` (a case before others may take of their shares): -> one result dict."""
    begin = CLOCK()
    run, p, attention = build(case.split(), cluster, tiny)
    step_s = warm_up(run, cluster, max(warmup, 1), share_end)
    setup_s = CLOCK() - begin
    steps = max(MIN_TIMED, min(steps, int((share_end - CLOCK()) / step_s)))
    if CLOCK() + steps * step_s > end:
        error = f'skipped: {MIN_TIMED} steps of {step_s:.3g} s pass the budget'
        return {'case': case, 'error': error, 'setup_s': setup_s}
    optimizer_seconds = time_optimizer_steps(run.optimizer, cluster)
    live_ledger.synchronize(cluster.device)
    if cluster.device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(cluster.device)
    start = time.perf_counter()
    for _ in range(steps):
        result = train.train_step(run)
    # the mean loss over the ranks (which also waits for the last step)
    loss = processes.reduce_mean(result.loss.detach().clone(), cluster).item()
    live_ledger.synchronize(cluster.device)
    elapsed = time.perf_counter() - start
    tokens_per_s = steps * run.micro_step_tokens / elapsed
    # on the CPU: the process's peak resident memory, against the ledger's total (runtime included)
    peak, reserved = live_ledger.peak_memory(cluster)
    on_gpu, memory, t = reserved is not None, p['memory'], run.train
    retries = torch.cuda.memory_stats(cluster.device)['num_alloc_retries'] if on_gpu else None
    flops_per_s = p['flops_per_token']['matmul'] * tokens_per_s / cluster.world_size
    mfu = flops_per_s / p['gpu']['peak_flops']
    line = dict(case=case, device=p['gpu']['name'], processes=cluster.world_size, sdpa=attention)
    line.update(torch=torch.__version__, dtype=p['dtype'], micro_batch=t.micro_batch)
    line.update(block_size=run.model_cfg.block_size, compile=t.compile, recompute=t.recompute)
    # the loss's row of config.PARTS['loss']
    line.update(loss_part=run.model_cfg.loss, params=p['params']['total'], steps_timed=steps)
    line.update(seconds=elapsed, loss=loss, tokens_per_s=tokens_per_s, mfu=mfu)
    line.update(tokens_per_s_predicted=p['tokens_per_s'], mfu_assumed=p['mfu_assumed'])
    line.update(optimizer_step_s=sum(optimizer_seconds) / len(optimizer_seconds))
    line.update(optimizer_step_s_predicted=p['optimizer_step_seconds'])
    line.update(optimizer_flops_predicted=p['optimizer_flops_per_step'])
    line.update(peak_flops=p['gpu']['peak_flops'], peak_bytes=peak, reserved_bytes=reserved)
    line.update(peak_bytes_predicted=memory['allocated' if on_gpu else 'total'])
    line.update(reserved_bytes_predicted=memory['total'] if on_gpu else None)
    line.update(alloc_retries=retries, fits_predicted=memory['fits'], setup_s=setup_s)
    del run.optimizer.step  # the timed wrapper's cycle (optimizer -> wrapper -> optimizer) undone
    return line


def run_device_script(cases, steps, warmup, budget_s, tiny):
    """Each case in turn within budget_s, its share the time left over the cases left; a case starts
    only while the time left covers the longest set-up (build, compile, warm-up) seen so far. A
    failure is the case's line (its traceback with it), and the next case runs."""
    cluster = processes.setup_cluster()
    processes.join_process_group(cluster)
    out, results, start = os.environ.get('OUT'), [], CLOCK()
    deadline = start + budget_s
    for index, case in enumerate(cases):
        left, setup_s = deadline - CLOCK(), max((r['setup_s'] for r in results), default=0)
        try:
            if left < setup_s:
                raise ConfigError(f'skipped: {left:.0f} s left, a set-up took {setup_s:.0f} s')
            share_end = CLOCK() + left / (len(cases) - index)
            result = bench_case(case, cluster, steps, warmup, share_end, deadline, tiny)
        except torch.OutOfMemoryError as e:
            result = {'case': case, 'error': f'out of memory: {str(e).splitlines()[0]}'}
        except ConfigError as e:
            result = {'case': case, 'error': str(e)}
        except Exception as e:  # an inductor, cuBLAS or SDPA failure: recorded, the next case runs
            first = (str(e).splitlines() or [''])[0]
            result = {'case': case, 'error': f'{type(e).__name__}: {first}'}
            result['traceback'] = traceback.format_exc()
        # between cases: the case's model and optimizer (reference cycles: gc), compiled graphs and
        # cached blocks dropped, so that the next measures its own
        gc.collect()
        torch._dynamo.reset()
        if cluster.device.type == 'cuda':
            torch.cuda.empty_cache()
        results.append({'setup_s': 0, **result})
        processes.log(cluster, json.dumps(result))
        if out and cluster.is_master:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, 'bench.jsonl'), 'a') as f:
                f.write(json.dumps(result) + '\n')
    processes.log(cluster, format_results(results))
    seconds = CLOCK() - start
    processes.log(cluster, f'{len(cases)} cases in {seconds:.0f} s of a {budget_s:.0f} s budget')
    processes.leave_process_group()  # each case's model is gone already
    return results


def format_results(results):
    """The JSON lines as a table a person reads: measured (predicted) for each quantity."""
    rows = [
        '| case | SDPA | tokens/s (predicted) | MFU (assumed) | optimizer step ms (predicted) | '
        'peak GiB (predicted) | reserved GiB (predicted) | retries |',
        '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    gib = 2**30
    for r in results:
        if 'error' in r:
            rows.append(f"| {r['case']} | {r['error']} | | | | | | |")
            continue
        reserved, predicted = r['reserved_bytes'], r['reserved_bytes_predicted']
        reserved = '-' if reserved is None else f"{reserved / gib:.1f} ({predicted / gib:.1f})"
        rows.append(
            f"| {r['case']} (micro-batch {r['micro_batch']}) | {r['sdpa']} | "
            f"{r['tokens_per_s']:,.0f} ({r['tokens_per_s_predicted']:,.0f}) | {r['mfu']:.1%} "
            f"({r['mfu_assumed']:.0%}) | {r['optimizer_step_s'] * 1e3:.3g} "
            f"({r['optimizer_step_s_predicted'] * 1e3:.3g}) | {r['peak_bytes'] / gib:.2f} "
            f"({r['peak_bytes_predicted'] / gib:.2f}) | {reserved} | "
            f"{'-' if r['alloc_retries'] is None else r['alloc_retries']} |"
        )
    return '\n'.join(rows)


# --------------------------------------------------------------------------------------------------
# Paired loops, alternating in one process, best of each kept (a busy machine slows whichever runs
# at the time): train.py's loop against a plain PyTorch loop of the same model and batch (nanoGPT's:
# random offsets into the first train shard, AdamW, clipping; no checkpoints, ledger, spike guard or
# data order), and train.py's loop with each loss of config.PARTS['loss'] (the paired bench that
# chose losses.CHUNK_ROWS: docs/measured.md).


def plain_loop(model_cfg, train_cfg, dtype, steps):
    """-> nanoGPT's step, a function that takes one (steps: unused, train_loop's plan)."""
    T, B = model_cfg.block_size, train_cfg.micro_batch
    accumulation = train_cfg.batch_tokens // (B * T)
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg)
    if train_cfg.compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), **optimizers.adamw_options(train_cfg, 1))
    autocast = torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bfloat16')
    tokens = data.open_shard(data.list_shards(train_cfg.data, 'train')[0])
    rng = np.random.default_rng(train_cfg.seed)

    def step():
        for _ in range(accumulation):
            starts = rng.integers(0, len(tokens) - T - 1, B)
            rows = np.stack([tokens[s : s + T + 1] for s in starts]).astype(np.int64)
            sequences = torch.from_numpy(rows)
            with autocast:
                _, loss = model(sequences[:, :-1], sequences[:, 1:])
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def train_loop(model_cfg, train_cfg, dtype, steps):
    """-> train.py's step (its Run on the config's data, planned for these steps)."""
    stream, _, _ = data.open_data(model_cfg, train_cfg)
    cluster = processes.setup_cluster()
    run = train.build_run(model_cfg, train_cfg, cluster, dtype, stream, steps, steps)
    return lambda: train.train_step(run)


def run_paired(config_path, overrides, steps, rounds, loops, ratio, warmup=3):
    """loops {name: (its overrides, its step's maker)} alternating over rounds, timed over `steps`
    after `warmup`, the best tokens/s of each printed with the ratio of the two named in `ratio`;
    -> {name: tokens/s}."""
    best = {}
    for _ in range(rounds):
        for name, (extra, loop) in loops.items():
            model_cfg, train_cfg = load_config(config_path, [*overrides, *extra])
            dtype = sums.run_dtype(train_cfg, sums.measure_device('cpu', train_cfg.dtype))
            step = loop(model_cfg, train_cfg, dtype, warmup + steps)
            for i in range(warmup + steps):
                if i == warmup:
                    start = time.perf_counter()
                step()
            tokens_per_s = steps * train_cfg.batch_tokens / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), tokens_per_s)
            torch._dynamo.reset()
    print(
        f"{' '.join([config_path, *overrides])}, {steps} steps x {rounds} alternating rounds, best "
        f"of each, {dtype}, compile {train_cfg.compile}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads:"
    )
    for name, tokens_per_s in best.items():
        print(f"  {name:<10} {tokens_per_s:,.0f} tokens/s")
    print(f"  {ratio[0]} / {ratio[1]}: {best[ratio[0]] / best[ratio[1]]:.3f}")
    return best


def run_loop_bench(config_path, overrides, steps, rounds):
    loops = {'train.py': ([], train_loop), 'plain loop': ([], plain_loop)}
    return run_paired(config_path, overrides, steps, rounds, loops, ('train.py', 'plain loop'))


def run_loss_bench(config_path, overrides, steps, rounds):
    loops = {loss: ([f'--loss={loss}'], train_loop) for loss in PARTS['loss']}
    return run_paired(config_path, overrides, steps, rounds, loops, ('chunked', 'full'))


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
                f'usage: python bench.py {argv[0]} CONFIG [--key=value ...] [--steps=N] '
                '[--rounds=N]'
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
