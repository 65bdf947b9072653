"""
test_communication.py: Ledger 5 against what train.py's processes really send, and its printed verdict.

1. Bytes, exact: 2 and 4 gloo processes run train.py's own step (train.build_run + train_step, then continuation.Stop's
   agreement, as the loop does) for every parallel mode with 1 and 3 micro-steps, on a tiny Llama whose DDP
   gradients fill two buckets and whose vocab FSDP2 pads. Torch's flight recorder (TORCH_FR_BUFFER_SIZE) logs
   every collective a process group runs, whoever calls it: DDP's C++ reducer, FSDP2, ZeroRedundancyOptimizer,
   DTensor, train.py. The collectives of the third step (after DDP has rebuilt its buckets) on every rank equal
   sums.collectives, call by call: op, dtype and size. gloo has no reduce-scatter of its own: ProcessGroupGloo
   runs reduce_scatter_tensor as an all-reduce of the whole input and keeps its chunk, so the flight recorder
   logs FSDP2's reduce-scatters as all-reduces of the same size; that they were reduce-scatters is counted on
   the Python side, at torch.distributed.reduce_scatter_single, which FSDP2 calls.
2. The printed ledger: the communication section and its verdict for h100x8_1b3 on one node and two, and a 70B
   Llama on 16 GPUs that is told it needs tensor or pipeline parallelism.
"""

import collections
import dataclasses
import json
import os
import subprocess
import sys

import pytest

import helpers
import ledger
from ledgergpt import bill, sums
from ledgergpt.config import ModelConfig, load_config

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ['ddp', 'zero1', 'zero2', 'fsdp']
ACCUMULATIONS = [1, 3]
# 2 x 64 Llama with GQA. V = 3001: DDP's gradients (507,328 fp32) close a first bucket at 1 MiB, so there are two;
# 3001 rows do not split evenly over 2 or 4 ranks, so FSDP2 pads the embeddings
TINY = dict(
    arch='llama',
    n_layer=2,
    n_head=2,
    n_kv_head=1,
    n_embd=64,
    vocab_size=3001,
    block_size=16,
    micro_batch=1,
    train_tokens=10**6,
    compile=False,
    data='synthetic',
)

COUNT = '''
import json, os, pickle, sys
import torch
import torch.distributed as dist
import train
from ledgergpt import continuation, data, processes
from ledgergpt.config import load_config

def recorded():
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())['entries']

python_reduce_scatters = []  # what FSDP2 asks for, before gloo turns it into an all-reduce
reduce_scatter_single = dist.reduce_scatter_single
def counting(output, input, *args, **kwargs):
    python_reduce_scatters.append([str(input.dtype).removeprefix('torch.'), input.numel()])
    return reduce_scatter_single(output, input, *args, **kwargs)
dist.reduce_scatter_single = counting

config, out = sys.argv[1], sys.argv[2]
cluster = processes.setup_cluster()
processes.join_process_group(cluster)
stop = continuation.Stop(cluster)
counted = {}
MOE = ['--n_experts=4', '--top_k=2', '--expert_hidden=32', '--n_shared_experts=1', '--n_dense_layers=1']
cases = [
    (mode, accumulation, dtype, [])
    for mode in ('ddp', 'zero1', 'zero2', 'fsdp')
    for accumulation in (1, 3)
    for dtype in (('float32', 'bfloat16') if mode in ('zero2', 'fsdp') and accumulation == 1 else ('float32',))
]
cases += [(mode, 1, 'float32', MOE) for mode in ('ddp', 'fsdp')]  # an MoE second layer: its block is the larger
# Muon: under zero2 and fsdp each block matrix's rows to its owner and back, in the compute dtype; elsewhere nothing
cases += [(mode, 1, 'float32', ['--optimizer=muon']) for mode in ('ddp', 'zero1', 'zero2', 'fsdp')]
cases += [(mode, 1, 'bfloat16', ['--optimizer=muon']) for mode in ('zero2', 'fsdp')]
for mode, accumulation, dtype, extra in cases:
    batch = accumulation * cluster.world_size * 16
    flags = [f'--parallel={mode}', f'--batch_tokens={batch}', *extra]
    model_cfg, train_cfg = load_config(config, flags)
    stream = data.SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train_cfg.seed, split=0)
    run = train.build_run(model_cfg, train_cfg, cluster, dtype, stream, 10**6, 10**6)
    for step in range(3):  # DDP sends all in one bucket at step 1 and rebuilds its buckets at step 2
        before = max((e['record_id'] for e in recorded()), default=-1)
        del python_reduce_scatters[:]
        train.train_step(run)
        stop.agreed()  # the loop's one collective besides the step's
    entries = [e for e in recorded() if e['record_id'] > before]
    counted[f'{mode} {accumulation} {dtype}' + {0: '', 1: ' muon', 5: ' moe'}[len(extra)]] = {
        'collectives': [
            [e['profiling_name'], e['input_dtypes'], e['input_sizes'], e['output_sizes']] for e in entries
        ],
        'reduce_scatters': list(python_reduce_scatters),
    }
    del run
stop.restore()
with open(os.path.join(out, f'rank{cluster.rank}.json'), 'w') as f:
    json.dump(counted, f)
dist.barrier()
dist.destroy_process_group()
'''

GLOO_DTYPES = {'Float': 'float32', 'BFloat16': 'bfloat16', 'Long': 'int64'}


def as_calls(recorded):
    """Flight-recorder entries -> a multiset of (op, dtype, NCCL-tests' size in elements): the all-gather's output,
    every other op's input."""
    calls = collections.Counter()
    for name, dtypes, inputs, outputs in recorded:
        op = name.removeprefix('gloo:')
        shape = outputs[0] if op == 'all_gather' else inputs[0]
        elements = 1
        for n in shape:
            elements *= n
        calls[op, GLOO_DTYPES[dtypes[0]], elements] += 1
    return calls


def ledger_calls(items, on_gloo=True):
    """sums.collectives -> the same multiset (reduce-scatters as gloo logs them: all-reduces of the input)."""
    calls = collections.Counter()
    for item in items:
        op = 'all_reduce' if on_gloo and item['op'] == 'reduce_scatter' else item['op']
        calls[op, item['dtype'], item['elements']] += item['calls']
    return calls


@pytest.fixture(scope='module')
def launched(tmp_path_factory):
    """Every rank's collectives of a step, for every mode, accumulation and dtype: one torchrun per world size, the
    two at once (each spends much of its time starting and stopping processes)."""
    tmp = tmp_path_factory.mktemp('comm')
    config = tmp / 'tiny.py'
    helpers.write_config(config, TINY)
    script = tmp / 'count.py'
    script.write_text(COUNT)
    runs = {}
    for world_size in (2, 4):
        (tmp / str(world_size)).mkdir()
        runs[world_size] = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'torch.distributed.run',
                '--standalone',
                f'--nproc_per_node={world_size}',
            ]
            + [str(script), str(config), str(tmp / str(world_size))],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT, TORCH_FR_BUFFER_SIZE='100000'),
        )
    counted = {}
    try:
        for world_size, process in runs.items():
            output, _ = process.communicate(timeout=900)
            assert process.returncode == 0, output[-5000:]
            counted[world_size] = [
                json.loads((tmp / str(world_size) / f'rank{rank}.json').read_text())
                for rank in range(world_size)
            ]
    finally:
        for process in runs.values():  # the other one, when one failed
            if process.poll() is None:
                process.kill()
    return counted


@pytest.fixture(params=[2, 4], ids=['2 processes', '4 processes'])
def counted(request, launched):
    return request.param, launched[request.param]


def test_every_collective_of_a_step_is_the_ledgers_on_every_rank(counted):
    world_size, ranks = counted
    model = ModelConfig(**{k: v for k, v in TINY.items() if k in ModelConfig.__dataclass_fields__})
    assert len(sums.ddp_buckets(model)) == 2  # the test model does exercise the bucketing
    # the script's MOE flags
    moe = dataclasses.replace(
        model, n_experts=4, top_k=2, expert_hidden=32, n_shared_experts=1, n_dense_layers=1
    )
    # FSDP2's blocks of two sizes
    assert len(set(sums.fsdp_unit_elements(moe, world_size)[1])) == 2
    for rank in ranks:
        assert len(rank) == 18
        for key, seen in rank.items():
            mode, accumulation, dtype, *extra = key.split()
            optimizer = 'muon' if extra == ['muon'] else 'adamw'
            items = sums.collectives(
                moe if extra == ['moe'] else model,
                mode,
                world_size,
                int(accumulation),
                dtype,
                optimizer,
            )
            assert as_calls(seen['collectives']) == ledger_calls(items), (world_size, key)
            # and FSDP2's reduce-scatters were asked for as such, with the ledger's dtype and size
            asked = collections.Counter((dtype, n) for dtype, n in seen['reduce_scatters'])
            expected = collections.Counter()
            for item in items:
                if item['op'] == 'reduce_scatter':
                    expected[item['dtype'], item['elements']] += item['calls']
            assert asked == expected, (world_size, key)
            # the bytes the ledger reports are the sum of what was seen
            seen_bytes = sum(
                sums.DTYPE_BYTES[d] * n * k
                for (_, d, n), k in as_calls(seen['collectives']).items()
            )
            assert seen_bytes == sum(item['bytes'] for item in items), key


def test_the_modes_differ_as_the_ledger_says(counted):
    """What the counts show, in words: ddp and zero1 all-reduce once a step whatever the accumulation (no_sync),
    zero1 adds 4P of broadcasts, FSDP2 communicates every micro-step, fsdp gathers the blocks again (not the root,
    which stays gathered for backward), and bf16 halves the gathers only."""
    world_size, (rank, *_) = counted
    model = ModelConfig(**{k: v for k, v in TINY.items() if k in ModelConfig.__dataclass_fields__})
    P = sums.count_params(model)['total']

    # bytes of the step's collectives, the int64 bookkeeping aside
    def volume(key, op=None, smallest=1):
        return sum(
            sums.DTYPE_BYTES[d] * n * k
            for (o, d, n), k in as_calls(rank[key]['collectives']).items()
            if d != 'int64' and n >= smallest and (op is None or o == op)
        )

    assert volume('ddp 1 float32') == volume('ddp 3 float32') == 4 * P
    assert volume('zero1 3 float32', 'broadcast') == 4 * P
    # not the norm
    assert volume('zero2 3 float32', smallest=100) == 3 * volume('zero2 1 float32', smallest=100)
    # fsdp gathers each block again, the root once
    _, blocks = sums.fsdp_unit_elements(model, world_size)
    assert volume('fsdp 1 float32', 'all_gather') == volume(
        'zero2 1 float32', 'all_gather'
    ) + 4 * sum(blocks)
    assert volume('fsdp 1 bfloat16', 'all_gather') * 2 == volume('fsdp 1 float32', 'all_gather')
    # fp32 reductions
    assert volume('fsdp 1 bfloat16', 'all_reduce') == volume('fsdp 1 float32', 'all_reduce')
    assert volume('zero2 1 float32', 'all_gather') > 4 * P  # the padded rows
    # Muon: nothing more under ddp and zero1; under zero2 and fsdp two all-to-alls a block of up to N
    # matrices of one shape (here 2 of each: one block), N x ceil(rows / N) x cols, in the compute dtype
    assert volume('ddp 1 float32 muon') == volume('ddp 1 float32')
    assert volume('zero1 1 float32 muon') == volume('zero1 1 float32')
    matrices = {
        s for n, s in sums.parameter_shapes(model) if n.startswith('blocks.') and len(s) == 2
    }
    padded = sum(2 * -(-rows // world_size) * world_size * cols for rows, cols in matrices)
    for mode in ('zero2', 'fsdp'):
        assert volume(f'{mode} 1 float32 muon') == volume(f'{mode} 1 float32') + 4 * padded
        assert volume(f'{mode} 1 bfloat16 muon') == volume(f'{mode} 1 bfloat16') + 2 * padded
        assert volume(f'{mode} 1 float32 muon', 'all_to_all') == 4 * padded


# -----------------------------------------------------------------------------------------------------
# The bus bytes, the seconds and the verdict (no processes)


def test_bus_bytes_are_nccl_tests_factors():
    model, train = load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), ['--parallel=ddp'])
    items = sums.collectives(model, 'ddp', 8, 4, 'bfloat16')
    P = sums.count_params(model)['total']
    gradients = [i for i in items if 'DDP bucket' in i['what']]
    assert sum(i['bytes'] for i in gradients) == 4 * P  # fp32 gradients, once per step
    assert sum(i['bus_bytes'] for i in gradients) == pytest.approx(4 * P * 2 * 7 / 8)
    # Muon under FSDP2: 22 layers' 4 shapes of matrix, each in 3 blocks (8 + 8 + 6), 2 all-to-alls each
    muon = [
        i
        for i in sums.collectives(model, 'fsdp', 8, 4, 'bfloat16', 'muon')
        if i['op'] == 'all_to_all'
    ]
    assert sum(i['calls'] for i in muon) == 4 * 3 * 2
    assert sum(i['bus_bytes'] for i in muon) == pytest.approx(sum(i['bytes'] for i in muon) * 7 / 8)
    sharded = sums.collectives(model, 'zero2', 8, 4, 'bfloat16')
    gathers = sum(i['bus_bytes'] for i in sharded if i['op'] == 'all_gather')
    root, blocks = sums.fsdp_unit_elements(model, 8)
    # a dense model's blocks are alike
    assert len(blocks) == model.n_layer and len(set(blocks)) == 1
    assert gathers == pytest.approx(4 * 2 * (root + sum(blocks)) * 7 / 8)
    # the blocks gathered again in backward, not the root
    sharded = sums.collectives(model, 'fsdp', 8, 4, 'bfloat16')
    gathers = sum(i['bus_bytes'] for i in sharded if i['op'] == 'all_gather')
    assert gathers == pytest.approx(4 * 2 * (root + 2 * sum(blocks)) * 7 / 8)
    assert sums.BUS_FACTORS['broadcast'](8) == 1.0
    # every GPU of the table has its links, with their sources
    assert set(sums.LINKS) == set(sums.GPUS)
    assert all(link.busbw_gbps <= link.line_gbps for link in sums.LINKS.values())


def test_seconds_hide_and_the_days_count_what_does_not():
    model, train = load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'))
    p = sums.predict(model, train)
    comm = p['comm']
    assert comm['topology']['busbw'] == 370e9 and comm['topology']['nodes'] == 1
    assert comm['seconds'] == pytest.approx(comm['bus_bytes'] / 370e9)
    assert 0 < comm['exposed_seconds'] < comm['seconds'] and comm['bound'] == 'compute'
    step = train.batch_tokens / p['tokens_per_s_compute']
    assert p['days'] == pytest.approx(p['days_compute'] * (step + comm['exposed_seconds']) / step)
    # a slower fabric: the same bytes take longer and show; the run becomes bound by it
    slow = sums.predict(
        *load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), ['--intra_node_busbw=5'])
    )
    assert slow['comm']['bytes'] == comm['bytes'] and slow['comm']['seconds'] == pytest.approx(
        comm['seconds'] * 74
    )
    assert slow['comm']['bound'] == 'intra-node' and slow['days'] > p['days']
    # two nodes: the NICs are the ring's other link; overridden slow, they bind
    two = sums.predict(
        *load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), ['--n_gpu=16', '--nodes=2'])
    )
    # 16 GPUs x 16 sequences x 2048 tokens: the step's 524,288 tokens in one micro-step
    assert two['comm']['topology']['inter_busbw'] == 8 * 48e9 and two['comm']['accumulation'] == 1
    ib = ['--n_gpu=16', '--nodes=2', '--inter_node_busbw=10']
    thin = sums.predict(*load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), ib))
    assert thin['comm']['topology']['busbw'] == 10e9 and thin['comm']['bound'] == 'inter-node'
    # one process sends nothing
    single = sums.predict(*load_config(os.path.join(ROOT, 'configs/h200_1b3.py')))
    assert single['comm']['collectives'] == [] and single['days'] == single['days_compute']


LLAMA3_70B = [  # Llama 3 70B's shape (Meta 2024) on 16 x H100 80GB, its 8K context
    '--arch=llama',
    '--n_layer=80',
    '--n_head=64',
    '--n_kv_head=8',
    '--n_embd=8192',
    '--ffn_hidden=28672',
    '--vocab_size=128256',
    '--block_size=8192',
    '--gpu=H100',
    '--n_gpu=16',
    '--parallel=fsdp',
    '--batch_tokens=4194304',
    '--micro_batch=1',
    '--recompute=True',
    '--train_tokens=15e12',
]


def test_the_verdict_follows_the_books_rule():
    model, train = load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'))
    fine = sums.predict(model, train)['parallelism']
    assert fine['enough'] and fine['verdict'] == 'data parallelism is enough'
    big = sums.predict(*load_config(None, LLAMA3_70B))['parallelism']
    assert (
        not big['enough']
        and 'tensor or pipeline' in big['verdict']
        and 'torchtitan' in big['verdict']
    )
    assert any('fully sharded' in reason for reason in big['reasons'])
    # a plan that fails as written but passes in another mode is told the flags
    flags = ['--parallel=ddp', '--micro_batch=16']  # 16 sequences of 2048 do not fit in 80 GB
    ddp = sums.predict(*load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), flags))
    assert not ddp['fits'] and ddp['parallelism']['enough']
    assert ddp['parallelism']['suggestion'].startswith(
        '--parallel=ddp --recompute=False --micro_batch='
    )
    assert sums.pipeline_bubble(4, 8) == pytest.approx(3 / 11)


@pytest.mark.parametrize('extra', [[], ['--nodes=2'], ['--n_gpu=16', '--nodes=2']])
def test_the_printed_ledger_has_the_communication_section(extra, capsys):
    assert ledger.main(['configs/h100x8_1b3.py', *extra]) == 0
    out = capsys.readouterr().out
    assert 'Ledger 5: communication' in out and 'ESTIMATE' in out
    assert 'all_gather' in out and 'reduce_scatter' in out and 'data parallelism is enough' in out
    if extra:
        assert 'between nodes' in out


def test_a_70b_plan_is_told_where_to_go(capsys):
    assert ledger.main(LLAMA3_70B) == 0
    out = capsys.readouterr().out
    assert 'needs tensor or pipeline parallelism' in out and 'Megatron-LM' in out


def test_the_readme_and_book_figures_are_the_ledgers():
    """README's two-node bill line and BOOK.md's worked communication figures, recomputed."""
    with open(os.path.join(ROOT, 'README.md')) as f:
        (line,) = [
            line
            for line in f
            if line.strip().startswith('python ledger.py configs/h100x8_1b3.py --n_gpu=16')
        ]
    two = sums.predict(
        *load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'), ['--n_gpu=16', '--nodes=2'])
    )
    comm = two['comm']
    assert (
        f"# {two['days']:.3g} days, ${two['cost_usd']:,.0f}; communication {comm['bytes'] / 1e9:.1f} GB a step, "
        f"{comm['seconds'] * 1e3:.1f} ms, {comm['exposed_fraction']:.1%} exposed" in line
    )
    with open(os.path.join(ROOT, 'BOOK.md')) as f:
        book = f.read()
    one = sums.predict(*load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py')))
    comm = one['comm']
    compute_step = one['step_seconds'] - comm['exposed_seconds']
    assert (
        f"**{comm['bytes'] / 1e9:.1f} GB** a step ({comm['bus_bytes'] / 1e9:.1f} GB of bus bytes), "
        f"~{comm['seconds'] * 1e3:.0f} ms at 370 GB/s\n  against a {compute_step:.2f} s step: all but "
        f"~{comm['exposed_seconds'] * 1e3:.0f} ms hides" in book
    )
    big = sums.predict(*load_config(None, LLAMA3_70B))['parallelism']
    (reason,) = [r for r in big['reasons'] if 'fully sharded' in r]
    assert f"one sequence needs {reason.split(': ')[1].split(' of ')[0]} GiB a GPU" in book.replace(
        '\n  ', ' '
    )


def test_train_pys_short_ledger_has_a_communication_line():
    short = bill.format_short(
        sums.predict(*load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py'))), ''
    )
    assert 'communication per step' in short and 'ESTIMATE' in short and 'exposed' in short
    cpu = sums.Device('a CPU', 1e11, 64 * sums.GIB, kind='cpu', dtype='float32')
    model, train = load_config(os.path.join(ROOT, 'configs/pystdlib_cpu.py'), ['--n_gpu=2'])
    p = sums.predict(model, train, device=cpu)
    assert (
        p['comm']['bytes'] > 0 and p['comm']['seconds'] is None and p['days'] == p['days_compute']
    )
    assert 'gloo on the CPU: seconds not meaningful' in bill.format_short(p, '')
    assert 'not meaningful' in bill.format_report(p)
    one = bill.format_short(sums.predict(model, train, n_gpu=1, device=cpu), '')
    assert 'communication' not in one


@pytest.mark.parametrize(
    'flags,message',
    [
        (['--nodes=9'], 'nodes (9) must be at most n_gpu (8)'),
        (['--nodes=-1'], 'nodes must be positive (or 0: 8 devices per node)'),
        (['--inter_node_busbw=-5'], 'inter_node_busbw must be positive GB/s per node'),
    ],
)
def test_a_bad_topology_is_one_line(flags, message, capsys):
    assert ledger.main(['configs/h100x8_1b3.py', *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1 and message in err
