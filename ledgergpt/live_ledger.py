"""
live_ledger.py: the live ledger. Before step 1 the prediction for the device this run is on (a GPU
by its name, else a GEMM probe and a probe of the run's own step); on log steps the measurements
beside it (tokens/s, MFU, days, peak memory); at evals and at the end, predicted beside measured.

Outputs in out_dir (rank 0): ledger.json and ledger.md (the prediction), metrics.jsonl (a line per
log step, eval and rollback; also to TensorBoard or W&B: trackers.py), summary.json and report.md
(with plot.py's loss.png), code.json and code.diff (the code train.py ran from).
"""

import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import time
from statistics import median

import torch
import torch.distributed as dist

from ledgergpt import bill, data, files, optimizers, plot, scaling, schedule, sums, trackers
from ledgergpt.config import IGNORE_INDEX, OPTIMIZERS, ConfigError, tokens_per_micro_step
from ledgergpt.continuation import TrainingStopped, interruptible
from ledgergpt.processes import log
from model import GPT


def from_rank0(cluster, value):
    shared = [value]
    if cluster.world_size > 1:
        dist.broadcast_object_list(shared, src=0)
    return shared[0]


def live_device(cluster, model_cfg, train):
    """The ledger's Device for the hardware at hand (sums.measure_device), rank 0's on all ranks."""
    device = sums.measure_device('auto', train.dtype) if cluster.is_master else None
    if device and device.kind == 'cpu':
        # what building the model loads besides its tensors (meta kernels import sympy and torch's
        # symbolic shapes: ~75 MB) belongs to the runtime
        with torch.device('meta'):
            GPT(model_cfg)
        source = 'measured: resident memory of this process before the model was built'
        shared_by = int(os.environ.get('LOCAL_WORLD_SIZE', 1))
        overhead = dict(overhead_bytes=sums.resident_bytes(), overhead_source=source)
        device = dataclasses.replace(device, shared_by=shared_by, **overhead)
    return from_rank0(cluster, device)


# --------------------------------------------------------------------------------------------------
# The CPU's MFU, from the run's own step timed at its shapes (train.py's build_run and train_step on
# synthetic tokens, compiled as the run, which then reuses the probe's graphs), cached per machine:
# a CPU's GEMM peak says little of what a small model reaches (docs/ledger.md, docs/measured.md).
# Later runs of the config are predicted from the median speed the last REACHED_KEPT reached.

PROBE_STEPS = 5  # timed steps at each size, after one that warms up: their median is kept
# the most micro-steps a probed step takes: a longer step is extrapolated from 1 and this
PROBE_MICRO_STEPS = 4
# what the step probe times with (a test that must ignore other processes' load sets
# time.thread_time with one thread: every CPU kernel, autograd's included, then runs in it)
PROBE_CLOCK = time.perf_counter
# one run on a busy machine (or one fast run) would set every next plan by itself
REACHED_KEPT = 5


def step_probe(model_cfg, train, dtype, device, cluster, trainer):
    """-> (the cache entry of this run's step on this CPU: tokens_per_s of one process, measured,
    probes, and once a run has learned it reached and reached_at; its key). trainer: train.py's
    (build_run, train_step). Under torchrun every rank probes at once (the run's contention and
    collectives); rank 0's entry is shared, its key naming the mode and world size."""
    accumulation = train.batch_tokens // (train.micro_batch * model_cfg.block_size)
    keys = dataclasses.asdict(train)  # the optimizer's row, and every key of its own
    own = [f'{k} {keys[k]}' for k in keys if k.startswith(train.optimizer + '_')]
    key = (
        f"{device.name} | train_step | {json.dumps(dataclasses.asdict(model_cfg), sort_keys=True)}"
        f" | micro_batch {train.micro_batch} | accumulation {accumulation} | recompute "
        f"{train.recompute} | compile {train.compile} | {dtype} | torch {torch.__version__} | "
        f"{', '.join([train.optimizer, *own])}"
        + (f" | {cluster.world_size} processes, {train.parallel}" if cluster.world_size > 1 else '')
    )

    def probe_it():
        with torch.device('meta'):
            params = sum(p.numel() for p in GPT(model_cfg).parameters())
        log(
            cluster,
            f"step probe: building the model ({params:,} parameters) on this CPU and timing its "
            f"training step, once for this machine (cached)",
        )
        with interruptible():  # Ctrl-C stops it, even one that lands in its gc's finalizers
            entry = _time_steps(model_cfg, train, dtype, cluster, trainer)
        reset_peak_resident()  # the run's peak is its own steps', not its probe's
        return entry

    due = cluster.world_size > 1 and from_rank0(cluster, cluster.is_master and sums.probe_due(key))
    if due and not cluster.is_master:
        probe_it()  # beside rank 0's, which is kept
    cached = sums.cached_probe(key, probe_it, 'tokens_per_s') if cluster.is_master else None
    return from_rank0(cluster, cached), key


def learn_speed(key, tokens_per_s, run):
    """A run's tokens/s so far into its step probe's cache entry, under the run's name: 'reached',
    the next run's prediction, is the median of the last REACHED_KEPT runs of this config here."""
    cache = sums.read_probes()
    if key in cache:
        runs = {**cache[key].get('reached_runs', {}), run: tokens_per_s}  # a run keeps its place
        runs = dict(list(runs.items())[-REACHED_KEPT:])
        now = time.strftime('%Y-%m-%d %H:%M:%S')
        cache[key].update(reached=median(runs.values()), reached_runs=runs, reached_at=now)
        with contextlib.suppress(OSError):
            files.save_json(sums.cache_path(), cache)


def synthetic_run(model_cfg, train, cluster, dtype, build_run):
    """train.py's Run (its build_run) on synthetic tokens, for timing steps (probe, bench.py)."""
    stream = data.SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=0)
    return build_run(model_cfg, train, cluster, dtype, stream, 10**9, 10**9)


def _time_steps(model_cfg, train, dtype, cluster, trainer):
    """-> the probe's entry: tokens_per_s of one process in the run's own step (the wrapper, its
    collectives, the clipping, the optimizer), and per size [micro-steps, median seconds]. A step of
    A > PROBE_MICRO_STEPS micro-steps is t1 + (A - 1) x the micro-step between 1 and
    PROBE_MICRO_STEPS. Every rank runs the same steps, so their collectives pair up."""
    build_run, train_step = trainer
    micro_step_tokens = tokens_per_micro_step(model_cfg, train, cluster.world_size)
    accumulation = train.batch_tokens // micro_step_tokens
    probed = dataclasses.replace(train, init_from='', batch_ramp_tokens=0)
    run = synthetic_run(model_cfg, probed, cluster, dtype, build_run)
    wrapper, seconds = type(run.model).__name__, []
    sizes = (accumulation,) if accumulation <= PROBE_MICRO_STEPS else (1, PROBE_MICRO_STEPS)
    for micro_steps in sizes:
        run.train = dataclasses.replace(probed, batch_tokens=micro_steps * micro_step_tokens)
        times = []
        for _ in range(1 + PROBE_STEPS):  # the first warms up (and compiles)
            begin = PROBE_CLOCK()
            train_step(run)
            times.append(PROBE_CLOCK() - begin)
        seconds.append([micro_steps, median(times[1:])])
    del run  # before the run builds its own: a DDP reducer goes while the process group is whole
    gc.collect()
    (_, first), (_, last) = seconds[0], seconds[-1]
    micro = max(0.0, last - first) / (PROBE_MICRO_STEPS - 1)  # noise cannot make it negative
    step = last if len(sizes) == 1 else first + (accumulation - 1) * micro
    tokens_per_s = train.batch_tokens / cluster.world_size / step
    return dict(tokens_per_s=tokens_per_s, wrapper=wrapper, step_seconds=seconds)


def probed_prediction(prediction, model_cfg, billed, dtype, device, cluster, trainer):
    """A CPU run's prediction at the MFU at which the ledger's step (its tokens' FLOPs, then the
    optimizer's) takes the time its step probe measured, or runs of its config reached."""
    probe, key = step_probe(model_cfg, billed, dtype, device, cluster, trainer)
    tokens_per_s = probe.get('reached') or probe['tokens_per_s']
    step_tokens = billed.batch_tokens / cluster.world_size  # a process's
    step_flops = step_tokens * prediction['flops_per_token']['hardware']
    step_flops += prediction['optimizer_flops_per_step']
    mfu = tokens_per_s * step_flops / step_tokens / device.peak_flops
    probed = dataclasses.replace(billed, mfu=mfu)
    prediction = sums.predict(model_cfg, probed, cluster.world_size, device)
    runs = len(probe.get('reached_runs', [0]))  # an entry from before the median: one run
    how = f"{'compiled' if billed.compile else 'eager'} as the run"
    source = (
        f"reached by runs of this config on this machine: the median of the last {runs}, "
        f"{probe['reached_at']}"
        if probe.get('reached')
        else f"measured on this CPU at this model's shapes, {how} (best of {probe['probes']} step "
        f"probe(s), {probe['measured']})"
    )
    prediction.update(mfu_source=f"{source}; the config says {billed.mfu:.0%}", mfu_probe_key=key)
    return prediction


def predict(config_path, model_cfg, train, cluster, force, cooldown, trainer):
    """The ledger's prediction for this run on its device, printed short: -> (prediction, compute
    dtype). One line if the ledger says it does not fit, unless forced. trainer: as step_probe's."""
    device = live_device(cluster, model_cfg, train)
    dtype = sums.run_dtype(train, device)  # 'auto': bf16 on a GPU, on a CPU the faster probed
    if not sums.names_device(train.gpu, device.name):
        log(
            cluster,
            f"the config plans for gpu={train.gpu} (`python ledger.py {config_path}` prints that "
            f"bill); this run is on {device.name}: the live ledger predicts for it",
        )
    # a cooldown bills its decay; the nodes this run spans (torchrun's LOCAL_WORLD_SIZE a node)
    decay = dict(train_tokens=train.cooldown_tokens, max_steps=0) if cooldown else {}
    nodes = -(-cluster.world_size // int(os.environ.get('LOCAL_WORLD_SIZE', 1)))
    billed = dataclasses.replace(train, nodes=nodes, **decay)
    prediction = sums.predict(model_cfg, billed, n_gpu=cluster.world_size, device=device)
    check_fits(prediction['memory'], device, force)  # before the step probe builds the model
    if device.kind == 'cpu':
        args = (model_cfg, billed, dtype, device, cluster, trainer)
        prediction = probed_prediction(prediction, *args)
    if cluster.world_size > 1:
        prediction['comm']['probe'] = collective_probe(cluster)
    for line in start_lines(config_path, prediction, model_cfg, train, cluster, dtype):
        log(cluster, line)
    return prediction, dtype


# model states from which materialising them takes seconds (1 GiB: ~60M parameters at 16 bytes)
BIG_STATES = 2**30
MATH_SDPA = (
    ': it keeps T x T scores per head, more than the ledger counts (it assumes a flash-type kernel)'
)


def start_lines(config_path, prediction, model_cfg, train, cluster, dtype):
    """What a run says before it builds its model, after the short bill."""
    where = f"{os.path.join(train.out_dir, 'ledger.md')}, or python ledger.py {config_path}"
    attention = sdpa_backend(model_cfg, cluster.device, dtype)
    measured = train.dtype == 'auto' and cluster.device.type == 'cpu'
    lines = [
        bill.format_short(prediction, where),
        f"attention: SDPA runs {attention} for {model_cfg.block_size} tokens in {dtype}"
        + (MATH_SDPA if attention == 'math' else ''),
        f"precision: {dtype} compute{' (the faster on this CPU, measured)' if measured else ''}, "
        f"fp32 weights, gradients and {OPTIMIZERS[train.optimizer].name} states",
    ]
    if train.objective != 'clm':
        lines.append(
            f"objective: {train.objective}: about {prediction['data']['loss_fraction']:.0%} of the "
            f"positions carry loss (the others' targets are {IGNORE_INDEX}: given, not predicted); "
            f"tokens/s and MFU count every position; the val loss is plain next-token prediction "
            f"on every position"
        )
    states = prediction['memory']['model_states']
    if states >= BIG_STATES:  # building it takes a while: say so first
        lines.append(
            f"building the model: {prediction['params']['total']:,} parameters, "
            f"{states / 2**30:.1f} GiB of weights, gradients and optimizer states per process"
        )
    return lines


def spend_minutes(train, prediction, cluster):
    """train_minutes -> the train_tokens they buy at the predicted speed (whole batches), fixed for
    the run and its resumes (continuation.keep_budgeted_tokens)."""
    tokens, speed = prediction['train']['train_tokens'], prediction['tokens_per_s']
    source = prediction.get('mfu_source', f"MFU {train.mfu:.0%}, the config's")
    log(
        cluster,
        f"train_minutes={train.train_minutes:g}: {tokens:,} tokens in "
        f"{tokens // train.batch_tokens:,} steps at the predicted {speed:,.0f} tokens/s ({source})",
    )
    return dataclasses.replace(train, train_tokens=tokens, train_minutes=0.0)


def check_fits(memory, device, force):
    """A run the ledger says does not fit stops in one line, unless forced, before any tensor:
    h200_1b3 on a 24 GiB CPU was 4 minutes of building 1.3B parameters, then the OOM kill."""
    if memory['fits'] or force:
        return
    cpu = device.kind == 'cpu'
    where = f"this machine's {device.memory_source} holds" if cpu else f'{device.name} has'
    gib = {k: memory[k] / 2**30 for k in ('total', 'model_states', 'gpu_memory', 'headroom_needed')}
    raise ConfigError(
        f"the ledger predicts {gib['total']:.1f} GiB per process ({gib['model_states']:.1f} GiB of "
        f"weights, gradients and optimizer states) but {where} {gib['gpu_memory']:.1f} GiB, of "
        f"which a plan leaves {gib['headroom_needed']:.1f} GiB free (the ledger's error band): "
        f"lower micro_batch, set recompute=True or parallel=fsdp, choose a smaller model, or pass "
        f"--force to start anyway"
    )


def plan_line(run):
    """The line before step 1: the steps planned, the global batch, the parallel mode."""
    train, cluster = run.train, run.cluster
    parallel = train.parallel if cluster.world_size > 1 else 'none (1 process)'
    return (
        f"training: {run.total_steps:,} steps planned for {train.train_tokens:,} tokens, this run "
        f"stops at step {run.stop_step:,}; global batch {train.batch_tokens:,} tokens = "
        f"{train.micro_batch} sequences x {run.model_cfg.block_size} tokens x "
        f"{cluster.world_size} process(es) x {train.batch_tokens // run.micro_step_tokens} "
        f"accumulation steps; parallel={parallel}"
    )


def unverified(reason, prediction, force, cluster):
    """The run is not what the ledger counted: it stops in one line, or with --force goes on, the
    ledger marked unverified (prediction['ledger_unverified']: summary.json, report.md)."""
    if not force:
        raise TrainingStopped(
            f"{reason}, or run with --force to train anyway, the ledger marked unverified"
        )
    earlier = prediction.get('ledger_unverified')
    prediction['ledger_unverified'] = f'{earlier}; {reason}' if earlier else reason
    log(cluster, f"warning: --force: {reason}; the report marks the ledger unverified")


def params_built(model, prediction, force, cluster):
    """The built model's parameter count, the ledger's, else (unverified) the first tensor off."""
    built, counted = sum(p.numel() for p in model.parameters()), prediction['params']['total']
    if built != counted:  # (a DTensor's numel is its full size)
        rows = dict(sums.parameter_shapes(model.config))
        tensors = {name: tuple(p.shape) for name, p in model.named_parameters()}
        # the first built tensor the rows give another shape, else the first row not built
        name = next(n for n in {**tensors, **rows} if rows.get(n) != tensors.get(n))
        reason = (
            f"the ledger counts {counted:,} parameters but the built model has {built:,}: {name} "
            f"is {tensors.get(name, 'not built')} in model.py and {rows.get(name, 'absent')} in "
            f"the parts' rows (config.PARTS: add the tensor to its part's row)"
        )
        unverified(reason, prediction, force, cluster)
    return built


def held_bytes(tensors):
    """Bytes of the distinct storages behind tensors (a DTensor's shard, a DDP .grad's bucket)."""
    local = (optimizers.to_local(t) for t in tensors if t is not None)
    storages = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in local}
    return sum(nbytes for _, nbytes in storages)


def measure_first_step(run, force=False):
    """Rank 0's first optimizer step: its matmul FLOPs (none for an elementwise update) and the
    model states it leaves (weights, gradients, optimizer states, as test_memory.py counts them),
    for report.md. Optimizer states other than the ledger's stop the run (unverified): the
    optimizer's row bills what it does not hold."""
    from torch.utils.flop_counter import FlopCounterMode

    optimizer, name, metrics = run.optimizer, run.train.optimizer, run.metrics
    if not run.cluster.is_master:
        return

    def first(*args, **kwargs):
        del optimizer.step  # the class's own from here
        with FlopCounterMode(display=False) as counter:
            result = optimizer.step(*args, **kwargs)
        states = getattr(optimizer, 'optim', optimizer).state.values()  # ZeRO-1: its rank's part
        states = held_bytes(v for state in states for v in state.values() if torch.is_tensor(v))
        held = held_bytes(run.params) + held_bytes(p.grad for p in run.params) + states
        metrics.measured.update(optimizer_flops=counter.get_total_flops(), model_states_bytes=held)
        predicted, row = metrics.prediction['memory']['optimizer'], OPTIMIZERS[name]
        if states != predicted:
            reason = (
                f"the ledger predicts {predicted:,} bytes of optimizer states on rank 0 (its row, "
                f"config.OPTIMIZERS['{name}']: {row.label}, {row.formula}) but the first step "
                f"left {states:,}: fix the row's state_bytes"
            )
            unverified(reason, metrics.prediction, force, run.cluster)
        return result

    optimizer.step = first


def collective_probe(cluster):
    """The all-reduce bus bandwidth of this run's process group: all-reduces of 256 MiB of fp32 on
    GPUs (the same number on every rank) after two for warm-up; busbw = bytes x 2(N-1)/N / seconds,
    as NCCL-tests computes it. On the CPU (gloo) 4 MiB thrice: the seconds mean nothing there."""
    on_gpu = cluster.device.type == 'cuda'
    size, iterations = (256 * 2**20, 20) if on_gpu else (4 * 2**20, 3)
    buffer = torch.ones(size // 4, device=cluster.device)
    for i in range(2 + iterations):
        if i == 2:  # after the warm-up, with the device idle
            synchronize(cluster.device)
            started = time.perf_counter()
        dist.all_reduce(buffer)
    synchronize(cluster.device)
    seconds = (time.perf_counter() - started) / iterations
    factor = sums.BUS_FACTORS['all_reduce'](cluster.world_size)
    bus = dict(bytes=size, seconds=seconds, busbw=size * factor / seconds)
    return bus | dict(backend=dist.get_backend(), meaningful=on_gpu)


def synchronize(device):
    """Wait for a GPU's kernels: else a clock times how fast Python queues them, not their run."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


SDPA_BACKENDS = ('math', 'flash attention', 'memory-efficient attention', 'cuDNN attention')


def sdpa_backend(model_cfg, device, dtype):
    """The kernel F.scaled_dot_product_attention picks for this run's shapes and dtype, asked as
    SDPA asks: flash, memory-efficient and cuDNN keep what the ledger counts; math does not."""
    head_dim, T, kind = model_cfg.head_dim, model_cfg.block_size, getattr(torch, dtype)
    q, k, v = (
        torch.empty(1, heads, T, head_dim, device=device, dtype=kind, requires_grad=True)
        for heads in (model_cfg.n_head, model_cfg.kv_heads, model_cfg.kv_heads)
    )
    gqa = model_cfg.kv_heads != model_cfg.n_head
    choice = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)
    return SDPA_BACKENDS[choice] if choice < len(SDPA_BACKENDS) else f'backend {choice}'


def reset_peak_resident():
    """Linux: VmHWM, the peak peak_memory reads, set back to the resident memory now."""
    with contextlib.suppress(OSError), open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def peak_memory(cluster):
    """-> (peak, peak reserved) bytes: CUDA's allocator's, or the CPU's peak resident (and None)."""
    device = cluster.device
    if device.type == 'cuda':
        return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    return sums.resident_bytes(peak=True), None


def record_code(out_dir, source=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    """The code that made the run (as modded-nanogpt's logs): from a git checkout, code.json gets
    the commit and the untracked files' names, code.diff `git diff HEAD`; outside one, nothing. A
    resumed run writes them again: what ran last is what the folder says."""

    def git(*args):
        command = ['git', '-C', source, *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    try:
        commit, diff = git('rev-parse', 'HEAD').strip(), git('diff', 'HEAD')
        untracked = git('ls-files', '--others', '--exclude-standard').split()
    except (OSError, subprocess.CalledProcessError):
        return None
    os.makedirs(out_dir, exist_ok=True)
    files.write_text_atomic(os.path.join(out_dir, 'code.diff'), diff)
    dirty = bool(diff or untracked)
    record = dict(commit=commit, dirty=dirty, diff='code.diff', untracked=untracked)
    files.save_json(os.path.join(out_dir, 'code.json'), record)
    return record


NO_PICTURE = '\n(no loss.png: `pip install matplotlib`, then `python plot.py RUN_DIR` draws it)\n'


class Metrics:
    """The measured half of the ledger, and rank 0's outputs. Speed is timed between log steps, the
    device synchronised at the clock, the clock paused around eval, checkpoints and samples. The
    first interval after a start or a rollback (compile, warm-up) is logged but left out of the
    run's figures in summary.json."""

    def __init__(
        self, cluster, train, prediction, built, append, bytes_per_token=None, plan=None, kept=()
    ):
        self.cluster, self.prediction, self.out_dir = cluster, prediction, train.out_dir
        # plan: (stop step, micro-step tokens, cooldown) for schedule.forecast; kept: {step: '25%'}
        self.train, self.plan, self.kept, self.forecasts = train, plan, kept, {}
        # meta.json's mean bytes per token: the train loss in bits per byte too (the val loss's
        # are exact: evaluate counts the bytes of the targets it scores)
        self.bytes_per_token = bytes_per_token
        # a fit's predicted final val loss, beside the measured; not a cooldown branch's (its D is
        # its start's tokens plus its decay: overtrain.py draws the fit beside the branches)
        self.fit = scaling.load_fit(train.fit) if train.fit and not train.cooldown_from else None
        where = f'the CPU ({torch.get_num_threads()} threads per process)'
        if cluster.device.type == 'cuda':
            where = torch.cuda.get_device_name(cluster.device)
        self.measured = dict(device=f'{cluster.world_size} x {where}', torch=torch.__version__)
        self.measured.update(params=built, bytes_per_token=bytes_per_token)
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
            elif os.path.exists(self.metrics_path):  # a resume keeps the forecasts made before it
                made = [e['forecast'] for e in plot.logged(self.metrics_path)[1] if 'forecast' in e]
                self.forecasts = {f['kept']: f for f in made if 'kept' in f}
            self.trackers = trackers.Trackers(train, prediction, report, resume=append)

    def start_clock(self):
        synchronize(self.cluster.device)
        self.started = time.perf_counter()

    def stop_clock(self):
        if self.started is not None:
            synchronize(self.cluster.device)
            self.interval_seconds += time.perf_counter() - self.started
            self.started = None

    def restart(self):
        """After a rollback: drop the interval, the next one warms up again."""
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, True

    def count(self, result, tokens_seen):
        self.interval_tokens += result.batch_tokens
        chinchilla = self.prediction['data']['chinchilla_tokens']  # 20 x P
        if tokens_seen >= chinchilla > tokens_seen - result.batch_tokens:
            log(
                self.cluster,
                f"step {result.step}: {tokens_seen:,} tokens seen passes the Chinchilla point 20 x "
                f"P = {chinchilla:,} (compute-optimal for this model): from here it over-trains",
            )

    def mfu(self, tokens_per_s):
        """MFU counts the matmul FLOPs, 6 N_matmul + 12 L H T per token (PaLM's, no recompute)."""
        peak = self.cluster.world_size * self.prediction['gpu']['peak_flops']
        return self.prediction['flops_per_token']['matmul'] * tokens_per_s / peak

    def days(self, tokens_per_s):  # the planned tokens at this speed
        return self.prediction['tokens'] / tokens_per_s / sums.SECONDS_PER_DAY

    def record(self, entry):
        """Append one JSON line (log, eval and rollback steps only: opening the file is free)."""
        if self.cluster.is_master:
            with open(self.metrics_path, 'a') as f:
                f.write(json.dumps(entry) + '\n')
            self.trackers.log(entry)

    def close(self):
        """The run's end (done, stopped or failed): report.md and loss.png to the trackers."""
        if self.trackers is not None:
            self.trackers.finish(self.out_dir)

    def log_step(self, result, total_steps, tokens_seen, loss, grad_norm, mean=(None, None)):
        tokens_per_s = self.interval_tokens / self.interval_seconds
        mfu, days, warmup = self.mfu(tokens_per_s), self.days(tokens_per_s), self.warmup
        peak, _ = peak_memory(self.cluster)
        bpb = sums.bits_per_byte(loss, self.bytes_per_token)
        step, lr = result.step, result.lr
        self.record(
            dict(step=step, tokens=tokens_seen, loss=loss, bpb=bpb, lr=lr, grad_norm=grad_norm)
            | dict(loss_mean=mean[0], mean_from=mean[1])  # over steps mean_from .. step
            | dict(batch_tokens=result.batch_tokens, tokens_per_s=tokens_per_s, mfu=mfu, days=days)
            | dict(peak_memory_bytes=peak, warmup=warmup)
        )
        log(
            self.cluster,
            f"step {step:>6}/{total_steps} | loss {loss:.4f}"
            + (f" ({bpb:.3f} bpb)" if bpb is not None else '')
            + f" | lr {lr:.2e} | norm {grad_norm:.2f} | {tokens_per_s:,.0f} tok/s | "
            f"MFU {mfu:.1%} | {days:.3g} days | peak mem {peak / 2**30:.2f} GiB"
            + (" | warm-up" if warmup else ""),
        )
        if warmup and self.cluster.device.type == 'cuda':
            # from here the peak is the steady state's, not the compile's (autotuning tries kernels
            # with buffers of their own); on the CPU the peak resident memory cannot be reset
            torch.cuda.reset_peak_memory_stats(self.cluster.device)
        if not warmup:
            self.run_tokens += self.interval_tokens
            self.run_seconds += self.interval_seconds
            speed = self.run_tokens / self.run_seconds
            self.measured.update(tokens_per_s=speed, mfu=self.mfu(speed), days=self.days(speed))
            self.check_probe(self.mfu(speed))
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, False

    def log_val(self, step, tokens_seen, val_loss, val_bytes_per_token):
        """An eval's val loss and bits per byte: into metrics.jsonl, the log and summary.json."""
        val_bpb = sums.bits_per_byte(val_loss, val_bytes_per_token)
        self.record({'step': step, 'tokens': tokens_seen, 'val_loss': val_loss, 'val_bpb': val_bpb})
        bpb = f", {val_bpb:.4f} bits per byte" if val_bpb is not None else ''
        log(self.cluster, f"step {step}: val loss {val_loss:.4f}{bpb}")
        if self.plan and self.cluster.is_master:
            self.forecast(step, tokens_seen)
        self.write_summary(step, tokens_seen, val_loss, val_bytes_per_token)

    def forecast(self, step, tokens_seen):
        """The run's final val loss forecast from its curve so far (schedule.forecast, ~10 ms
        after the first): into the log and metrics.jsonl, and kept for summary.json when made at
        one of FORECAST_AT. A failure is a line: training goes on."""
        try:
            made = schedule.forecast(self.metrics_path, self.train, *self.plan)
        except Exception as e:  # noqa: BLE001 (whatever it is, the run goes on)
            made = {'not_yet': f'{type(e).__name__}: {e}'}
        if step in self.kept:  # for summary.json, report.md and loss.png
            made['kept'] = self.kept[step]
            self.forecasts[made['kept']] = made
        self.record({'step': step, 'tokens': tokens_seen, 'forecast': made})
        log(self.cluster, f"step {step}: {bill.forecast_line(made)}")

    def record_sources(self, step, tokens_seen, results, sources):
        """A mixture's eval, results {source: (loss, bytes per token)}: each source's val loss and
        bits per byte into metrics.jsonl ('val_sources'), the log and summary.json. -> the weighted
        totals (sum_s w_s L_s, sum_s w_s B_s), whose ratio is the mixture's bits per byte."""
        scored, each, weighted = {}, [], []
        for name, (loss, size) in results.items():
            weight, bpb = sources[name]['weight'], sums.bits_per_byte(loss, size)
            scored[name] = dict(weight=weight, loss=loss, bpb=bpb)
            each.append(f"{name} ({weight:.1%}) {loss:.4f}" + (f", {bpb:.4f} bpb" if bpb else ''))
            weighted.append((weight * loss, None if size is None else weight * size))
        self.record({'step': step, 'tokens': tokens_seen, 'val_sources': scored})
        self.measured['val_sources'] = scored
        log(self.cluster, f"step {step}: val per source: " + '; '.join(each))
        losses, sizes = zip(*weighted)
        return sum(losses), None if None in sizes else sum(sizes)

    def check_probe(self, mfu):
        """A run faster than its prediction by sums.REPROBE_FACTOR or more on a measured peak: that
        probe read low (a busy machine), so it is flagged, and the next run probes again."""
        if not self.cluster.is_master:
            return
        probe_key, assumed = self.prediction['gpu'].get('probe_key'), self.prediction['mfu']
        reason = f"a run measured MFU {mfu:.1%} against the {assumed:.1%} its prediction assumed"
        limit, key = sums.REPROBE_FACTOR * assumed, self.prediction.get('mfu_probe_key')
        if key:  # a CPU predicted from its step probe: learn what the run reached, per process
            learn_speed(key, self.measured['tokens_per_s'] / self.cluster.world_size, self.run_name)
            # the GEMM peak then only divides the MFU shown: above 100%, it read low
            reason, limit = f"a run measured MFU {mfu:.1%}, above 100% of the peak", 1.0
        if self.probe_flagged or not probe_key or mfu < limit:
            return
        self.probe_flagged = sums.flag_reprobe(probe_key, reason)
        if self.probe_flagged:
            peak = self.prediction['gpu']['peak_source'].split(' (cache')[0]
            log(
                self.cluster,
                f"{reason}: this device's peak ({peak}) looks measured while the machine was busy; "
                f"the next run probes it again and keeps the better",
            )

    def write_summary(self, step, tokens_seen, val_loss=None, val_bytes_per_token=None):
        """summary.json and report.md, from the same numbers (sums.summarize), and the loss curve
        (plot.py's loss.png, in report.md; a run without matplotlib goes on without it)."""
        if not self.cluster.is_master:
            return
        peak, reserved = peak_memory(self.cluster)
        self.measured.update(peak_memory_bytes=peak, peak_reserved_bytes=reserved)
        self.measured.update(step=step, tokens_seen=tokens_seen)
        if val_loss is not None:
            self.measured.update(val_loss=val_loss, val_bytes_per_token=val_bytes_per_token)
        summary = sums.summarize(self.prediction, self.measured)
        summary['forecasts'] = self.forecasts  # the law's, at 10%, 25% and 50% of the run
        if self.fit:  # the fit's predicted final val loss beside the measured one
            summary.update(scaling.check(self.fit, self.prediction))
        files.save_json(os.path.join(self.out_dir, 'summary.json'), summary)
        picture = '\n![train and val loss against tokens seen](loss.png)\n'
        picture = picture if plot.draw_run(self.out_dir) else NO_PICTURE
        fit = f"\n\n{scaling.format_check(summary)}" if self.fit else ''
        text = bill.format_comparison(summary) + fit + '\n' + picture
        files.write_text_atomic(os.path.join(self.out_dir, 'report.md'), text)


def router_stats(model):
    """MoE: the last step's routing for metrics.jsonl (moe.update_router_bias keeps it): per MoE
    layer, each expert's share of the routed tokens x n_experts (1: an even load), the load's
    coefficient of variation, and the router biases."""
    load = model.expert_load.double()
    return {
        'expert_load': (load / load.sum(-1, keepdim=True).clamp(min=1) * load.shape[-1]).tolist(),
        'expert_load_cv': (load.std(-1, correction=0) / load.mean(-1).clamp(min=1e-9)).tolist(),
        'router_bias': torch.stack([layer.router_bias for layer in model.moe]).tolist(),
    }
