"""
sums.py: the book's sums for a config, as numbers: parameters, FLOPs, days, memory, data, cost and
communication (Ledgers 1-5: BOOK.md lists each formula with its source and a worked number).
predict() returns one JSON-able dict; bill.py prints it (`python ledger.py`). Standard library only:
torch is imported only to measure the device at hand (measure_device, gemm_flops).
"""

import collections
import contextlib
import dataclasses
import difflib
import math
import os
import platform
import sys
import time
from functools import partial

from ledgergpt import config
from ledgergpt.config import GIB, MIB, SECONDS_PER_DAY, ConfigError, ModelConfig, sharded
from ledgergpt.files import load_json, save_json

# --------------------------------------------------------------------------------------------------
# Devices. A GPU is known by its name: the dense BF16 tensor-core peak (no 2:4 sparsity) from the
# vendor datasheets (the A800 is the A100 with slower NVLink) and its memory as the driver reports
# it. Any other GPU, and a CPU, are measured: the best FLOP/s of a large matmul in the run's dtype
# over about a second (a GEMM probe, cached per machine), the memory what the machine gives.


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # FLOP/s of dense matmuls in the compute dtype, per device
    memory_bytes: int  # memory of one device (a CPU: the machine's RAM, shared by its processes)
    kind: str = 'gpu'  # 'gpu' or 'cpu'
    dtype: str = 'bfloat16'  # the compute dtype the peak is for (a run with dtype='auto' uses it)
    peak_source: str = 'vendor datasheet, dense BF16 tensor cores'
    memory_source: str = 'nvidia-smi total'
    overhead_bytes: int = 2 * GIB  # the runtime's memory besides the ledger's tensors (Ledger 4d)
    overhead_source: str = (
        'ESTIMATE: CUDA context, kernels 0.81 GB and fragmentation 0.5-1 GB (the book), '
        'cuBLAS/flash workspaces'
    )
    shared_by: int = 0  # processes sharing this device's memory (0: a CPU's n_gpu, a GPU's 1)
    probe_key: str = ''  # a measured peak: its entry in the probe cache (measure_device), else ''


# memory: nvidia-smi's MiB total (the H200 NVL has the SXM part's 141 GB stack), rocm-smi's bytes
GPUS = {
    'H200': Device('H200 SXM 141GB', 989e12, 143771 * MIB),
    'H200-NVL': Device('H200 NVL 141GB', 835e12, 143771 * MIB),
    'H100': Device('H100 SXM 80GB', 989e12, 81559 * MIB),
    'H100-PCIe': Device('H100 PCIe 80GB', 756e12, 81559 * MIB),
    'H100-NVL': Device('H100 NVL 94GB', 835e12, 95830 * MIB),
    'A100': Device('A100 SXM 80GB', 312e12, 81920 * MIB),
    'A800': Device('A800 80GB', 312e12, 81920 * MIB),
    'MI300X': Device('MI300X 192GB', 1307e12, 205_822_885_888, memory_source='rocm-smi total'),
    'B200': Device('B200 180GB', 2250e12, 183359 * MIB),
}
MEASURED = ('auto', 'cpu')  # the `gpu` names that mean "measure the device at hand"


def gpu_spec(name, dtype='auto'):
    """The Device a `gpu` key names, case-insensitive: the GPU table's entry, or ('auto', 'cpu') the
    device at hand measured in the compute dtype `dtype` ('auto', 'bfloat16', 'float32') gives on
    it; ConfigError naming the known ones."""
    if name.lower() in MEASURED:
        return measure_device(name.lower(), dtype)
    by_lower = {key.lower(): key for key in GPUS}
    if name.lower() in by_lower:
        return GPUS[by_lower[name.lower()]]
    close = difflib.get_close_matches(name.lower(), [*by_lower, *MEASURED], n=1, cutoff=0.5)
    hint = f"did you mean '{by_lower.get(close[0], close[0])}'? " if close else ''
    raise ConfigError(
        f"unknown gpu '{name}': {hint}known: {', '.join(GPUS)}, or 'auto' / 'cpu' to measure this "
        f"machine (add yours to GPUS in ledgergpt/sums.py)"
    )


def table_key(label):
    """The GPUS key a device's name holds, the longest ('NVIDIA H100 NVL': 'H100-NVL'), or ''."""
    known = [key for key in GPUS if key.lower().replace('-', ' ') in label.lower()]
    return max(known, key=len, default='')


def names_device(gpu, label):
    """Whether a `gpu` key names the device whose own name is `label` ('H200': 'NVIDIA H200')."""
    return gpu.lower() in ('auto', label.lower(), table_key(label).lower())


def run_dtype(train, device):
    return device.dtype if train.dtype == 'auto' else train.dtype


def cache_path():
    """The per-machine cache of probes: $XDG_CACHE_HOME (or ~/.cache)/ledgergpt/devices.json."""
    root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(root, 'ledgergpt', 'devices.json')


def resident_bytes(peak=False):
    """This process's resident memory now, or its peak: Linux's VmRSS or VmHWM, else getrusage's
    peak. Not ru_maxrss on Linux: it keeps the parent's at the spawn (a child of a 2 GiB process
    reports 2 GiB there, 9 MB in VmHWM: measured), a sweep's run would report its parent's size."""
    try:
        with open('/proc/self/status') as f:
            fields = dict(line.split(':', 1) for line in f)
        return int(fields['VmHWM' if peak else 'VmRSS'].split()[0]) * 1024
    except (OSError, KeyError):
        import resource

        kib = 1 if sys.platform == 'darwin' else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib


def machine_memory():
    """-> (bytes of RAM this process may use, their source): a cgroup limit when one is set
    (containers, Slurm), else the machine's physical RAM."""
    ram, source = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), 'physical RAM (sysconf)'
    for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
        limit = ''
        with contextlib.suppress(OSError), open(path) as f:
            limit = f.read().strip()
        if limit.isdigit() and int(limit) < ram:
            ram, source = int(limit), f'cgroup limit ({path})'
    return ram, source


def cpu_name():
    with contextlib.suppress(OSError), open('/proc/cpuinfo') as f:
        for line in f:
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    return platform.processor() or platform.machine()


def measure_device(name='auto', dtype='auto', seconds=1.0):
    """The device at hand ('auto': the CUDA GPU if any, else the CPU; 'cpu') as a Device: a GPU of
    the table with its datasheet peak, any other with a cached GEMM probe (gemm_flops). dtype 'auto'
    on a CPU is the faster of fp32 and bf16 (bf16 runs 6x fp32 on a Xeon with AMX, ~200x slower on
    an AVX2-only EPYC: measured). A CPU's runtime overhead is measured: the resident memory once
    torch and its thread pools are up."""
    try:  # measuring the device needs torch; nothing else in this file does
        import torch
    except ImportError:
        raise ConfigError(
            f"gpu = {name!r} measures this machine, which needs torch (pip install torch); bill a "
            "named GPU without it, e.g. --gpu=H100"
        ) from None

    on_gpu = name == 'auto' and torch.cuda.is_available()
    if dtype == 'auto' and not on_gpu:
        cpus = (measure_device('cpu', d, seconds) for d in ('float32', 'bfloat16'))
        return max(cpus, key=lambda d: d.peak_flops)
    dtype = 'bfloat16' if dtype == 'auto' else dtype
    if on_gpu:
        index = torch.cuda.current_device()
        label, threads, device = torch.cuda.get_device_name(index), 0, torch.device('cuda', index)
        total = torch.cuda.get_device_properties(index).total_memory
        fields = dict(memory_bytes=total, memory_source='torch.cuda.get_device_properties')
        if key := table_key(label):
            fields['peak_source'] = f'vendor datasheet ({key}), dense BF16'
            return dataclasses.replace(GPUS[key], name=label, dtype=dtype, **fields)
    else:
        threads, device = torch.get_num_threads(), torch.device('cpu')
        label = f'CPU ({cpu_name()}, {threads} threads)'
    key = f'{label} | {dtype} | {threads} threads | torch {torch.__version__}'

    def probe_it():
        best, n = gemm_flops(8192 if on_gpu else 2048, device, dtype, seconds)
        return {'peak_flops': best, 'runtime_bytes': resident_bytes(), 'matmul': f'{n}x{n}x{n}'}

    probe = cached_probe(key, probe_it, 'peak_flops')
    if not on_gpu:
        ram, ram_source = machine_memory()
        runtime = 'measured: resident memory of the runtime (torch, its libraries and thread pools)'
        fields = dict(memory_bytes=ram, memory_source=ram_source, kind='cpu')
        fields.update(overhead_bytes=probe['runtime_bytes'], overhead_source=runtime)
    fields['peak_source'] = (
        f"measured: GEMM probe, {probe['matmul']} {dtype}, the best of {probe.get('probes', 1)} "
        f"probe(s), peak measured at {probe['measured']} (cache: {cache_path()})"
    )
    return Device(label, probe['peak_flops'], dtype=dtype, probe_key=key, **fields)


def gemm_flops(n_max, device, dtype, seconds):
    """-> (the best FLOP/s of n x n matmuls in `dtype` on `device`, n). n doubles from 256 while one
    takes under 0.1 s, up to n_max: an emulated dtype (bf16 on a CPU without bf16 or AVX-512 units,
    ~0.3 GFLOP/s: a minute for one 2048-square) takes seconds. Then that size repeats `seconds`."""
    import torch

    def timed(a, b, out):
        begin = time.perf_counter()
        torch.mm(a, b, out=out)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        return time.perf_counter() - begin

    n = min(256, n_max)
    while True:  # the first call at each size warms up
        a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
        out = torch.mm(a, b)
        took = timed(a, b, out)
        if n >= n_max or took > 0.1:
            break
        n *= 2
    best, start = 2 * n**3 / took, time.perf_counter()
    while time.perf_counter() - start < seconds:
        best = max(best, 2 * n**3 / timed(a, b, out))
    return best, n  # a, b and out are freed here, before the runtime's own footprint is read


def cached_probe(key, measure, best_of):
    """The probe cache's entry `key`, measured with measure() -> its fields when new or flagged
    (flag_reprobe). Load only slows a probe: the entry with the highest `best_of` is kept, with its
    date; 'probes' counts them. The GEMM probe and live_ledger's step probe share it."""
    path = cache_path()
    cache = read_probes(path)
    if probe_due(key, cache):
        entry, old = measure(), cache.get(key, {})
        if entry[best_of] >= old.get(best_of, 0):
            cache[key] = {**entry, 'measured': time.strftime('%Y-%m-%d %H:%M:%S')}
        cache[key]['probes'] = old.get('probes', 0) + 1
        cache[key].pop('reprobe', None)
        with contextlib.suppress(OSError):  # a read-only home costs the next run another second
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save_json(path, cache)
    return cache[key]


def probe_due(key, cache=None):
    entry = (read_probes() if cache is None else cache).get(key)
    return entry is None or bool(entry.get('reprobe'))


def read_probes(path=None):
    try:
        return load_json(path or cache_path())
    except (OSError, ValueError):
        return {}


# A probe taken while the machine was busy reads low, and every prediction from it is slow: a run
# whose measured MFU exceeds its prediction's by this factor flags its probe (flag_reprobe), so the
# next measure_device probes again, keeping the better.
REPROBE_FACTOR = 1.5


def flag_reprobe(probe_key, reason):
    """Mark a cached probe to be measured again at its next use. -> whether it was marked."""
    cache = read_probes()
    if probe_key in cache:
        cache[probe_key]['reprobe'] = reason
        with contextlib.suppress(OSError):
            save_json(cache_path(), cache)
            return True
    return False


# --------------------------------------------------------------------------------------------------
# Ledger 1: parameters, exact: the tensors model.py builds (== sum(p.numel())), from config.PARTS'
# rows (the book's closed form: book_params). Every block of a kind (dense; MoE) has the same
# tensors, so the sums count one and multiply (tensor_copies): a 1e9-layer model in milliseconds.

# the bill's group of a tensor, by its module: outside the blocks, and in one (QK-norm's: 'attn')
ROOT_PARTS = {'tok_emb': 'embedding', 'pos_emb': 'position', 'lm_head': 'output', 'norm_f': 'norms'}
BLOCK_PARTS = {'attn': 'attention', 'mlp': 'ffn', 'attn_norm': 'norms', 'mlp_norm': 'norms'}
BILL_PARTS = ('embedding', 'position', 'attention', 'ffn', 'norms', 'output')


def block_shapes(model, i):
    """(name, shape) of block i's tensors as model.Block registers them: norms, attention (and its
    QK-norm's), FFN (the MLP row's, or an MoE's router, experts and shared experts)."""
    H, block, norm = model.n_embd, f'blocks.{i}', model.part('norm').shapes(model)
    shapes = [(f'{block}.attn_norm.{n}', s) for n, s in norm]
    shapes += [(f'{block}.attn.{n}', s) for n, s in model.part('attention').shapes(model)]
    shapes += [(f'{block}.attn.qk_norm.{n}', s) for n, s in model.part('qk_norm').shapes(model)]
    shapes += [(f'{block}.mlp_norm.{n}', s) for n, s in norm]
    if i < model.n_layer - model.moe_layers:
        return shapes + [(f'{block}.mlp.{n}', s) for n, s in model.part('mlp').shapes(model)]
    E, S = model.expert_hidden, model.n_shared_experts * model.expert_hidden
    shapes += [(f'{block}.mlp.router.weight', (model.n_experts, H))]
    experts = [(f'experts.{j}', E) for j in range(model.n_experts)] + ([('shared', S)] if S else [])
    for name, width in experts:
        shapes += [(f'{block}.mlp.{name}.{n}', s) for n, s in expert_shapes(model, width)]
    return shapes


def root_shapes(model):
    """-> ((name, shape)s before the blocks: the embeddings; after: the final norm and lm_head)."""
    H, V = model.n_embd, model.vocab_size
    positions = [(f'pos_emb.{n}', s) for n, s in model.part('positions').shapes(model)]
    final = [(f'norm_f.{n}', s) for n, s in model.part('norm').shapes(model)]
    lm_head = [] if model.tie_embeddings else [('lm_head.weight', (V, H))]
    return [('tok_emb.weight', (V, H))] + positions, final + lm_head


def block_kinds(model):
    """-> [(the kind's first block, its number of blocks)]: the dense blocks, then the MoE ones."""
    dense = model.n_layer - model.moe_layers
    return [(first, n) for first, n in ((0, dense), (dense, model.moe_layers)) if n]


def parameter_shapes(model):
    """(name, shape) of every tensor in model.named_parameters()' order (a tied lm_head is the
    embedding's own tensor, listed once): as long as the model, so the sums read tensor_copies."""
    head, tail = root_shapes(model)
    return head + [shape for i in range(model.n_layer) for shape in block_shapes(model, i)] + tail


def tensor_copies(model):
    """(name, shape, copies): parameter_shapes with each kind of block's tensors once (named for its
    first block), copies the blocks of that kind."""
    head, tail = root_shapes(model)
    blocks = [(n, s, k) for first, k in block_kinds(model) for n, s in block_shapes(model, first)]
    return [(n, s, 1) for n, s in head] + blocks + [(n, s, 1) for n, s in tail]


def count_params(model):
    """Parameters by part. 'matmul': the Linear weights, lm_head's even when tied (the lookup is
    free, the projection not); 'blocks_matmul' those in the blocks; 'active' and 'blocks_matmul'
    leave out the routed experts a token does not visit (Ledger MoE; the _total keys keep them)."""
    counts, blocks_matmul = dict.fromkeys(BILL_PARTS, 0), 0
    for name, shape, copies in tensor_copies(model):
        in_block = name.startswith('blocks.')
        part = BLOCK_PARTS[name.split('.')[2]] if in_block else ROOT_PARTS[name.split('.')[0]]
        counts[part] += copies * math.prod(shape)
        if in_block and len(shape) == 2:
            blocks_matmul += copies * math.prod(shape)
    moe, M, VH = moe_params(model), model.moe_layers, model.vocab_size * model.n_embd
    counts['per_layer'] = sum(math.prod(s) for _, s in block_shapes(model, 0))
    counts['blocks_matmul_total'] = blocks_matmul
    counts['total'] = sum(counts[k] for k in BILL_PARTS)
    counts['active'] = counts['total'] - M * moe['idle']
    counts['blocks_matmul'] = blocks_matmul - M * moe['idle_matmul']  # the FLOPs count these
    counts['matmul'] = counts['blocks_matmul'] + VH
    counts['matmul_total'] = blocks_matmul + VH
    counts['moe_layer'], counts['moe_layer_active'] = moe['layer'], moe['layer'] - moe['idle']
    ffn = [math.prod(s) for _, s in model.part('mlp').shapes(model) if len(s) == 2]
    counts['ffn_matmul'], counts['ffn_last_matmul'] = sum(ffn), ffn[-1]
    return counts


def book_params(model):
    """The book's closed form for a Llama (RMSNorm, SwiGLU, no biases, untied), GQA's k and v
    narrower (4H^2 -> 2H^2 + 2H*kv_width): test_parts.py holds it equal to count_params."""
    H, V, L, F = model.n_embd, model.vocab_size, model.n_layer, model.ffn_width
    kv_width = model.kv_heads * model.head_dim
    return 2 * V * H + H + L * (2 * H * H + 2 * H * kv_width + 3 * H * F + 2 * H)


# --------------------------------------------------------------------------------------------------
# Ledger 2: a token's FLOPs forward + backward, each convention's (BOOK.md, Derivations: Ledger 2)


def flops_per_token(model, recompute=False, compiled_blocks=False):
    """Training FLOPs per token by convention. compiled_blocks: each block torch.compile'd alone,
    so the recompute reruns the whole block."""
    params = count_params(model)
    L, H = model.n_layer, model.n_embd
    keys = model.part('attention').keys(model)  # keys a query attends to (config.PARTS)
    attention = 12 * L * H * keys['model']
    kernel = 12 * L * H * keys['kernel']  # what the kernel computes, masked keys included
    executed = 6 * params['matmul'] + kernel
    # the rerun skips a dense block's last FFN matmul, an MoE layer's shared experts' down_proj
    # (H x n_shared * expert_hidden: the routed experts' outputs are saved; Ledger MoE)
    M, shared = model.moe_layers, model.n_shared_experts * model.expert_hidden
    skipped = 0 if compiled_blocks else (L - M) * params['ffn_last_matmul'] + M * H * shared
    rerun_matmul = params['blocks_matmul'] - skipped
    return {
        'book': (8 if recompute else 6) * params['active'],  # P: the active parameters
        'matmul': 6 * params['matmul'] + attention,  # model FLOPs: what MFU counts (PaLM)
        'matmul_causal': 6 * params['matmul'] + round(12 * L * H * keys['causal']),
        'nanogpt': 6 * (params['active'] - params['position']) + attention,
        # what the GPU executes; with recompute + the blocks' forward again
        'hardware': executed + 2 * rerun_matmul + kernel // 3 if recompute else executed,
        'attention': attention,
        'attention_share': attention / (6 * params['blocks_matmul']),
        'attention_share_approx': keys['model'] / (6 * H),
        'keys_symbol': model.part('attention').keys_symbol,
    }


# --------------------------------------------------------------------------------------------------
# Ledger 3: days = total FLOPs / (n_gpu * peak * MFU) / 86400 (the book's LLaMA-65B: BOOK_EXAMPLES)


def train_days(total_flops, n_gpu, peak_flops, mfu):
    return total_flops / (n_gpu * peak_flops * mfu) / SECONDS_PER_DAY


# --------------------------------------------------------------------------------------------------
# Ledger 4a: model states, the book's accounting (mixed precision + Adam; ZeRO, Rajbhandari et al.
# 2020): 16 bytes a parameter, sharded as BOOK_STATES says (BOOK.md, Ledger 4).

BOOK_STATES = {'ddp': '16P', 'zero1': '4P + 12P/N', 'zero2': '2P + 14P/N', 'fsdp': '16P/N (ZeRO-3)'}


def model_state_bytes(n_params, parallel='ddp', n_gpu=1):
    """The book's bytes of weights, gradients and optimizer states per GPU (BOOK_STATES)."""
    N = n_gpu
    shards = {'ddp': (1, 1, 1), 'zero1': (1, 1, N), 'zero2': (1, N, N), 'fsdp': (N, N, N)}
    if parallel not in shards:
        raise ConfigError(f"parallel must be one of {', '.join(shards)}, not '{parallel}'")
    # bytes a parameter: 16-bit weights 2 and gradients 2, fp32 master weights, Adam's m and v 12
    parts = zip(('weights', 'grads', 'optimizer'), (2, 2, 12), shards[parallel])
    states = {part: size * n_params / over for part, size, over in parts}
    states['total'] = sum(states.values())
    return states


# --------------------------------------------------------------------------------------------------
# Ledger 4a': model states as train.py holds them, exact to the byte on each rank (test_memory.py;
# BOOK.md, Derivations: Ledger 4a', Muon's model states and step)


def zero1_partition(model, n_gpu, optimizer, value):
    """Per rank, the sum of value(name, shape) over the tensors ZeroRedundancyOptimizer gives it as
    train.py builds it: in config.param_groups' order, each group's tensors largest first (in the
    parameters' order on a tie), each to the rank with the fewest elements so far. A tensor of each
    size at a time, over the root's tensors and then each kind of block's (zero1_deal)."""
    head, tail = root_shapes(model)
    kinds = [(head, 1)] + [(block_shapes(model, i), k) for i, k in block_kinds(model)] + [(tail, 1)]
    pairs = [(name, shape) for name, shape, _ in tensor_copies(model)]
    loads, sums = [0] * n_gpu, [0] * n_gpu
    for _, _, names in config.param_groups(optimizer, pairs):
        group = set(names)
        for size in sorted({math.prod(s) for n, s in pairs if n in group}, reverse=True):
            for shapes, blocks in kinds:
                run = [value(n, s) for n, s in shapes if n in group and math.prod(s) == size]
                zero1_deal(run, blocks, size, loads, sums)
    return sums


def zero1_deal(values, blocks, size, loads, sums):
    """ZeRO-1's greedy over `blocks` copies of a run of tensors of one size (their values, in
    order): each to the rank with the fewest elements (the first on a tie), one at a time while
    their loads lie in different multiples of `size`. From then on the ranks take one each in
    turn, ordered by their loads' remainders, for good: the rest in closed form (a bounded loop)."""
    n, total, dealt = len(loads), len(values) * blocks, 0
    while dealt < total and len({load // size for load in loads}) > 1:
        rank = loads.index(min(loads))
        loads[rank] += size
        sums[rank] += values[dealt % len(values)]
        dealt += 1
    order = sorted(range(n), key=lambda rank: (loads[rank] % size, rank))
    period = math.lcm(n, len(values))
    # the tensors dealt + c, + c + period, ...: the same rank, the same tensor of the run
    for c in range(min(period, total - dealt)):
        times = (total - dealt - c - 1) // period + 1
        loads[order[c % n]] += times * size
        sums[order[c % n]] += times * values[(dealt + c) % len(values)]


def optimizer_row(optimizer, name, shape):
    """The row of config.OPTIMIZERS that updates a tensor: the optimizer's, or its rest's (Muon's
    AdamW) for the tensors it does not take."""
    row = config.OPTIMIZERS[optimizer]
    return config.OPTIMIZERS[row.rest] if row.takes and not row.takes(name, shape) else row


def optimizer_step_flops(model, train, n_gpu):
    """Matmul FLOPs of an optimizer step (Muon's Newton-Schulz; AdamW none) on each rank: over every
    tensor (DDP), ZeRO-1's own, or under ZeRO-2 and FSDP2 the matrices each rank owns."""

    def flops(name, shape):
        return optimizer_row(train.optimizer, name, shape).step_flops(shape, train)

    if n_gpu > 1 and train.parallel == 'zero1':
        return zero1_partition(model, n_gpu, train.optimizer, flops)
    if sharded(train.parallel, n_gpu):  # the rest's (AdamW's) step: no matmul
        whole = config.OPTIMIZERS[train.optimizer].step_flops
        ranks = owned_matrices(model, train.optimizer, n_gpu)
        return [sum(mine * whole(shape, train) for shape, mine in owned) for owned in ranks]
    return [sum(k * flops(n, s) for n, s, k in tensor_copies(model))] * n_gpu


def whole_matrix_shapes(model, optimizer):
    """-> {shape: matrices} of the tensors an optimizer row needs whole (its `gathers`: Muon's), in
    the parameters' order of first appearance: config.muon_blocks's order."""
    row, counts = config.OPTIMIZERS[optimizer], {}
    for name, shape, copies in tensor_copies(model):
        if row.gathers and optimizer_row(optimizer, name, shape) is row:
            counts[tuple(shape)] = counts.get(tuple(shape), 0) + copies
    return counts


def owned_matrices(model, optimizer, n_gpu):
    """Per rank, [(shape, matrices it orthogonalises)] under ZeRO-2 and FSDP2: config.muon_blocks's
    dealing (a shape's c matrices to ranks turn, turn + 1, ... mod N) in closed form."""
    owned, turn = [[] for _ in range(n_gpu)], 0
    for shape, c in whole_matrix_shapes(model, optimizer).items():
        for rank, mine in enumerate(owned):
            mine.append((shape, c // n_gpu + ((rank - turn) % n_gpu < c % n_gpu)))
        turn += c
    return owned


def fsdp_rows(rows, n_gpu, rank):
    """-> (padded, real) rows of a tensor's first dimension on `rank` under FSDP2 (torch.chunk)."""
    chunk = -(-rows // n_gpu)
    return chunk, max(0, min(chunk, rows - rank * chunk))


def fsdp_padded(shape, n_gpu):
    """A tensor's elements, its rows padded to a multiple of n_gpu: what FSDP2 gathers whole."""
    return fsdp_rows(shape[0], n_gpu, 0)[0] * n_gpu * math.prod(shape[1:])


def fsdp_units(model, n_gpu):
    """-> (root, [(elements, blocks)]): FSDP2's padded elements of its root unit (embeddings, final
    norm, lm_head) and of each size of block (an MoE's outweigh its dense ones), largest first."""
    head, tail = root_shapes(model)
    units = collections.Counter()
    for first, count in block_kinds(model):
        units[sum(fsdp_padded(s, n_gpu) for _, s in block_shapes(model, first))] += count
    return sum(fsdp_padded(s, n_gpu) for _, s in head + tail), sorted(units.items(), reverse=True)


def fsdp_unit_elements(model, n_gpu):
    """-> (root, blocks): fsdp_units with every block listed, largest first."""
    root, units = fsdp_units(model, n_gpu)
    return root, [elements for elements, count in units for _ in range(count)]


def held_model_states(model, parallel, n_gpu, dtype='bfloat16', rank=0, optimizer='adamw'):
    """Bytes of weights, gradients, optimizer states and FSDP2's gathered weights (in the compute
    dtype) on `rank`, as train.py holds them; 'book' the book's figure for the same strategy."""
    tensors = tensor_copies(model)
    n_params = padded = sum(k * math.prod(s) for _, s, k in tensors)

    def state(name, shape, held=None):  # of the shape this rank holds (FSDP2: its rows)
        return optimizer_row(optimizer, name, shape).state_bytes(held or shape)

    optimizer_held, gathered = sum(k * state(n, s) for n, s, k in tensors), 0
    if n_gpu > 1 and parallel == 'zero1':
        optimizer_held = zero1_partition(model, n_gpu, optimizer, state)[rank]
    elif sharded(parallel, n_gpu):
        rows = [(*fsdp_rows(s[0], n_gpu, rank), n, s, k) for n, s, k in tensors]
        padded = sum(k * rows_padded * math.prod(s[1:]) for rows_padded, _, _, s, k in rows)
        optimizer_held = sum(k * state(n, s, (real, *s[1:])) for _, real, n, s, k in rows)
        root, units = fsdp_units(model, n_gpu)
        # zero2 keeps every block gathered, fsdp two at a time; and one block's unsharded gradients
        two = [elements for elements, count in units for _ in range(min(count, 2))][:2]
        blocks = sum(e * count for e, count in units) if parallel == 'zero2' else sum(two)
        gathered = (2 if dtype == 'bfloat16' else 4) * (root + blocks + units[0][0])
    states = dict(weights=4 * padded, grads=4 * padded, optimizer=optimizer_held, gathered=gathered)
    states['total'] = sum(states.values())
    states['book'] = model_state_bytes(n_params, parallel, n_gpu)['total']
    # MoE: the book's "16 x active parameters"; every expert's states are held all the same
    active = count_params(model)['active']
    states['book_active'] = model_state_bytes(active, parallel, n_gpu)['total']
    return states


# --------------------------------------------------------------------------------------------------
# Ledger 4b: activations, what autograd saves for backward a token, eager and compiled (4b'), each
# part's from its row of config.PARTS (BOOK.md, Derivations: Ledger 4b)


def activation_bytes(
    model,
    micro_batch,
    recompute,
    dtype_bytes=2,
    attention='flash',
    residual_bytes=4,
    fused_norm=True,
    compiled=None,
):
    """Bytes autograd holds at its peak for one device's micro-batch (the loss's buffers aside:
    logits_bytes). attention: 'flash' (the attention row's kernel) or 'math' (SDPA's math kernel);
    compiled: None (eager), 'model' (one process, DDP, ZeRO-1) or 'blocks' (FSDP2)."""
    if attention not in ('flash', 'math'):
        raise ConfigError(f"attention must be 'flash' or 'math', not '{attention}'")
    a, r, autocast = dtype_bytes, residual_bytes, dtype_bytes < residual_bytes  # bf16 matmuls
    H, L, M, T = model.n_embd, model.n_layer, model.moe_layers, model.block_size
    tokens = micro_batch * T
    if M or attention == 'math':  # the MoE routing's host read breaks the graph: eager
        compiled = None
    layer, head, ffn = saved_per_token(model, a, r, attention, fused_norm, compiled, recompute)
    # int64 ids, and a learned table's positions
    position_ids = 8 * T if model.part('positions').shapes(model) and not compiled else 0
    parts = {'token_ids': tokens * 16 + position_ids, 'head': tokens * head}
    # (layers, bytes a token saves, bf16 weight copies) of each kind: dense, MoE (Ledger MoE)
    copy, params = 2 if autocast else 0, count_params(model)
    shapes = model.part('attention').shapes(model)
    attn_weights = sum(math.prod(s) for _, s in shapes if len(s) == 2)
    kinds = [(L - M, layer, copy * (attn_weights + params['ffn_matmul']))]
    if M:
        moe = moe_activation_bytes(model, a, autocast)
        kinds.append((M, layer - ffn + moe['total'], copy * (attn_weights + params['moe_layer'])))
    kinds = [kind for kind in kinds if kind[0]]
    lm_head_copy = 2 * model.vocab_size * H if autocast else 0
    if recompute:  # lm_head's copy only: the blocks' are made again as each is rerun
        parts['block_inputs'] = tokens * L * r * H
        rerun = [tokens * (saved - r * H) + weights for _, saved, weights in kinds]
        parts['recomputed_block'], parts['bf16_weights'] = max(rerun), lm_head_copy
    else:
        parts['blocks'] = sum(n * tokens * saved for n, saved, _ in kinds)
        parts['bf16_weights'] = sum(n * weights for n, _, weights in kinds) + lm_head_copy
    parts['total'] = sum(parts.values())
    if M:  # of which (not added again): the tokens' dispatched copies and the experts' outputs
        parts['routing_buffers'] = (1 if recompute else M) * tokens * moe['dispatched']
    return parts


def saved_per_token(model, a, r, attention, fused_norm, compiled, recompute):
    """-> the bytes a token saves in a dense layer, in the head (final norm and loss), and of the
    layer's, its FFN's eager bytes (an MoE layer replaces). a, r: activation and residual bytes."""
    H, norm, mlp, loss = model.n_embd, model.part('norm'), model.part('mlp'), model.part('loss')
    if attention == 'math':  # q, k, v expanded to every head, and the softmax probabilities
        attn = a * H + 3 * a * H + a * model.n_head * model.block_size + a * H
    else:
        rows = ('attention', 'positions', 'qk_norm')
        attn = sum(model.part(row).saved(model, a, r, compiled) for row in rows)
    ffn = mlp.saved(model, a, r, False)
    eager_norm = norm.saved(model, a, r, False, fused_norm)
    # the loss keeps lm_head's input, or h's gradient (chunked)
    layer, head = 2 * eager_norm + attn + ffn, eager_norm + loss.saved(model, a, r, False)
    if compiled:
        middle = a * H if compiled == 'blocks' else r * H  # o_proj's output, or the residual after
        compiled_norm = norm.saved(model, a, r, True)
        layer = r * H + middle + 2 * compiled_norm + attn + mlp.saved(model, a, r, True)
        if compiled == 'model':  # the last residual (recomputed with recompute), the loss's own
            last = 0 if recompute else r * H
            head = last + compiled_norm + loss.saved(model, a, r, True)
    return layer, head, ffn


def logits_bytes(model, micro_batch, dtype_bytes=2, compiled=False):
    """The loss's buffers at their peak (its row's `buffers`): the full loss's micro_batch x T x V
    logits, 12 bytes each eager (nanochat's 32 x 2048 x 65536 ran out of memory on an 80 GB H100:
    one fp32 copy is 16 GiB), or the chunked loss's chunk and lm_head's gradient."""
    loss = model.part('loss')
    parts = loss.buffers(model, micro_batch * model.block_size, dtype_bytes, compiled)
    return dict(parts, total=sum(parts.values()))


# --------------------------------------------------------------------------------------------------
# Ledger 4d: the total per device = model states as held + activations + the loss's buffers + the
# runtime's own memory (an ESTIMATE on a GPU, measured on the CPU, plus torch.compile's host memory
# there), against the device's memory. (BOOK.md, Derivations: Ledger 4d)
COMPILE_HOST_BYTES = 100 * MIB
# A plan fits only with this share of the device left: the ledger's error band (within 15% on the
# CPU, test_memory.py; on a GPU the runtime's share is an ESTIMATE), so a plan it calls fitting is
# one a person can run, not one at 79.64 of 79.65 GiB. Whatever says "fits" reads memory['fits'].
HEADROOM_FRACTION = 0.05
GRAPHS = {'model': 'compiled whole', 'blocks': 'compiled block by block', None: 'eager'}


def compile_mode(train, n_gpu):
    """How train.py compiles: None (eager), 'model' (one process, DDP, ZeRO-1) or 'blocks' (each
    block alone, under FSDP2: zero2 and fsdp on more than one process)."""
    if not train.compile:
        return None
    return 'blocks' if sharded(train.parallel, n_gpu) else 'model'


def memory_per_gpu(model, train, n_gpu=None, micro_batch=None, device=None, rank=0):
    """Bytes per device by part, the total, the device's memory, the headroom, and whether it fits
    (at least HEADROOM_FRACTION of the device's memory left)."""
    n_gpu = n_gpu or train.n_gpu
    micro_batch = micro_batch or train.micro_batch
    device = device or gpu_spec(train.gpu, train.dtype)
    dtype = run_dtype(train, device)
    a = 2 if dtype == 'bfloat16' else 4
    # the residual stream: fp32 under autocast; bf16 where FSDP2 casts the weights (zero2, fsdp)
    r = 2 if a == 2 and sharded(train.parallel, n_gpu) else 4
    states = held_model_states(model, train.parallel, n_gpu, dtype, rank, train.optimizer)
    compiled = compile_mode(train, n_gpu)
    fused = device.kind != 'cpu'

    def saved(compiled=None):  # this run's graph's, and eager's printed beside it
        return activation_bytes(model, micro_batch, train.recompute, a, 'flash', r, fused, compiled)

    def loss_bytes(compiled=False):  # compiled only with the whole model (FSDP2: the blocks)
        return logits_bytes(model, micro_batch, a, compiled)['total']

    eager = saved()
    memory = {key: states[key] for key in ('weights', 'grads', 'optimizer', 'gathered')}
    memory.update(
        model_states=states['total'],
        book_model_states=states['book'],
        book_formula=BOOK_STATES[train.parallel],
        activations=saved(compiled)['total'],
        logits=loss_bytes(compiled == 'model'),
        activations_eager=eager['total'],
        logits_eager=loss_bytes(),
        graph=GRAPHS[compiled],
        overhead=device.overhead_bytes,
        compile_host=COMPILE_HOST_BYTES if compiled and device.kind == 'cpu' else 0,
        book_active_model_states=states['book_active'],
        routing_buffers=eager.get('routing_buffers', 0),
    )
    memory['allocated'] = memory['model_states'] + memory['activations'] + memory['logits']
    memory['total'] = memory['allocated'] + memory['overhead'] + memory['compile_host']
    processes = device.shared_by or (n_gpu if device.kind == 'cpu' else 1)
    memory['gpu_memory'] = device.memory_bytes // processes
    memory['headroom'] = memory['gpu_memory'] - memory['total']
    memory['headroom_needed'] = math.ceil(HEADROOM_FRACTION * memory['gpu_memory'])
    memory['fits'] = memory['headroom'] >= memory['headroom_needed']
    return memory


def max_micro_batch(model, train, n_gpu=None, device=None):
    """The largest micro-batch whose total fits, headroom kept (memory_per_gpu); 0 if none does."""
    device = device or gpu_spec(train.gpu, train.dtype)

    def fits(micro_batch):
        return memory_per_gpu(model, train, n_gpu, micro_batch, device)['fits']

    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):  # memory grows with the micro-batch: bracket, then bisect
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def gpus_for_model_states(n_params, gpu_memory_bytes):
    """The book's rule of thumb: 16P bytes sharded over N GPUs (ZeRO-3) fit, N >= 16P / memory,
    rounded up to a power of two (room for activations): 13B: 3, 4; 30B: 8; 65B: 16 (80 GB)."""
    floor = math.ceil(16 * n_params / gpu_memory_bytes)
    return floor, 2 ** math.ceil(math.log2(floor))


# --------------------------------------------------------------------------------------------------
# Ledger 5: communication, the bytes each parallel mode moves per optimizer step as train.py moves
# them, call by call, in NCCL-tests' algorithm and bus bytes (BOOK.md, Derivations: Ledger 5)

DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default, 25 MiB
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2, 'int64': 8}
BUS_FACTORS = {  # NCCL-tests' doc/PERFORMANCE.md: bus bytes = algorithm bytes x this, on N ranks
    'all_reduce': lambda n: 2 * (n - 1) / n,
    'broadcast': lambda n: 1.0,
    **dict.fromkeys(('all_gather', 'reduce_scatter', 'all_to_all'), lambda n: (n - 1) / n),
}
COLLECTIVE_FIELDS = ('what', 'op', 'dtype', 'elements', 'calls', 'phase')  # then bytes, bus_bytes


def ddp_buckets(model):
    """Elements of each DDP bucket in all-reduce order (the reducer's
    compute_bucket_assignment_by_size over the tensors in reverse: a bucket closes once its fp32
    gradients fill its cap). A row per bucket, as long as the model: ddp and zero1 on n_gpu > 1."""
    buckets, current, limit = [], 0, DDP_FIRST_BUCKET_BYTES
    for _, shape in reversed(parameter_shapes(model)):
        current += math.prod(shape)
        if current * 4 >= limit:
            buckets.append(current)
            current, limit = 0, DDP_BUCKET_BYTES
    return buckets + ([current] if current else [])


def collectives(model, parallel, n_gpu, accumulation, dtype='bfloat16', optimizer='adamw'):
    """Every collective of a step of train.py, the same on every rank, as dicts of COLLECTIVE_FIELDS
    (op: a key of BUS_FACTORS; elements: NCCL-tests' S; phase: 'step' and 'update' outside the
    micro-steps, 'forward', 'backward'), and bytes, bus_bytes a step. dtype: the compute dtype."""
    if n_gpu == 1:
        return []
    items = [
        ('loss normaliser', 'all_reduce', 'int64', 1, 1, 'step'),
        ('stop flag (host, gloo)', 'all_reduce', 'int64', 1, 1, 'step'),
    ]
    if model.n_experts:  # MoE: the tokens per expert, summed for the router bias (moe.py)
        loads = model.moe_layers * model.n_experts
        items.append(('MoE expert loads', 'all_reduce', 'float32', loads, 1, 'update'))
    if sharded(parallel, n_gpu):
        items += fsdp_collectives(model, parallel, n_gpu, accumulation, dtype, optimizer)
    else:  # DDP's buckets on the last micro-step's backward
        for i, n in enumerate(ddp_buckets(model), 1):
            items.append((f'gradients, DDP bucket {i}', 'all_reduce', 'float32', n, 1, 'backward'))
    if parallel == 'zero1':  # each tensor from its owner, a row per size
        sizes = collections.Counter()
        for _, shape, copies in tensor_copies(model):
            sizes[math.prod(shape)] += copies
        items += [
            ('updated weights, ZeRO-1 broadcast', 'broadcast', 'float32', n, count, 'update')
            for n, count in sorted(sizes.items(), reverse=True)
        ]
    rows = [dict(zip(COLLECTIVE_FIELDS, item)) for item in items]
    for row in rows:
        row['bytes'] = row['elements'] * DTYPE_BYTES[row['dtype']] * row['calls']
        row['bus_bytes'] = row['bytes'] * BUS_FACTORS[row['op']](n_gpu)
    return rows


def fsdp_collectives(model, parallel, n_gpu, accumulation, dtype, optimizer):
    """FSDP2's, every micro-step: each unit gathered in forward (fsdp: the blocks again in
    backward), its gradients reduce-scattered; then the gradient norm, and Muon's owner traffic."""
    gathered = dtype if dtype in ('bfloat16', 'float32') else 'float32'  # the policy's param_dtype
    root, units = fsdp_units(model, n_gpu)
    A = accumulation
    # a row per size of block: one for a dense model, an MoE's dense and expert blocks apart
    each = ['each block' if len(units) == 1 else f'each block of {n:,}' for n, _ in units]
    per_size = [(name, n, A * count) for name, (n, count) in zip(each, units)]
    passes = [('weights', 'all_gather', gathered, 'forward')]
    if parallel == 'fsdp':  # resharded after forward
        passes += [('weights again', 'all_gather', gathered, 'backward')]
    passes += [('gradients', 'reduce_scatter', 'float32', 'backward')]
    items = [('weights, root unit', 'all_gather', gathered, root, A, 'forward')]
    for what, op, kind, phase in passes:
        items += [(f'{what}, {name}', op, kind, n, calls, phase) for name, n, calls in per_size]
    n_tensors = sum(copies for _, _, copies in tensor_copies(model))
    items.append(('gradients, root unit', 'reduce_scatter', 'float32', root, A, 'backward'))
    items.append(('gradient norm (DTensor)', 'all_reduce', 'float32', n_tensors, 1, 'update'))
    # Muon: blocks of up to N matrices of one shape (config.muon_blocks), each block's rows to their
    # owners and back: two all-to-alls of N x ceil(rows / N) x cols, in the compute dtype
    blocks = collections.Counter()
    for shape, c in whole_matrix_shapes(model, optimizer).items():
        blocks[fsdp_padded(shape, n_gpu)] += 2 * -(-c // n_gpu)
    what = config.OPTIMIZERS[optimizer].gathers
    items += [(what, 'all_to_all', dtype, n, k, 'update') for n, k in sorted(blocks.items())[::-1]]
    return items


# Ledger 5b: seconds, an ESTIMATE until measured: a collective's bus bytes / the bus bandwidth NCCL
# reaches on the slowest link it crosses (latency left out). Across nodes, a ring per NIC (one a
# GPU, as DGX/HGX nodes have): a node's NICs add up. Where nothing is published, the line rate x
# 370/450, NCCL's efficiency on NVLink4. (BOOK.md, Ledger 5: each figure's source)


@dataclasses.dataclass(frozen=True)
class Links:
    fabric: str  # what joins the GPUs inside a node
    line_gbps: float  # its line rate per GPU and direction, GB/s (the bidirectional figure / 2)
    busbw_gbps: float  # the bus bandwidth NCCL reaches on it (nccl-tests' busbw), GB/s
    busbw_source: str
    nic: str  # the usual NIC between nodes, one per GPU
    nic_busbw_gbps: float  # what NCCL reaches through one of them, GB/s
    nic_source: str


NVLINK4_EFFICIENCY = 370 / 450
ESTIMATE = 'ESTIMATE: line rate x 370/450'
# fmt: off
NDR = ('InfiniBand NDR 400 Gb/s', 48.0,
       'NVIDIA (nccl-tests#267): 48-49 GB/s per ConnectX-7 at NDR')
HDR = ('InfiniBand HDR 200 Gb/s', 24.0,
       'NVIDIA (nccl#412): 24 GB/s per HDR NIC; x8 = 192 GB/s (nccl#812)')
NVLINK4 = Links('NVLink4 + NVSwitch, 900 GB/s bidirectional', 450, 370,
                'NVIDIA (nccl-tests#212): NVLink4 line rate 450 GB/s, NCCL ~370 busbw (~480 for '
                'all-reduce with NVLS)', *NDR)
PCIE5 = Links('PCIe Gen5 x16, 128 GB/s bidirectional (NVLink bridges join pairs at most)', 64,
              64 * NVLINK4_EFFICIENCY, ESTIMATE, *NDR)
LINKS = {  # keyed like GPUS; fabric figures from the vendors' datasheets
    'H200': NVLINK4, 'H200-NVL': PCIE5, 'H100': NVLINK4, 'H100-PCIe': PCIE5, 'H100-NVL': PCIE5,
    'A100': Links('NVLink3 + NVSwitch, 600 GB/s bidirectional', 300, 232,
                  'measured: all_reduce_perf on 8 x A100, 232.5 GB/s (nccl-tests#175)', *HDR),
    'A800': Links('NVLink3, 400 GB/s bidirectional', 200, 160,
                  'NVIDIA (nccl#412): ~160 GB/s intra-node', *HDR),
    'MI300X': Links('Infinity Fabric, 7 x 128 GB/s bidirectional', 448, 448 * NVLINK4_EFFICIENCY,
                    ESTIMATE + ' (RCCL)', *NDR),
    'B200': Links('NVLink5 + NVSwitch, 1.8 TB/s bidirectional', 900, 900 * NVLINK4_EFFICIENCY,
                  ESTIMATE, *NDR),
}
# fmt: on
GPUS_PER_NODE = 8  # an HGX/DGX board: the node count when `nodes` is 0
COMM_EXPOSED_LIMIT = 0.10  # communication "hides" while at most this share of a step waits


def topology(train, n_gpu, device):
    """-> dict: nodes, gpus_per_node, the intra- and inter-node bus bandwidths (bytes/s; None when
    unknown, unless the config gives them), their sources, and the one all ranks get (`link`'s)."""
    nodes = train.nodes or math.ceil(n_gpu / GPUS_PER_NODE)
    if nodes > n_gpu:
        raise ConfigError(
            f"nodes ({nodes}) must be at most n_gpu ({n_gpu}): each node holds at least one device"
        )
    per_node = math.ceil(n_gpu / nodes)
    # a GPU of the table, named or measured and recognised: the key its name holds (table_key)
    links = LINKS.get(table_key(device.name)) if device.kind == 'gpu' else None
    intra, intra_source = None, 'unknown: not a GPU of the table (set intra_node_busbw, GB/s)'
    inter, inter_source = None, 'unknown (set inter_node_busbw, GB/s per node)'
    if links:
        intra, intra_source = links.busbw_gbps * 1e9, links.busbw_source
        inter = per_node * links.nic_busbw_gbps * 1e9
        inter_source = f'{per_node} x {links.nic} per node: {links.nic_source}'
    if train.intra_node_busbw:
        intra, intra_source = train.intra_node_busbw * 1e9, 'intra_node_busbw (config)'
    if train.inter_node_busbw:
        inter, inter_source = train.inter_node_busbw * 1e9, 'inter_node_busbw (config), per node'
    if nodes == 1:
        busbw, link = intra, 'intra-node'
    else:  # one ring crosses both: the slower sets the pace
        busbw = None if intra is None or inter is None else min(intra, inter)
        link = 'inter-node' if busbw is None or inter < intra else 'intra-node'
    return dict(
        nodes=nodes,
        gpus_per_node=per_node,
        fabric=links.fabric if links else None,
        intra_busbw=intra,
        intra_source=intra_source,
        inter_busbw=inter if nodes > 1 else None,
        inter_source=inter_source if nodes > 1 else None,
        busbw=busbw,
        link=link,
    )


def communication(model, train, n_gpu, device, compute_step_seconds):
    """Ledger 5 for a plan: the collectives of a step, their bytes, their seconds (ESTIMATE), the
    part that does not hide under the step's compute (compute_step_seconds: Ledger 3), the bound."""
    micro_step_tokens = train.micro_batch * model.block_size * n_gpu
    accumulation = max(1, math.ceil(train.batch_tokens / micro_step_tokens))
    dtype = run_dtype(train, device)
    items = collectives(model, train.parallel, n_gpu, accumulation, dtype, train.optimizer)
    comm = dict(
        collectives=items,
        accumulation=accumulation,
        bytes=sum(i['bytes'] for i in items),
        bus_bytes=sum(i['bus_bytes'] for i in items),
        topology=topology(train, n_gpu, device),
        **dict.fromkeys(('seconds', 'exposed_seconds', 'exposed_fraction')),
        exposed_limit=COMM_EXPOSED_LIMIT,
        bound='compute',
    )
    if train.parallel == 'zero1' and n_gpu > 1:  # each rank broadcasts the tensors it owns
        owned = zero1_partition(model, n_gpu, train.optimizer, lambda _, shape: math.prod(shape))
        comm['broadcast_bytes_by_rank'] = [4 * elements for elements in owned]
    busbw = comm['topology']['busbw']
    if not items or busbw is None:
        return comm
    # the compute it can hide under: FSDP2's every micro-step, DDP's last (no_sync before)
    windows = accumulation if sharded(train.parallel, n_gpu) else 1
    hidden = windows * (compute_step_seconds / accumulation)
    comm.update(exposed_communication(items, busbw, compute_step_seconds, hidden, train.recompute))
    if comm['exposed_fraction'] > COMM_EXPOSED_LIMIT:
        comm['bound'] = comm['topology']['link']
    return comm


def exposed_communication(items, busbw, step_seconds, hidden, recompute):
    """-> seconds, exposed_seconds, exposed_fraction (each item gets its 'seconds'): a phase's
    collectives wait beyond its share of the `hidden` seconds of compute, forward 2 of the book's
    6P (2 of 8P with recompute), backward the rest."""
    forward_share = 2 / (8 if recompute else 6)
    seconds = dict.fromkeys(('step', 'update', 'forward', 'backward', 'edge'), 0.0)
    buckets = [i for i, item in enumerate(items) if 'DDP bucket' in item['what']]
    for i, item in enumerate(items):
        item['seconds'] = item['bus_bytes'] / busbw
        # nothing to hide under: the root's gather (forward's first) and reduce-scatter (backward's
        # last), DDP's last bucket (the first layers' gradients, ready as backward ends)
        edge = 'root unit' in item['what'] or (buckets and i == buckets[-1])
        seconds['edge' if edge else item['phase']] += item['seconds']
    waits = seconds['step'] + seconds['update'] + seconds['edge']
    waits += max(0.0, seconds['forward'] - hidden * forward_share)
    waits += max(0.0, seconds['backward'] - hidden * (1 - forward_share))
    fraction = waits / (step_seconds + waits)
    return dict(seconds=sum(seconds.values()), exposed_seconds=waits, exposed_fraction=fraction)


# Ledger 5c: the book's rule as a verdict, data parallelism with ZeRO/FSDP or else tensor or
# pipeline parallelism (BOOK.md, Derivations: Ledger 5c)
NOT_ENOUGH = (
    'needs tensor or pipeline parallelism, which this trainer does not do: see torchtitan '
    '(PyTorch: tensor, pipeline and context parallelism on FSDP2) or Megatron-LM (NVIDIA)'
)
PLANS = [(p, r) for p in ('ddp', 'zero1', 'zero2', 'fsdp') for r in (False, True)]  # tried in order


def pipeline_bubble(stages, micro_batches):
    return (stages - 1) / (micro_batches + stages - 1)


def compute_step_seconds(model, train, n_gpu, device):
    """A step's tokens' compute alone: the hardware FLOPs of batch_tokens at the assumed MFU."""
    compiled_blocks = compile_mode(train, n_gpu) == 'blocks'
    hardware = flops_per_token(model, train.recompute, compiled_blocks)['hardware']
    return train.batch_tokens * hardware / (n_gpu * device.peak_flops * train.mfu)


def plan_check(model, train, n_gpu, device):
    """-> (fits, exposed fraction or None, memory total, memory of the device) for one plan."""
    memory = memory_per_gpu(model, train, n_gpu, device=device)
    step = compute_step_seconds(model, train, n_gpu, device)
    exposed_fraction = communication(model, train, n_gpu, device, step)['exposed_fraction']
    return memory['fits'], exposed_fraction, memory['total'], memory['gpu_memory']


def passing_plan(model, train, n_gpu, device, sequences):
    """The flags of the first of PLANS, at the largest micro-batch that fits, that fits and hides
    its communication; else None."""
    for parallel, recompute in PLANS:
        trial = dataclasses.replace(train, parallel=parallel, recompute=recompute)
        micro_batch = min(max_micro_batch(model, trial, n_gpu, device), sequences // n_gpu)
        if not micro_batch:
            continue
        trial = dataclasses.replace(trial, micro_batch=micro_batch)
        ok, exposed_fraction, _, _ = plan_check(model, trial, n_gpu, device)
        if ok and (exposed_fraction is None or exposed_fraction <= COMM_EXPOSED_LIMIT):
            return f'--parallel={parallel} --recompute={recompute} --micro_batch={micro_batch}'
    return None


def parallelism_verdict(model, train, n_gpu, device, fits, exposed_fraction):
    """-> dict: enough (bool), verdict (one line), reasons, suggestion (a passing plan's flags)."""
    sequences = train.batch_tokens // model.block_size
    hides = exposed_fraction is None or exposed_fraction <= COMM_EXPOSED_LIMIT
    if sequences >= n_gpu and fits and hides:
        verdict = 'data parallelism is enough' if n_gpu > 1 else 'one device: nothing to spread'
        return dict(enough=True, verdict=verdict, reasons=[], suggestion=None)
    reasons = []
    if sequences < n_gpu:
        need = 'data parallelism needs one a GPU'
        reasons.append(f'the global batch has {sequences} sequences for {n_gpu} GPUs: {need}')
    if not fits:
        reasons.append('the plan does not fit in memory')
    if not hides:
        limit = f'(limit {COMM_EXPOSED_LIMIT:.0%})'
        reasons.append(f'{exposed_fraction:.0%} of a step waits on communication {limit}')
    best = passing_plan(model, train, n_gpu, device, sequences) if sequences >= n_gpu else None
    if best:
        verdict = f'data parallelism is enough with {best}'
        return dict(enough=True, verdict=verdict, reasons=reasons, suggestion=best)
    if sequences >= n_gpu:
        trial = dataclasses.replace(train, parallel='fsdp', recompute=True, micro_batch=1)
        _, exposed_fraction, total, memory = plan_check(model, trial, n_gpu, device)
        shown = f'{total / GIB:,.1f} of {memory / GIB:,.1f} GiB per GPU'
        if exposed_fraction is not None:
            shown += f', {exposed_fraction:.0%} of a step exposed communication'
        reasons.append(f'fully sharded (fsdp, recompute, micro-batch 1): {shown}')
    micro_batches = train.batch_tokens // (train.micro_batch * model.block_size * n_gpu)
    bubble = pipeline_bubble(4, max(1, micro_batches))
    return dict(enough=False, bubble=bubble, verdict=NOT_ENOUGH, reasons=reasons, suggestion=None)


# Ledger MoE: FLOPs, days, cost and activations scale with the ACTIVE parameters, the model states
# with the TOTAL (BOOK.md, Derivations: Ledger MoE)


def expert_shapes(model, width):
    """An expert's (name, shape)s: the mlp row's (a SwiGLU's, a ReLU²'s...) at H' = width."""
    return model.part('mlp').shapes(dataclasses.replace(model, ffn_hidden=width))


def moe_params(model):
    """An MoE layer's FFN parameters: 'layer' all, 'idle' the routed experts a token does not visit
    ('idle_matmul' their matrices), 'router' the router's. All 0 for a dense model."""
    if not model.n_experts:
        return dict.fromkeys(('layer', 'idle', 'idle_matmul', 'router'), 0)
    n, k, H, E = model.n_experts, model.top_k, model.n_embd, model.expert_hidden

    def size(width, matrices=False):  # a SwiGLU's 3HE, a GELU's or ReLU²'s 2HE (+ biases)
        shapes = expert_shapes(model, width) if width else []
        return sum(math.prod(s) for _, s in shapes if len(s) == 2 or not matrices)

    layer = n * H + n * size(E) + size(model.n_shared_experts * E)
    idle = {'idle': (n - k) * size(E), 'idle_matmul': (n - k) * size(E, matrices=True)}
    return {'layer': layer, **idle, 'router': n * H}


def moe_activation_bytes(model, a, autocast):
    """Bytes an MoE layer's FFN saves a token (eager, moe.py), for the dense FFN's; a: activation
    bytes, k routed experts a token: inputs a*H (the router's and the shared experts'; under
    autocast those keep their own bf16 copy, a*H more); router: fp32 affinities 4n, the chosen ids
    (int64) 8k, chosen affinities and their sum 4k + 4, gates 4k; dispatched: each token copied to
    its k experts a*k*H and their outputs back a*k*H, the two gathers' ids 8k each; experts: the mlp
    row's eager bytes at width E less its input (counted above): a SwiGLU's 4a*E (gate|up,
    silu(gate), the product), a ReLU²'s 2a*E; the shared ones' at width s*E."""
    n, k, H, E = model.n_experts, model.top_k, model.n_embd, model.expert_hidden
    shared = model.n_shared_experts * E

    def expert(width):  # one expert's saved bytes a token without its input
        at_width = dataclasses.replace(model, ffn_hidden=width)
        return model.part('mlp').saved(at_width, a, a, False) - a * H if width else 0

    parts = {
        'inputs': a * H * (2 if autocast and shared else 1),
        'router': 4 * n + 8 * k + 4 * k + 4 + 4 * k,
        'dispatched': 2 * a * k * H + 16 * k,
        'experts': k * expert(E) + expert(shared),
    }
    parts['total'] = sum(parts.values())
    return parts


# --------------------------------------------------------------------------------------------------
# Data and tokens (BOOK.md, Data and tokens; uint16 while vocab <= 65,536, where the book says <; a
# bf16 export 2P bytes). A fitted L(N, D) = E + A/N^alpha + B/D^beta is for ITS data and tokenizer:
# the curve's shape, not our nats.

CHINCHILLA_TOKENS_PER_PARAM = 20
CHINCHILLA_FITS = {  # Hoffmann et al. 2022; Besiroglu et al. (Epoch AI) 2024
    'hoffmann2022': dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),
    'epoch2024': dict(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658),
}


def chinchilla_loss(n_params, n_tokens, fit='hoffmann2022'):
    c = CHINCHILLA_FITS[fit]
    return c['E'] + c['A'] / n_params ** c['alpha'] + c['B'] / n_tokens ** c['beta']


def token_bytes(vocab_size):
    return 2 if vocab_size <= 2**16 else 4


# The share of the positions that carry loss (ul2's: 0.40 by default); compute counts every one
# (BOOK.md, Derivations: The share of the positions that carry loss)
UL2_RATES = tuple(config.DEFAULTS[f'ul2_{d}_rate'] for d in 'srx')


def loss_fraction(objective, ul2_rates=UL2_RATES):
    """The expected share of the positions whose target carries loss under `objective`; ul2_rates:
    the shares of the fragments given UL2's S, R and X denoisers."""
    if objective != 'ul2':
        return {'clm': 1.0, 'fim': 1.0, 'prefix_lm': 0.5}[objective]

    def share(denoisers):  # a fragment given R or X takes one of its settings uniformly
        return sum((r + r / mu) / (1 + 2 * r / mu) for mu, r in denoisers) / len(denoisers)

    s_rate, r_rate, x_rate = ul2_rates
    return s_rate * 0.5 + r_rate * share(config.R_DENOISERS) + x_rate * share(config.X_DENOISERS)


def data_ledger(
    n_params, vocab_size, train_tokens, dataset_tokens=0, trained_fraction=1.0, optimizer_bytes=None
):
    """Tokens per parameter against Chinchilla, the dataset, storage, checkpoints, loss fits.
    trained_fraction: loss_fraction; optimizer_bytes: the optimizer's states a checkpoint holds
    beside the fp32 weights (None: AdamW's m and v, 8P)."""
    stored_tokens = dataset_tokens or train_tokens
    chinchilla_tokens = CHINCHILLA_TOKENS_PER_PARAM * n_params
    optimizer_bytes = 8 * n_params if optimizer_bytes is None else optimizer_bytes
    expected = {fit: chinchilla_loss(n_params, train_tokens, fit) for fit in CHINCHILLA_FITS}
    return {
        'train_tokens': train_tokens,
        'loss_fraction': trained_fraction,
        'loss_tokens': train_tokens * trained_fraction,
        'tokens_per_param': train_tokens / n_params,
        'chinchilla_tokens': chinchilla_tokens,
        'chinchilla_multiple': train_tokens / chinchilla_tokens,
        'chinchilla_params_for_tokens': train_tokens / CHINCHILLA_TOKENS_PER_PARAM,
        'dataset_tokens': dataset_tokens or None,
        'enough_data': dataset_tokens >= train_tokens if dataset_tokens else None,
        'epochs': train_tokens / dataset_tokens if dataset_tokens else None,
        'token_bytes': token_bytes(vocab_size),
        'shard_bytes': stored_tokens * token_bytes(vocab_size),
        'parquet_bytes_low': stored_tokens * 3,
        'parquet_bytes_high': stored_tokens * 4,
        'checkpoint_bytes': 4 * n_params + optimizer_bytes,
        'export_bytes': 2 * n_params,
        'expected_loss': expected,
        'fits': CHINCHILLA_FITS,
    }


# --------------------------------------------------------------------------------------------------
# A mixture of data folders (mixture.py): GPT-3's table (Brown et al. 2020, Table 2.2): each
# source's sequences drawn by the run's own schedule, x block_size, and the epochs over its folder's
# train tokens (meta.json). Muennighoff et al. 2023 (Scaling Data-Constrained Language Models):
# repeated tokens are worth about as much as new ones up to ~4 epochs, nearly nothing by ~40.
REPEAT_EPOCHS = 4
SOURCE_FIELDS = ('name', 'folder', 'weight', 'sequences', 'tokens', 'dataset_tokens', 'epochs')
SOURCE_FIELDS += ('repeats_too_often', 'shard_bytes')  # a source's row in mixture_ledger


def folder_meta(folder):
    """A data folder's meta.json, or None before prepare.py has finished there."""
    try:
        meta = load_json(os.path.join(folder, 'meta.json'))
        return meta if isinstance(meta.get('train_tokens'), int) else None
    except (OSError, ValueError, AttributeError):
        return None


def mixture_ledger(model, train, sequences):
    """Per source, a row of SOURCE_FIELDS over the run's `sequences` (predict's planned steps x
    batch_tokens / block_size: a batch ramp lowers it by less than a step); the shards' bytes are
    the drawn tokens' while the folder is not made."""
    # the run's schedule (standard library too); imported here: a one-folder ledger needs none
    from ledgergpt import mixture

    schedule = mixture.Schedule(train.data, train.seed)
    rows = []
    sources = zip(schedule.names, schedule.folders, schedule.weights, schedule.drawn(sequences))
    for name, folder, weight, drawn in sources:
        meta = folder_meta(folder)
        tokens = drawn * model.block_size
        dataset = meta['train_tokens'] if meta else None
        epochs = tokens / dataset if dataset else None
        stored = meta['train_tokens'] + meta.get('val_tokens', 0) if meta else tokens
        shard_bytes = stored * token_bytes(model.vocab_size)
        repeats = epochs is not None and epochs > REPEAT_EPOCHS
        row = (name, folder, weight, drawn, tokens, dataset, epochs, repeats, shard_bytes)
        rows.append(dict(zip(SOURCE_FIELDS, row)))
    return {'period': schedule.period, 'sources': rows, 'repeat_epochs': REPEAT_EPOCHS}


# --------------------------------------------------------------------------------------------------
# The whole ledger for a config, as one JSON-able dict (train.py writes it to out_dir/ledger.json).


def step_compute(model, train, n_gpu, device):
    """-> (FLOPs a token, the optimizer's a step on each rank, their seconds, tokens/s of compute).
    train.mfu is the share of peak spent on matmuls, recomputation included ('hardware' FLOPs); MFU
    proper (PaLM, train.py's) counts the model's ('matmul'): lower by matmul / hardware with
    recompute (LLaMA-7B: 1 / 1.33). The optimizer's follow, at the same MFU, on the busiest rank."""
    compiled_blocks = compile_mode(train, n_gpu) == 'blocks'  # train.py's build_model
    flops = flops_per_token(model, train.recompute, compiled_blocks)
    optimizer_flops = optimizer_step_flops(model, train, n_gpu)
    optimizer_seconds = max(optimizer_flops) / (device.peak_flops * train.mfu)
    step_seconds = compute_step_seconds(model, train, n_gpu, device) + optimizer_seconds
    return flops, optimizer_flops, optimizer_seconds, train.batch_tokens / step_seconds


def run_length(train, tokens_per_s):
    """-> (train, tokens, steps): train_minutes' whole batches (at least one) at tokens_per_s, or
    train_tokens, capped by max_steps."""
    if train.train_minutes:
        batches = max(1, int(train.train_minutes * 60 * tokens_per_s // train.batch_tokens))
        train = dataclasses.replace(train, train_tokens=batches * train.batch_tokens)
    tokens = min(train.train_tokens, train.max_steps * train.batch_tokens or math.inf)
    return train, tokens, math.ceil(tokens / train.batch_tokens)


def run_data(model, train, n_params, tokens):
    """-> {'data': the run's data ledger, 'mixture': a mixture's per source, else None}."""
    optimizer_bytes = None  # Muon's momentum + AdamW's m, v for the rest; AdamW's alone: 12P
    if train.optimizer != 'adamw':
        optimizer_bytes = held_model_states(model, 'ddp', 1, optimizer=train.optimizer)['optimizer']
    fraction = loss_fraction(train.objective, [getattr(train, f'ul2_{d}_rate') for d in 'srx'])
    data = data_ledger(
        n_params, model.vocab_size, tokens, train.dataset_tokens, fraction, optimizer_bytes
    )
    if not config.is_mixture(train.data):
        return {'data': data, 'mixture': None}
    sequences = math.ceil(tokens / train.batch_tokens) * train.batch_tokens // model.block_size
    return {'data': data, 'mixture': mixture_ledger(model, train, sequences)}


def predict(model, train, n_gpu=None, device=None):
    """Every sum of the ledger for a plan: n_gpu (train.n_gpu) of `device` (the config's gpu)."""
    n_gpu = n_gpu or train.n_gpu
    micro_step_tokens = config.tokens_per_micro_step(model, train, n_gpu)
    device = device or gpu_spec(train.gpu, train.dtype)
    flops, optimizer_flops, optimizer_seconds, compute_tokens_per_s = step_compute(
        model, train, n_gpu, device
    )
    memory = memory_per_gpu(model, train, n_gpu, device=device)
    # Ledger 5: a step is its compute plus the communication that does not hide under it (ESTIMATE)
    comm = communication(model, train, n_gpu, device, train.batch_tokens / compute_tokens_per_s)
    slowdown = 1 + (comm['exposed_seconds'] or 0) / (train.batch_tokens / compute_tokens_per_s)
    tokens_per_s = compute_tokens_per_s / slowdown
    train, tokens, steps = run_length(train, tokens_per_s)
    hardware_flops_per_s = n_gpu * device.peak_flops * train.mfu
    compute_seconds = tokens * flops['hardware'] / hardware_flops_per_s + steps * optimizer_seconds
    days = compute_seconds / SECONDS_PER_DAY * slowdown
    fits, exposed = memory['fits'], comm['exposed_fraction']
    params = count_params(model)
    return {
        'model': dataclasses.asdict(model),
        'train': dataclasses.asdict(train),
        'gpu': dataclasses.asdict(device),
        'n_gpu': n_gpu,
        'dtype': run_dtype(train, device),
        'params': params,
        'flops_per_token': flops,
        'compiled_blocks': compile_mode(train, n_gpu) == 'blocks',
        'tokens': tokens,
        'steps': steps,
        'grad_accum': train.batch_tokens // micro_step_tokens,
        'total_flops': tokens * flops['hardware'] + steps * sum(optimizer_flops),
        'optimizer_flops_per_step': max(optimizer_flops),  # on the busiest rank
        'optimizer_flops_rank0': optimizer_flops[0],  # live_ledger.measure_first_step's
        'optimizer_flops': steps * sum(optimizer_flops),  # the run's, every rank's
        'optimizer_step_seconds': optimizer_seconds,
        'model_flops': tokens * flops['matmul'],
        'book_flops': tokens * flops['book'],
        'mfu_assumed': train.mfu,
        'mfu': tokens_per_s * flops['matmul'] / (n_gpu * device.peak_flops),
        'tokens_per_s': tokens_per_s,
        'step_seconds': train.batch_tokens / tokens_per_s,
        'days': days,
        'days_compute': compute_seconds / SECONDS_PER_DAY,
        'tokens_per_s_compute': compute_tokens_per_s,
        'comm': comm,
        'parallelism': parallelism_verdict(model, train, n_gpu, device, fits, exposed),
        'days_book': train_days(tokens * flops['book'], n_gpu, device.peak_flops, train.mfu),
        'gpu_hours': days * 24 * n_gpu,
        'cost_usd': days * 24 * n_gpu * train.usd_per_gpu_hour,
        'memory': memory,
        'memory_per_gpu_bytes': memory['total'],
        'fits': memory['fits'],
        'max_micro_batch': max_micro_batch(model, train, n_gpu, device),
        **run_data(model, train, params['total'], tokens),
    }


# --------------------------------------------------------------------------------------------------
# The book's worked examples (BOOK.md), recomputed and compared at the book's precision (a format
# spec; '>' for a bound): `ledger.py --book` prints them, test_ledger.py checks every one.
LLAMA_7B = ModelConfig(  # a llama
    n_layer=32, n_head=32, n_embd=4096, ffn_hidden=11008, vocab_size=32000, block_size=2048
)
BOOK, NOTE = 'the book, BOOK.md', 'the planning note, BOOK.md'
H200, A800, A100 = GPUS['H200'], GPUS['A800'], GPUS['A100']
LLAMA_65B_FLOPS = 8 * 1.4e12 * 6.5e10  # 8CP


def seed_days(params, tokens):
    """The planning note's sum: 6ND on one H200 at MFU 0.40."""
    return train_days(6 * params * tokens, 1, H200.peak_flops, 0.40)


def book_totals():
    """LLaMA-7B on 2 x A800 (ZeRO-3): model states, and the total with the book's activation,
    softmax and other figures as given (its GB are GiB, as its 50.20 is)."""
    states = model_state_bytes(count_params(LLAMA_7B)['total'], 'fsdp', 2)['total'] / GIB
    return states, states + 6.20 + 3.91 + 6


# the planning note's runs on one H200: (params, tokens, its figure as written, value, precision)
SEED_RUNS = [
    (0.76e9, 25e9, '~3.3', 3.3, '.2g'),
    (1.3e9, 26e9, '5.93 (~6)', 5.93, '.3g'),
    (1.3e9, 50e9, '11.4 (~11)', 11.4, '.3g'),
    (7e9, 140e9, '~172', 172, '.3g'),
    (13e9, 260e9, '593 (~590)', 593, '.3g'),
]
# the book's figure as written, its value, the ledger's value (a function), the precision
EXAMPLE_FIELDS = tuple('section what formula book book_value value precision source'.split())
SEED_COST = f'($3-4: {seed_days(1.3e9, 26e9) * 72:.0f}-{seed_days(1.3e9, 26e9) * 96:.0f})'
# fmt: off
BOOK_EXAMPLES = [
    ('Ledger 1', 'LLaMA-7B parameters',
     "2VH + H + L(4H^2 + 3HH' + 2H), V 32000, L 32, H 4096, H' 11008", '6,738,415,616', 6738415616,
     lambda: count_params(LLAMA_7B)['total'], ',d', BOOK + '; LLaMA, Touvron et al. 2023'),
    ('Ledger 1', 'LLaMA-7B: share of params in linear layers', 'N_matmul / P (book: > 95%)',
     '> 95%', 0.95,
     lambda: count_params(LLAMA_7B)['matmul'] / count_params(LLAMA_7B)['total'], '>', BOOK),
    ('Ledger 2', 'LLaMA-7B on 1B tokens', '6 x P x C', '4.04e19', 4.04e19,
     lambda: 6 * count_params(LLAMA_7B)['total'] * 1e9, '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B training FLOPs', '8CP, C 1.4e12, P 6.5e10 (recompute)', '7.28e23',
     7.28e23, lambda: LLAMA_65B_FLOPS, '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B seconds', '8CP / (2048 x 2e14 effective)', '1.78e6', 1.78e6,
     lambda: LLAMA_65B_FLOPS / (2048 * 2e14), '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B days (paper: 21)', 'seconds / 86400', '20.6', 20.6,
     lambda: train_days(LLAMA_65B_FLOPS, 2048, A100.peak_flops, 2e14 / A100.peak_flops), '.3g',
     BOOK + '; LLaMA, Touvron et al. 2023: 21 days'),
    *[('Ledger 3', f'one H200: {n / 1e9:g}B params, {d / 1e9:g}B tokens',
       '6ND / (989e12 x 0.40) / 86400', book, value, partial(seed_days, n, d), precision, NOTE)
      for n, d, book, value, precision in SEED_RUNS],
    ('Ledger 3', 'cost of the 1.3B/26B run, USD', f'days x 24 x $3.5/H200-hour {SEED_COST}',
     '~$500', 500, lambda: seed_days(1.3e9, 26e9) * 24 * 3.5, '.1g', NOTE),
    ('Ledger 4', 'LLaMA-7B model states per GPU, GiB',
     '16P/2 (ZeRO-3 on 2 x A800-80G); 50.205, the book truncates', '50.20', 50.20,
     lambda: book_totals()[0], '.3g', BOOK),
    ('Ledger 4', 'LLaMA-7B total per GPU, GiB',
     "16P/2 + the book's 6.20 + 3.91 + ~6 (its GB are GiB, as its 50.20 is)", '~66', 66,
     lambda: book_totals()[1], '.2g', BOOK),
    ('Ledger 4', 'LLaMA-7B spare on an 80 GB card, GiB', 'A800: 81,920 MiB = 80 GiB, - total',
     '~14', 14, lambda: A800.memory_bytes / GIB - book_totals()[1], '.2g', BOOK),
    ('Ledger 4', '13B: model states, GB', '16P', '208', 208, lambda: 16 * 13e9 / 1e9, '.3g', BOOK),
    ('Ledger 4', '13B: fewest 80 GB GPUs', 'ceil(16P / 80 GB)', '3', 3,
     lambda: gpus_for_model_states(13e9, A800.memory_bytes)[0], 'd', BOOK),
    ('Ledger 4', '13B: recommended GPUs', 'rounded up to a power of two', '4', 4,
     lambda: gpus_for_model_states(13e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '30B: recommended GPUs', 'ceil(16P / 80 GB) = 6, to a power of two', '8', 8,
     lambda: gpus_for_model_states(30e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '65B: recommended GPUs', 'ceil(16P / 80 GB) = 13, to a power of two', '16', 16,
     lambda: gpus_for_model_states(65e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '175B: model states alone, TB', '16P', '~2.8', 2.8, lambda: 16 * 175e9 / 1e12,
     '.2g', BOOK),
    ('Data', '175B: Chinchilla-optimal tokens, T', '20 x P', '3.5', 3.5, lambda: 20 * 175e9 / 1e12,
     '.2g', NOTE + '; Chinchilla, Hoffmann et al. 2022'),
    ('Data', 'GPT-3 tokens per parameter', '300B / 175B', '~1.7', 1.7, lambda: 300e9 / 175e9,
     '.2g', NOTE + '; GPT-3, Brown et al. 2020'),
    ('Data', '25B tokens are optimal for, B params', 'D / 20', '~1.25', 1.25,
     lambda: 25e9 / 20 / 1e9, '.3g', NOTE),
    ('Data', '0.76B params: optimal tokens, B', '20 x P', '15.2', 15.2, lambda: 20 * 0.76e9 / 1e9,
     '.3g', NOTE),
    ('Data', 'Llama-3-8B tokens per parameter', '15T / 8B (~95x Chinchilla from the rounded 1,900)',
     '~1,900', 1900, lambda: 15e12 / 8e9, '.2g', NOTE + '; Llama 3, Meta 2024'),
    ('Data', 'bytes per token, vocab 50,257 (GPT-2)', 'uint16 while vocab <= 65,536', '2', 2,
     partial(token_bytes, 50257), 'd', NOTE),
    ('Data', 'bytes per token, vocab 128,256 (Llama 3)', 'uint32 above', '4', 4,
     partial(token_bytes, 128256), 'd', NOTE),
    ('Data', '250B tokens at 2 bytes/token, GB', 'D x 2', '500', 500,
     lambda: 250e9 * token_bytes(50257) / 1e9, '.3g', NOTE),
    ('Data', '25B tokens as parquet, GB', 'D x ~4 bytes/token (3-4)', '~100', 100,
     lambda: 25e9 * 4 / 1e9, '.2g', NOTE),
    ('Data', '1.3B Adam checkpoint, GB', '12P: fp32 weights + Adam m, v', '~16', 16,
     lambda: 12 * 1.3e9 / 1e9, '.2g', NOTE),
]
# fmt: on


def book_examples():
    """BOOK_EXAMPLES computed: dicts of EXAMPLE_FIELDS (value: the ledger's), shown and matches
    (whether the two agree at the precision)."""
    examples = []
    for row in BOOK_EXAMPLES:
        example = dict(zip(EXAMPLE_FIELDS, row))
        value = example['value'] = example['value']()
        precision, book_value = example['precision'], example['book_value']
        if precision == '>':
            matches, shown = value > book_value, f'{value:.1%}'
        else:
            whole = precision in ('d', ',d')
            rounded = round(value) if whole else value
            matches = format(rounded, precision) == format(book_value, precision)
            shown = format(round(value), precision) if whole else f'{value:.4g}'
        examples.append({**example, 'shown': shown, 'matches': matches})
    return examples


# --------------------------------------------------------------------------------------------------
# Bits per byte, a loss free of the tokenizer: L nats a token over b bytes a token is L / (ln 2 * b)
# bits a byte (GPT-2's tokens on FineWeb-Edu ~4.5 bytes, our 8192-token BPE on Python ~3.8). The CPU
# default's 5.52 nats at 3.84 bytes: 2.07 bits. Exact with the bytes of the very targets scored
# (data.target_bytes): a folder's mean is ~1% off its val.


def bits_per_byte(loss_nats, bytes_per_token):
    """None when the loss (no eval yet) or the bytes per token (synthetic data) are unknown."""
    known = loss_nats is not None and bytes_per_token
    return loss_nats / math.log(2) / bytes_per_token if known else None


# --------------------------------------------------------------------------------------------------
# Predicted against measured: summary.json's flat dict (train.py, each eval), report.md's table.
# Memory: the CUDA allocator's peak beside the ledger's 'allocated', or the CPU's peak resident
# memory (VmHWM) beside its total (the measured runtime included).


def summarize(prediction, measured):
    """measured: device, torch, params, and what the run has so far of tokens_per_s, mfu, days,
    peak_memory_bytes, peak_reserved_bytes, val_loss, val_bytes_per_token, step, tokens_seen."""
    p, memory = prediction, prediction['memory']
    on_cpu = p['gpu']['kind'] == 'cpu'
    kind = 'peak resident memory (VmHWM)' if on_cpu else 'peak allocated (max_memory_allocated)'
    return {
        'device': measured.get('device'),
        'torch': measured.get('torch'),
        # --force past a parameter count the rows do not give
        'ledger_unverified': p.get('ledger_unverified'),
        'predicted_for': f"{p['n_gpu']} x {p['gpu']['name']}",
        'peak_source': p['gpu']['peak_source'],
        'step': measured.get('step'),
        'tokens_seen': measured.get('tokens_seen'),
        'params_predicted': p['params']['total'],
        'params_built': measured.get('params'),
        'tokens_per_s_predicted': p['tokens_per_s'],
        'tokens_per_s_measured': measured.get('tokens_per_s'),
        'mfu_assumed': p['mfu_assumed'],
        # a CPU run's: measured, not assumed (live_ledger.step_probe)
        'mfu_source': p.get('mfu_source'),
        'mfu_predicted': p['mfu'],
        'mfu_measured': measured.get('mfu'),
        'memory_kind': kind,
        'memory_graph': memory['graph'],
        'memory_predicted_bytes': memory['total'] if on_cpu else memory['allocated'],
        'memory_measured_bytes': measured.get('peak_memory_bytes'),
        'reserved_predicted_bytes': None if on_cpu else memory['total'],
        'reserved_measured_bytes': None if on_cpu else measured.get('peak_reserved_bytes'),
        'days_predicted': p['days'],
        'days_projected': measured.get('days'),
        # rank 0's first optimizer step (live_ledger.measure_first_step): the states it leaves
        # (FSDP2's gathered weights aside) and its matmul FLOPs
        'model_states_predicted_bytes': memory['weights'] + memory['grads'] + memory['optimizer'],
        'model_states_measured_bytes': measured.get('model_states_bytes'),
        'optimizer_flops_predicted': p.get('optimizer_flops_rank0'),
        'optimizer_flops_measured': measured.get('optimizer_flops'),
        'val_loss': measured.get('val_loss'),
        'bytes_per_token': measured.get('bytes_per_token'),
        'val_bytes_per_token': measured.get('val_bytes_per_token'),
        'val_bpb': bits_per_byte(measured.get('val_loss'), measured.get('val_bytes_per_token')),
        # a mixture's: {source: {weight, loss, bpb}} (live_ledger.py)
        'val_sources': measured.get('val_sources'),
        **comm_summary(p),
    }


def comm_summary(prediction):
    """summary.json's communication keys (Ledger 5): a step's bytes, its seconds from the link table
    and at the bus bandwidth the run's probe measured (live_ledger.collective_probe; not gloo's)."""
    comm = prediction['comm']
    probe = comm.get('probe')
    meaningful = bool(probe and probe['meaningful'])
    note = '{} on the CPU: the seconds are not meaningful (the bytes are exact)'
    return {
        'comm_bytes_per_step': comm['bytes'],
        'comm_bus_bytes_per_step': comm['bus_bytes'],
        'comm_seconds_predicted': comm['seconds'],
        'comm_busbw_measured': probe['busbw'] if probe else None,
        'comm_seconds_measured': comm['bus_bytes'] / probe['busbw'] if meaningful else None,
        'comm_exposed_fraction_predicted': comm['exposed_fraction'],
        'comm_seconds_note': note.format(probe['backend']) if probe and not meaningful else None,
    }
