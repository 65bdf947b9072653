"""
live_ledger.py: the live ledger. Before step 1 the prediction for the device this run is on (a GPU by its name, else a
GEMM probe); on log steps the measurements beside it (tokens/s, MFU, days, peak memory); at each eval and at the
end summary.json and report.md, predicted and measured side by side. Also the record of the code that ran.

Outputs in out_dir (rank 0): ledger.json and ledger.md (the prediction), metrics.jsonl (one line per log step,
eval and rollback), summary.json and report.md (with plot.py's loss.png), code.json and code.diff (the commit and
the uncommitted changes of the checkout train.py ran from); with the key tracker, every metrics.jsonl record also
goes to TensorBoard or W&B (trackers.py).
"""

import dataclasses
import gc
import json
import os
import statistics
import subprocess
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ledgergpt import bill, data, files, plot, scaling, sums, trackers
from ledgergpt.config import IGNORE_INDEX, OPTIMIZERS, ConfigError, tokens_per_micro_step
from ledgergpt.continuation import TrainingStopped
from ledgergpt.processes import log
from model import GPT


def live_device(cluster, model_cfg, train):
    """The ledger's Device for the hardware this run is on (sums.measure_device: a GPU by its name, else a GEMM
    probe), measured on rank 0 and shared, so every rank predicts alike. On the CPU the runtime overhead is rank 0's
    resident memory before the model's tensors exist, and the RAM is shared by the processes on this machine."""
    device = None
    if cluster.is_master:
        device = sums.measure_device('auto', train.dtype)
        if device.kind == 'cpu':
            # what building the model loads besides its tensors (meta kernels import sympy and torch's
            # symbolic shapes: ~75 MB) belongs to the runtime
            with torch.device('meta'):
                GPT(model_cfg)
            device = dataclasses.replace(
                device,
                overhead_bytes=sums.resident_bytes(),
                shared_by=int(os.environ.get('LOCAL_WORLD_SIZE', 1)),
                overhead_source='measured: resident memory of this process before the model was built',
            )
    if cluster.world_size > 1:
        shared = [device]
        dist.broadcast_object_list(shared, src=0)
        device = shared[0]
    return device


# -----------------------------------------------------------------------------------------------------
# The CPU's MFU, measured at the model's own shapes. A CPU's GEMM peak (2048-square matmuls) says little about what
# a small model reaches: the same 4 x 256 Llama runs at ~18% of the peak on a Xeon with AMX, whose 2 TFLOP/s need
# big matrices, and at ~58% on a 2-core AMD EPYC without AMX. So a CPU run is predicted from its own step: the
# model, built fresh and spread over the processes as the run spreads it (DDP, ZeRO-1, FSDP2), compiled as the run
# compiles it, trains a few steps of synthetic tokens in train.py's train_step, collectives, clipping and optimizer
# included (a bare model's steps missed gloo's collectives and FSDP2's CPU work around them, and read zero2 and fsdp
# 1.2-1.3x fast: docs/measured.md), the median step kept (a step's own jitter is the run's too: the fastest of
# three read 5% fast under zero1 on a 2-core EPYC, docs/measured.md), cached per machine like the GEMM probe. The
# compile costs the run nothing more: its own model, built next in this process, reuses the probe's graphs (~3 s,
# not ~30). Once runs of the config have measured their speed, the next is predicted from the median of the last
# REACHED_KEPT (learn_speed).

PROBE_STEPS = 5  # timed steps at each size, after one that warms up: their median is kept
# the most micro-steps a probed step takes: a longer step is extrapolated from 1 and this
PROBE_MICRO_STEPS = 4
# what the step probe times with (a test that must ignore other processes' load sets time.thread_time with one
# thread: every CPU kernel, autograd's included, then runs in the calling thread)
PROBE_CLOCK = time.perf_counter


def step_probe(model_cfg, train, dtype, device, cluster):
    """-> (the cache entry: tokens_per_s of one process in this run's training step on this CPU (_time_steps),
    measured (its date), probes, and once a run has learned it, reached and reached_at; the entry's key). Under
    torchrun every rank probes at once, each with its own threads, so the probe feels the run's contention (two
    processes on two cores: each one thread) and its collectives; rank 0's entry is shared, and its key names the
    mode and world size."""
    key = (
        f"{device.name} | train_step | {json.dumps(dataclasses.asdict(model_cfg), sort_keys=True)} | "
        f"micro_batch {train.micro_batch} | "
        f"accumulation {train.batch_tokens // (train.micro_batch * model_cfg.block_size)} | recompute "
        f"{train.recompute} | compile {train.compile} | {dtype} | torch {torch.__version__}"
        + (
            ''
            if train.optimizer == 'adamw'
            else f' | {train.optimizer} {train.muon_ns_steps} steps'
        )
        + (f" | {cluster.world_size} processes, {train.parallel}" if cluster.world_size > 1 else '')
    )

    def probe_it():
        with torch.device('meta'):
            params = sum(p.numel() for p in GPT(model_cfg).parameters())
        log(
            cluster,
            f"step probe: building the model ({params:,} parameters) on this CPU and timing its training "
            f"step, once for this machine (cached)",
        )
        entry = _time_steps(model_cfg, train, dtype, cluster)
        reset_peak_resident()  # the run's peak is its own steps', not its probe's (compiling beside its states)
        return entry

    if cluster.world_size == 1:
        return sums.cached_probe(key, probe_it, 'tokens_per_s'), key
    due = [cluster.is_master and sums.probe_due(key)]
    dist.broadcast_object_list(due, src=0)
    if due[0] and not cluster.is_master:
        probe_it()  # beside rank 0's, which is kept
    shared = [sums.cached_probe(key, probe_it, 'tokens_per_s') if cluster.is_master else None]
    dist.broadcast_object_list(shared, src=0)
    return shared[0], key


# A run's speed is the median of the last five runs': one run on a busy machine (or one fast run kept as the best)
# would set every next plan by itself.
REACHED_KEPT = 5


def learn_speed(key, tokens_per_s, run):
    """A run's measured tokens/s (so far: each log step updates it) into its step probe's cache entry, under the
    run's name `run`: 'reached' is the median of the last REACHED_KEPT runs of this config on this machine, the next
    run's prediction."""
    cache = sums.read_probes()
    if key in cache:
        entry = cache[key]
        # the run's place kept as it updates
        runs = {**entry.get('reached_runs', {}), run: tokens_per_s}
        runs = dict(list(runs.items())[-REACHED_KEPT:])
        entry.update(
            reached=statistics.median(runs.values()),
            reached_runs=runs,
            reached_at=time.strftime('%Y-%m-%d %H:%M:%S'),
        )
        try:
            files.save_json(sums.cache_path(), cache)
        except OSError:
            pass


def _time_steps(model_cfg, train, dtype, cluster):
    """-> the probe's entry: tokens_per_s of one process in the run's own step (train.py's build_run and train_step
    on synthetic tokens: the wrapper, its collectives, the clipping, the optimizer), the module the step called
    (`wrapper`), and `step_seconds`: [micro-steps, seconds] of each size timed, the median of PROBE_STEPS steps.
    A run of up to PROBE_MICRO_STEPS micro-steps a step is timed at its own; a longer one at 1 and PROBE_MICRO_STEPS,
    a step of A micro-steps then taking t1 + (A - 1) x the micro-step between them. Every rank runs the same steps,
    so their collectives pair up."""
    import train as trainer  # train.py imports this module, so its step is imported when it is timed

    micro_step_tokens = tokens_per_micro_step(model_cfg, train, cluster.world_size)
    accumulation = train.batch_tokens // micro_step_tokens
    probed = dataclasses.replace(train, init_from='', batch_ramp_tokens=0)
    stream = data.SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=0)
    run = trainer.build_run(model_cfg, probed, cluster, dtype, stream, 10**9, 10**9)
    wrapper, seconds = type(run.model).__name__, []
    sizes = (accumulation,) if accumulation <= PROBE_MICRO_STEPS else (1, PROBE_MICRO_STEPS)
    for micro_steps in sizes:
        run.train = dataclasses.replace(probed, batch_tokens=micro_steps * micro_step_tokens)
        times = []
        for _ in range(1 + PROBE_STEPS):  # the first warms up (and compiles)
            begin = PROBE_CLOCK()
            trainer.train_step(run)
            times.append(PROBE_CLOCK() - begin)
        seconds.append([micro_steps, statistics.median(times[1:])])
    del run  # before the run builds its own: a DDP reducer goes while the process group is whole
    gc.collect()
    (_, first), (_, last) = seconds[0], seconds[-1]
    micro = max(0.0, last - first) / (PROBE_MICRO_STEPS - 1)  # noise cannot make it negative
    step = last if len(sizes) == 1 else first + (accumulation - 1) * micro
    tokens_per_s = train.batch_tokens / cluster.world_size / step
    return dict(tokens_per_s=tokens_per_s, wrapper=wrapper, step_seconds=seconds)


def predict(config_path, model_cfg, train, cluster, force, cooldown):
    """The ledger's prediction for this run, on the device it is on, printed short: -> (prediction, compute dtype).
    A run the ledger says does not fit stops here (one line) unless forced. Also says which attention kernel SDPA
    runs, the precision, and under another objective the share of positions that carry loss."""
    device = live_device(cluster, model_cfg, train)
    # 'auto': bf16 on a GPU, on a CPU whichever its probe found faster
    dtype = sums.run_dtype(train, device)
    if train.gpu.lower() not in ('auto', device.name.lower()):
        log(
            cluster,
            f"the config plans for gpu={train.gpu} (`python ledger.py {config_path}` prints that bill); "
            f"this run is on {device.name}: the live ledger predicts for it",
        )
    billed = (
        dataclasses.replace(train, train_tokens=train.cooldown_tokens, max_steps=0)
        if cooldown
        else train
    )
    # the nodes this run really spans (torchrun's LOCAL_WORLD_SIZE processes a node)
    billed = dataclasses.replace(
        billed, nodes=-(-cluster.world_size // int(os.environ.get('LOCAL_WORLD_SIZE', 1)))
    )
    prediction = sums.predict(model_cfg, billed, n_gpu=cluster.world_size, device=device)
    # before the step probe builds the model: known without it
    check_fits(prediction['memory'], device, force)
    if device.kind == 'cpu':  # the MFU this model reaches here, measured (above), per process
        probe, key = step_probe(model_cfg, train, dtype, device, cluster)
        tokens_per_s = probe.get('reached') or probe['tokens_per_s']
        # the MFU at which the ledger's step (its tokens' FLOPs, then the optimizer's) takes the
        # probe's time on each process (batch_tokens / world_size tokens a step)
        step_tokens = train.batch_tokens / cluster.world_size
        step_flops = step_tokens * prediction['flops_per_token']['hardware']
        step_flops += prediction['optimizer_flops_per_step']
        mfu = tokens_per_s * step_flops / step_tokens / device.peak_flops
        billed = dataclasses.replace(billed, mfu=mfu)
        prediction = sums.predict(model_cfg, billed, cluster.world_size, device)
        runs = len(probe.get('reached_runs', [0]))  # an entry from before the median: one run
        how = f"{'compiled' if train.compile else 'eager'} as the run"
        prediction['mfu_source'] = (
            f"reached by runs of this config on this machine: the median of the last {runs}, "
            f"{probe['reached_at']}"
            if probe.get('reached')
            else f"measured on this CPU at this model's shapes, {how} (best of {probe['probes']} step "
            f"probe(s), {probe['measured']})"
        ) + f"; the config says {train.mfu:.0%}"
        prediction['mfu_probe_key'] = key
    if cluster.world_size > 1:
        prediction['comm']['probe'] = collective_probe(cluster)
    log(
        cluster,
        bill.format_short(
            prediction,
            f"{os.path.join(train.out_dir, 'ledger.md')}, or python ledger.py {config_path}",
        ),
    )
    attention = sdpa_backend(model_cfg, cluster.device, dtype)
    log(
        cluster,
        f"attention: SDPA runs {attention} for {model_cfg.block_size} tokens in {dtype}"
        + (
            ': it keeps T x T scores per head, more than the ledger counts (it assumes a flash-type kernel)'
            if attention == 'math'
            else ''
        ),
    )
    log(
        cluster,
        f"precision: {dtype} compute"
        + (
            ' (the faster on this CPU, measured)'
            if train.dtype == 'auto' and cluster.device.type == 'cpu'
            else ''
        )
        + f", fp32 weights, gradients and {OPTIMIZERS[train.optimizer].label.split()[0]} states",
    )
    if train.objective != 'clm':
        log(
            cluster,
            f"objective: {train.objective}: about {prediction['data']['loss_fraction']:.0%} of the positions "
            f"carry loss (the others' targets are {IGNORE_INDEX}: given, not predicted); tokens/s and MFU "
            f"count every position; the val loss is plain next-token prediction on every position",
        )
    # building it takes a while: say so first
    if prediction['memory']['model_states'] >= BIG_STATES:
        log(
            cluster,
            f"building the model: {prediction['params']['total']:,} parameters, "
            f"{prediction['memory']['model_states'] / 2**30:.1f} GiB of weights, gradients and optimizer states "
            f"per process",
        )
    return prediction, dtype


def spend_minutes(train, prediction, cluster):
    """train_minutes -> the train_tokens the prediction bought with them (sums.predict: whole
    batches at the predicted tokens/s), fixed for the rest of the run and its resumes (train_minutes
    0 in its checkpoints: continuation.keep_budgeted_tokens)."""
    tokens = prediction['train']['train_tokens']
    source = prediction.get('mfu_source', f"MFU {train.mfu:.0%}, the config's")
    log(
        cluster,
        f"train_minutes={train.train_minutes:g}: {tokens:,} tokens in {tokens // train.batch_tokens:,} "
        f"steps at the predicted {prediction['tokens_per_s']:,.0f} tokens/s ({source})",
    )
    return dataclasses.replace(train, train_tokens=tokens, train_minutes=0.0)


# model states from which materialising them takes seconds (1 GiB: ~60M parameters with AdamW)
BIG_STATES = 2**30


def check_fits(memory, device, force):
    """A run the ledger says does not fit stops in one line, unless forced. The bill needs no tensor, so it comes
    within seconds, before the step probe or the model's materialisation: configs/h200_1b3.py on a 24 GiB CPU machine
    was 4 minutes of building 1.3B parameters, then the kernel's OOM kill."""
    if memory['fits'] or force:
        return
    where = (
        f"this machine's {device.memory_source} holds"
        if device.kind == 'cpu'
        else f"{device.name} has"
    )
    raise ConfigError(
        f"the ledger predicts {memory['total'] / 2**30:.1f} GiB per process ({memory['model_states'] / 2**30:.1f} "
        f"GiB of weights, gradients and optimizer states) but {where} {memory['gpu_memory'] / 2**30:.1f} GiB, of "
        f"which a plan leaves {memory['headroom_needed'] / 2**30:.1f} GiB free (the ledger's error band): "
        f"lower micro_batch, set recompute=True or parallel=fsdp, choose a smaller model, or pass --force to start "
        f"anyway"
    )


def plan_line(run):
    """The line a run prints before step 1: the steps planned and where this one stops, the global batch as
    micro-batch x sequence x processes x accumulation, the parallel mode."""
    train, cluster = run.train, run.cluster
    return (
        f"training: {run.total_steps:,} steps planned for {train.train_tokens:,} tokens, this run stops at "
        f"step {run.stop_step:,}; global batch {train.batch_tokens:,} tokens = {train.micro_batch} sequences x "
        f"{run.model_cfg.block_size} tokens x {cluster.world_size} process(es) x "
        f"{train.batch_tokens // run.micro_step_tokens} accumulation steps; "
        f"parallel={train.parallel if cluster.world_size > 1 else 'none (1 process)'}"
    )


def params_built(model, prediction, force=False, cluster=None):
    """The built model's parameter count, which must be the one the ledger predicted: else the run stops here with
    the first tensor that differs from the parts' rows, or with --force goes on, the ledger marked unverified
    (prediction['ledger_unverified'], which summary.json and report.md carry)."""
    # DTensor.numel() is the full size: sharding-proof
    built = sum(p.numel() for p in model.parameters())
    if built == prediction['params']['total']:
        return built
    rows = dict(sums.parameter_shapes(model.config))
    tensors = {name: tuple(p.shape) for name, p in model.named_parameters()}
    name = next((n for n in tensors if rows.get(n) != tensors[n]), None) or next(
        n for n in rows if n not in tensors
    )
    reason = (
        f"the ledger counts {prediction['params']['total']:,} parameters but the built model has {built:,}: "
        f"{name} is {tensors.get(name, 'not built')} in model.py and {rows.get(name, 'absent')} in the parts' "
        f"rows (config.PARTS: add the tensor to its part's row)"
    )
    if not force:
        raise TrainingStopped(
            f"{reason}, or run with --force to train anyway, the ledger marked unverified"
        )
    prediction['ledger_unverified'] = reason
    if cluster is not None:
        log(cluster, f"warning: --force: {reason}; the report marks the ledger unverified")
    return built


def collective_probe(cluster, iterations=20):
    """The all-reduce bus bandwidth this run's process group reaches, measured beside the GEMM probe: a fixed
    number of all-reduces (the same on every rank) of 256 MiB of fp32 on GPUs, timed after two for warm-up; busbw =
    bytes x 2(N-1)/N / seconds, as NCCL-tests computes it. Well under a second on a GPU node. On the CPU (gloo) a
    4 MiB buffer, three times: the bytes are what matters there, the seconds are not meaningful."""
    on_gpu = cluster.device.type == 'cuda'
    buffer = torch.ones((256 if on_gpu else 4) * 2**20 // 4, device=cluster.device)
    iterations = iterations if on_gpu else 3
    for i in range(2 + iterations):
        if i == 2:  # after the warm-up, with the device idle
            if on_gpu:
                torch.cuda.synchronize(cluster.device)
            started = time.perf_counter()
        dist.all_reduce(buffer)
    if on_gpu:
        torch.cuda.synchronize(cluster.device)
    seconds = (time.perf_counter() - started) / iterations
    size, n = buffer.numel() * 4, cluster.world_size
    return {
        'bytes': size,
        'seconds': seconds,
        'busbw': size * 2 * (n - 1) / n / seconds,
        'backend': dist.get_backend(),
        'meaningful': on_gpu,
    }


SDPA_BACKENDS = {
    0: 'math',
    1: 'flash attention',
    2: 'memory-efficient attention',
    3: 'cuDNN attention',
}


def sdpa_backend(model_cfg, device, dtype):
    """The kernel F.scaled_dot_product_attention picks for this run's shapes and dtype, asked the way SDPA itself
    asks (torch._fused_sdp_choice). Flash, memory-efficient and cuDNN keep only the output and the log-sum-exp for
    backward, as the ledger assumes; math materialises the T x T scores of every head."""
    head_dim, T = model_cfg.head_dim, model_cfg.block_size
    q, k, v = (
        torch.empty(
            1, heads, T, head_dim, device=device, dtype=getattr(torch, dtype), requires_grad=True
        )
        for heads in (model_cfg.n_head, model_cfg.kv_heads, model_cfg.kv_heads)
    )
    choice = torch._fused_sdp_choice(
        q, k, v, is_causal=True, enable_gqa=model_cfg.kv_heads != model_cfg.n_head
    )
    return SDPA_BACKENDS.get(choice, f'backend {choice}')


def reset_peak_resident():
    """Linux: VmHWM, the peak that peak_memory reads, set back to the resident memory now (/proc/self/clear_refs, 5).
    Elsewhere the peak keeps what came before."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass


def peak_memory(cluster):
    """-> (peak, peak reserved) bytes: the CUDA caching allocator's, or on the CPU the process's peak resident
    memory (and None)."""
    if cluster.device.type == 'cuda':
        return torch.cuda.max_memory_allocated(cluster.device), torch.cuda.max_memory_reserved(
            cluster.device
        )
    return sums.resident_bytes(peak=True), None


def record_code(out_dir, source=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    """A run records the code that produced it (as modded-nanogpt's logs do): when train.py runs from a git
    checkout, out_dir/code.json gets the commit and out_dir/code.diff the uncommitted changes to tracked files
    (`git diff HEAD`) with the untracked files' names in code.json. Outside a checkout, or without git, nothing.
    A resumed run writes them again: what ran last is what the folder says."""

    def git(*args):
        return subprocess.run(
            ['git', '-C', source, *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        commit = git('rev-parse', 'HEAD').strip()
        diff = git('diff', 'HEAD')
        untracked = git('ls-files', '--others', '--exclude-standard').split()
    except (OSError, subprocess.CalledProcessError):
        return None
    os.makedirs(out_dir, exist_ok=True)
    files.write_text_atomic(os.path.join(out_dir, 'code.diff'), diff)
    record = {
        'commit': commit,
        'dirty': bool(diff or untracked),
        'diff': 'code.diff',
        'untracked': untracked,
    }
    files.save_json(os.path.join(out_dir, 'code.json'), record)
    return record


def held_bytes(tensors):
    """Bytes of the distinct storages behind tensors (a DTensor: its local shard; a DDP gradient: its bucket)."""
    storages = {}
    for t in tensors:
        if t is not None:
            storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
            storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
    return sum(storages.values())


def measure_first_step(run):
    """Rank 0's first optimizer step, once: its matmul FLOPs (FlopCounterMode: Muon's Newton-Schulz, AdamW none)
    and the model states it leaves (weights, gradients, the optimizer's states, as test_memory.py counts them),
    for summary.json and report.md beside the ledger's. From the second step on, the optimizer's own step: no cost
    in the loop."""
    from torch.utils.flop_counter import FlopCounterMode

    optimizer = run.optimizer
    if not run.cluster.is_master:
        return

    def first(*args, **kwargs):
        del optimizer.step  # the class's own from here
        with FlopCounterMode(display=False) as counter:
            result = optimizer.step(*args, **kwargs)
        states = getattr(optimizer, 'optim', optimizer).state.values()  # ZeRO-1: its rank's part
        held = [run.params, [p.grad for p in run.params]]
        held.append([v for state in states for v in state.values() if torch.is_tensor(v)])
        run.metrics.measured.update(
            optimizer_flops=counter.get_total_flops(), model_states_bytes=sum(map(held_bytes, held))
        )
        return result

    optimizer.step = first


class Metrics:
    """The measured half of the ledger, and rank 0's outputs: ledger.json and ledger.md (the prediction),
    metrics.jsonl (one line per log step, eval and rollback), summary.json and report.md.

    Speed is timed over the steps between log steps, the device synchronised before the clock is read (else it
    times how fast Python queues kernels, not how fast they run), the clock paused around eval, checkpoints and
    samples. The first interval after a start or a rollback holds the compile and warm-up steps: it is logged
    but left out of the run's figures in summary.json."""

    def __init__(self, cluster, train, prediction, params_built, append, bytes_per_token=None):
        self.cluster, self.prediction, self.out_dir = cluster, prediction, train.out_dir
        # the data's (meta.json): the train loss in bits per byte too, at the folder's mean bytes per token (the
        # val loss's are exact: evaluate counts the bytes of the targets it scores)
        self.bytes_per_token = bytes_per_token
        # MFU counts the model's matmul FLOPs, 6 N_matmul + 12 L H T per token (PaLM's convention, no recompute)
        self.flops_per_token = prediction['flops_per_token']['matmul']
        self.peak_flops = prediction['gpu']['peak_flops']
        self.chinchilla = prediction['data']['chinchilla_tokens']  # 20 x P
        # a fit's predicted final val loss, in summary.json beside the measured one; not for a cooldown branch (its D
        # is its start's tokens plus its decay: overtrain.py draws the fit beside the branches instead)
        self.fit = scaling.load_fit(train.fit) if train.fit and not train.cooldown_from else None
        where = (
            torch.cuda.get_device_name(cluster.device)
            if cluster.device.type == 'cuda'
            else f'the CPU ({torch.get_num_threads()} threads per process)'
        )
        self.measured = {
            'device': f'{cluster.world_size} x {where}',
            'torch': torch.__version__,
            'params': params_built,
            'bytes_per_token': bytes_per_token,
        }
        self.run_tokens, self.run_seconds = 0, 0.0  # over the intervals after the first
        # what the probe cache files this run's speed under (learn_speed): its folder and start
        self.run_name = f"{os.path.abspath(train.out_dir)} {time.strftime('%Y-%m-%d %H:%M:%S')}"
        self.probe_flagged = False
        self.interval_tokens, self.interval_seconds, self.started, self.warmup = 0, 0.0, None, True
        self.metrics_path = os.path.join(train.out_dir, 'metrics.jsonl')
        self.trackers = None  # trackers.py's, on rank 0: every record below goes to them too
        if cluster.is_master:
            os.makedirs(train.out_dir, exist_ok=True)
            files.save_json(os.path.join(train.out_dir, 'ledger.json'), prediction)
            report = bill.format_report(prediction)
            files.write_text_atomic(os.path.join(train.out_dir, 'ledger.md'), report + '\n')
            if not append:
                open(self.metrics_path, 'w').close()
            self.trackers = trackers.Trackers(train, prediction, report, resume=append)

    def _now(self):
        if self.cluster.device.type == 'cuda':
            torch.cuda.synchronize(self.cluster.device)
        return time.perf_counter()

    def start_clock(self):
        self.started = self._now()

    def stop_clock(self):
        if self.started is not None:
            self.interval_seconds += self._now() - self.started
            self.started = None

    def restart(self):
        """After a rollback: drop the interval, the next one warms up again."""
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, True

    def count(self, result, tokens_seen):
        """A step done (no device sync): its tokens join the interval; the step past Chinchilla's point says so."""
        self.interval_tokens += result.batch_tokens
        if tokens_seen >= self.chinchilla > tokens_seen - result.batch_tokens:
            if self.cluster.is_master:
                print(
                    f"step {result.step}: {tokens_seen:,} tokens seen passes the Chinchilla point 20 x P = "
                    f"{self.chinchilla:,} (compute-optimal for this model): from here it over-trains",
                    flush=True,
                )

    def mfu(self, tokens_per_s):
        return self.flops_per_token * tokens_per_s / (self.cluster.world_size * self.peak_flops)

    def days(self, tokens_per_s):
        # the planned tokens at this speed
        return self.prediction['tokens'] / tokens_per_s / sums.SECONDS_PER_DAY

    def record(self, entry):
        """Append one JSON line (on log, eval and rollback steps only: opening the file each time is free)."""
        if self.cluster.is_master:
            with open(self.metrics_path, 'a') as f:
                f.write(json.dumps(entry) + '\n')
            self.trackers.log(entry)

    def close(self):
        """The end of the run (done, stopped or failed): report.md and loss.png to the trackers, which close."""
        if self.trackers is not None:
            self.trackers.finish(self.out_dir)

    def log_step(self, result, total_steps, tokens_seen, loss, grad_norm):
        tokens_per_s = self.interval_tokens / self.interval_seconds
        peak, _ = peak_memory(self.cluster)
        bpb = sums.bits_per_byte(loss, self.bytes_per_token)
        self.record(
            {
                'step': result.step,
                'tokens': tokens_seen,
                'loss': loss,
                'bpb': bpb,
                'lr': result.lr,
                'grad_norm': grad_norm,
                'batch_tokens': result.batch_tokens,
                'tokens_per_s': tokens_per_s,
                'mfu': self.mfu(tokens_per_s),
                'days': self.days(tokens_per_s),
                'peak_memory_bytes': peak,
                'warmup': self.warmup,
            }
        )
        if self.cluster.is_master:
            print(
                f"step {result.step:>6}/{total_steps} | loss {loss:.4f}"
                + (f" ({bpb:.3f} bpb)" if bpb is not None else '')
                + f" | lr {result.lr:.2e} | "
                f"norm {grad_norm:.2f} | {tokens_per_s:,.0f} tok/s | MFU {self.mfu(tokens_per_s):.1%} | "
                f"{self.days(tokens_per_s):.3g} days | peak mem {peak / 2**30:.2f} GiB"
                + (" | warm-up" if self.warmup else ""),
                flush=True,
            )
        if self.warmup and self.cluster.device.type == 'cuda':
            # from here the peak is the steady state's, not the compile's (autotuning tries kernels with buffers of
            # their own); on the CPU the process's peak resident memory cannot be reset
            torch.cuda.reset_peak_memory_stats(self.cluster.device)
        if not self.warmup:
            self.run_tokens += self.interval_tokens
            self.run_seconds += self.interval_seconds
            run_speed = self.run_tokens / self.run_seconds
            self.measured.update(
                tokens_per_s=run_speed, mfu=self.mfu(run_speed), days=self.days(run_speed)
            )
            self.check_probe(self.mfu(run_speed))
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, False

    def log_val(self, step, tokens_seen, val_loss, val_bytes_per_token):
        """An eval step's val loss and bits per byte: into metrics.jsonl, the log and summary.json."""
        val_bpb = sums.bits_per_byte(val_loss, val_bytes_per_token)
        self.record({'step': step, 'tokens': tokens_seen, 'val_loss': val_loss, 'val_bpb': val_bpb})
        log(
            self.cluster,
            f"step {step}: val loss {val_loss:.4f}"
            + (f", {val_bpb:.4f} bits per byte" if val_bpb is not None else ''),
        )
        self.write_summary(step, tokens_seen, val_loss, val_bytes_per_token)

    def record_sources(self, step, tokens_seen, results, sources):
        """A mixture's eval: each source's val loss and bits per byte (at the exact bytes of its own scored targets)
        into metrics.jsonl ('val_sources'), the log and summary.json. results: {source: (loss, bytes per token)}.
        Returns the weighted totals (sum_s w_s L_s, sum_s w_s B_s): the loss per token of the mixture as the schedule
        draws it, and its bytes per token, whose ratio is the mixture's bits per byte."""
        scored = {
            name: {
                'weight': sources[name]['weight'],
                'loss': loss,
                'bpb': sums.bits_per_byte(loss, text_bytes),
            }
            for name, (loss, text_bytes) in results.items()
        }
        self.record({'step': step, 'tokens': tokens_seen, 'val_sources': scored})
        self.measured['val_sources'] = scored
        if self.cluster.is_master:
            print(
                f"step {step}: val per source: "
                + '; '.join(
                    f"{name} ({s['weight']:.1%}) {s['loss']:.4f}"
                    + (f", {s['bpb']:.4f} bpb" if s['bpb'] else '')
                    for name, s in scored.items()
                ),
                flush=True,
            )
        weights = [sources[name]['weight'] for name in results]
        loss = sum(w * loss for w, (loss, _) in zip(weights, results.values()))
        per_token = [b for _, b in results.values()]
        return loss, None if None in per_token else sum(w * b for w, b in zip(weights, per_token))

    def check_probe(self, mfu):
        """A run faster than its prediction by sums.REPROBE_FACTOR or more, on a peak the probe measured: that
        probe read low (the machine was busy), so it is flagged and the next run probes again (once per run). A CPU
        run predicted from its step probe records the speed it reached (learn_speed), and flags the peak only when
        its MFU passes 100%."""
        probe_key, assumed = self.prediction['gpu'].get('probe_key'), self.prediction['mfu']
        reason = f"a run measured MFU {mfu:.1%} against the {assumed:.1%} its prediction assumed"
        limit = sums.REPROBE_FACTOR * assumed
        key = self.prediction.get('mfu_probe_key')
        if key:  # a CPU predicted from its step probe: learn what the run reached, per process
            if self.cluster.is_master:
                per_process = self.measured['tokens_per_s'] / self.cluster.world_size
                learn_speed(key, per_process, self.run_name)
            # the GEMM peak then only divides the MFU shown: above 100%, it read low
            reason, limit = f"a run measured MFU {mfu:.1%}, above 100% of the peak", 1.0
        if self.probe_flagged or not probe_key or mfu < limit or not self.cluster.is_master:
            return
        self.probe_flagged = sums.flag_reprobe(probe_key, reason)
        if self.probe_flagged:
            log(
                self.cluster,
                f"{reason}: this device's peak ({self.prediction['gpu']['peak_source'].split(' (cache')[0]}) "
                f"looks measured while the machine was busy; the next run probes it again and keeps the better",
            )

    def write_summary(self, step, tokens_seen, val_loss=None, val_bytes_per_token=None):
        """summary.json and report.md, from the same numbers (sums.summarize), and the loss curve (plot.py's
        loss.png, shown in report.md; a run without matplotlib goes on without it)."""
        if not self.cluster.is_master:
            return
        self.measured['peak_memory_bytes'], self.measured['peak_reserved_bytes'] = peak_memory(
            self.cluster
        )
        self.measured.update(step=step, tokens_seen=tokens_seen)
        if val_loss is not None:
            self.measured.update(val_loss=val_loss, val_bytes_per_token=val_bytes_per_token)
        summary = sums.summarize(self.prediction, self.measured)
        if self.fit:  # the fit's predicted final val loss beside the measured one
            summary.update(scaling.check(self.fit, self.prediction))
        files.save_json(os.path.join(self.out_dir, 'summary.json'), summary)
        picture = plot.draw_run(self.out_dir)
        files.write_text_atomic(
            os.path.join(self.out_dir, 'report.md'),
            bill.format_comparison(summary)
            + (f"\n\n{scaling.format_check(summary)}" if self.fit else '')
            + '\n'
            + (
                '\n![train and val loss against tokens seen](loss.png)\n'
                if picture
                else '\n(no loss.png: `pip install matplotlib`, then `python plot.py RUN_DIR` draws it)\n'
            ),
        )


# -----------------------------------------------------------------------------------------------------
# Mixture of experts: the routing's signals for metrics.jsonl, at log steps only (they read the device).


def router_stats(model):
    """The last step's routing (moe.update_router_bias keeps it): per MoE layer, each expert's share of the routed
    tokens x n_experts (1: an even load; a run with recompute counts each token twice, the shares stay), the load's
    coefficient of variation, and the router biases."""
    load = model.expert_load.double()
    return {
        'expert_load': (load / load.sum(-1, keepdim=True).clamp(min=1) * load.shape[-1]).tolist(),
        'expert_load_cv': (load.std(-1, correction=0) / load.mean(-1).clamp(min=1e-9)).tolist(),
        'router_bias': torch.stack([layer.router_bias for layer in model.moe]).tolist(),
    }
