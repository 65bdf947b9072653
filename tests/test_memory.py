"""
test_memory.py: the memory ledger against the memory a run really holds, on the CPU.

1. Model states, exact: after the first optimizer step of train.py's own loop, the bytes of the parameters, their
   gradients (DDP's buckets included: the .grad tensors are views of them) and the optimizer's states (AdamW's,
   and Muon's momentum beside AdamW's for the rest), each storage counted once, equal sums.held_model_states on
   every rank, for one process and for each parallel mode with 2
   gloo processes (a vocab of 515 and GQA, so that FSDP2 pads and ZeRO-1's greedy partition is uneven). Its second
   layer is a mixture of experts (odd widths: padded too), whose states scale with the total parameters, not the
   active ones (the book's '16 x active'), so the same count proves Ledger MoE.
2. Peak memory: a run's peak resident memory (VmHWM, what summary.json reports; not ru_maxrss, which starts at the
   parent's) is within 15% of the ledger's prediction for this CPU (the live tensors plus the runtime's resident
   memory, measured before the model's tensors exist, plus torch.compile's own host memory when compiled), for the
   CPU default config, for each parallel mode compiled and for FSDP2 eager. glibc's malloc normally keeps freed
   blocks for reuse (fast, but the peak RSS then runs up to ~1.35x the live bytes, which the ledger names), so
   these runs set MALLOC_MMAP_THRESHOLD_ to return every large block at once: the peak RSS is then the live peak.
"""

import json
import math
import os
import subprocess
import sys

import pytest

import helpers
from ledgergpt import sums
from ledgergpt.config import OPTIMIZERS, ModelConfig

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ['ddp', 'zero1', 'zero2', 'fsdp']
MODEL_KEYS = set(ModelConfig.__dataclass_fields__)

COUNT_STATES = '''
import json, sys
import torch
from torch.distributed.tensor import DTensor
import train
from ledgergpt import processes, sums
from ledgergpt.config import OPTIMIZERS

def stored_bytes(tensors):
    """Bytes of the distinct storages behind tensors (a DTensor: its local shard)."""
    storages = {}
    for t in tensors:
        if t is not None:
            storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
            storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
    return sum(storages.values())

for optimizer in OPTIMIZERS:  # one launch, every row (Muon: its momentum on the blocks' matrices)
    run = train.setup(sys.argv[1:] + [f'--optimizer={optimizer}', sys.argv[-1] + f'/{optimizer}'])
    counted, optimizer_step = {}, run.optimizer.step
    def step_and_count(*args, **kwargs):
        result = optimizer_step(*args, **kwargs)
        inner = getattr(run.optimizer, 'optim', run.optimizer)  # ZeRO-1 keeps its part in its own optimizer
        params = list(run.model.parameters())
        states = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
        counted.update(weights=stored_bytes(params), grads=stored_bytes(p.grad for p in params),
                       optimizer=stored_bytes(states))
        return result
    run.optimizer.step = step_and_count
    train.train_step(run)  # the real step: micro-steps, clipping, the update; zero_grad comes after the count
    held = sums.held_model_states(run.model_cfg, run.train.parallel, run.cluster.world_size, 'float32',
                                    run.cluster.rank, optimizer)
    with open(f'{run.train.out_dir}/states_rank{run.cluster.rank}.json', 'w') as f:  # a file a rank
        json.dump({'rank': run.cluster.rank, 'counted': counted, 'ledger': {k: held[k] for k in counted}}, f)
    del run
if torch.distributed.is_initialized():  # leave together: a rank exiting mid-collective makes gloo abort
    torch.distributed.barrier()
# the runs collected first (each optimizer's counting step holds its run in a cycle), then the group destroyed
processes.leave_process_group()
'''

TINY = dict(
    arch='llama',
    n_layer=2,
    n_head=2,
    n_kv_head=1,
    n_embd=64,
    vocab_size=515,
    block_size=32,
    # the second layer a mixture of experts: every expert's states are held whether a token visits it or not
    n_experts=4,
    top_k=2,
    expert_hidden=37,
    n_shared_experts=1,
    n_dense_layers=1,
    micro_batch=2,
    batch_tokens=256,
    train_tokens=2560,
    compile=False,
    dtype='float32',
    data='synthetic',
    eval_tokens=64,
    sample_tokens=0,
)


def python_or_torchrun(processes):
    if processes == 1:
        return [sys.executable]
    return [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        f'--nproc_per_node={processes}',
    ]


@pytest.mark.parametrize(
    'mode,processes', [('ddp', 1)] + [(mode, 2) for mode in MODES], ids=['one-process'] + MODES
)
def test_model_states_are_exact_on_every_rank(mode, processes, tmp_path):
    config = tmp_path / 'tiny.py'
    helpers.write_config(config, TINY)
    script = tmp_path / 'count_states.py'
    script.write_text(COUNT_STATES)
    result = subprocess.run(
        python_or_torchrun(processes)
        + [str(script), str(config), f'--parallel={mode}', f'--out_dir={tmp_path / "out"}'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    held = {}
    for optimizer in OPTIMIZERS:
        ranks = held[optimizer] = [
            json.loads((tmp_path / 'out' / optimizer / f'states_rank{rank}.json').read_text())
            for rank in range(processes)
        ]
        assert sorted(r['rank'] for r in ranks) == list(range(processes))
        for rank in ranks:
            assert rank['counted'] == rank['ledger'], (optimizer, rank)
            assert rank['counted']['weights'] > 0 and rank['counted']['optimizer'] > 0
    model = ModelConfig(**{k: v for k, v in TINY.items() if k in MODEL_KEYS})
    # Muon: 4 bytes a parameter of the blocks' matrices, the router's (4 x 64) aside (no step count); AdamW's 8
    # a parameter and 4 a tensor for the rest (embeddings, lm_head, norms, the router)
    shapes = sums.parameter_shapes(model)
    matrices = [
        s for n, s in shapes if n.startswith('blocks.') and len(s) == 2 and '.router.' not in n
    ]
    P, M = sum(math.prod(s) for _, s in shapes), sum(math.prod(s) for s in matrices)
    assert (
        4 * M + 8 * (P - M) + 4 * (len(shapes) - len(matrices))
        == (sums.held_model_states(model, 'ddp', 1, optimizer='muon')['optimizer'])
    )
    ranks = held['adamw']
    one_process = sums.held_model_states(model, 'ddp', 1)
    params = sums.count_params(model)
    # the total, not the active
    assert one_process['weights'] == 4 * params['total'] > 4 * params['active']
    sharded = (
        {
            'ddp': set(),
            'zero1': {'optimizer'},
            'zero2': {'weights', 'grads', 'optimizer'},
            'fsdp': {'weights', 'grads', 'optimizer'},
        }[mode]
        if processes > 1
        else set()
    )
    # a sharded part: about half of one process's on each rank
    for part in ('weights', 'grads', 'optimizer'):
        share = [rank['counted'][part] / one_process[part] for rank in ranks]
        assert (
            all(0.45 < s < 0.55 for s in share) if part in sharded else share == [1.0] * processes
        ), (part, share)


def peak_memory_run(tmp_path, processes, *flags):
    """train.py on this config for 2 steps; -> (predicted, measured) peak bytes from its summary.json."""
    out = tmp_path / 'out'
    command = python_or_torchrun(processes) + [
        'train.py',
        'configs/pystdlib_cpu.py',
        '--data=synthetic',
        '--max_steps=2',
        '--eval_tokens=4096',
        f'--out_dir={out}',
        *flags,
    ]
    # threads pinned as dtype is (below): a thread's buffers are part of the peak; torchrun gives each process one.
    # The step probe's cache is the run's own (XDG_CACHE_HOME), so that what the suite ran before cannot change its
    # path (a cached speed skips the probe); the one-process run compiles in its own inductor cache, in this
    # process: nothing another test compiled is loaded, and inductor's worker pool (up after a time that depends
    # on the load) takes no kernels
    threads = '2' if processes == 1 else '1'
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_='65536',
        OMP_NUM_THREADS=threads,
        XDG_CACHE_HOME=str(tmp_path / 'cache'),
    )
    if processes == 1:
        env.update(
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / 'inductor'), TORCHINDUCTOR_COMPILE_THREADS='1'
        )
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads((out / 'summary.json').read_text())
    # a failure shows where the peak came: the per-step peaks train.py logged, and the ledger's terms
    lines = (result.stdout + result.stderr).splitlines()
    print('\n'.join(line for line in lines if 'peak mem' in line or 'memory per' in line))
    return summary['memory_predicted_bytes'], summary['memory_measured_bytes']


def test_a_started_process_reports_its_own_peak_not_its_parents():
    # Linux's ru_maxrss of a spawned process starts at its parent's resident memory (the suite's worker, 1.4-1.6 GB
    # late in a full run, made the CPU default's peak 1.37-1.56 GB against 0.98 alone); VmHWM is the process's own
    parent = bytearray(768 * 2**20)
    parent[::4096] = b'x' * len(parent[::4096])  # resident: every page touched
    assert sums.resident_bytes() > 768 * 2**20
    script = (
        'import resource; from ledgergpt import sums; '
        'print(sums.resident_bytes(peak=True), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)'
    )
    result = subprocess.run(
        [sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    own, maxrss = map(int, result.stdout.split())
    del parent
    assert own < 64 * 2**20, own  # a bare interpreter and the standard library
    if sys.platform == 'linux':
        assert maxrss > 768 * 2**20, maxrss  # what summary.json reported before: the parent's


@pytest.mark.skipif(sys.platform != 'linux', reason="VmHWM and clear_refs are Linux's")
def test_the_peak_a_run_reports_starts_after_its_step_probe():
    """The step probe compiles beside the run's states and reached a peak the run's own steps did not (zero1:
    715 MB against 686); live_ledger.reset_peak_resident sets VmHWM back to the resident memory, so summary.json's
    peak is the run's."""
    script = (
        'from ledgergpt import live_ledger, sums; '
        'block = bytearray(512 * 2**20); block[::4096] = b"x" * len(block[::4096]); del block; '
        'before = sums.resident_bytes(peak=True); live_ledger.reset_peak_resident(); '
        'print(before, sums.resident_bytes(peak=True), sums.resident_bytes())'
    )
    result = subprocess.run(
        [sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    before, after, now = map(int, result.stdout.split())
    assert before > 512 * 2**20 > after and after - now < 16 * 2**20, (before, after, now)


def test_cpu_default_peak_memory_within_15_percent(tmp_path):
    # its own shape and batch: 16 x 256 tokens, V 8192, in fp32. Its dtype 'auto' takes bf16 or fp32 from a timing
    # probe, so under load the run could take the path it was not calibrated on (1.108 GB against 0.867 predicted,
    # seen): pinned, as every measured test pins what it measures (the auto choice: test_probe.py)
    # Its plan pinned too: train_minutes buys the tokens of the probe's speed, so a loaded suite planned 17 steps where
    # a quiet machine plans 37, and the step-2 peak differed (1.04 GiB against 0.97)
    predicted, measured = peak_memory_run(tmp_path, 1, '--dtype=float32', '--train_tokens=303104')
    assert measured == pytest.approx(predicted, rel=0.15), (predicted, measured)


@pytest.mark.parametrize('mode', MODES)
def test_compiled_peak_memory_of_each_mode_within_10_percent(mode, tmp_path):
    # compiled, as every config runs: the whole model under DDP and ZeRO-1, block by block under ZeRO-2 and FSDP2
    # (the loss eager), plus torch.compile's host memory; fp32, what each mode itself holds
    predicted, measured = peak_memory_run(
        tmp_path,
        2,
        f'--parallel={mode}',
        '--micro_batch=4',
        '--batch_tokens=4096',
        '--compile=True',
        '--dtype=float32',
    )
    assert measured == pytest.approx(predicted, rel=0.10), (predicted, measured)


def test_eager_peak_memory_of_fsdp_within_10_percent(tmp_path):
    # eager: the gathered weights and gradients of FSDP2's units, without compile's share
    predicted, measured = peak_memory_run(
        tmp_path,
        2,
        '--parallel=fsdp',
        '--micro_batch=4',
        '--batch_tokens=4096',
        '--compile=False',
        '--dtype=float32',
    )
    assert measured == pytest.approx(predicted, rel=0.10), (predicted, measured)


# the chunked loss's forward and backward on one chunk of 2,048 rows (V 8192, H 256), alone in a process: the peak
# resident memory over what h, the weight and the targets hold, after a first call has compiled it
CHUNKED_LOSS_PEAK = '''
import sys, torch
from ledgergpt import live_ledger, losses, sums
torch.set_num_threads(1)
compiled, bf16 = sys.argv[1] == 'compiled', sys.argv[2] == 'bfloat16'
h = torch.randn(2048, 256, requires_grad=True)
weight = torch.randn(8192, 256, requires_grad=True)
targets = torch.randint(8192, (2048,))


def step():
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
        losses.chunked_cross_entropy(h[None], weight, targets[None], 'sum').backward()


step = torch.compile(step) if compiled else step
step()
h.grad = weight.grad = None
live_ledger.reset_peak_resident()
before = sums.resident_bytes()
step()
print(sums.resident_bytes(peak=True) - before)
'''


@pytest.mark.skipif(sys.platform != 'linux', reason="VmHWM and clear_refs are Linux's")
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('graph', ['eager', 'compiled'])
def test_the_chunked_loss_peak_is_the_ledgers_buffers(graph, dtype, tmp_path):
    """Eager, the softmax runs in place in the chunk's one fp32 buffer (4 bytes a logit in fp32; 4 + 2 in bf16, the
    matmul's bf16 output beside it); compiled, inductor makes the matmul's logits, the softmax and its gradient
    three buffers (12 bytes a logit in fp32, 8 in bf16). Counted as eager's, the compiled fp32 chunk measured 2.4x
    its prediction; now (2026-12-04, 2-core EPYC) eager 1.02 and 1.10 (fp32, bf16), compiled 0.92 and 0.95. Under
    autocast the weight's bf16 copy is the activations' term."""
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_='65536',
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / 'inductor'),
        TORCHINDUCTOR_COMPILE_THREADS='1',
    )
    result = subprocess.run(
        [sys.executable, '-c', CHUNKED_LOSS_PEAK, graph, dtype],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = int(result.stdout.split()[-1])
    a = 2 if dtype == 'bfloat16' else 4
    config = ModelConfig(
        arch='llama', n_layer=1, n_head=4, n_embd=256, vocab_size=8192, block_size=2048
    )
    predicted = sums.logits_bytes(config, 1, a, compiled=graph == 'compiled')['total']
    weight_copy = config.vocab_size * config.n_embd * 2 if a == 2 else 0  # lm_head's bf16 copy
    assert measured == pytest.approx(predicted + weight_copy, rel=0.15), (measured, predicted)
