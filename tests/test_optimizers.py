"""
test_optimizers.py: the optimizer rows (config.OPTIMIZERS) as train.py builds them (optimizers.py). Muon's update is
torch.optim.Muon's to the bit (beside AdamW's for the rest), its groups come from the raw model's names, its
Newton-Schulz FLOPs are the ledger's exactly (FlopCounterMode), a Muon run resumes bit-exactly on one process, and a
resume that switches the optimizer is refused unless allowed (then its states start afresh). Its states per rank:
test_memory.py; its collectives: test_communication.py; 2 processes in every mode: test_distributed.py.
"""

import collections
import copy
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import helpers
import train
from ledgergpt import config, optimizers, sums
from ledgergpt.config import ConfigError, load_config
from model import GPT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = [
    '--n_layer=2',
    '--n_head=2',
    '--n_embd=64',
    '--vocab_size=512',
    '--block_size=32',
    '--data=synthetic',
]
MOE = ['--n_experts=4', '--top_k=2', '--expert_hidden=32', '--n_dense_layers=1']


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny shapes on one thread: the same kernels and sums whatever the machine's load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(*flags):
    model_cfg, train_cfg = load_config(None, TINY + list(flags))
    torch.manual_seed(0)
    model = GPT(model_cfg)
    model.init_weights()
    return model, model_cfg, train_cfg


def train_steps(model, optimizers_, steps=3):
    torch.manual_seed(1)
    x, y = torch.randint(512, (2, 32)), torch.randint(512, (2, 32))
    for _ in range(steps):
        model(x, y)[1].backward()
        for optimizer in optimizers_:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    'flags,torch_options',
    [
        ([], dict(adjust_lr_fn='match_rms_adamw')),  # AdamW's lr, scaled per matrix
        (  # Muon's own LR with Keller Jordan's scaling, plain momentum, 3 Newton-Schulz steps
            ['--muon_lr=0.02', '--muon_nesterov=False', '--muon_ns_steps=3', '--muon_momentum=0.9'],
            dict(adjust_lr_fn='original', nesterov=False, ns_steps=3, momentum=0.9),
        ),
    ],
    ids=['match_rms_adamw', 'own-lr'],
)
def test_muon_is_torch_muon_on_the_block_matrices_and_adamw_on_the_rest(flags, torch_options):
    model, _, train_cfg = tiny_model('--optimizer=muon', *flags)
    twin = copy.deepcopy(model)
    ours = optimizers.build(model, train_cfg, 1, 'bfloat16')
    assert [(g['kind'], g['weight_decay'], len(g['params'])) for g in ours.param_groups] == [
        ('muon', 0.1, 8),  # qkv, o, gate_up, down in each of 2 blocks
        ('adamw', 0.1, 2),  # the embedding and lm_head
        ('adamw', 0.0, 5),  # the norms
    ]
    named = dict(twin.named_parameters())
    matrices = [p for n, p in named.items() if n.startswith('blocks.') and p.dim() == 2]
    rest = [p for p in named.values() if all(p is not m for m in matrices)]
    lr = train_cfg.muon_lr or train_cfg.lr
    theirs = [
        torch.optim.Muon(matrices, lr=lr, weight_decay=train_cfg.weight_decay, **torch_options),
        torch.optim.AdamW(
            [
                {'params': [p for p in rest if p.dim() == 2], 'weight_decay': 0.1},
                {'params': [p for p in rest if p.dim() < 2], 'weight_decay': 0.0},
            ],
            **optimizers.adamw_options(train_cfg, 1),
        ),
    ]
    # one schedule drives both: train.py sets every group's lr to AdamW's, Muon's own peak is its ratio to it
    train_steps(model, [ours])
    train_steps(twin, theirs)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    # one momentum buffer a matrix, nothing else; AdamW's two buffers and step count for the rest
    states = [set(ours.state[p]) for group in ours.param_groups for p in group['params']]
    assert states == [{'momentum_buffer'}] * 8 + [{'exp_avg', 'exp_avg_sq', 'step'}] * 7


def test_newton_schulz_runs_in_the_runs_compute_dtype():
    """A run that computes fp32 orthogonalises in fp32 (torch's iteration, its coefficients): the update is the
    float64 iteration's to fp32's rounding, where torch's bf16 one is off by bf16's (bf16 is torch's own to the bit:
    the test above)."""
    model, _, train_cfg = tiny_model('--optimizer=muon')
    group = optimizers.build(model, train_cfg, 1, 'float32').param_groups[0]  # the blocks' matrices
    torch.manual_seed(0)
    update = torch.randn(96, 64)  # tall: the iteration works on its 64 x 96 transpose
    exact = optimizers.newton_schulz(update.double(), group, torch.float64)
    fp32 = optimizers.newton_schulz(update, group, torch.float32)
    bf16 = optimizers.newton_schulz(update, group, torch.bfloat16)
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    assert (fp32 - exact).abs().max() < 1e-5 < 1e-3 < (bf16.double() - exact).abs().max()
    # the optimizer takes the dtype the run computes in, through build: two runs, two updates
    stepped = {}
    for dtype in ('float32', 'bfloat16'):
        model, _, train_cfg = tiny_model('--optimizer=muon')
        optimizer = optimizers.build(model, train_cfg, 1, dtype)
        assert optimizer.ns_dtype == getattr(torch, dtype)
        train_steps(model, [optimizer], steps=1)
        stepped[dtype] = model.blocks[0].attn.qkv_proj.weight.detach().clone()
    assert not torch.equal(stepped['float32'], stepped['bfloat16'])


def test_groups_are_the_raw_models_names_and_the_router_stays_on_adamw():
    model, model_cfg, train_cfg = tiny_model('--optimizer=muon', *MOE)
    built = optimizers.build(model, train_cfg, 1, 'bfloat16')
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in built.param_groups if g['kind'] == 'muon' for p in g['params']]
    assert (
        'blocks.1.mlp.router.weight' not in muon
        and 'blocks.1.mlp.experts.3.down_proj.weight' in muon
    )
    assert all(n.startswith('blocks.') for n in muon)
    # the ledger's grouping is the same list, from its own shapes
    groups = config.param_groups('muon', sums.parameter_shapes(model_cfg))
    assert [names for kind, _, names in groups if kind == 'muon'] == [muon]
    # AdamW alone: matrices decayed, vectors not, as the book's recipe
    adamw = config.param_groups('adamw', sums.parameter_shapes(model_cfg))
    assert [(kind, decayed) for kind, decayed, _ in adamw] == [('adamw', True), ('adamw', False)]


def test_newton_schulz_flops_are_the_ledgers_exactly():
    """FlopCounterMode counts the step's matmuls (AdamW's fused update has none): each matrix's
    muon_ns_steps x (4m^2 n + 2m^3), in either orientation (the MoE's experts are wide, the others tall)."""
    for flags in ([], ['--muon_ns_steps=3'], MOE):
        model, model_cfg, train_cfg = tiny_model('--optimizer=muon', *flags)
        optimizer = optimizers.build(model, train_cfg, 1, 'bfloat16')
        model(*(torch.randint(512, (2, 32)) for _ in range(2)))[1].backward()
        with FlopCounterMode(display=False) as counter:
            optimizer.step()
        (predicted,) = sums.optimizer_step_flops(model_cfg, train_cfg, 1)
        assert counter.get_total_flops() == predicted > 0, flags
        qkv = (model_cfg.n_embd * 3, model_cfg.n_embd)  # 192 x 64: m = 64, n = 192
        assert config.newton_schulz_flops(qkv, train_cfg) == train_cfg.muon_ns_steps * (
            4 * 64 * 64 * 192 + 2 * 64**3
        )
    model, model_cfg, train_cfg = tiny_model()
    optimizer = optimizers.build(model, train_cfg, 1, 'bfloat16')
    model(*(torch.randint(512, (2, 32)) for _ in range(2)))[1].backward()
    with FlopCounterMode(display=False) as counter:
        optimizer.step()
    assert counter.get_total_flops() == sums.optimizer_step_flops(model_cfg, train_cfg, 1)[0] == 0


def test_the_ledger_bills_muons_states_and_step():
    model_cfg, train_cfg = load_config(None, ['--optimizer=muon'] + TINY[:-1])
    adamw = sums.predict(model_cfg, dataclasses.replace(train_cfg, optimizer='adamw'), 1)
    muon = sums.predict(model_cfg, train_cfg, 1)
    shapes = sums.parameter_shapes(model_cfg)
    matrices = [s for n, s in shapes if config.muon_takes(n, s)]
    # 4 bytes of momentum for AdamW's 8 on each block matrix, and no step count
    saved = 4 * sum(rows * cols for rows, cols in matrices) + 4 * len(matrices)
    assert adamw['memory']['optimizer'] - muon['memory']['optimizer'] == saved
    # a checkpoint holds the fp32 weights and those states (the disk check before step 1 reads it)
    P = muon['params']['total']
    assert muon['data']['checkpoint_bytes'] == 4 * P + muon['memory']['optimizer']
    assert adamw['data']['checkpoint_bytes'] == 12 * P
    steps, per_step = muon['steps'], muon['optimizer_flops_per_step']
    assert per_step == sum(
        config.newton_schulz_flops(s, train_cfg) for n, s in shapes if config.muon_takes(n, s)
    )
    assert muon['total_flops'] == adamw['total_flops'] + steps * per_step
    seconds = per_step / (muon['gpu']['peak_flops'] * train_cfg.mfu)
    assert muon['optimizer_step_seconds'] == pytest.approx(seconds)
    assert muon['days_compute'] == pytest.approx(adamw['days_compute'] + steps * seconds / 86400)
    # ZeRO-1: each rank orthogonalises the matrices it owns; the busiest rank sets the step
    per_rank = sums.optimizer_step_flops(
        model_cfg, dataclasses.replace(train_cfg, parallel='zero1'), 2
    )
    assert sum(per_rank) == per_step and 0 < min(per_rank)


def test_muon_keys_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="muon_lr = 0.02 is for optimizer = 'muon'"):
        load_config(None, ['--muon_lr=0.02'])
    with pytest.raises(ConfigError, match=r'muon_ns_steps must be in 1\.\.99'):
        load_config(None, ['--optimizer=muon', '--muon_ns_steps=0'])
    with pytest.raises(ConfigError, match=r'muon_momentum must be in \[0, 1\)'):
        load_config(None, ['--optimizer=muon', '--muon_momentum=1'])
    assert {'optimizer', 'muon_lr', 'muon_momentum', 'muon_nesterov', 'muon_ns_steps'} <= set(
        config.CONTINUATION_KEYS
    )


# -----------------------------------------------------------------------------------------------------
# A Muon run resumes bit-exactly; a resume that switches the optimizer is refused unless allowed.


def write_config(tmp_path, data, **overrides):
    keys = dict(helpers.TINY_RUN, train_tokens=12 * 256, ckpt_every=6, data=data, **overrides)
    return helpers.write_config(tmp_path / 'config.py', keys)


def losses(out):
    with open(os.path.join(out, 'metrics.jsonl')) as f:
        entries = [json.loads(line) for line in f]
    return {e['step']: e['loss'] for e in entries if 'loss' in e and 'event' not in e}


def test_muon_run_resumes_bit_exactly_and_a_switch_needs_allowing(pystdlib_data, tmp_path, capsys):
    config_path = write_config(tmp_path, pystdlib_data, optimizer='muon')
    full, out = tmp_path / 'full', tmp_path / 'out'
    assert train.main([config_path, f'--out_dir={full}']) == 0
    assert train.main([config_path, f'--out_dir={out}', '--max_steps=6']) == 0
    assert train.main([config_path, f'--out_dir={out}', '--resume']) == 0
    expected, resumed = losses(full), losses(out)
    assert [resumed[s] for s in range(7, 13)] == [expected[s] for s in range(7, 13)]  # exactly
    # the report sets the ledger's model states and Newton-Schulz FLOPs beside the first step's, equal
    summary = json.loads((full / 'summary.json').read_text())
    assert summary['model_states_measured_bytes'] == summary['model_states_predicted_bytes'] > 0
    assert summary['optimizer_flops_measured'] == summary['optimizer_flops_predicted'] > 0
    report = (full / 'report.md').read_text()
    assert "| optimizer step's matmul FLOPs on rank 0" in report and report.count('| 1.000 |') >= 3
    assert 'Muon momentum + AdamW' in (full / 'ledger.md').read_text()
    # the same checkpoint resumed with AdamW: refused in one line, unless allowed; then AdamW starts afresh
    step6 = f'--resume={out}/ckpt/step_0000006'
    capsys.readouterr()
    assert train.main([config_path, f'--out_dir={out}', step6, '--optimizer=adamw']) == 2
    err = capsys.readouterr().err
    assert "optimizer 'muon' -> 'adamw'" in err and '--allow_change=optimizer' in err
    switched = train.setup(
        [config_path, f'--out_dir={tmp_path / "switched"}', step6, '--optimizer=adamw']
        + ['--allow_change=optimizer']
    )
    assert "optimizer changed from 'muon' to 'adamw': its states start afresh" in (
        capsys.readouterr().out
    )
    assert switched.state.step == 6 and not switched.optimizer.state
    assert all(g['kind'] == 'adamw' for g in switched.optimizer.param_groups)


def test_the_books_muon_figures_are_the_ledgers():
    """BOOK.md's derivation of Muon's model states and step, for the 1.3B run, recomputed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'BOOK.md')) as f:
        book = f.read()
    text = book[book.index("### Derivations: Muon's model states and step") :]
    M, P, share, rule, muon, adamw, per_step, step = re.search(
        r'M = ([\d,]+) of P = ([\d,]+) \(([\d.]+)%\), 16P - 4M = ([\d.]+)P: ([\d.]+) GiB for AdamW.s\n?'
        r'\s*([\d.]+) GiB.*?5 steps.*?: ([\d.e]+) a step, [\d.]+% of the step.s\s+([\d.e]+)',
        text,
        re.S,
    ).groups()
    model_cfg, train_cfg = load_config(os.path.join(root, 'configs/h200_1b3_muon.py'))
    p = sums.predict(model_cfg, train_cfg)
    a = sums.predict(model_cfg, dataclasses.replace(train_cfg, optimizer='adamw'))
    shapes = sums.parameter_shapes(model_cfg)
    matrices = sum(s[0] * s[1] for n, s in shapes if config.muon_takes(n, s))
    total = p['params']['total']
    assert (int(M.replace(',', '')), int(P.replace(',', ''))) == (matrices, total)
    assert f'{100 * matrices / total:.1f}' == share and f'{16 - 4 * matrices / total:.1f}' == rule
    assert f"{p['memory']['model_states'] / 2**30:.1f}" == muon
    assert f"{a['memory']['model_states'] / 2**30:.1f}" == adamw
    assert f"{p['optimizer_flops_per_step']:.2e}".replace('e+', 'e') == per_step
    assert f"{p['total_flops'] / p['steps']:.2e}".replace('e+', 'e') == step


# Muon under FSDP2 (Shard(0) DTensor matrices): each matrix orthogonalised once, by the owner
# config.muon_blocks gives it, its rows sent there and back by all-to-alls.
SHARDED_MUON = '''
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from ledgergpt import config, optimizers

dist.init_process_group('gloo')
ranks, rank = dist.get_world_size(), dist.get_rank()
torch.manual_seed(0)
# rows 64 and 40 split evenly or not; 5 and 3 leave a rank padded or empty
shapes = [(64, 32), (40, 96), (5, 16), (3, 8), (96, 64), (64, 32), (64, 32), (5, 16)]
fulls = [torch.randn(shape) for shape in shapes]
grads = [[torch.randn(shape) for shape in shapes] for _ in range(2)]
options = dict(lr=0.02, ns_dtype=torch.bfloat16, momentum=0.95, nesterov=True, ns_steps=5,
               ns_coefficients=(3.4445, -4.775, 2.0315), muon_eps=1e-7,
               adjust_lr_fn='match_rms_adamw', lr_ratio=1.0, weight_decay=0.1)
calls = []
newton_schulz = optimizers.newton_schulz
def counted(update, group, dtype):
    calls.append(tuple(update.shape))
    return newton_schulz(update, group, dtype)

def run(params, shard):
    optimizer = optimizers.MuonAdamW([dict(params=params, kind='muon')], **options)
    for step in grads:
        for param, grad in zip(params, step):
            param.grad = shard(grad)
        optimizer.step()
    return params

alone = run([torch.nn.Parameter(full.clone()) for full in fulls], lambda grad: grad.clone())
optimizers.newton_schulz = counted
mesh = init_device_mesh('cpu', (ranks,))
def sharded(tensor):
    return distribute_tensor(tensor.clone(), mesh, [Shard(0)])
spread = run([torch.nn.Parameter(sharded(full)) for full in fulls], sharded)
equal = [torch.equal(p.full_tensor(), q.detach()) for p, q in zip(spread, alone)]
owned = [i for _, block in config.muon_blocks(shapes, ranks) for i, owner in block if owner == rank]
with open(f'{sys.argv[1]}/rank{rank}.json', 'w') as f:
    json.dump(dict(equal=equal, calls=calls, owned=owned), f)
dist.barrier()
dist.destroy_process_group()
# no interpreter teardown: about one exit in ten here aborted after the last Python line, in C++
# ("terminate called without an active exception", SIGABRT), with every rank's answer written
os._exit(0)
'''


@pytest.mark.parametrize('processes', [2, 4])
def test_muon_under_fsdp2_orthogonalises_each_matrix_once_to_the_bit(processes, tmp_path):
    """Two steps of Muon on Shard(0) DTensor matrices over 2 and 4 gloo processes equal one process's
    to the bit, and each rank ran Newton-Schulz on its own matrices only: each matrix once."""
    (tmp_path / 'run.py').write_text(SHARDED_MUON)
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone']
    command += [f'--nproc_per_node={processes}', str(tmp_path / 'run.py'), str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f'rank{r}.json')) for r in range(processes)]
    assert all(all(rank['equal']) for rank in ranks)
    shapes = [(64, 32), (40, 96), (5, 16), (3, 8), (96, 64), (64, 32), (64, 32), (5, 16)]
    owned = sorted(i for rank in ranks for i in rank['owned'])
    assert owned == list(range(len(shapes))) and all(rank['owned'] for rank in ranks[:2])
    for rank in ranks:  # two steps, each of its own matrices once
        assert rank['calls'] == [list(shapes[i]) for i in rank['owned']] * 2


@pytest.mark.parametrize('ranks', [2, 3, 8])
def test_the_ledger_deals_muons_matrices_as_the_optimizer_does(ranks):
    """sums.owned_matrices, config.muon_blocks in closed form: each rank's matrices of each shape, and
    its Newton-Schulz FLOPs, on a dense and an MoE model (routed and shared experts' shapes)."""
    for flags in ([], MOE + ['--n_shared_experts=1']):
        model_cfg, train_cfg = load_config(None, TINY + ['--optimizer=muon', *flags])
        train_cfg = dataclasses.replace(train_cfg, parallel='fsdp')
        shapes = [s for n, s in sums.parameter_shapes(model_cfg) if config.muon_takes(n, s)]
        dealt = [collections.Counter() for _ in range(ranks)]
        for shape, block in config.muon_blocks(shapes, ranks):
            for _, owner in block:
                dealt[owner][shape] += 1
        owned = sums.owned_matrices(model_cfg, 'muon', ranks)
        assert [{s: k for s, k in mine if k} for mine in owned] == [dict(d) for d in dealt]
        flops = [
            sum(k * config.newton_schulz_flops(s, train_cfg) for s, k in d.items()) for d in dealt
        ]
        assert sums.optimizer_step_flops(model_cfg, train_cfg, ranks) == flops
        assert sum(flops) == sums.optimizer_step_flops(model_cfg, train_cfg, 1)[0]
