"""
test_model.py: the model against the ledger (parameters, FLOPs, activation memory) and against its own contract
(causality, attention, training, generation, recomputation). CPU only, float32, tiny shapes.

    python -m pytest -q -x test_model.py
"""

import math
import os

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ledgergpt import sums
from ledgergpt.config import FAMILIES, IGNORE_INDEX, load_config
from model import GPT, MLPS, ModelConfig, apply_rope


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    """Tiny shapes: threads cost more than they give (and the suite shares 2 cores). Restored for other files."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


LLAMA = dict(arch='llama', n_layer=2, n_head=4, n_embd=64, vocab_size=256, block_size=32)
GPT2 = dict(
    arch='gpt2',
    n_layer=2,
    n_head=4,
    n_embd=64,
    vocab_size=256,
    block_size=32,
    tie_embeddings=True,
    bias=True,
)


def tiny(**overrides):
    base = LLAMA if overrides.get('arch', 'llama') == 'llama' else GPT2
    return ModelConfig(**{**base, **overrides})


def batch(config, micro_batch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (micro_batch, config.block_size)
    return (
        torch.randint(0, config.vocab_size, shape, generator=generator),
        torch.randint(0, config.vocab_size, shape, generator=generator),
    )


# -----------------------------------------------------------------------------------------------------
# Ledger 1: parameters. The ledger counts from the config; the model builds from it; they must agree exactly.

PARAM_CONFIGS = [
    tiny(),  # llama, MHA, untied
    tiny(n_kv_head=2),  # llama, GQA
    tiny(n_kv_head=1, tie_embeddings=True),  # llama, multi-query, tied
    tiny(ffn_hidden=100, vocab_size=300, n_layer=3),  # explicit FFN width, odd vocab
    tiny(arch='gpt2'),  # gpt2, bias, tied
    tiny(arch='gpt2', bias=False),  # gpt2, no bias
    tiny(arch='gpt2', tie_embeddings=False),  # gpt2, untied
    tiny(arch='gpt2', n_kv_head=2, bias=True),  # gpt2 with GQA
    tiny(
        arch='gpt2', n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024
    ),  # GPT-2 124M shape
]


@pytest.mark.parametrize(
    'config',
    PARAM_CONFIGS,
    ids=lambda c: (
        f'{c.arch}-kv{c.kv_heads}-tie{c.tie_embeddings}-bias{c.bias}-L{c.n_layer}-H{c.n_embd}'
    ),
)
def test_param_count_matches_ledger(config):
    with torch.device('meta'):
        model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == sums.count_params(config)['total']


@pytest.mark.parametrize(
    'config',
    PARAM_CONFIGS,
    ids=lambda c: (
        f'{c.arch}-kv{c.kv_heads}-tie{c.tie_embeddings}-bias{c.bias}-L{c.n_layer}-H{c.n_embd}'
    ),
)
def test_parameter_shapes_are_the_models_tensors_in_order(config):
    """The ledger's tensor list (what ZeRO-1 and FSDP2 shard, Ledger 4a') is named_parameters(), name for name."""
    with torch.device('meta'):
        model = GPT(config)
    assert sums.parameter_shapes(config) == [
        (name, tuple(p.shape)) for name, p in model.named_parameters()
    ]


@pytest.mark.parametrize('arch', list(FAMILIES))
@pytest.mark.parametrize('bias', [True, False])
def test_the_model_is_what_its_family_row_says(arch, bias):
    """config.FAMILIES drives the model as it drives the ledger: each field of the row, seen in the modules built."""
    config = tiny(arch=arch, bias=bias, ffn_hidden=0)
    family = config.family
    with torch.device('meta'):
        model = GPT(config)
    norms = {'layernorm': torch.nn.LayerNorm, 'rmsnorm': torch.nn.RMSNorm}
    assert all(type(m) is norms[family.norm] for m in (model.norm_f, model.blocks[0].attn_norm))
    assert type(model.blocks[0].mlp) is MLPS[family.mlp]
    ffn_matrices = [p for p in model.blocks[0].mlp.parameters() if p.dim() == 2]
    assert (
        sum(p.numel() for p in ffn_matrices)
        == config.ffn_matrices * config.n_embd * config.ffn_width
    )
    mlp = config.part('mlp')
    assert (
        config.ffn_width
        == math.ceil(mlp.ffn_ratio * config.n_embd / mlp.ffn_multiple) * mlp.ffn_multiple
    )
    assert hasattr(model, 'pos_emb') == (family.positions == 'learned')
    assert (
        hasattr(model, 'rope_cos') == model.blocks[0].attn.use_rope == (family.positions == 'rope')
    )
    has_biases = any(name.endswith('.bias') for name, _ in model.named_parameters())
    assert has_biases == (bias and family.bias) == config.biases
    assert (model.lm_head.weight is model.tok_emb.weight) == config.tie_embeddings


def test_llama_7b_on_meta_device_matches_ledger_and_paper():
    config, _ = load_config(
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs/llama_7b.py'
        )
    )
    with torch.device('meta'):
        model = GPT(config)
    numel = sum(p.numel() for p in model.parameters())
    assert numel == sums.count_params(config)['total'] == 6_738_415_616
    assert all(p.is_meta for p in model.parameters())


def test_meta_construction_then_init_weights_is_complete_and_deterministic():
    config = tiny(arch='llama', n_kv_head=2)
    torch.manual_seed(0)
    with torch.device('meta'):
        meta_model = GPT(config)
    meta_model.to_empty(device='cpu')
    torch.manual_seed(1)
    meta_model.init_weights()
    real_model = GPT(config)  # initialised once by the constructor, with other random numbers
    torch.manual_seed(1)
    real_model.init_weights()
    for (name, a), (_, b) in zip(meta_model.state_dict().items(), real_model.state_dict().items()):
        assert torch.equal(a, b), name
    # non-persistent buffers: not in state_dict, rebuilt by init_weights
    for name in ('rope_cos', 'rope_sin'):
        assert torch.equal(getattr(meta_model, name), getattr(real_model, name))


def test_init_scales_residual_projections():
    config = tiny(n_layer=8, n_embd=256, n_head=4)
    model = GPT(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    assert model.blocks[0].attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[3].attn.o_proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert model.blocks[7].mlp.down_proj.weight.std().item() == pytest.approx(
        residual_std, rel=0.05
    )
    assert torch.equal(model.norm_f.weight, torch.ones(config.n_embd))


# -----------------------------------------------------------------------------------------------------
# Ledger 2: FLOPs. FlopCounterMode counts every aten matmul of a forward + backward. The CPU flash kernel has no
# FLOP formula, so attention runs on the math backend, whose two batched matmuls (q k^T, p v) cover the full
# T x T square: exactly the PaLM/nanoGPT non-causal convention of the ledger's 'matmul' figure.


@pytest.mark.parametrize(
    'config',
    [tiny(), tiny(n_kv_head=2), tiny(arch='gpt2'), tiny(arch='gpt2', bias=False)],
    ids=['llama', 'llama-gqa', 'gpt2', 'gpt2-nobias'],
)
def test_flops_match_ledger_matmul_count(config):
    model = GPT(config)
    idx, targets = batch(config, micro_batch=2)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, targets)[1].backward()
    predicted = sums.flops_per_token(config)['matmul'] * idx.numel()
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.01)


# With recompute, backward reruns each block's forward up to down_proj's input (non-reentrant checkpoint stops
# once every saved tensor is back), never lm_head. ffn_hidden=96 makes down_proj (H'H) a size no other matrix
# has, so the count pins which matmul is skipped; the book's 8N_matmul + 16LHT would be ~8% high here.

RECOMPUTE_CONFIGS = [tiny(n_kv_head=2, ffn_hidden=96), tiny(arch='gpt2', ffn_hidden=96)]


@pytest.mark.parametrize('config', RECOMPUTE_CONFIGS, ids=['llama-gqa', 'gpt2'])
def test_recompute_flops_match_ledger_hardware_count(config):
    model = GPT(config)
    model.recompute = True
    idx, targets = batch(config, micro_batch=2)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, targets)[1].backward()
    predicted = sums.flops_per_token(config, recompute=True)['hardware'] * idx.numel()
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.01)


def test_recompute_of_a_compiled_block_reruns_it_whole():
    """A block compiled on its own (train.py under FSDP) is one autograd node that saves after its whole graph ran,
    so the recompute includes down_proj. FlopCounterMode makes dynamo fall back to eager, so we count inside the
    compiled graphs instead (aot_eager: the aten graphs run as Python), recompute on minus off."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    config = RECOMPUTE_CONFIGS[0]
    counted = []

    def counting_compiler(graph, example_inputs):
        def run(*args):
            with FlopCounterMode(display=False) as counter:
                # not graph(...): no module hooks inside autograd
                out = torch.fx.Interpreter(graph).run(*args)
            counted.append(counter.get_total_flops())
            return out

        return make_boxed_func(run)

    idx, targets = batch(config, micro_batch=2)
    block_flops = {}
    for recompute in (False, True):
        torch._dynamo.reset()
        model = GPT(config)
        model.recompute = recompute
        for block in model.blocks:
            block.compile(backend=aot_autograd(fw_compiler=counting_compiler), dynamic=False)
        with sdpa_kernel(SDPBackend.MATH):
            model(idx, targets)[1].backward()  # compiles
            counted.clear()
            model(idx, targets)[1].backward()
        block_flops[recompute] = sum(counted)
    torch._dynamo.reset()
    flops = sums.flops_per_token(config, recompute=True, compiled_blocks=True)
    assert (
        block_flops[True] - block_flops[False]
        == (flops['hardware'] - flops['matmul']) * idx.numel()
    )


# -----------------------------------------------------------------------------------------------------
# Ledger 4b: activation memory. We record every tensor autograd saves for backward during the forward (each
# storage once: views of one buffer share it), leaving out parameters and buffers, and hold the ledger to it.


def saved_bytes(run, exclude=()):
    """Bytes of the distinct storages autograd saves while run() executes, minus the storages in exclude."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    return sum(nbytes for ptr, nbytes in storages.items() if ptr not in excluded)


def measured_activation_bytes(model, micro_batch, recompute, autocast=False):
    """What a training step holds for backward, measured: the tensors saved by the forward and the loss; with
    recompute, plus one block's activations, rebuilt in the backward while that block's gradient is taken.
    autocast: bf16 autocast, as train.py runs on a GPU (its bf16 weight copies are saved tensors too)."""
    config = model.config
    idx, targets = batch(config, micro_batch)
    model.recompute = recompute
    state = list(model.parameters()) + list(model.buffers())
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        total = saved_bytes(lambda: model(idx, targets), exclude=state)
        if recompute:
            x = torch.randn(micro_batch, config.block_size, config.n_embd, requires_grad=True)
            cos, sin = (model.rope_cos, model.rope_sin) if config.arch == 'llama' else (None, None)
            # x is already held
            total += saved_bytes(lambda: model.blocks[0](x, cos, sin), exclude=state + [x])
    return total


def predicted_activation_bytes(config, micro_batch, recompute, attention, dtype_bytes=4):
    """The ledger's activations (CPU kernels: composite RMSNorm) plus what the loss saves (LOSS_SAVED)."""
    activations = sums.activation_bytes(
        config,
        micro_batch,
        recompute,
        dtype_bytes=dtype_bytes,
        attention=attention,
        residual_bytes=4,
        fused_norm=False,
    )
    loss = sums.logits_bytes(config, micro_batch, dtype_bytes)
    # the chunked loss casts lm_head's weight for its forward alone: alive at the peak (the ledger's bf16 weight
    # copies count it), but not saved
    copy = (
        2 * config.vocab_size * config.n_embd
        if dtype_bytes == 2 and config.loss == 'chunked'
        else 0
    )
    return activations['total'] + loss[LOSS_SAVED[config.loss]] - copy


# what each loss saves beyond the final norm's and its per-token row: the fp32 log-softmax, or lm_head's gradient
LOSS_SAVED = {'full': 'log_softmax', 'chunked': 'grad_weight'}
# compiled: lm_head's output, or as eager
COMPILED_LOSS_SAVED = {'full': 'logits', 'chunked': 'grad_weight'}


@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize(
    'config',
    [
        tiny(),
        tiny(n_kv_head=2),
        tiny(arch='gpt2'),
        tiny(arch='gpt2', bias=False),
        tiny(loss='full'),
        tiny(arch='gpt2', loss='full'),
    ],
    ids=['llama', 'llama-gqa', 'gpt2', 'gpt2-nobias', 'llama-full-loss', 'gpt2-full-loss'],
)
def test_activation_bytes_match_saved_tensors(config, recompute):
    model = GPT(config)
    for micro_batch in (1, 3):
        measured = measured_activation_bytes(model, micro_batch, recompute)
        predicted = predicted_activation_bytes(config, micro_batch, recompute, attention='flash')
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)


@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize(
    'config',
    [tiny(n_kv_head=2), tiny(arch='gpt2'), tiny(n_kv_head=2, loss='full')],
    ids=['llama-gqa', 'gpt2', 'llama-gqa-full-loss'],
)
def test_activation_bytes_under_bf16_autocast(config, recompute):
    """As on a GPU: bf16 matmul outputs, fp32 residual stream and norms, bf16 weight copies, fp32 loss."""
    model = GPT(config)
    for micro_batch in (1, 3):
        measured = measured_activation_bytes(model, micro_batch, recompute, autocast=True)
        predicted = predicted_activation_bytes(
            config, micro_batch, recompute, attention='flash', dtype_bytes=2
        )
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)


@pytest.mark.parametrize(
    'config', [tiny(n_kv_head=2), tiny(arch='gpt2')], ids=['llama-gqa', 'gpt2']
)
def test_activation_bytes_math_attention_keeps_the_score_matrix(config):
    model = GPT(config)
    for micro_batch in (1, 3):
        with sdpa_kernel(SDPBackend.MATH):
            measured = measured_activation_bytes(model, micro_batch, recompute=False)
        predicted = predicted_activation_bytes(
            config, micro_batch, recompute=False, attention='math'
        )
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)
    flash = sums.activation_bytes(config, 1, False, attention='flash')['total']
    assert sums.activation_bytes(config, 1, False, attention='math')['total'] > flash


# -----------------------------------------------------------------------------------------------------
# Ledger 4b': what a torch.compile'd model saves. A backend records the forward graph that AOTAutograd's min-cut
# partitioner (inductor's, with inductor's decompositions) produces, without compiling it further; its outputs past
# the loss are what the forward saves for backward. Each storage once (a view or a split keeps its whole base),
# parameters and buffers left out (held anyway).

VIEW_OPS = {
    'view',
    'permute',
    'alias',
    'transpose',
    'expand',
    'reshape',
    '_unsafe_view',
    't',
    'slice',
    'select',
    'unsqueeze',
    'squeeze',
    'as_strided',
}
SPLIT_OPS = {'split', 'split_with_sizes', 'chunk', 'unbind'}


def op_name(node):
    return getattr(node.target, '__name__', str(node.target)).split('.')[0]


def storage_of(node):
    """The node whose buffer `node` is a view of (itself if none)."""
    while node.op == 'call_function':
        if op_name(node) in VIEW_OPS:
            node = node.args[0]
        elif op_name(node) == 'getitem' and op_name(node.args[0]) in SPLIT_OPS:
            node = node.args[0].args[0]
        else:
            break
    return node


def compiled_saved_bytes(module, inputs, held, autocast=False):
    """Bytes the compiled forward of module(*inputs) saves for backward, leaving out the tensors in `held`."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    graphs = []
    backend = aot_autograd(
        fw_compiler=lambda gm, _: graphs.append(gm) or make_boxed_func(gm.forward),
        bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    torch._dynamo.reset()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        torch.compile(module, backend=backend, dynamic=False)(*inputs)
    torch._dynamo.reset()
    held_shapes = {(tuple(t.shape), t.dtype) for t in held}
    storages = {}
    for node in [n for n in graphs[0].graph.nodes if n.op == 'output'][0].args[0][1:]:
        base = storage_of(node)
        value = base.meta.get('val')
        if not isinstance(value, torch.Tensor):
            continue
        if (
            base.op == 'placeholder'
            and (tuple(int(d) for d in value.shape), value.dtype) in held_shapes
        ):
            continue  # a parameter or buffer
        if value.dtype == torch.uint8:
            continue  # checkpoint()'s saved CPU RNG state, 5 KB of host memory per block: not the device's
        storages[base] = math.prod(int(d) for d in value.shape) * value.element_size()
    return sum(storages.values())


@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize(
    'config',
    [tiny(n_kv_head=2), tiny(arch='gpt2'), tiny(n_kv_head=2, loss='full')],
    ids=['llama-gqa', 'gpt2', 'llama-gqa-full-loss'],
)
def test_compiled_model_saves_what_the_ledger_says(config, recompute, autocast):
    model = GPT(config)
    model.recompute = recompute
    held = list(model.parameters()) + list(model.buffers())
    a = 2 if autocast else 4
    # the chunked loss at tokens x V x a > V x H x 4 (every real shape): the partitioner keeps its two gradients,
    # not the chunks' gradients of the logits
    for micro_batch in (1, 3) if config.loss == 'full' else (8, 12):
        measured = compiled_saved_bytes(model, batch(config, micro_batch), held, autocast)
        parts = sums.activation_bytes(
            config, micro_batch, recompute, dtype_bytes=a, compiled='model'
        )
        # that one is rebuilt in the backward
        saved = parts['total'] - parts.get('recomputed_block', 0)
        loss = sums.logits_bytes(config, micro_batch, a, compiled=True)
        copy = 2 * config.vocab_size * config.n_embd if autocast and config.loss == 'chunked' else 0
        predicted = saved + loss[COMPILED_LOSS_SAVED[config.loss]] - copy  # as eager: not saved
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)


@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16'])
@pytest.mark.parametrize(
    'config', [tiny(n_kv_head=2), tiny(arch='gpt2')], ids=['llama-gqa', 'gpt2']
)
def test_a_block_compiled_alone_saves_what_the_ledger_says(config, autocast):
    """Under FSDP2 train.py compiles each block on its own: it keeps o_proj's output instead of the residual."""
    model = GPT(config)
    block = model.blocks[0]
    held = list(block.parameters()) + list(model.buffers())
    cos, sin = (model.rope_cos, model.rope_sin) if config.arch == 'llama' else (None, None)
    a = 2 if autocast else 4
    for micro_batch in (1, 3):
        x = torch.randn(micro_batch, config.block_size, config.n_embd, requires_grad=True)
        measured = compiled_saved_bytes(block, (x, cos, sin), held, autocast)
        one_layer = ModelConfig(**{**config.__dict__, 'n_layer': 1})
        parts = sums.activation_bytes(
            one_layer, micro_batch, False, dtype_bytes=a, compiled='blocks'
        )
        predicted = (
            parts['blocks']
            + parts['bf16_weights']
            - (2 * config.vocab_size * config.n_embd if autocast else 0)
        )
        assert predicted == pytest.approx(measured, rel=0.10), (micro_batch, predicted, measured)


# -----------------------------------------------------------------------------------------------------
# Behaviour.


@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_causal_changing_a_token_never_changes_earlier_logits(arch):
    config = tiny(arch=arch)
    model = GPT(config).eval()
    idx, _ = batch(config, micro_batch=1)
    logits, _ = model(idx)
    for t in (0, 10, config.block_size - 2):
        changed = idx.clone()
        changed[0, t + 1] = (changed[0, t + 1] + 1) % config.vocab_size
        changed_logits, _ = model(changed)
        assert torch.equal(changed_logits[0, : t + 1], logits[0, : t + 1])
        assert not torch.allclose(changed_logits[0, t + 1], logits[0, t + 1])


def reference_attention(attn, x, cos, sin):
    """Textbook attention from the module's weights: explicit heads, K/V repeated per group, RoPE as complex
    rotation of the (i, i + d/2) pairs, masked softmax(q k^T / sqrt(d)) v."""
    B, T, _ = x.shape
    n_head, n_kv_head, head_dim = attn.n_head, attn.n_kv_head, attn.head_dim
    q, k, v = (x @ attn.qkv_proj.weight.T).split(
        [n_head * head_dim, n_kv_head * head_dim, n_kv_head * head_dim], -1
    )
    q, k, v = (t.view(B, T, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    if attn.use_rope:
        rotation = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))  # e^(i t theta)

        def rotate(t):
            pairs = torch.complex(t[..., : head_dim // 2], t[..., head_dim // 2 :]) * rotation
            return torch.cat((pairs.real, pairs.imag), dim=-1)

        q, k = rotate(q), rotate(k)
    k, v = (
        k.repeat_interleave(n_head // n_kv_head, dim=1),
        v.repeat_interleave(n_head // n_kv_head, dim=1),
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, n_head * head_dim)
    return y @ attn.o_proj.weight.T


@pytest.mark.parametrize('n_kv_head', [4, 2, 1], ids=['mha', 'gqa', 'mqa'])
def test_attention_matches_reference_and_gqa_with_all_heads_is_multi_head(n_kv_head):
    config = tiny(n_kv_head=n_kv_head)
    model = GPT(config)
    attn = model.blocks[0].attn
    x = torch.randn(2, config.block_size, config.n_embd)
    cos, sin = model.rope_cos, model.rope_sin
    torch.testing.assert_close(
        attn(x, cos, sin), reference_attention(attn, x, cos, sin), atol=1e-5, rtol=1e-4
    )
    # n_kv_head = n_head is the same model as n_kv_head = 0 (plain multi-head)
    if n_kv_head == config.n_head:
        torch.manual_seed(0)
        plain = GPT(tiny(n_kv_head=0))
        torch.manual_seed(0)
        grouped = GPT(config)
        idx, _ = batch(config, micro_batch=2)
        assert torch.equal(plain(idx)[0], grouped(idx)[0])


def test_rope_rotates_pairs_and_keeps_norms():
    config = tiny()
    model = GPT(config)
    x = torch.randn(1, config.block_size, 2, config.head_dim)
    rotated = apply_rope(x, model.rope_cos, model.rope_sin)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotated[:, 0], x[:, 0])  # position 0: angle 0


@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_loss_at_init_is_close_to_log_vocab(arch):
    config = tiny(arch=arch, vocab_size=512)
    model = GPT(config)
    idx, targets = batch(config, micro_batch=4)
    _, loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(config.vocab_size), abs=0.1)


def test_summed_loss_is_the_mean_times_the_targets_that_carry_loss():
    """reduction='sum' adds the targets' losses (IGNORE_INDEX ones carry none), so that a trainer can divide by the
    count over a whole step, not per micro-batch."""
    config = tiny()
    model = GPT(config)
    idx, targets = batch(config, micro_batch=2)
    targets[0, :20] = IGNORE_INDEX
    _, mean = model(idx, targets)
    _, total = model(idx, targets, reduction='sum')
    assert total.item() == pytest.approx(
        mean.item() * (targets != IGNORE_INDEX).sum().item(), rel=1e-5
    )


@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_tiny_model_overfits_one_batch(arch):
    torch.manual_seed(0)
    config = tiny(
        arch=arch, n_layer=2, n_embd=32, n_head=2, ffn_hidden=64, vocab_size=64, block_size=16
    )
    model = GPT(config)
    idx, targets = batch(config, micro_batch=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(100):
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1, loss.item()  # from ln(64) = 4.16


@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_recompute_gives_the_same_loss_and_gradients(arch):
    config = tiny(arch=arch)
    model = GPT(config)
    idx, targets = batch(config, micro_batch=2)
    grads = []
    for recompute in (False, True):
        model.recompute = recompute
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    for plain, recomputed in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(plain, recomputed, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('arch,recompute', [('llama', True), ('gpt2', False)])
def test_forward_is_one_graph_for_torch_compile(arch, recompute):
    config = tiny(arch=arch, n_kv_head=2)
    model = GPT(config)
    model.recompute = recompute
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(*batch(config, micro_batch=2))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, (
        explanation.break_reasons
    )


@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_generate(arch):
    config = tiny(arch=arch, block_size=16)
    model = GPT(config).eval()
    prompt = torch.randint(0, config.vocab_size, (2, 5))
    # runs past block_size: crops
    out = model.generate(prompt, max_new_tokens=20, temperature=0.8, top_k=10)
    assert out.shape == (2, 25) and torch.equal(out[:, :5], prompt)
    assert 0 <= out.min() and out.max() < config.vocab_size
    greedy = model.generate(prompt, max_new_tokens=8, top_k=1)
    assert torch.equal(greedy, model.generate(prompt, max_new_tokens=8, top_k=1))
    assert torch.equal(greedy, model.generate(prompt, max_new_tokens=8, temperature=0))
    logits, _ = model(prompt)
    assert torch.equal(greedy[:, 5], logits[:, -1].argmax(-1))
