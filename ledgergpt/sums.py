"""
sums.py: the book's sums for a config, as numbers: parameters, FLOPs, days, memory, data and cost, and the
communication of a multi-GPU run (Ledger 5). predict() returns one JSON-able dict; bill.py prints it, and
`python ledger.py` is the command. Each formula carries its name, its source and a worked number; BOOK.md lists
them all. Standard library only: a bill for a named GPU needs nothing installed. Measuring the device at hand
(`gpu='auto'` or 'cpu': a short GEMM probe) imports torch inside measure_device, the one place this file uses it.
"""

import collections
import dataclasses
import difflib
import functools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from functools import partial

from ledgergpt.config import (
    DEFAULTS,
    GIB,
    MIB,
    OPTIMIZERS,
    R_DENOISERS,
    SECONDS_PER_DAY,
    X_DENOISERS,
    ConfigError,
    ModelConfig,
    is_mixture,
    linear,
    param_groups,
    sharded,
    tokens_per_micro_step,
)
from ledgergpt.files import save_json

# -----------------------------------------------------------------------------------------------------
# Devices. A GPU is known by its name: dense BF16 tensor-core peak (no 2:4 sparsity) from the vendor datasheets
# (NVIDIA H100/H200/A100/B200, AMD MI300X; the A800 is the A100 with slower NVLink, same compute) and its memory as
# the driver reports it (nvidia-smi's MiB total, rocm-smi's bytes). A GPU not in the table, and a CPU, are
# measured: the peak is the best FLOP/s of a large matmul in the run's compute dtype over about a second (a GEMM
# probe, cached per machine), the memory what the machine gives the process. The prediction is for the device
# the run is on: train.py resolves 'auto'; `ledger.py CONFIG` prints for the config's `gpu`.


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # FLOP/s of dense matmuls in the compute dtype, per device
    memory_bytes: int  # memory of one device (a CPU: the machine's RAM, shared by its processes)
    kind: str = 'gpu'  # 'gpu' or 'cpu'
    # the compute dtype the peak is for (the one a run with dtype='auto' uses)
    dtype: str = 'bfloat16'
    peak_source: str = 'vendor datasheet, dense BF16 tensor cores'
    memory_source: str = 'nvidia-smi total'
    # memory the runtime takes besides the ledger's tensors (see Ledger 4d)
    overhead_bytes: int = 2 * GIB
    overhead_source: str = (
        'ESTIMATE: CUDA context, kernels 0.81 GB and fragmentation 0.5-1 GB (the book), '
        'cuBLAS/flash workspaces'
    )
    shared_by: int = 0  # processes sharing this device's memory (0: a CPU's n_gpu, a GPU's 1)
    probe_key: str = ''  # a measured peak: its entry in the probe cache (measure_device), else ''


GPUS = {
    'H200': Device('H200 SXM 141GB', 989e12, 143771 * MIB),  # nvidia-smi: 143771MiB
    'H200-NVL': Device(
        'H200 NVL 141GB', 835e12, 143771 * MIB
    ),  # same 141 GB HBM3e stack as the SXM part
    'H100': Device('H100 SXM 80GB', 989e12, 81559 * MIB),  # nvidia-smi: 81559MiB
    'H100-PCIe': Device('H100 PCIe 80GB', 756e12, 81559 * MIB),
    'H100-NVL': Device('H100 NVL 94GB', 835e12, 95830 * MIB),  # nvidia-smi: 95830MiB
    'A100': Device('A100 SXM 80GB', 312e12, 81920 * MIB),  # nvidia-smi: 81920MiB
    'A800': Device('A800 80GB', 312e12, 81920 * MIB),
    'MI300X': Device('MI300X 192GB', 1307e12, 205_822_885_888, memory_source='rocm-smi total'),
    'B200': Device('B200 180GB', 2250e12, 183359 * MIB),  # nvidia-smi: 183359MiB
}
MEASURED = ('auto', 'cpu')  # the `gpu` names that mean "measure the device at hand"


def gpu_spec(name):
    """The GPU table's entry for a name, case-insensitive; ConfigError naming the known ones."""
    by_lower = {key.lower(): key for key in GPUS}
    if name.lower() in by_lower:
        return GPUS[by_lower[name.lower()]]
    close = difflib.get_close_matches(
        name.lower(), list(by_lower) + list(MEASURED), n=1, cutoff=0.5
    )
    hint = f"did you mean '{by_lower.get(close[0], close[0])}'? " if close else ''
    raise ConfigError(
        f"unknown gpu '{name}': {hint}known: {', '.join(GPUS)}, or 'auto' / 'cpu' to measure this "
        f"machine (add yours to GPUS in ledger.py)"
    )


def device_spec(name, dtype='auto'):
    """The Device a `gpu` key names: a table entry, or for 'auto' / 'cpu' the device at hand, measured in the
    compute dtype that `dtype` ('auto', 'bfloat16', 'float32') gives on it."""
    if name.lower() in MEASURED:
        return measure_device(name.lower(), dtype)
    return gpu_spec(name)


def run_dtype(train, device):
    """The compute dtype of a run: the config's, or for 'auto' the device's (bf16 on a GPU, the faster on a CPU)."""
    return device.dtype if train.dtype == 'auto' else train.dtype


def cache_path():
    """The per-machine cache of GEMM probes: $XDG_CACHE_HOME/ledgergpt/devices.json (default ~/.cache)."""
    root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(root, 'ledgergpt', 'devices.json')


def resident_bytes(peak=False):
    """This process's resident memory now, or its peak so far: Linux's VmRSS or VmHWM (/proc/self/status), elsewhere
    getrusage's peak. Not ru_maxrss on Linux: a process keeps in it the resident memory of its parent at the spawn
    (a child of a 2 GiB process reports 2 GiB there, 9 MB in VmHWM: measured), so a run started by a sweep, a
    notebook or the test suite would report its parent's size as its own peak."""
    try:
        with open('/proc/self/status') as f:
            fields = dict(line.split(':', 1) for line in f)
        return int(fields['VmHWM' if peak else 'VmRSS'].split()[0]) * 1024
    except (OSError, KeyError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
            1 if sys.platform == 'darwin' else 1024
        )


def machine_memory():
    """-> (bytes of RAM this process may use, where the figure comes from): a cgroup limit when one is set
    (containers, Slurm), else the machine's physical RAM."""
    ram, source = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), 'physical RAM (sysconf)'
    for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < ram:
            ram, source = int(limit), f'cgroup limit ({path})'
    return ram, source


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def measure_device(name='auto', dtype='auto', seconds=1.0):
    """The device at hand as a Device. 'auto': the current CUDA GPU if there is one, else the CPU; 'cpu': the CPU.
    A GPU in the table keeps its datasheet peak, with the memory torch sees; any other device gets a GEMM probe:
    square matmuls (up to 2048 on a CPU, 8192 on a GPU: gemm_flops) repeated for `seconds`, the best FLOP/s kept,
    cached per machine, dtype, thread count and torch version (cache_path), probed again when a run flagged it
    (flag_reprobe), the best probe seen kept (with its date: the ledger says when the peak was measured). dtype
    'auto' is bf16 on a GPU; on a CPU both fp32 and bf16 are probed and the faster is the run's (bf16 matmuls run 6x
    fp32 on a Xeon with AMX, measured here, and ~200x slower than fp32 on an AVX2-only EPYC). On the CPU the runtime
    overhead is measured too: this process's resident memory once torch and its thread pools are up."""
    import torch  # measuring the device needs it; nothing else in this file does

    on_gpu = name == 'auto' and torch.cuda.is_available()
    if dtype == 'auto' and not on_gpu:
        return max(
            (measure_device('cpu', d, seconds) for d in ('float32', 'bfloat16')),
            key=lambda d: d.peak_flops,
        )
    dtype = 'bfloat16' if dtype == 'auto' else dtype
    if on_gpu:
        index = torch.cuda.current_device()
        label, props = torch.cuda.get_device_name(index), torch.cuda.get_device_properties(index)
        known = [key for key in GPUS if key.lower().replace('-', ' ') in label.lower()]
        memory = dict(
            memory_bytes=props.total_memory, memory_source='torch.cuda.get_device_properties'
        )
        if known:
            key = max(known, key=len)  # 'H100 NVL' before 'H100'
            return dataclasses.replace(
                GPUS[key],
                name=label,
                peak_source=f'vendor datasheet ({key}), dense BF16',
                dtype=dtype,
                **memory,
            )
        device, threads = torch.device('cuda', index), 0
    else:
        label = f'CPU ({cpu_name()}, {torch.get_num_threads()} threads)'
        device, threads = torch.device('cpu'), torch.get_num_threads()
    key = f'{label} | {dtype} | {threads} threads | torch {torch.__version__}'

    def probe_it():
        best, n = gemm_flops(8192 if on_gpu else 2048, device, dtype, seconds)
        return {'peak_flops': best, 'runtime_bytes': resident_bytes(), 'matmul': f'{n}x{n}x{n}'}

    probe = cached_probe(key, probe_it, 'peak_flops')
    peak_source = (
        f"measured: GEMM probe, {probe['matmul']} {dtype}, the best of {probe.get('probes', 1)} probe(s), "
        f"peak measured at {probe['measured']} (cache: {cache_path()})"
    )
    if on_gpu:
        return Device(
            label,
            probe['peak_flops'],
            kind='gpu',
            dtype=dtype,
            peak_source=peak_source,
            probe_key=key,
            **memory,
        )
    ram, ram_source = machine_memory()
    return Device(
        label,
        probe['peak_flops'],
        ram,
        kind='cpu',
        dtype=dtype,
        peak_source=peak_source,
        memory_source=ram_source,
        overhead_bytes=probe['runtime_bytes'],
        overhead_source='measured: resident memory of the runtime (torch, its libraries and thread pools)',
        probe_key=key,
    )


def gemm_flops(n_max, device, dtype, seconds):
    """-> (the best FLOP/s of square matmuls in `dtype` on `device`, their size n). n doubles from 256 while one
    matmul takes under 0.1 s, up to n_max: a dtype the device only emulates (bf16 on a CPU without bf16 or AVX-512
    units runs at ~0.3 GFLOP/s, a minute for one 2048-square matmul) is measured in seconds, not minutes. Then
    matmuls of that size repeat for `seconds` (the first call at each size warms up)."""
    import torch

    def timed(a, b, out):
        begin = time.perf_counter()
        torch.mm(a, b, out=out)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        return time.perf_counter() - begin

    n = min(256, n_max)
    while True:
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
    """The probe cache's entry `key` (cache_path: per machine), measured with measure() -> its fields when it is
    new or flagged (flag_reprobe). Load only slows a probe, so the entry with the highest `best_of` seen is kept
    (with its date); 'probes' counts the measurements. The GEMM probe and live_ledger's step probe share it."""
    path = cache_path()
    cache = read_probes(path)
    if probe_due(key, cache):
        entry, old = measure(), cache.get(key, {})
        if entry[best_of] >= old.get(best_of, 0):
            cache[key] = {**entry, 'measured': time.strftime('%Y-%m-%d %H:%M:%S')}
        cache[key]['probes'] = old.get('probes', 0) + 1
        cache[key].pop('reprobe', None)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save_json(path, cache)
        except OSError:
            pass  # a read-only home only costs the next run another second
    return cache[key]


def probe_due(key, cache=None):
    """Whether the probe cache lacks `key` or has it flagged for another measurement."""
    entry = (read_probes() if cache is None else cache).get(key)
    return entry is None or bool(entry.get('reprobe'))


def read_probes(path=None):
    path = path or cache_path()
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# A probe that ran while the machine was busy reads low, and every prediction from it is slow by that factor: the
# cache keeps the best probe seen, and a run whose measured MFU exceeds the MFU its prediction assumed by this
# factor or more flags its probe, so the next measure_device probes again (keeping the better of the two).
REPROBE_FACTOR = 1.5


def flag_reprobe(probe_key, reason):
    """Mark a cached probe to be measured again at its next use. -> whether it was marked (False: no such probe)."""
    path = cache_path()
    cache = read_probes(path)
    if probe_key not in cache:
        return False
    cache[probe_key]['reprobe'] = reason
    try:
        save_json(path, cache)
    except OSError:
        return False
    return True


# -----------------------------------------------------------------------------------------------------
# Ledger 1: parameters, exact, counted the way model.py builds the model (== sum(p.numel())), from the rows of
# config.PARTS: parameter_shapes lists every tensor, count_params sums them by part. Llama with n_kv_head = n_head,
# untied: the book's P = 2VH + H + L(4H^2 + 3HH' + 2H); LLaMA-7B -> 6,738,415,616 (book_params).


def block_shapes(model, i):
    """(name, shape) of block i's tensors, as model.Block registers them: its norms, attention (with its QK-norm
    row's tensors), and FFN (the MLP row's, or an MoE's router, experts and shared experts)."""
    H, block = model.n_embd, f'blocks.{i}'
    norm, bias = model.part('norm').shapes(model), model.biases
    qkv_width = (model.n_head + 2 * model.kv_heads) * model.head_dim
    shapes = [(f'{block}.attn_norm.{n}', s) for n, s in norm]
    shapes += linear(f'{block}.attn.qkv_proj', H, qkv_width, bias) + linear(
        f'{block}.attn.o_proj', H, H, bias
    )
    shapes += [(f'{block}.attn.qk_norm.{n}', s) for n, s in model.part('qk_norm').shapes(model)]
    shapes += [(f'{block}.mlp_norm.{n}', s) for n, s in norm]
    if i < model.n_layer - model.moe_layers:
        return shapes + [(f'{block}.mlp.{n}', s) for n, s in model.part('mlp').shapes(model)]
    E, S = model.expert_hidden, model.n_shared_experts * model.expert_hidden  # MoE: SwiGLU experts
    shapes += [(f'{block}.mlp.router.weight', (model.n_experts, H))]
    for name, width in [(f'experts.{j}', E) for j in range(model.n_experts)] + (
        [('shared', S)] if S else []
    ):
        shapes += linear(f'{block}.mlp.{name}.gate_up_proj', H, 2 * width, bias)
        shapes += linear(f'{block}.mlp.{name}.down_proj', width, H, bias)
    return shapes


def parameter_shapes(model):
    """(name, shape) of every parameter tensor, in the order model.py registers them (= model.named_parameters();
    a tied output projection is the embedding's own tensor, listed once). The exact sharding of Ledger 4 needs the
    tensors, not just their sum: ZeRO-1 hands out whole tensors, FSDP2 splits each one's first dimension."""
    H, V = model.n_embd, model.vocab_size
    positions = [(f'pos_emb.{n}', s) for n, s in model.part('positions').shapes(model)]
    shapes = [('tok_emb.weight', (V, H))] + positions
    for i in range(model.n_layer):
        shapes += block_shapes(model, i)
    shapes += [(f'norm_f.{n}', s) for n, s in model.part('norm').shapes(model)]
    return shapes + ([] if model.tie_embeddings else [('lm_head.weight', (V, H))])


def _part_of(name):
    """The bill's group of a parameter tensor: embedding, position, attention (with QK-norm's gains), ffn, norms
    (the blocks' two and the final one), output."""
    top = name.split('.')[0]
    if top != 'blocks':
        return {
            'tok_emb': 'embedding',
            'pos_emb': 'position',
            'lm_head': 'output',
            'norm_f': 'norms',
        }[top]
    return {'attn': 'attention', 'mlp': 'ffn', 'attn_norm': 'norms', 'mlp_norm': 'norms'}[
        name.split('.')[2]
    ]


def count_params(model):
    """Parameter counts by part, the sums of parameter_shapes. 'matmul' is what takes part in matrix multiplies:
    every Linear weight including the output projection (counted even when tied: the lookup is free, the
    projection is not); it excludes the embedding lookups, norms and biases. 'blocks_matmul' is the part of it
    inside the transformer blocks; 'active' (and the 'blocks_matmul' FLOPs count) leave out the routed experts a
    token does not visit (Ledger MoE)."""
    counts = dict.fromkeys(('embedding', 'position', 'attention', 'ffn', 'norms', 'output'), 0)
    blocks_matmul = 0
    for name, shape in parameter_shapes(model):
        counts[_part_of(name)] += math.prod(shape)
        if name.startswith('blocks.') and len(shape) == 2:
            blocks_matmul += math.prod(shape)
    moe, M = moe_params(model), model.moe_layers
    counts['per_layer'] = sum(math.prod(s) for _, s in block_shapes(model, 0))
    counts['blocks_matmul_total'] = blocks_matmul
    counts['total'] = sum(
        counts[k] for k in ('embedding', 'position', 'attention', 'ffn', 'norms', 'output')
    )
    # what one token's forward uses: every weight but the experts it does not visit (dense: all of them)
    counts['active'] = counts['total'] - M * moe['idle']
    counts['blocks_matmul'] = blocks_matmul - M * moe['idle']  # the FLOPs count these
    counts['matmul'] = counts['blocks_matmul'] + model.vocab_size * model.n_embd
    counts['matmul_total'] = blocks_matmul + model.vocab_size * model.n_embd
    counts['moe_layer'], counts['moe_layer_active'] = moe['layer'], moe['layer'] - moe['idle']
    counts['ffn_matmul'] = sum(
        math.prod(s) for _, s in model.part('mlp').shapes(model) if len(s) == 2
    )
    counts['ffn_last_matmul'] = [
        math.prod(s) for _, s in model.part('mlp').shapes(model) if len(s) == 2
    ][-1]
    return counts


def book_params(model):
    """The book's closed form for a Llama (RMSNorm, SwiGLU, no biases, untied): 2VH + H + L(4H^2 + 3HH' + 2H),
    with GQA's k and v narrower: 4H^2 becomes 2H^2 + 2H*kv_width. test_parts.py holds it equal to count_params."""
    H, V, L, F = model.n_embd, model.vocab_size, model.n_layer, model.ffn_width
    kv_width = model.kv_heads * model.head_dim
    return 2 * V * H + H + L * (2 * H * H + 2 * H * kv_width + 3 * H * F + 2 * H)


# -----------------------------------------------------------------------------------------------------
# Ledger 2: compute, the FLOPs a token forward + backward by each convention: the book's 6P (8P with recompute),
# PaLM's 6N_matmul + 12LHT (what MFU counts), nanoGPT's 6N + 12LHT, and what recomputation really reruns
# (FlopCounterMode's count, exactly). Derived term by term in BOOK.md, 'Derivations: Ledger 2'.


def flops_per_token(model, recompute=False, compiled_blocks=False):
    """Training FLOPs per token (forward + backward) under the conventions above. compiled_blocks: each block
    is torch.compile'd on its own, so the recompute reruns the whole block (see above)."""
    params = count_params(model)
    L, H = model.n_layer, model.n_embd
    keys = model.part('attention').keys(model)  # keys a query attends to (config.PARTS)
    attention = 12 * L * H * keys['model']
    kernel = 12 * L * H * keys['kernel']  # what the kernel computes, masked keys included
    matmul = 6 * params['matmul'] + attention
    executed = 6 * params['matmul'] + kernel
    # an MoE layer's last saved tensors are the routed experts' outputs: the rerun skips only the shared experts'
    # down_proj (H x n_shared * expert_hidden), which runs last (Ledger MoE); a dense block its FFN's last matmul
    M, shared = model.moe_layers, model.n_shared_experts * model.expert_hidden
    skipped = 0 if compiled_blocks else (L - M) * params['ffn_last_matmul'] + M * H * shared
    rerun_matmul = params['blocks_matmul'] - skipped
    executed_recompute = executed + 2 * rerun_matmul + kernel // 3  # + the blocks' forward again
    return {
        'book': (8 if recompute else 6) * params['active'],  # P: the active parameters (dense: all)
        'matmul': matmul,  # model FLOPs: what MFU counts (PaLM)
        'matmul_causal': 6 * params['matmul']
        + round(12 * L * H * keys['causal']),  # the unmasked keys
        'nanogpt': 6 * (params['active'] - params['position']) + attention,
        'hardware': executed_recompute if recompute else executed,  # what the GPU executes
        'attention': attention,
        'attention_share': attention / (6 * params['blocks_matmul']),
        'attention_share_approx': keys['model'] / (6 * H),
        'keys_symbol': model.part('attention').keys_symbol,
    }


# -----------------------------------------------------------------------------------------------------
# Ledger 3: time and money. days = total FLOPs / (n_gpu * peak * MFU) / 86400. The book's LLaMA-65B check:
# 8CP = 8 * 1.4e12 * 6.5e10 = 7.28e23 FLOPs on 2048 A100 at an effective 2e14 FLOP/s -> 20.6 days (paper: 21).


def train_days(total_flops, n_gpu, peak_flops, mfu):
    return total_flops / (n_gpu * peak_flops * mfu) / SECONDS_PER_DAY


# -----------------------------------------------------------------------------------------------------
# Ledger 4a: model states, the book's accounting (mixed precision + Adam; ZeRO, Rajbhandari et al. 2020).
# Per parameter: 16-bit weight 2 + 16-bit gradient 2 + fp32 master weight, momentum, variance 4 each = 16 bytes.
# ZeRO shards them over the N data-parallel GPUs: ZeRO-1 the optimizer states (4P + 12P/N), ZeRO-2 also the
# gradients (2P + 14P/N), ZeRO-3/FSDP also the weights (16P/N). LLaMA-7B on 2 GPUs, ZeRO-3: 16P/2 = 50.2 GiB.

BOOK_STATES = {'ddp': '16P', 'zero1': '4P + 12P/N', 'zero2': '2P + 14P/N', 'fsdp': '16P/N (ZeRO-3)'}


def model_state_bytes(n_params, parallel='ddp', n_gpu=1):
    """The book's bytes of weights, gradients and optimizer states per GPU, by strategy (BOOK_STATES)."""
    shards = {
        'ddp': (1, 1, 1),
        'zero1': (1, 1, n_gpu),
        'zero2': (1, n_gpu, n_gpu),
        'fsdp': (n_gpu, n_gpu, n_gpu),
    }
    if parallel not in shards:
        raise ConfigError(f"parallel must be one of {', '.join(shards)}, not '{parallel}'")
    weights_over, grads_over, optimizer_over = shards[parallel]
    states = {
        'weights': 2 * n_params / weights_over,  # 16-bit weights
        'grads': 2 * n_params / grads_over,  # 16-bit gradients
        'optimizer': 12
        * n_params
        / optimizer_over,  # fp32 master weights, Adam momentum and variance
    }
    states['total'] = states['weights'] + states['grads'] + states['optimizer']
    return states


# -----------------------------------------------------------------------------------------------------
# Ledger 4a': model states as train.py holds them, exact to the byte on each rank (test_memory.py counts every
# tensor after the first optimizer step): fp32 weights and gradients, the optimizer's states (its row in
# config.OPTIMIZERS), FSDP2's padded shards and gathered weights. Derived term by term in BOOK.md, 'Derivations:
# Ledger 4a''.


def zero1_partition(model, n_gpu, optimizer='adamw'):
    """ZeroRedundancyOptimizer's assignment of parameter tensors to ranks, as train.py builds it (its param groups
    in config.param_groups' order: for AdamW matrices, then vectors; for Muon its matrices first): each group's
    tensors largest first, each to the rank holding the fewest elements so far. -> per rank, its (name, shape)s."""
    shapes = dict(parameter_shapes(model))
    sizes, owned = [0] * n_gpu, [[] for _ in range(n_gpu)]
    for _, _, names in param_groups(optimizer, list(shapes.items())):
        for name in sorted(names, key=lambda n: math.prod(shapes[n]), reverse=True):  # stable
            rank = sizes.index(min(sizes))
            sizes[rank] += math.prod(shapes[name])
            owned[rank].append((name, shapes[name]))
    return owned


def optimizer_row(optimizer, name, shape):
    """The row of config.OPTIMIZERS that updates a parameter tensor: the optimizer's own, or its rest's (Muon's
    AdamW) for the tensors it does not take."""
    row = OPTIMIZERS[optimizer]
    return OPTIMIZERS[row.rest] if row.takes and not row.takes(name, shape) else row


def optimizer_state_bytes(optimizer, tensors):
    """Bytes of optimizer state over (name, shape, held shape) triples: each tensor's row's state_bytes of the
    shape this rank holds (its rows under FSDP2)."""
    return sum(optimizer_row(optimizer, n, s).state_bytes(held) for n, s, held in tensors)


def optimizer_step_flops(model, train, n_gpu):
    """Matmul FLOPs of one optimizer step on each of the n_gpu ranks: each tensor's row's step_flops (Muon:
    Newton-Schulz of the whole matrix; AdamW: none) over the tensors a rank updates: every one (one process, DDP,
    and ZeRO-2 / FSDP2, where each rank orthogonalises every gathered matrix), or under ZeRO-1 those it owns."""
    if n_gpu > 1 and train.parallel == 'zero1':
        ranks = zero1_partition(model, n_gpu, train.optimizer)
    else:
        ranks = [parameter_shapes(model)] * n_gpu
    row = partial(optimizer_row, train.optimizer)
    return [sum(row(n, s).step_flops(s, train) for n, s in owned) for owned in ranks]


def fsdp_rows(rows, n_gpu, rank):
    """-> (padded, real) rows of a tensor's first dimension on `rank` under FSDP2 (torch.chunk, padded)."""
    chunk = -(-rows // n_gpu)
    return chunk, max(0, min(chunk, rows - rank * chunk))


def fsdp_unit_elements(model, n_gpu):
    """-> (root, blocks): elements FSDP2 gathers whole for its root unit (embeddings, final norm, lm_head) and for
    each block, largest first (an MoE's blocks outweigh its dense ones), each tensor's rows padded to a multiple of
    n_gpu (what an all-gather returns and a reduce-scatter takes in)."""
    whole = {
        name: -(-shape[0] // n_gpu) * n_gpu * math.prod(shape[1:])
        for name, shape in parameter_shapes(model)
    }
    blocks = [
        sum(v for k, v in whole.items() if k.startswith(f'blocks.{i}.'))
        for i in range(model.n_layer)
    ]
    root = sum(v for k, v in whole.items() if not k.startswith('blocks.'))
    return root, sorted(blocks, reverse=True)


def held_model_states(model, parallel, n_gpu, dtype='bfloat16', rank=0, optimizer='adamw'):
    """Bytes of weights, gradients, the optimizer's states (its row in config.OPTIMIZERS) and FSDP2's gathered
    weights on `rank`, as train.py holds them; dtype is the compute dtype ('bfloat16' or 'float32'). 'book' is
    the book's figure for the same strategy."""
    named = parameter_shapes(model)
    shapes = [shape for _, shape in named]
    n_params = sum(map(math.prod, shapes))
    states = {
        'weights': 4 * n_params,
        'grads': 4 * n_params,
        'optimizer': optimizer_state_bytes(optimizer, [(n, s, s) for n, s in named]),
        'gathered': 0,
    }
    if n_gpu > 1 and parallel == 'zero1':
        owned = zero1_partition(model, n_gpu, optimizer)[rank]
        states['optimizer'] = optimizer_state_bytes(optimizer, [(n, s, s) for n, s in owned])
    elif sharded(parallel, n_gpu):
        padded, held = 0, []
        for name, shape in named:
            rows_padded, rows_real = fsdp_rows(shape[0], n_gpu, rank)
            padded += rows_padded * math.prod(shape[1:])
            held.append((name, shape, (rows_real, *shape[1:])))
        states.update(
            weights=4 * padded, grads=4 * padded, optimizer=optimizer_state_bytes(optimizer, held)
        )
        compute_bytes = 2 if dtype == 'bfloat16' else 4
        root, blocks = fsdp_unit_elements(model, n_gpu)
        # all blocks, or two at a time
        gathered = sum(blocks) if parallel == 'zero2' else sum(blocks[:2])
        states['gathered'] = compute_bytes * (root + gathered) + compute_bytes * blocks[0]
    states['total'] = states['weights'] + states['grads'] + states['optimizer'] + states['gathered']
    states['book'] = model_state_bytes(n_params, parallel, n_gpu)['total']
    # MoE: the book's "16 x active parameters"; every expert's states are held all the same (Ledger MoE)
    states['book_active'] = model_state_bytes(count_params(model)['active'], parallel, n_gpu)[
        'total'
    ]
    return states


# -----------------------------------------------------------------------------------------------------
# Ledger 4b: activations, what autograd saves for backward a token, each part's bytes from its row in
# config.PARTS, calibrated against model.py's tensors (test_model.py, test_parts.py), eager and under
# torch.compile's min-cut partitioner (4b'). Derived term by term in BOOK.md, 'Derivations: Ledger 4b'.


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
    """Bytes autograd holds for backward at its peak (loss buffers aside: logits_bytes), for one GPU's
    micro-batch of full sequences, from the parts' rows (config.PARTS: each part's saved bytes a token).
    attention: 'flash' (the attention row's kernel: flash/cuDNN/efficient and CPU's flash) or 'math' (SDPA's
    math kernel). compiled: None (eager), 'model' (the whole model compiled: one process, DDP, ZeRO-1) or
    'blocks' (each block compiled alone: train.py under FSDP2), as Ledger 4b' counts it (the row's kernel)."""
    if attention not in ('flash', 'math'):
        raise ConfigError(f"attention must be 'flash' or 'math', not '{attention}'")
    # autocast: bf16 matmuls
    a, r, autocast = (dtype_bytes, residual_bytes, dtype_bytes < residual_bytes)
    H, L, M, T = model.n_embd, model.n_layer, model.moe_layers, model.block_size
    tokens, norm, mlp, positions = (
        micro_batch * T,
        model.part('norm'),
        model.part('mlp'),
        model.part('positions'),
    )
    # the MoE routing's host read breaks the compiled graph: counted eager
    if M or attention == 'math':
        compiled = None
    if attention == 'math':  # q, k, v expanded to every head, and the softmax probabilities
        attn = a * H + 3 * a * H + a * model.n_head * T + a * H
    else:
        attn = model.part('attention').saved(model, a, r, compiled)
        attn += positions.saved(model, a, r, compiled) + model.part('qk_norm').saved(
            model, a, r, compiled
        )
    ffn = mlp.saved(model, a, r, False)  # eager's, which an MoE layer replaces
    eager_norm = norm.saved(model, a, r, False, fused_norm)
    # what the loss keeps a token: lm_head's input, or h's gradient (chunked)
    loss = model.part('loss')
    layer, head = 2 * eager_norm + attn + ffn, eager_norm + loss.saved(model, a, r, False)
    if compiled:
        # o_proj's output, or the residual after it
        middle = a * H if compiled == 'blocks' else r * H
        layer = (
            r * H + middle + 2 * norm.saved(model, a, r, True) + attn + mlp.saved(model, a, r, True)
        )
        # + the last residual (recomputed with recompute), and the loss's own
        if compiled == 'model':
            head = (
                (0 if recompute else r * H)
                + norm.saved(model, a, r, True)
                + loss.saved(model, a, r, True)
            )
    # a learned table's, int64
    position_ids = 8 * T if positions.shapes(model) and not compiled else 0
    parts = {'token_ids': tokens * 16 + position_ids, 'head': tokens * head}
    # (layers, bytes a token saves, bf16 weight copies) of each kind of layer: dense, and MoE (Ledger MoE)
    params = count_params(model)
    attention_weights = sum(
        math.prod(s) for _, s in model.part('attention').shapes(model) if len(s) == 2
    )
    kinds = [(L - M, layer, 2 * (attention_weights + params['ffn_matmul']) if autocast else 0)]
    if M:
        moe_saved = moe_activation_bytes(model, a, autocast)
        moe_weights = 2 * (attention_weights + params['moe_layer']) if autocast else 0
        kinds.append((M, layer - ffn + moe_saved['total'], moe_weights))
    kinds = [kind for kind in kinds if kind[0]]
    lm_head_copy = 2 * model.vocab_size * H if autocast else 0
    if recompute:  # lm_head's copy only: the blocks' are made again as each is rerun
        parts['block_inputs'] = tokens * L * r * H
        parts['recomputed_block'] = max(
            tokens * (saved - r * H) + weights for _, saved, weights in kinds
        )
        parts['bf16_weights'] = lm_head_copy
    else:
        parts['blocks'] = sum(n * tokens * saved for n, saved, _ in kinds)
        parts['bf16_weights'] = sum(n * weights for n, _, weights in kinds) + lm_head_copy
    parts['total'] = sum(parts.values())
    # of which (not added again): the dispatched copies of the tokens and the experts' outputs
    if M:
        parts['routing_buffers'] = (1 if recompute else M) * tokens * moe_saved['dispatched']
    return parts


def logits_bytes(model, micro_batch, dtype_bytes=2, compiled=False):
    """The loss's buffers at their peak, from its row of config.PARTS['loss'] (its `buffers`): the full loss's
    micro_batch x T x V logits, 12 bytes each eager (this ran nanochat out of memory on an 80 GB H100: at its
    32 x 2048 x 65536 one fp32 copy is 16 GiB), or the chunked loss's one chunk and lm_head's gradient."""
    parts = model.part('loss').buffers(model, micro_batch * model.block_size, dtype_bytes, compiled)
    return dict(parts, total=sum(parts.values()))


# -----------------------------------------------------------------------------------------------------
# Ledger 4d: the total per device = model states as held + activations + the loss's buffers + the runtime's own
# memory (an ESTIMATE on a GPU, measured on the CPU, plus torch.compile's host memory there), against the device's
# memory. Derived term by term in BOOK.md, 'Derivations: Ledger 4d'.
COMPILE_HOST_BYTES = 100 * MIB
# A plan fits only with this share of the device left over: the ledger's measured error band (a run's peak memory
# against its prediction: within 15% on the CPU, test_memory.py; on a GPU the runtime's share is an ESTIMATE), so a
# plan it calls fitting is one a person can run, not one at 79.64 of 79.65 GiB. "fits", "largest micro-batch that
# fits" and the parallelism verdict all read memory['fits'].
HEADROOM_FRACTION = 0.05


def compile_mode(train, n_gpu):
    """How train.py compiles the model: None (eager), 'model' (whole: one process, DDP, ZeRO-1) or 'blocks' (each
    block on its own, under FSDP2: zero2 and fsdp on more than one process)."""
    if not train.compile:
        return None
    return 'blocks' if sharded(train.parallel, n_gpu) else 'model'


def memory_per_gpu(model, train, n_gpu=None, micro_batch=None, device=None, rank=0):
    """Bytes per device by part, the total, the device's memory, the headroom, and whether it fits: with at least
    HEADROOM_FRACTION of the device's memory left."""
    n_gpu = n_gpu or train.n_gpu
    micro_batch = micro_batch or train.micro_batch
    device = device or device_spec(train.gpu, train.dtype)
    dtype = run_dtype(train, device)
    dtype_bytes = 2 if dtype == 'bfloat16' else 4
    # the residual stream: fp32 under autocast; bf16 where FSDP2 casts the weights (train.py: zero2/fsdp, N > 1)
    residual_bytes = 2 if dtype_bytes == 2 and sharded(train.parallel, n_gpu) else 4
    states = held_model_states(model, train.parallel, n_gpu, dtype, rank, train.optimizer)
    compiled = compile_mode(train, n_gpu)
    # sharing one device's memory
    processes = device.shared_by or (n_gpu if device.kind == 'cpu' else 1)
    # what autograd saves, as this run's graph saves it (and eager's, printed beside it)
    saved = functools.partial(
        activation_bytes,
        model,
        micro_batch,
        train.recompute,
        dtype_bytes,
        residual_bytes=residual_bytes,
        fused_norm=device.kind != 'cpu',
    )
    # the loss's buffers: compiled only where the whole model is (under FSDP2 the blocks are, the loss runs eager)
    loss_bytes = functools.partial(logits_bytes, model, micro_batch, dtype_bytes)
    eager = saved()
    memory = {
        'weights': states['weights'],
        'grads': states['grads'],
        'optimizer': states['optimizer'],
        'gathered': states['gathered'],
        'model_states': states['total'],
        'book_model_states': states['book'],
        'book_formula': BOOK_STATES[train.parallel],
        'activations': saved(compiled=compiled)['total'],
        'logits': loss_bytes(compiled=compiled == 'model')['total'],
        'activations_eager': eager['total'],
        'logits_eager': loss_bytes()['total'],
        'graph': {'model': 'compiled whole', 'blocks': 'compiled block by block', None: 'eager'}[
            compiled
        ],
        'overhead': device.overhead_bytes,
        'compile_host': COMPILE_HOST_BYTES if compiled and device.kind == 'cpu' else 0,
        'book_active_model_states': states['book_active'],  # MoE: the book's 16 x active parameters
        # MoE: of the activations, the dispatched copies (eager)
        'routing_buffers': eager.get('routing_buffers', 0),
    }
    memory['allocated'] = memory['model_states'] + memory['activations'] + memory['logits']
    memory['total'] = memory['allocated'] + memory['overhead'] + memory['compile_host']
    memory['gpu_memory'] = device.memory_bytes // processes
    memory['headroom'] = memory['gpu_memory'] - memory['total']
    memory['headroom_needed'] = math.ceil(HEADROOM_FRACTION * memory['gpu_memory'])
    memory['fits'] = memory['headroom'] >= memory['headroom_needed']
    return memory


def max_micro_batch(model, train, n_gpu=None, device=None):
    """The largest micro-batch (sequences per device) whose total fits, headroom kept (memory_per_gpu); 0 if not
    even one does."""
    device = device or device_spec(train.gpu, train.dtype)

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
    """The book's rule of thumb for full-parameter training: 16P bytes sharded over N GPUs (ZeRO-3) must fit,
    so N >= 16P / memory; the recommendation rounds up to a power of two (1, 2, 4, 8 per node, then whole
    nodes), which leaves room for activations: 13B -> 3 (floor), 4 recommended; 30B -> 8; 65B -> 16 (80 GB)."""
    floor = math.ceil(16 * n_params / gpu_memory_bytes)
    return floor, 2 ** math.ceil(math.log2(floor))


# -----------------------------------------------------------------------------------------------------
# Ledger 5: communication, the bytes each parallel mode moves per optimizer step, as train.py's code moves them
# (test_communication.py counts every collective on every rank under gloo and holds the list to this one, call by
# call), in NCCL-tests' algorithm and bus bytes. Derived term by term in BOOK.md, 'Derivations: Ledger 5'.

DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default, 25 MiB
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2, 'int64': 8}


BUS_FACTORS = {  # NCCL-tests' doc/PERFORMANCE.md: bus bytes = algorithm bytes x this, on N ranks
    'all_reduce': lambda n: 2 * (n - 1) / n,
    'all_gather': lambda n: (n - 1) / n,
    'reduce_scatter': lambda n: (n - 1) / n,
    'broadcast': lambda n: 1.0,
}


def ddp_buckets(
    model, first_bytes=DDP_FIRST_BUCKET_BYTES, cap_bytes=DDP_BUCKET_BYTES, element_bytes=4
):
    """Elements of each DDP bucket, in the order they are all-reduced (the C++ reducer's
    compute_bucket_assignment_by_size over the gradients in backward's order, taken as the reverse of the
    parameters': a bucket closes once it holds at least its cap, 1 MiB for the first, then 25 MiB)."""
    buckets, current, limit = [], 0, first_bytes
    for _, shape in reversed(parameter_shapes(model)):
        current += math.prod(shape)
        if current * element_bytes >= limit:
            buckets.append(current)
            current, limit = 0, cap_bytes
    return buckets + ([current] if current else [])


def collectives(model, parallel, n_gpu, accumulation, dtype='bfloat16', optimizer='adamw'):
    """Every collective of one optimizer step of train.py on every rank (the same list on each), as dicts: what,
    op ('all_reduce', 'all_gather', 'reduce_scatter', 'broadcast'), dtype, elements (NCCL-tests' S), calls per
    step, phase ('step': before the micro-steps or after the update, nothing to hide under; 'forward' and
    'backward': inside a micro-step; 'update': after backward, before the next step) and bytes, bus_bytes per
    step. One process: none. dtype: the compute dtype; optimizer: its row of config.OPTIMIZERS."""
    if n_gpu == 1:
        return []
    shapes = parameter_shapes(model)
    items = [
        ('loss normaliser', 'all_reduce', 'int64', 1, 1, 'step'),
        ('stop flag (host, gloo)', 'all_reduce', 'int64', 1, 1, 'step'),
    ]
    # MoE: the step's tokens per expert, summed over ranks for the router bias (moe.py)
    if model.n_experts:
        items.append(
            (
                'MoE expert loads',
                'all_reduce',
                'float32',
                model.moe_layers * model.n_experts,
                1,
                'update',
            )
        )
    if not sharded(parallel, n_gpu):  # ddp, zero1: DDP's buckets, on the last micro-step's backward
        items += [
            (f'gradients, DDP bucket {i + 1}', 'all_reduce', 'float32', n, 1, 'backward')
            for i, n in enumerate(ddp_buckets(model))
        ]
        if parallel == 'zero1':  # each tensor from its owner, after the update
            sizes = sorted({math.prod(s) for _, s in shapes}, reverse=True)
            counts = [sum(math.prod(s) == n for _, s in shapes) for n in sizes]
            items += [
                ('updated weights, ZeRO-1 broadcast', 'broadcast', 'float32', n, count, 'update')
                for n, count in zip(sizes, counts)
            ]
    else:
        # MixedPrecisionPolicy's param_dtype
        gathered = dtype if dtype in ('bfloat16', 'float32') else 'float32'
        root, blocks = fsdp_unit_elements(model, n_gpu)
        A = accumulation
        # blocks of one size (a dense model) are one row; an MoE's dense and expert blocks a row per size
        sizes = sorted(set(blocks), reverse=True)
        each = ['each block' if len(sizes) == 1 else f'each block of {n:,}' for n in sizes]
        per_size = [(name, n, A * blocks.count(n)) for name, n in zip(each, sizes)]
        items += [('weights, root unit', 'all_gather', gathered, root, A, 'forward')]
        items += [
            (f'weights, {name}', 'all_gather', gathered, n, calls, 'forward')
            for name, n, calls in per_size
        ]
        if parallel == 'fsdp':  # the blocks resharded after forward: gathered again in backward
            items += [
                (f'weights again, {name}', 'all_gather', gathered, n, calls, 'backward')
                for name, n, calls in per_size
            ]
        items += [
            (f'gradients, {name}', 'reduce_scatter', 'float32', n, calls, 'backward')
            for name, n, calls in per_size
        ]
        items += [
            ('gradients, root unit', 'reduce_scatter', 'float32', root, A, 'backward'),
            ('gradient norm (DTensor)', 'all_reduce', 'float32', len(shapes), 1, 'update'),
        ]
        # Muon: each matrix's update whole for Newton-Schulz, gathered in the compute dtype (what it casts to
        # first), its rows padded as FSDP2's are (optimizers.py); a row per size, as ZeRO-1's broadcasts
        row = OPTIMIZERS[optimizer]
        whole = [
            -(-s[0] // n_gpu) * n_gpu * s[1]
            for n, s in shapes
            if row.gathers and optimizer_row(optimizer, n, s) is row
        ]
        items += [
            (row.gathers, 'all_gather', dtype, n, k, 'update')
            for n, k in sorted(collections.Counter(whole).items(), reverse=True)
        ]
    result = []
    for what, op, kind, elements, calls, phase in items:
        size = elements * DTYPE_BYTES[kind] * calls
        result.append(
            dict(
                what=what,
                op=op,
                dtype=kind,
                elements=elements,
                calls=calls,
                phase=phase,
                bytes=size,
                bus_bytes=size * BUS_FACTORS[op](n_gpu),
            )
        )
    return result


# Ledger 5b: seconds, an ESTIMATE until measured. A collective takes its bus bytes / the bus bandwidth NCCL
# reaches on the slowest link it crosses (the latency of the few-byte ones, tens of microseconds, is left out).
# Inside a node that is the GPUs' fabric; across nodes NCCL runs one ring per NIC (rail-optimised: a NIC per GPU,
# as DGX/HGX nodes have), so the node's NICs add up: 8 x 200 Gb/s HDR gave 192 GB/s of all-reduce busbw across
# two DGX A100 (NVIDIA, nccl#812), 8 x 24 GB/s. A collective over several nodes goes at the slower of the two.
# Where nothing is published the bus bandwidth is the line rate x 370/450, NCCL's efficiency on NVLink4.


@dataclass(frozen=True)
class Links:
    fabric: str  # what joins the GPUs inside a node
    line_gbps: float  # its line rate per GPU and direction, GB/s (the datasheet's bidirectional figure / 2)
    busbw_gbps: float  # the bus bandwidth NCCL reaches on it (nccl-tests' busbw), GB/s
    busbw_source: str
    nic: str  # the usual NIC between nodes, one per GPU
    nic_busbw_gbps: float  # what NCCL reaches through one of them, GB/s
    nic_source: str


NVLINK4_EFFICIENCY = 370 / 450
_NVLINK4 = 'NVIDIA (nccl-tests#212): NVLink4 line rate 450 GB/s, NCCL ~370 busbw (~480 for all-reduce with NVLS)'
_NDR = (
    'InfiniBand NDR 400 Gb/s',
    48.0,
    'NVIDIA (nccl-tests#267): 48-49 GB/s per ConnectX-7 at NDR',
)
_HDR = (
    'InfiniBand HDR 200 Gb/s',
    24.0,
    'NVIDIA (nccl#412): 24 GB/s per HDR NIC; x8 = 192 GB/s (nccl#812)',
)
_PCIE5 = Links(
    'PCIe Gen5 x16, 128 GB/s bidirectional (NVLink bridges join pairs at most)',
    64,
    64 * NVLINK4_EFFICIENCY,
    'ESTIMATE: line rate x 370/450',
    *_NDR,
)
LINKS = {  # keyed like GPUS; fabric figures from the vendors' datasheets
    'H200': Links('NVLink4 + NVSwitch, 900 GB/s bidirectional', 450, 370, _NVLINK4, *_NDR),
    'H200-NVL': _PCIE5,
    'H100': Links('NVLink4 + NVSwitch, 900 GB/s bidirectional', 450, 370, _NVLINK4, *_NDR),
    'H100-PCIe': _PCIE5,
    'H100-NVL': _PCIE5,
    'A100': Links(
        'NVLink3 + NVSwitch, 600 GB/s bidirectional',
        300,
        232,
        'measured: all_reduce_perf on 8 x A100, 232.5 GB/s (nccl-tests#175)',
        *_HDR,
    ),
    'A800': Links(
        'NVLink3, 400 GB/s bidirectional',
        200,
        160,
        'NVIDIA (nccl#412): ~160 GB/s intra-node',
        *_HDR,
    ),
    'MI300X': Links(
        'Infinity Fabric, 7 x 128 GB/s bidirectional',
        448,
        448 * NVLINK4_EFFICIENCY,
        'ESTIMATE: line rate x 370/450 (RCCL)',
        *_NDR,
    ),
    'B200': Links(
        'NVLink5 + NVSwitch, 1.8 TB/s bidirectional',
        900,
        900 * NVLINK4_EFFICIENCY,
        'ESTIMATE: line rate x 370/450',
        *_NDR,
    ),
}
GPUS_PER_NODE = 8  # an HGX/DGX board: the node count when `nodes` is 0
# the ledger's line: communication "hides" while at most this share of a step waits
COMM_EXPOSED_LIMIT = 0.10


def device_links(device):
    """The LINKS entry for a Device from the GPU table (named, or measured and recognised), else None."""
    for key, gpu in GPUS.items():
        if device.kind == 'gpu' and (device.name == gpu.name or f'({key})' in device.peak_source):
            return LINKS[key]
    return None


def topology(train, n_gpu, device):
    """-> dict: nodes, gpus_per_node, the intra- and inter-node bus bandwidths (bytes/s; None when unknown: a CPU or
    a GPU not in the table, unless the config gives them), the bandwidth a collective over all ranks gets, and
    which link sets it, with sources."""
    nodes = train.nodes or math.ceil(n_gpu / GPUS_PER_NODE)
    if nodes > n_gpu:
        raise ConfigError(
            f"nodes ({nodes}) must be at most n_gpu ({n_gpu}): each node holds at least one device"
        )
    per_node = math.ceil(n_gpu / nodes)
    links = device_links(device)
    intra, intra_source = (
        (train.intra_node_busbw * 1e9, 'intra_node_busbw (config)')
        if train.intra_node_busbw
        else (links.busbw_gbps * 1e9, links.busbw_source)
        if links
        else (None, 'unknown: not a GPU of the table (set intra_node_busbw, GB/s)')
    )
    inter, inter_source = (
        (train.inter_node_busbw * 1e9, 'inter_node_busbw (config), per node')
        if train.inter_node_busbw
        else (
            per_node * links.nic_busbw_gbps * 1e9,
            f'{per_node} x {links.nic} per node: {links.nic_source}',
        )
        if links
        else (None, 'unknown (set inter_node_busbw, GB/s per node)')
    )
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
    """Ledger 5 for a plan: the collectives of a step, their bytes, and (ESTIMATE) their seconds, how many of them
    hide under backward / forward compute, the exposed rest, and the bound. compute_step_seconds: the step's
    compute alone (Ledger 3)."""
    dtype = run_dtype(train, device)
    accumulation = max(
        1, math.ceil(train.batch_tokens / (train.micro_batch * model.block_size * n_gpu))
    )
    items = collectives(model, train.parallel, n_gpu, accumulation, dtype, train.optimizer)
    comm = dict(
        collectives=items,
        accumulation=accumulation,
        bytes=sum(i['bytes'] for i in items),
        bus_bytes=sum(i['bus_bytes'] for i in items),
        topology=topology(train, n_gpu, device),
        seconds=None,
        exposed_seconds=None,
        exposed_fraction=None,
        exposed_limit=COMM_EXPOSED_LIMIT,
        bound='compute',
    )
    if train.parallel == 'zero1' and n_gpu > 1:  # each rank broadcasts the tensors it owns
        comm['broadcast_bytes_by_rank'] = [
            4 * sum(math.prod(shape) for _, shape in owned)
            for owned in zero1_partition(model, n_gpu, train.optimizer)
        ]
    busbw = comm['topology']['busbw']
    if not items or busbw is None:
        return comm
    # the windows communication can hide under: a micro-step's forward (2 of the book's 6P, 2 of 8P with recompute)
    # and backward; FSDP2 hides in every micro-step, DDP only in the last one's backward (no_sync before)
    forward_share = 2 / (8 if train.recompute else 6)
    micro = compute_step_seconds / accumulation
    windows = accumulation if sharded(train.parallel, n_gpu) else 1
    seconds = {phase: 0.0 for phase in ('step', 'update', 'forward', 'backward', 'edge')}
    last_bucket = max(
        (i for i, item in enumerate(items) if 'DDP bucket' in item['what']), default=None
    )
    for i, item in enumerate(items):
        item['seconds'] = item['bus_bytes'] / busbw
        # nothing to hide under: the first all-gather of forward (the root unit), the last
        # reduce-scatter (the root's), DDP's last bucket (the first layers' gradients, ready as backward ends)
        edge = 'root unit' in item['what'] or i == last_bucket
        seconds['edge' if edge else item['phase']] += item['seconds']
    exposed = (
        seconds['step']
        + seconds['update']
        + seconds['edge']
        + max(0.0, seconds['forward'] - windows * micro * forward_share)
        + max(0.0, seconds['backward'] - windows * micro * (1 - forward_share))
    )
    comm.update(
        seconds=sum(seconds.values()),
        exposed_seconds=exposed,
        exposed_fraction=exposed / (compute_step_seconds + exposed),
    )
    if comm['exposed_fraction'] > COMM_EXPOSED_LIMIT:
        comm['bound'] = comm['topology']['link']
    return comm


# Ledger 5c: the book's rule as a verdict: data parallelism with ZeRO/FSDP is enough while every GPU gets a
# sequence, the plan fits and at most COMM_EXPOSED_LIMIT of a step waits on communication; else tensor or pipeline
# parallelism. Derived term by term in BOOK.md, 'Derivations: Ledger 5c'.

ELSEWHERE = 'torchtitan (PyTorch: tensor, pipeline and context parallelism on FSDP2) or Megatron-LM (NVIDIA)'


def pipeline_bubble(stages, micro_batches):
    return (stages - 1) / (micro_batches + stages - 1)


def _plan_check(model, train, n_gpu, device):
    """-> (fits, exposed fraction or None, memory total, memory of the device) for one plan."""
    memory = memory_per_gpu(model, train, n_gpu, device=device)
    hardware = flops_per_token(model, train.recompute, compile_mode(train, n_gpu) == 'blocks')[
        'hardware'
    ]
    compute_step = train.batch_tokens * hardware / (n_gpu * device.peak_flops * train.mfu)
    exposed = communication(model, train, n_gpu, device, compute_step)['exposed_fraction']
    return memory['fits'], exposed, memory['total'], memory['gpu_memory']


def parallelism_verdict(model, train, n_gpu, device, fits, exposed_fraction):
    """-> dict: enough (bool), verdict (one line), reasons, and a suggestion (the flags of a plan that passes)."""
    sequences = train.batch_tokens // model.block_size
    reasons = []
    if sequences < n_gpu:
        reasons.append(
            f'the global batch has {sequences} sequences for {n_gpu} GPUs: data parallelism needs one a GPU'
        )
    hides = exposed_fraction is None or exposed_fraction <= COMM_EXPOSED_LIMIT
    if not reasons and fits and hides:
        verdict = 'data parallelism is enough' if n_gpu > 1 else 'one device: nothing to spread'
        return dict(enough=True, verdict=verdict, reasons=[], suggestion=None)
    if not fits:
        reasons.append('the plan does not fit in memory')
    if not hides:
        reasons.append(
            f'{exposed_fraction:.0%} of a step waits on communication (limit {COMM_EXPOSED_LIMIT:.0%})'
        )
    best = None
    if sequences >= n_gpu:
        for parallel in ('ddp', 'zero1', 'zero2', 'fsdp'):
            for recompute in (False, True):
                trial = dataclasses.replace(train, parallel=parallel, recompute=recompute)
                micro_batch = min(max_micro_batch(model, trial, n_gpu, device), sequences // n_gpu)
                if not micro_batch:
                    continue
                trial = dataclasses.replace(trial, micro_batch=micro_batch)
                ok, exposed, _, _ = _plan_check(model, trial, n_gpu, device)
                if ok and (exposed is None or exposed <= COMM_EXPOSED_LIMIT):
                    best = (
                        best
                        or f'--parallel={parallel} --recompute={recompute} --micro_batch={micro_batch}'
                    )
    if best:
        return dict(
            enough=True,
            verdict=f'data parallelism is enough with {best}',
            reasons=reasons,
            suggestion=best,
        )
    if sequences >= n_gpu:
        trial = dataclasses.replace(train, parallel='fsdp', recompute=True, micro_batch=1)
        ok, exposed, total, memory = _plan_check(model, trial, n_gpu, device)
        reasons.append(
            f'fully sharded (fsdp, recompute, micro-batch 1): {total / GIB:,.1f} of {memory / GIB:,.1f} GiB per GPU'
            + (f', {exposed:.0%} of a step exposed communication' if exposed is not None else '')
        )
    return dict(
        enough=False,
        bubble=pipeline_bubble(
            4, max(1, train.batch_tokens // (train.micro_batch * model.block_size * n_gpu))
        ),
        verdict=f'needs tensor or pipeline parallelism, which this trainer does not do: see {ELSEWHERE}',
        reasons=reasons,
        suggestion=None,
    )


# Ledger MoE: a mixture of experts: FLOPs, days, cost and activations scale with the ACTIVE parameters, the model
# states with the TOTAL (every expert's states are held); the book's 16 x active is printed beside them. Derived
# term by term in BOOK.md, 'Derivations: Ledger MoE'.


def moe_params(model):
    """One MoE layer's FFN parameters: 'layer' all of them, 'idle' the routed experts a token does not visit,
    'router' the router's. All 0 for a dense model."""
    if not model.n_experts:
        return {'layer': 0, 'idle': 0, 'router': 0}
    n, k, H = model.n_experts, model.top_k, model.n_embd
    expert = 3 * H * model.expert_hidden  # a SwiGLU: gate, up, down
    return {
        'layer': n * H + (n + model.n_shared_experts) * expert,
        'idle': (n - k) * expert,
        'router': n * H,
    }


def moe_activation_bytes(model, a, autocast):
    """Bytes an MoE layer's FFN saves for backward per token (eager; moe.py's MoE.forward), in place of the dense
    FFN's a*H + 4a*H'. a: activation bytes (2 under bf16 autocast, 4 in fp32); k routed experts per token:
      inputs:      the FFN input a*H, read by the router and the shared experts (under autocast each Linear keeps
                   its own bf16 copy: the shared experts' a*H more)
      router:      the fp32 sigmoid affinities 4n; the chosen experts' ids (int64) 8k; the chosen affinities and
                   their sum 4k + 4, and the gates 4k
      dispatched:  the routing buffers: each token copied once per chosen expert a*k*H, and the experts' outputs
                   back in token order a*k*H, with the two gathers' ids 8k each
      experts:     k SwiGLUs of width E a token: 4a*E each (gate|up, silu(gate), the product); shared 4a*s*E"""
    n, k, H, E = model.n_experts, model.top_k, model.n_embd, model.expert_hidden
    shared = model.n_shared_experts * E
    parts = {
        'inputs': a * H * (2 if autocast and shared else 1),
        'router': 4 * n + 8 * k + 4 * k + 4 + 4 * k,
        'dispatched': 2 * a * k * H + 16 * k,
        'experts': 4 * a * k * E + 4 * a * shared,
    }
    parts['total'] = sum(parts.values())
    return parts


# -----------------------------------------------------------------------------------------------------
# Data and tokens (the planning note). Chinchilla (Hoffmann et al. 2022): compute-optimal tokens ~ 20 x params.
# Token storage: uint16 (2 bytes) while every id fits, i.e. vocab <= 65,536 (the book writes < 65,536), else
# uint32. FineWeb-Edu parquet is ~3-4 bytes/token compressed. A checkpoint with Adam is 12P bytes (fp32 weights,
# momentum, variance); a bf16 export of the weights alone is 2P.
# Expected loss from a fitted scaling law L(N, D) = E + A/N^alpha + B/D^beta. Both fits are for THEIR data
# (MassiveText) and tokenizer, so they give the shape of the curve, not our loss in nats per GPT-2 token.

CHINCHILLA_TOKENS_PER_PARAM = 20
CHINCHILLA_FITS = {
    'hoffmann2022': dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),  # Hoffmann et al. 2022
    'epoch2024': dict(
        E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658
    ),  # Besiroglu et al. (Epoch AI) 2024
}


def chinchilla_loss(n_params, n_tokens, fit='hoffmann2022'):
    c = CHINCHILLA_FITS[fit]
    return c['E'] + c['A'] / n_params ** c['alpha'] + c['B'] / n_tokens ** c['beta']


def token_bytes(vocab_size):
    return 2 if vocab_size <= 2**16 else 4


# The share of the positions that carry loss under each objective (clm and fim 1, prefix_lm 1/2, ul2 its mixture
# of denoisers: 0.40 at the default rates); compute counts every position. Derived term by term in BOOK.md,
# 'Derivations: The share of the positions that carry loss'.

UL2_RATES = (DEFAULTS['ul2_s_rate'], DEFAULTS['ul2_r_rate'], DEFAULTS['ul2_x_rate'])


def loss_fraction(objective, ul2_rates=UL2_RATES):
    """The expected share of the positions whose target carries loss under `objective` (a name in
    config.OBJECTIVES); ul2_rates: the shares of the fragments given UL2's S, R and X denoisers."""
    if objective != 'ul2':
        return {'clm': 1.0, 'fim': 1.0, 'prefix_lm': 0.5}[objective]

    def mixture(denoisers):  # a fragment given R or X takes one of its settings uniformly
        return sum((r + r / mu) / (1 + 2 * r / mu) for mu, r in denoisers) / len(denoisers)

    s_rate, r_rate, x_rate = ul2_rates
    return s_rate * 0.5 + r_rate * mixture(R_DENOISERS) + x_rate * mixture(X_DENOISERS)


def data_ledger(
    n_params, vocab_size, train_tokens, dataset_tokens=0, trained_fraction=1.0, optimizer_bytes=None
):
    """Tokens per parameter against Chinchilla, whether the dataset is enough, storage, checkpoints, loss fits.
    trained_fraction: the share of the tokens that carry loss (loss_fraction); optimizer_bytes: the optimizer's
    states a checkpoint holds beside the fp32 weights (None: AdamW's m and v, 8P)."""
    stored_tokens = dataset_tokens or train_tokens
    data = {
        'train_tokens': train_tokens,
        'loss_fraction': trained_fraction,
        'loss_tokens': train_tokens * trained_fraction,
        'tokens_per_param': train_tokens / n_params,
        'chinchilla_tokens': CHINCHILLA_TOKENS_PER_PARAM * n_params,
        'chinchilla_multiple': train_tokens / (CHINCHILLA_TOKENS_PER_PARAM * n_params),
        'chinchilla_params_for_tokens': train_tokens / CHINCHILLA_TOKENS_PER_PARAM,
        'dataset_tokens': dataset_tokens or None,
        'enough_data': dataset_tokens >= train_tokens if dataset_tokens else None,
        'epochs': train_tokens / dataset_tokens if dataset_tokens else None,
        'token_bytes': token_bytes(vocab_size),
        'shard_bytes': stored_tokens * token_bytes(vocab_size),
        'parquet_bytes_low': stored_tokens * 3,
        'parquet_bytes_high': stored_tokens * 4,
        'checkpoint_bytes': 4 * n_params
        + (8 * n_params if optimizer_bytes is None else optimizer_bytes),
        'export_bytes': 2 * n_params,
        'expected_loss': {
            fit: chinchilla_loss(n_params, train_tokens, fit) for fit in CHINCHILLA_FITS
        },
        'fits': CHINCHILLA_FITS,
    }
    return data


# -----------------------------------------------------------------------------------------------------
# A mixture of data folders (mixture.py): GPT-3's table (Brown et al. 2020, Table 2.2: each dataset's tokens, its
# weight in the mix and the epochs elapsed over the run). The sequences each source gives are counted exactly with
# the schedule the run reads by; its tokens are those sequences x block_size (the targets trained on). Epochs are
# those tokens over the folder's train tokens (its meta.json, once prepare.py has made it). Muennighoff et al. 2023
# (Scaling Data-Constrained Language Models): up to ~4 epochs, repeated tokens are worth about as much as new ones;
# beyond that their value decays fast (about 40 epochs, nearly none): the ledger warns past 4.

REPEAT_EPOCHS = 4  # Muennighoff et al. 2023: repetition past ~4 epochs buys much less than new data


def folder_meta(folder):
    """A data folder's meta.json as a dict, or None before prepare.py has finished there (the ledger runs before)."""
    try:
        with open(os.path.join(folder, 'meta.json')) as f:
            meta = json.load(f)
        return meta if isinstance(meta.get('train_tokens'), int) else None
    except (OSError, ValueError, AttributeError):
        return None


def mixture_ledger(data, seed, sequences, block_size, vocab_size):
    """Per source of a mixture: weight, sequences and tokens drawn over the run's `sequences` (global positions
    0 .. sequences - 1; predict passes the planned steps x batch_tokens / block_size, which a batch ramp lowers by
    less than a step), the folder's train tokens, epochs, a repeat warning past REPEAT_EPOCHS, and the bytes its
    shards take (train + val tokens x token bytes; the tokens drawn while the folder is not made yet)."""
    # the schedule the run reads by (standard library too); here, so a one-folder ledger needs none
    from ledgergpt import mixture

    schedule = mixture.Schedule(data, seed)
    rows = []
    for name, folder, weight, drawn in zip(
        schedule.names, schedule.folders, schedule.weights, schedule.drawn(sequences)
    ):
        meta = folder_meta(folder)
        tokens = drawn * block_size
        dataset = meta['train_tokens'] if meta else None
        epochs = tokens / dataset if dataset else None
        stored = meta['train_tokens'] + meta.get('val_tokens', 0) if meta else tokens
        rows.append(
            {
                'name': name,
                'folder': folder,
                'weight': weight,
                'sequences': drawn,
                'tokens': tokens,
                'dataset_tokens': dataset,
                'epochs': epochs,
                'repeats_too_often': epochs is not None and epochs > REPEAT_EPOCHS,
                'shard_bytes': stored * token_bytes(vocab_size),
            }
        )
    return {'period': schedule.period, 'sources': rows, 'repeat_epochs': REPEAT_EPOCHS}


# -----------------------------------------------------------------------------------------------------
# The whole ledger for a config, as one JSON-able dict (train.py writes it to out_dir/ledger.json).


def predict(model, train, n_gpu=None, device=None):
    """Every sum of the ledger for (ModelConfig, TrainConfig) on n_gpu devices (default: train.n_gpu) of `device`
    (default: the one the config's `gpu` names, measured for 'auto' / 'cpu')."""
    n_gpu = n_gpu or train.n_gpu
    # train.py's check: no plan it would refuse
    micro_step_tokens = tokens_per_micro_step(model, train, n_gpu)
    device = device or device_spec(train.gpu, train.dtype)
    params = count_params(model)
    compiled_blocks = compile_mode(train, n_gpu) == 'blocks'  # train.py's build_model
    flops = flops_per_token(model, train.recompute, compiled_blocks)
    # train.mfu is the fraction of peak the devices spend on matmul FLOPs, recomputation included ('hardware': it
    # sets tokens_per_s and days); MFU proper (PaLM, what train.py measures) counts only the model's FLOPs
    # ('matmul'), so with recompute the predicted MFU is lower by matmul / hardware (LLaMA-7B: 1 / 1.33).
    hardware_flops_per_s = n_gpu * device.peak_flops * train.mfu
    # the optimizer's matmuls (Muon's Newton-Schulz), once a step on every rank (ZeRO-1: its own tensors, the
    # busiest rank sets the pace), at the same assumed MFU: a step's compute is its tokens' and then these
    optimizer_flops = optimizer_step_flops(model, train, n_gpu)
    optimizer_seconds = max(optimizer_flops) / (device.peak_flops * train.mfu)
    step_compute = train.batch_tokens * flops['hardware'] / hardware_flops_per_s + optimizer_seconds
    compute_tokens_per_s = train.batch_tokens / step_compute
    memory = memory_per_gpu(model, train, n_gpu, device=device)
    # Ledger 5: a step is its compute plus the communication that does not hide under it (ESTIMATE)
    comm = communication(model, train, n_gpu, device, train.batch_tokens / compute_tokens_per_s)
    slowdown = 1 + (comm['exposed_seconds'] or 0) / (train.batch_tokens / compute_tokens_per_s)
    tokens_per_s = compute_tokens_per_s / slowdown
    if train.train_minutes:  # whole batches, at least one, in that many minutes at this speed
        batches = max(1, int(train.train_minutes * 60 * tokens_per_s // train.batch_tokens))
        train = dataclasses.replace(train, train_tokens=batches * train.batch_tokens)
    tokens = (
        min(train.train_tokens, train.max_steps * train.batch_tokens)
        if train.max_steps
        else train.train_tokens
    )
    steps = math.ceil(tokens / train.batch_tokens)
    compute_days = (
        tokens * flops['hardware'] / hardware_flops_per_s + steps * optimizer_seconds
    ) / SECONDS_PER_DAY
    days = compute_days * slowdown
    return {
        'model': dataclasses.asdict(model),
        'train': dataclasses.asdict(train),
        'gpu': dataclasses.asdict(device),
        'n_gpu': n_gpu,
        'dtype': run_dtype(train, device),
        'params': params,
        'flops_per_token': flops,
        'compiled_blocks': compiled_blocks,
        'tokens': tokens,
        'steps': steps,
        'grad_accum': train.batch_tokens // micro_step_tokens,
        'total_flops': tokens * flops['hardware'] + steps * sum(optimizer_flops),
        'optimizer_flops_per_step': max(optimizer_flops),  # on the busiest rank
        'optimizer_flops_rank0': optimizer_flops[
            0
        ],  # what rank 0 measures (live_ledger.measure_first_step)
        'optimizer_flops': steps * sum(optimizer_flops),  # the run's, every rank's
        'optimizer_step_seconds': optimizer_seconds,
        'model_flops': tokens * flops['matmul'],
        'book_flops': tokens * flops['book'],
        'mfu_assumed': train.mfu,
        'mfu': tokens_per_s
        * flops['matmul']
        / (n_gpu * device.peak_flops),  # = mfu x matmul / hardware
        'tokens_per_s': tokens_per_s,
        'step_seconds': train.batch_tokens / tokens_per_s,
        'days': days,
        'days_compute': compute_days,
        'tokens_per_s_compute': compute_tokens_per_s,
        'comm': comm,
        'parallelism': parallelism_verdict(
            model, train, n_gpu, device, memory['fits'], comm['exposed_fraction']
        ),
        'days_book': train_days(tokens * flops['book'], n_gpu, device.peak_flops, train.mfu),
        'gpu_hours': days * 24 * n_gpu,
        'cost_usd': days * 24 * n_gpu * train.usd_per_gpu_hour,
        'memory': memory,
        'memory_per_gpu_bytes': memory['total'],
        'fits': memory['fits'],
        'max_micro_batch': max_micro_batch(model, train, n_gpu, device),
        'data': data_ledger(
            params['total'],
            model.vocab_size,
            tokens,
            train.dataset_tokens,
            loss_fraction(train.objective, (train.ul2_s_rate, train.ul2_r_rate, train.ul2_x_rate)),
            held_model_states(model, 'ddp', 1, optimizer=train.optimizer)['optimizer']
            if train.optimizer != 'adamw'
            else None,  # Muon's momentum and AdamW's m, v for the rest; AdamW alone: the book's 12P
        ),
        'mixture': mixture_ledger(
            train.data,
            train.seed,
            math.ceil(tokens / train.batch_tokens) * train.batch_tokens // model.block_size,
            model.block_size,
            model.vocab_size,
        )
        if is_mixture(train.data)
        else None,
    }


# -----------------------------------------------------------------------------------------------------
# The book's worked examples (BOOK.md), recomputed: the book's figure beside the ledger's, compared at the book's
# precision (a format spec; '>' for a bound). test_ledger.py checks every one; `ledger.py --book` prints them.

LLAMA_7B = ModelConfig(
    arch='llama',
    n_layer=32,
    n_head=32,
    n_embd=4096,
    ffn_hidden=11008,
    vocab_size=32000,
    block_size=2048,
)
BOOK, NOTE = 'the book, BOOK.md', 'the planning note, BOOK.md'
H200, A800, A100 = GPUS['H200'], GPUS['A800'], GPUS['A100']


def seed_days(params, tokens):
    """The planning note's sum: 6ND on one H200 at MFU 0.40."""
    return train_days(6 * params * tokens, 1, H200.peak_flops, 0.40)


def book_totals():
    """LLaMA-7B on 2 x A800 (ZeRO-3): model states, and the total with the book's activation, softmax and other
    figures taken as given (its GB are GiB, as its 50.20 is)."""
    states = model_state_bytes(count_params(LLAMA_7B)['total'], 'fsdp', 2)['total'] / GIB
    return states, states + 6.20 + 3.91 + 6


# section, what, formula, the book's figure as written, its value, the ledger's (a function), precision, source
# fmt: off
BOOK_EXAMPLES = [
    ('Ledger 1', 'LLaMA-7B parameters', "2VH + H + L(4H^2 + 3HH' + 2H), V 32000, L 32, H 4096, H' 11008",
     '6,738,415,616', 6738415616, lambda: count_params(LLAMA_7B)['total'], ',d', BOOK + '; LLaMA, Touvron et al. 2023'),
    ('Ledger 1', 'LLaMA-7B: share of params in linear layers', 'N_matmul / P (book: > 95%)', '> 95%', 0.95,
     lambda: count_params(LLAMA_7B)['matmul'] / count_params(LLAMA_7B)['total'], '>', BOOK),
    ('Ledger 2', 'LLaMA-7B on 1B tokens', '6 x P x C', '4.04e19', 4.04e19,
     lambda: 6 * count_params(LLAMA_7B)['total'] * 1e9, '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B training FLOPs', '8CP, C 1.4e12, P 6.5e10 (recompute)', '7.28e23', 7.28e23,
     lambda: 8 * 1.4e12 * 6.5e10, '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B seconds', '8CP / (2048 x 2e14 effective)', '1.78e6', 1.78e6,
     lambda: 8 * 1.4e12 * 6.5e10 / (2048 * 2e14), '.3g', BOOK),
    ('Ledger 3', 'LLaMA-65B days (paper: 21)', 'seconds / 86400', '20.6', 20.6,
     lambda: train_days(8 * 1.4e12 * 6.5e10, 2048, A100.peak_flops, 2e14 / A100.peak_flops), '.3g',
     BOOK + '; LLaMA, Touvron et al. 2023: 21 days'),
    ('Ledger 3', 'one H200: 0.76B params, 25B tokens', '6ND / (989e12 x 0.40) / 86400', '~3.3', 3.3,
     lambda: seed_days(0.76e9, 25e9), '.2g', NOTE),
    ('Ledger 3', 'one H200: 1.3B params, 26B tokens', '6ND / (989e12 x 0.40) / 86400', '5.93 (~6)', 5.93,
     lambda: seed_days(1.3e9, 26e9), '.3g', NOTE),
    ('Ledger 3', 'one H200: 1.3B params, 50B tokens', '6ND / (989e12 x 0.40) / 86400', '11.4 (~11)', 11.4,
     lambda: seed_days(1.3e9, 50e9), '.3g', NOTE),
    ('Ledger 3', 'one H200: 7B params, 140B tokens', '6ND / (989e12 x 0.40) / 86400', '~172', 172,
     lambda: seed_days(7e9, 140e9), '.3g', NOTE),
    ('Ledger 3', 'one H200: 13B params, 260B tokens', '6ND / (989e12 x 0.40) / 86400', '593 (~590)', 593,
     lambda: seed_days(13e9, 260e9), '.3g', NOTE),
    ('Ledger 3', 'cost of the 1.3B/26B run, USD',
     f'days x 24 x $3.5/H200-hour ($3-4: {seed_days(1.3e9, 26e9) * 72:.0f}-{seed_days(1.3e9, 26e9) * 96:.0f})',
     '~$500', 500, lambda: seed_days(1.3e9, 26e9) * 24 * 3.5, '.1g', NOTE),
    ('Ledger 4', 'LLaMA-7B model states per GPU, GiB', '16P/2 (ZeRO-3 on 2 x A800-80G); 50.205, the book truncates',
     '50.20', 50.20, lambda: book_totals()[0], '.3g', BOOK),
    ('Ledger 4', 'LLaMA-7B total per GPU, GiB', "16P/2 + the book's 6.20 + 3.91 + ~6 (its GB are GiB, as its 50.20 is)",
     '~66', 66, lambda: book_totals()[1], '.2g', BOOK),
    ('Ledger 4', 'LLaMA-7B spare on an 80 GB card, GiB', 'A800: 81,920 MiB = 80 GiB, - total', '~14', 14,
     lambda: A800.memory_bytes / GIB - book_totals()[1], '.2g', BOOK),
    ('Ledger 4', '13B: model states, GB', '16P', '208', 208, lambda: 16 * 13e9 / 1e9, '.3g', BOOK),
    ('Ledger 4', '13B: fewest 80 GB GPUs', 'ceil(16P / 80 GB)', '3', 3,
     lambda: gpus_for_model_states(13e9, A800.memory_bytes)[0], 'd', BOOK),
    ('Ledger 4', '13B: recommended GPUs', 'rounded up to a power of two', '4', 4,
     lambda: gpus_for_model_states(13e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '30B: recommended GPUs', 'ceil(16P / 80 GB) = 6, to a power of two', '8', 8,
     lambda: gpus_for_model_states(30e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '65B: recommended GPUs', 'ceil(16P / 80 GB) = 13, to a power of two', '16', 16,
     lambda: gpus_for_model_states(65e9, A800.memory_bytes)[1], 'd', BOOK),
    ('Ledger 4', '175B: model states alone, TB', '16P', '~2.8', 2.8, lambda: 16 * 175e9 / 1e12, '.2g', BOOK),
    ('Data', '175B: Chinchilla-optimal tokens, T', '20 x P', '3.5', 3.5, lambda: 20 * 175e9 / 1e12, '.2g',
     NOTE + '; Chinchilla, Hoffmann et al. 2022'),
    ('Data', 'GPT-3 tokens per parameter', '300B / 175B', '~1.7', 1.7, lambda: 300e9 / 175e9, '.2g',
     NOTE + '; GPT-3, Brown et al. 2020'),
    ('Data', '25B tokens are optimal for, B params', 'D / 20', '~1.25', 1.25, lambda: 25e9 / 20 / 1e9, '.3g', NOTE),
    ('Data', '0.76B params: optimal tokens, B', '20 x P', '15.2', 15.2, lambda: 20 * 0.76e9 / 1e9, '.3g', NOTE),
    ('Data', 'Llama-3-8B tokens per parameter', '15T / 8B (~95x Chinchilla from the rounded 1,900)', '~1,900', 1900,
     lambda: 15e12 / 8e9, '.2g', NOTE + '; Llama 3, Meta 2024'),
    ('Data', 'bytes per token, vocab 50,257 (GPT-2)', 'uint16 while vocab <= 65,536', '2', 2,
     lambda: token_bytes(50257), 'd', NOTE),
    ('Data', 'bytes per token, vocab 128,256 (Llama 3)', 'uint32 above', '4', 4, lambda: token_bytes(128256), 'd',
     NOTE),
    ('Data', '250B tokens at 2 bytes/token, GB', 'D x 2', '500', 500, lambda: 250e9 * token_bytes(50257) / 1e9, '.3g',
     NOTE),
    ('Data', '25B tokens as parquet, GB', 'D x ~4 bytes/token (3-4)', '~100', 100, lambda: 25e9 * 4 / 1e9, '.2g', NOTE),
    ('Data', '1.3B Adam checkpoint, GB', '12P: fp32 weights + Adam m, v', '~16', 16, lambda: 12 * 1.3e9 / 1e9, '.2g',
     NOTE),
]
# fmt: on


def book_examples():
    """BOOK_EXAMPLES computed: dicts of section, what, formula, book (as written), book_value, value (the
    ledger's), precision (the format spec the two agree at), source, shown, matches."""
    examples = []
    for section, what, formula, book, book_value, compute, precision, source in BOOK_EXAMPLES:
        value = compute()
        if precision == '>':
            matches, shown = value > book_value, f'{value:.1%}'
        else:
            whole = precision in ('d', ',d')
            matches = format(round(value) if whole else value, precision) == format(
                book_value, precision
            )
            shown = format(round(value), precision) if whole else f'{value:.4g}'
        examples.append(
            dict(
                section=section,
                what=what,
                formula=formula,
                book=book,
                book_value=book_value,
                value=value,
                precision=precision,
                source=source,
                shown=shown,
                matches=matches,
            )
        )
    return examples


# -----------------------------------------------------------------------------------------------------
# Bits per byte: a loss that does not depend on the tokenizer. A cross-entropy of L nats per token over text of
# b bytes per token is L / ln 2 bits per token, L / (ln 2 * b) bits per byte: GPT-2's tokens on FineWeb-Edu are
# ~4.5 bytes, our 8192-token BPE on Python source ~3.8, so per-token losses of two tokenizers (or two codebases)
# compare only once divided by their own bytes per token. The CPU default's 5.52 nats at 3.84 bytes: 2.07 bits.
# Exact only with the bytes of the very targets scored (data.target_bytes): a folder's mean is ~1% off its val.


def bits_per_byte(loss_nats, bytes_per_token):
    """None when the bytes per token are unknown (synthetic data)."""
    return loss_nats / math.log(2) / bytes_per_token if bytes_per_token else None


# -----------------------------------------------------------------------------------------------------
# Predicted against measured: one flat dict (train.py writes it to out_dir/summary.json at each eval and at the
# end) and the markdown table report.md renders from it. Throughput is the run's mean after the warm-up interval;
# memory is the CUDA allocator's peak (max_memory_allocated, beside the ledger's 'allocated') or on the CPU the
# process's peak resident memory (VmHWM, beside the ledger's total, which includes the measured runtime).


def summarize(prediction, measured):
    """measured: device, torch, params, and whichever of tokens_per_s, mfu, peak_memory_bytes, peak_reserved_bytes,
    days, val_loss, val_bytes_per_token (of the val targets scored), step, tokens_seen the run has so far (None or
    missing: not yet)."""
    p, memory = prediction, prediction['memory']
    on_cpu = p['gpu']['kind'] == 'cpu'
    return {
        'device': measured.get('device'),
        'torch': measured.get('torch'),
        'ledger_unverified': p.get(
            'ledger_unverified'
        ),  # --force past a parameter count the rows do not give
        'predicted_for': f"{p['n_gpu']} x {p['gpu']['name']}",
        'peak_source': p['gpu']['peak_source'],
        'step': measured.get('step'),
        'tokens_seen': measured.get('tokens_seen'),
        'params_predicted': p['params']['total'],
        'params_built': measured.get('params'),
        'tokens_per_s_predicted': p['tokens_per_s'],
        'tokens_per_s_measured': measured.get('tokens_per_s'),
        'mfu_assumed': p['mfu_assumed'],
        'mfu_source': p.get(
            'mfu_source'
        ),  # a CPU run's: measured, not assumed (live_ledger.step_probe)
        'mfu_predicted': p['mfu'],
        'mfu_measured': measured.get('mfu'),
        'memory_kind': 'peak resident memory (VmHWM)'
        if on_cpu
        else 'peak allocated (max_memory_allocated)',
        'memory_graph': memory['graph'],
        'memory_predicted_bytes': memory['total'] if on_cpu else memory['allocated'],
        'memory_measured_bytes': measured.get('peak_memory_bytes'),
        'reserved_predicted_bytes': None if on_cpu else memory['total'],
        'reserved_measured_bytes': None if on_cpu else measured.get('peak_reserved_bytes'),
        'days_predicted': p['days'],
        'days_projected': measured.get('days'),
        # rank 0's first optimizer step (live_ledger.measure_first_step): the model states it leaves (weights,
        # gradients, optimizer states, FSDP2's gathered weights aside) and its matmul FLOPs (Muon's Newton-Schulz)
        'model_states_predicted_bytes': memory['weights'] + memory['grads'] + memory['optimizer'],
        'model_states_measured_bytes': measured.get('model_states_bytes'),
        'optimizer_flops_predicted': p.get('optimizer_flops_rank0'),
        'optimizer_flops_measured': measured.get('optimizer_flops'),
        'val_loss': measured.get('val_loss'),
        'bytes_per_token': measured.get('bytes_per_token'),
        'val_bytes_per_token': measured.get('val_bytes_per_token'),
        'val_bpb': bits_per_byte(measured['val_loss'], measured.get('val_bytes_per_token'))
        if measured.get('val_loss') is not None
        else None,
        'val_sources': measured.get(
            'val_sources'
        ),  # a mixture's: {source: {weight, loss, bpb}} (live_ledger.py)
        **comm_summary(p),
    }


def comm_summary(prediction):
    """summary.json's communication keys (Ledger 5): the bytes of a step (exact), the seconds the ledger predicts
    from its link table, and the seconds at the all-reduce bus bandwidth the run's own probe measured
    (live_ledger.collective_probe); on gloo (the CPU) the seconds are not meaningful and say so."""
    comm = prediction['comm']
    probe = comm.get('probe')
    meaningful = bool(probe and probe['meaningful'])
    return {
        'comm_bytes_per_step': comm['bytes'],
        'comm_bus_bytes_per_step': comm['bus_bytes'],
        'comm_seconds_predicted': comm['seconds'],
        'comm_busbw_measured': probe['busbw'] if probe else None,
        'comm_seconds_measured': comm['bus_bytes'] / probe['busbw'] if meaningful else None,
        'comm_exposed_fraction_predicted': comm['exposed_fraction'],
        'comm_seconds_note': None
        if meaningful or not probe
        else f"{probe['backend']} on the CPU: the seconds are not meaningful (the bytes are exact)",
    }
