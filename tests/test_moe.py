"""
test_moe.py: the mixture of experts (moe.py's MoE, ledger.py's Ledger MoE) against the ledger, on the CPU.

1. Parameters: the total = sum(p.numel()), tensor by tensor; the active ones = the tensors a forward of one token
   gives a gradient to (all but the n - k routed experts it skips, in every MoE layer).
2. FLOPs: FlopCounterMode on a dropless forward and backward = 6 x the active matmul weights + attention, with
   and without recomputation (which reruns the routed experts' down_proj, not the shared ones').
3. Activations: within 10% of the tensors autograd saves (the routing buffers included), fp32 and bf16 autocast.
4. Balance: the bias update evens out a skewed router; the balance loss weighs per target as the loss does;
   train.py writes each expert's load, its CV and the router biases to metrics.jsonl at log steps.
5. Bad MoE keys are one line; export refuses an MoE checkpoint; the ledger prints total beside active.
Model-state bytes per rank under DDP, ZeRO-1/2 and FSDP2 with an MoE layer: test_memory.py (its TINY has one).
"""

import json
import os

import pytest
import torch
from test_model import batch, measured_activation_bytes, predicted_activation_bytes, saved_bytes
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import helpers
import sweep
import train
from ledgergpt import bill, checkpoint, hf, live_ledger, plot, sums
from ledgergpt.config import ConfigError, load_config
from ledgergpt.moe import update_router_bias
from model import GPT, ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


MOE = dict(
    arch='llama',
    n_layer=3,
    n_head=4,
    n_embd=64,
    vocab_size=256,
    block_size=32,
    n_experts=8,
    top_k=2,
    expert_hidden=32,
)


def moe(**overrides):
    return ModelConfig(**{**MOE, **overrides})


CONFIGS = [
    moe(),  # every layer MoE, no shared expert
    moe(n_shared_experts=1, n_dense_layers=1),  # DeepSeekMoE: a dense first layer, a shared expert
    moe(
        n_shared_experts=2,
        n_kv_head=2,
        tie_embeddings=True,
        top_k=3,
        expert_hidden=24,
        route_scale=2.5,
    ),
    # the experts are the mlp row's, as the dense FFN: ReLU² (nanochat's), GPT-2's GELU with biases
    moe(mlp='relu2', n_shared_experts=1),
    moe(arch='gpt2', n_shared_experts=1, n_dense_layers=1, tie_embeddings=True, bias=True),
]
IDS = ['routed', 'shared-dense1', 'shared2-gqa-tied', 'relu2-experts', 'gpt2-gelu-experts']


def built(config, seed=0):
    torch.manual_seed(seed)
    return GPT(config)


@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_total_params_are_the_models_tensors(config):
    model = built(config)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == sums.parameter_shapes(
        config
    )
    counts = sums.count_params(config)
    assert sum(p.numel() for p in model.parameters()) == counts['total']
    assert counts['active'] < counts['total']


@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_active_params_are_what_one_token_touches(config):
    model = built(config)
    idx = torch.randint(0, config.vocab_size, (1, 1))
    model(idx, idx)[1].backward()
    touched = sum(
        p.numel() for p in model.parameters() if p.grad is not None and p.grad.abs().sum() > 0
    )
    assert touched == sums.count_params(config)['active']
    # exactly top_k routed experts per MoE layer got a gradient; the rest hold zeros
    for layer in model.moe:
        visited = [e for e in layer.experts if e.down_proj.weight.grad.abs().sum() > 0]
        assert len(visited) == config.top_k


@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_flops_are_the_active_matmuls(config, recompute):
    model = built(config)
    model.recompute = recompute
    idx, targets = batch(config, micro_batch=2)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, targets)[1].backward()
    flops = sums.flops_per_token(config, recompute=recompute)
    assert counter.get_total_flops() == flops['hardware'] * idx.numel()
    dense_of_the_same_total = 6 * sums.count_params(config)['matmul_total'] + flops['attention']
    assert flops['matmul'] < dense_of_the_same_total


@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16-autocast'])
@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_activations_match_saved_tensors(config, autocast):
    model = built(config)
    for micro_batch in (1, 3):
        measured = measured_activation_bytes(model, micro_batch, recompute=False, autocast=autocast)
        predicted = predicted_activation_bytes(
            config, micro_batch, False, 'flash', dtype_bytes=2 if autocast else 4
        )
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)
    routing = sums.activation_bytes(config, 1, False, dtype_bytes=4)['routing_buffers']
    assert routing == config.moe_layers * config.block_size * (
        2 * 4 * config.top_k * config.n_embd + 16 * config.top_k
    )


def test_recompute_activations_hold_the_largest_block_rerun():
    """With recompute, the backward reruns one block at a time: here the MoE block, larger than the dense one."""
    config = moe(n_shared_experts=1, n_dense_layers=1, expert_hidden=64, top_k=4)
    model = built(config)
    model.recompute = True
    state = list(model.parameters()) + list(model.buffers())
    for micro_batch in (1, 3):
        idx, targets = batch(config, micro_batch)
        measured = saved_bytes(lambda: model(idx, targets), exclude=state)  # noqa: B023 (run at once)
        x = torch.randn(micro_batch, config.block_size, config.n_embd, requires_grad=True)
        reruns = [
            saved_bytes(lambda: block(x, model.rope_cos, model.rope_sin), exclude=state + [x])  # noqa: B023
            for block in model.blocks
        ]
        assert reruns[1] > reruns[0]  # the MoE block saves more than the dense one
        measured += max(reruns)
        predicted = predicted_activation_bytes(config, micro_batch, True, 'flash')
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)


# -----------------------------------------------------------------------------------------------------
# Balance.


def test_compile_leaves_the_moe_layers_eager():
    """torch.compile traces the dense parts, never the routing: its slice sizes change every step
    (a host read), so a traced expert loop would recompile on them."""
    model = built(moe(n_dense_layers=1))
    traced = []

    def backend(graph, inputs):  # dynamo's graphs, run as traced
        traced.extend(str(node.target) for node in graph.graph.nodes)
        return graph.forward

    model.compile(backend=backend)
    for _ in range(3):
        idx, targets = batch(model.config, micro_batch=2)
        model(idx, targets)[1].backward()
    assert any('scaled_dot_product_attention' in op for op in traced)
    assert not any('topk' in op or 'bincount' in op for op in traced)


def test_bias_update_evens_out_a_skewed_router():
    config = moe(n_layer=1, n_experts=4, top_k=1)
    model = built(config)
    layer = model.moe[0]
    with torch.no_grad():  # every token's affinity favours expert 0
        layer.router.weight[0] += 0.5
    x = torch.randn(4, config.block_size, config.n_embd) + 1.0  # a direction every token shares

    def cv_of_a_step():
        layer(x)  # a training forward (grad enabled) counts its tokens
        update_router_bias(model, 0.01)
        return live_ledger.router_stats(model)['expert_load_cv'][0]

    before = cv_of_a_step()
    cvs = [cv_of_a_step() for _ in range(300)]
    assert before > 1.5  # every token on one expert: CV sqrt(3)
    # a sign update of fixed size ends in a small cycle around the even load (here 128 tokens over 4 experts)
    assert max(cvs[-20:]) < before / 5, cvs[-20:]
    bias = live_ledger.router_stats(model)['router_bias'][0]
    assert bias[0] == min(bias) and bias[0] < 0  # the favoured expert's bias fell
    assert all(layer.load == 0)  # the counts start again each step


def test_balance_loss_is_weighed_per_target_like_the_loss():
    config = moe(n_shared_experts=1)
    model = built(config)
    idx, targets = batch(config, micro_batch=2)
    targets[0, :5] = -1  # IGNORE_INDEX: 59 targets carry loss
    _, plain = model(idx, targets)
    for layer in model.moe:
        layer.aux_loss_coef = 0.5
    _, mean = model(idx, targets)
    _, summed = model(idx, targets, reduction='sum')
    assert mean > plain  # the balance loss is positive: f_i P_i >= 0, summed over the layers
    assert summed.item() == pytest.approx(mean.item() * 59, rel=1e-5)
    model.eval()
    with torch.no_grad():
        # eval: the loss alone
        assert model(idx, targets)[1].item() == pytest.approx(plain.item(), rel=1e-6)


def test_train_logs_the_load_at_log_steps(tmp_path):
    config = tmp_path / 'moe.py'
    keys = dict(
        MOE,
        n_shared_experts=1,
        n_dense_layers=1,
        data='synthetic',
        micro_batch=2,
        batch_tokens=128,
        train_tokens=128 * 4,
        log_every=2,
        eval_every=1000,
        eval_tokens=128,
        ckpt_every=1000,
        compile=False,
        dtype='float32',
        router_bias_speed=0.01,
        aux_loss_coef=0.001,
    )
    helpers.write_config(config, keys)
    assert train.main([str(config), f'--out_dir={tmp_path / "out"}']) == 0
    entries = [
        json.loads(line) for line in (tmp_path / 'out' / 'metrics.jsonl').read_text().splitlines()
    ]
    loads = [e for e in entries if 'expert_load' in e]
    assert [e['step'] for e in loads] == [2, 4]
    for entry in loads:
        assert (
            len(entry['expert_load'])
            == len(entry['router_bias'])
            == len(entry['expert_load_cv'])
            == 2
        )
        for share, cv in zip(entry['expert_load'], entry['expert_load_cv']):
            assert len(share) == 8 and sum(share) == pytest.approx(8)  # shares x n_experts: mean 1
            assert cv == pytest.approx(torch.tensor(share).std(correction=0).item(), rel=1e-6)
    # and moe.png beside loss.png: the load on a plot
    tokens, cv, shares = plot.read_load(tmp_path / 'out')
    assert tokens.tolist() == [e['tokens'] for e in loads] and cv.tolist() == [
        e['expert_load_cv'] for e in loads
    ]
    assert (
        shares.tolist() == loads[-1]['expert_load']
        and (tmp_path / 'out' / 'moe.png').stat().st_size > 0
    )
    # the biases are in checkpoints
    saved, _ = checkpoint.load_model(str(tmp_path / 'out'), torch.device('cpu'))
    assert (
        torch.stack([layer.router_bias for layer in saved.moe]).tolist() == loads[-1]['router_bias']
    )
    # each bias moved by +-0.01 per step (the sign of its load error), 4 steps: a multiple of 0.01, at most 0.04
    for bias in loads[-1]['router_bias'][0]:
        assert abs(bias) <= 0.04 + 1e-6 and round(bias / 0.01) == pytest.approx(
            bias / 0.01, abs=1e-3
        )


# -----------------------------------------------------------------------------------------------------
# Config, export and the printed ledger.


@pytest.mark.parametrize(
    'overrides,words',
    [
        (
            ['--n_experts=4', '--top_k=5', '--expert_hidden=8'],
            'top_k must be in 1..n_experts (4), got 5',
        ),
        (['--n_experts=4', '--top_k=2'], 'needs expert_hidden'),
        (
            [
                '--n_experts=4',
                '--top_k=2',
                '--expert_hidden=8',
                '--n_layer=2',
                '--n_dense_layers=2',
            ],
            'n_dense_layers',
        ),
        (['--top_k=2'], 'top_k = 2 is for a mixture of experts: set n_experts too'),
        (['--n_experts=-1'], 'n_experts must be positive (or 0)'),
    ],
)
def test_bad_moe_keys_are_one_line(overrides, words):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert words in str(error.value) and '\n' not in str(error.value)


def test_export_refuses_an_moe_model():
    with pytest.raises(ConfigError, match='mixture-of-experts model .* has no Hugging Face export'):
        hf.check_exportable(moe(), 256)


@pytest.mark.parametrize('path', ['configs/pystdlib_moe.py', 'configs/h200_moe.py'])
def test_ledger_prints_total_beside_active(path):
    model, train_config = load_config(os.path.join(ROOT, path), ['--gpu=H200'])
    prediction = sums.predict(model, train_config)
    text = bill.format_report(prediction)
    params, memory = prediction['params'], prediction['memory']
    assert f"{params['total']:,}" in text and f"{params['active']:,}" in text
    assert prediction['flops_per_token']['matmul'] == 6 * params[
        'matmul'
    ] + 12 * model.n_layer * model.n_embd * (model.block_size)
    # one process: the book's 16 x active
    assert memory['book_active_model_states'] == 16 * params['active']
    assert memory['model_states'] > memory['book_active_model_states']  # held: ~16 x the total
    assert 'book: 16 x active' in text


def test_the_bill_writes_the_experts_mlp_row():
    """An expert is the mlp row's MLP at width E: the bill's formula and the counts follow the row."""
    for mlp, formula in (('swiglu', '3HE'), ('relu2', '2HE')):
        model, train_config = load_config(
            os.path.join(ROOT, 'configs/pystdlib_moe.py'), ['--gpu=H200', f'--mlp={mlp}']
        )
        prediction = sums.predict(model, train_config)
        assert f'(8 + 1) x {formula}: every expert' in bill.format_report(prediction)
        assert sum(p.numel() for p in GPT(model).parameters()) == prediction['params']['total']


# -----------------------------------------------------------------------------------------------------
# The CPU comparison in the README (experiments/moe_vs_dense.py, retired after commit 1e8bcd6): a dense model and
# configs/pystdlib_moe.py's experts as overrides of configs/pystdlib_cpu.py; --small shrinks both alike, experts
# of 128 so that 3 + 1 of them are the dense H' of 512.
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


def comparison_points(small=False):
    moe, _ = load_config(os.path.join(ROOT, 'configs/pystdlib_moe.py'))
    experts = {key: getattr(moe, key) for key in MOE_KEYS}
    shrink = SMALL if small else {}
    if small:
        experts['expert_hidden'] = 512 // (experts['top_k'] + experts['n_shared_experts'])
    return {'dense': {'compile': False, **shrink}, 'moe': {'compile': False, **shrink, **experts}}


@pytest.mark.parametrize('small', [False, True], ids=['pystdlib_moe', 'small'])
def test_the_comparison_pairs_the_same_active_ffn_width(small):
    points = comparison_points(small)
    dense, _ = sweep.point_config(points['dense'])
    experts, _ = sweep.point_config(points['moe'])
    assert experts.n_experts and not dense.n_experts
    assert (experts.top_k + experts.n_shared_experts) * experts.expert_hidden == dense.ffn_width
    dense_params, moe_params = sums.count_params(dense), sums.count_params(experts)
    # the only active weights the dense model lacks
    router = experts.moe_layers * experts.n_experts * experts.n_embd
    assert moe_params['active'] == dense_params['total'] + router
    assert moe_params['total'] > dense_params['total']


def test_readme_table_counts_are_the_ledgers():
    with open(os.path.join(ROOT, 'README.md')) as f:
        rows = [line for line in f if line.startswith(('| dense |', '| moe |'))]
    assert len(rows) == 2
    for row, name in zip(rows, ('dense', 'moe'), strict=True):
        # the README's run: --small
        model, _ = sweep.point_config(comparison_points(small=True)[name])
        params = sums.count_params(model)
        cells = [cell.strip() for cell in row.split('|')[1:-1]]
        assert cells[1:4] == [
            f"{params['total'] / 1e6:.2f}M",
            f"{params['active'] / 1e6:.2f}M",
            f"{sums.flops_per_token(model)['matmul']:.3g}",
        ]
