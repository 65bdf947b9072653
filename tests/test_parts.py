"""
test_parts.py: every row of config.PARTS against the modules model.py builds from it, and the ledger's figures
for a part proven as the others are: its tensors against named_parameters(), its FLOPs against FlopCounterMode,
its saved bytes against the tensors autograd keeps (with minus without, exact to the byte), and its export.
QK-norm (weightless and learned) and the ReLU² MLP are parts any family takes by a key.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from test_model import (  # one_thread: test_model's autouse module fixture, for these tiny shapes too
    batch,
    measured_activation_bytes,
    one_thread,  # noqa: F401
    predicted_activation_bytes,
    tiny,
)
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ledgergpt import hf, sums
from ledgergpt.config import FAMILIES, PARTS, ConfigError, ModelConfig
from model import GPT

NEW_PARTS = [dict(qk_norm='weightless'), dict(qk_norm='learned'), dict(mlp='relu2')]
BASES = [dict(), dict(n_kv_head=2), dict(arch='gpt2')]


def every_part():
    """A config for every row of every kind, in the family that does not have it by default as well."""
    for kind, rows in PARTS.items():
        for name in rows:
            for arch in FAMILIES:
                yield tiny(arch=arch, **{kind: name})


@pytest.mark.parametrize('config', list(every_part()), ids=str)
def test_each_rows_tensors_are_the_models(config):
    with torch.device('meta'):
        model = GPT(config)
    assert sums.parameter_shapes(config) == [
        (n, tuple(p.shape)) for n, p in model.named_parameters()
    ]
    assert sum(p.numel() for p in model.parameters()) == sums.count_params(config)['total']


def test_the_books_closed_form_is_the_sum_of_the_rows():
    for config in (tiny(), tiny(n_kv_head=2), tiny(n_layer=3, ffn_hidden=100, vocab_size=300)):
        assert sums.count_params(config)['total'] == sums.book_params(config)
    llama_7b = ModelConfig(n_layer=32, n_head=32, n_embd=4096, ffn_hidden=11008, vocab_size=32000)
    assert sums.book_params(llama_7b) == sums.count_params(llama_7b)['total'] == 6_738_415_616


def counted_flops(config, recompute=False):
    torch.manual_seed(0)
    model = GPT(config)
    model.recompute = recompute
    idx, targets = batch(config, 2)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, targets)[1].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize('part', NEW_PARTS, ids=str)
@pytest.mark.parametrize('base', BASES, ids=str)
def test_a_parts_flops_with_minus_without_are_the_ledgers(base, part, recompute):
    """The math kernel counts QK^T and AV as matmuls; the ledger's attention term is the same 12LHT."""
    tokens = 2 * tiny(**base).block_size
    counted, predicted = [], []
    for config in (tiny(**base), tiny(**base, **part)):
        counted.append(counted_flops(config, recompute))
        predicted.append(tokens * sums.flops_per_token(config, recompute)['hardware'])
    assert counted == predicted
    assert counted[1] - counted[0] == predicted[1] - predicted[0]


@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('recompute', [False, True], ids=['stored', 'recompute'])
@pytest.mark.parametrize('part', NEW_PARTS, ids=str)
@pytest.mark.parametrize('base', BASES, ids=str)
def test_a_parts_saved_bytes_with_minus_without_are_the_ledgers(base, part, recompute, autocast):
    measured, predicted = [], []
    for config in (tiny(**base), tiny(**base, **part)):
        torch.manual_seed(0)
        model = GPT(config)
        measured.append(measured_activation_bytes(model, 3, recompute, autocast))
        predicted.append(
            predicted_activation_bytes(config, 3, recompute, 'flash', 2 if autocast else 4)
        )
    assert measured[1] - measured[0] == predicted[1] - predicted[0]


def test_qk_norm_gives_each_head_of_q_and_k_unit_rms_before_rope():
    for qk_norm in ('weightless', 'learned'):
        config = tiny(qk_norm=qk_norm, n_kv_head=2)
        model = GPT(config)
        attn, T = model.blocks[0].attn, config.block_size
        seen = {}

        def keep(module, args, out, seen=seen):
            seen.update(q=out[0], k=out[1])

        attn.qk_norm.register_forward_hook(keep)
        attn(torch.randn(2, T, config.n_embd) * 7, model.rope_cos[:T], model.rope_sin[:T])
        for t in seen.values():  # gains start at 1, so both forms start at rms 1 per head
            assert torch.allclose(t.pow(2).mean(-1).sqrt(), torch.ones(()), atol=1e-3)
    learned = GPT(tiny(qk_norm='learned')).blocks[0].attn.qk_norm
    assert [p.shape for p in learned.parameters()] == [(16,), (16,)]


def test_relu2_is_relu_squared():
    config = tiny(mlp='relu2')
    mlp = GPT(config).blocks[0].mlp
    x = torch.randn(3, config.n_embd)
    expected = F.linear(F.relu(F.linear(x, mlp.up_proj.weight)) ** 2, mlp.down_proj.weight)
    assert torch.allclose(mlp(x), expected, atol=1e-6)
    assert config.ffn_width == 4 * config.n_embd


def test_a_part_key_is_checked_in_one_line():
    from ledgergpt.config import load_config

    with pytest.raises(
        ConfigError, match="qk_norm must be one of none, weightless, learned, not 'rms'"
    ):
        load_config(None, ['--qk_norm=rms'])
    with pytest.raises(ConfigError, match="mlp must be one of gelu, swiglu, relu2"):
        load_config(None, ['--mlp=relu3'])
    assert math.isclose(
        load_config(None, ['--mlp=relu2', '--n_embd=64', '--n_head=4'])[0].ffn_width, 256
    )


def test_a_part_without_a_hugging_face_class_is_refused_in_one_line():

    assert hf.hf_class_of(tiny(qk_norm='learned')) == 'Qwen3ForCausalLM'
    assert hf.hf_class_of(tiny(arch='gpt2', mlp='relu2')) == 'GPT2LMHeadModel'
    assert hf.hf_class_of(tiny(mlp='relu2')) == 'ArceeForCausalLM'
    with pytest.raises(
        ConfigError,
        match=r"mlp = 'relu2' \(ReLU² MLP\) has no Hugging Face export: the classes that hold it are "
        r"GPT2LMHeadModel, ArceeForCausalLM, and none",
    ):
        # Qwen3 has SwiGLU, Arcee no QK-norm
        hf.hf_class_of(tiny(mlp='relu2', qk_norm='learned'))
    with pytest.raises(
        ConfigError, match=r"qk_norm = 'weightless' .* classes that hold it are Qwen3"
    ):
        hf.hf_class_of(tiny(arch='gpt2', qk_norm='weightless'))
    with pytest.raises(
        ConfigError, match=r'logit_softcap = 15 has no Hugging Face export: none of Llama'
    ):
        hf.hf_class_of(tiny(logit_softcap=15.0))


def test_a_tensor_the_layout_does_not_name_is_never_dropped():
    """A fork that adds a tensor to a part and not to export.py's layout gets one line, not a silent export."""

    model = GPT(tiny())
    model.blocks[1].attn.register_parameter('extra', torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ConfigError, match=r'blocks\.1\.attn\.extra has no LlamaForCausalLM name'):
        hf.hf_tensors(model, 'LlamaForCausalLM')


def test_a_fork_without_its_row_stops_in_one_line_or_runs_unverified_with_force(
    tmp_path, pystdlib_data, monkeypatch, capsys
):
    """A part added to model.py but not to its row: the run stops before step 1 naming the tensor, and with
    --force it trains, summary.json and report.md marking the ledger unverified."""
    import json

    import helpers
    import model
    import train

    build, attend = model.Attention.__init__, model.Attention.forward

    # a fork's new tensor, its row not written (a norm: init_weights sets it)
    def with_a_gain(self, config):
        build(self, config)
        self.gain = torch.nn.RMSNorm(config.n_head)

    monkeypatch.setattr(model.Attention, '__init__', with_a_gain)
    monkeypatch.setattr(
        model.Attention, 'forward', lambda self, *a: attend(self, *a) * self.gain.weight.mean()
    )
    config = helpers.write_config(
        tmp_path / 'config.py',
        dict(
            n_layer=2,
            n_head=2,
            n_embd=64,
            vocab_size=512,
            block_size=32,
            micro_batch=4,
            batch_tokens=128,
            max_steps=2,
            train_tokens=256,
            compile=False,
            dtype='float32',
            eval_tokens=256,
            data=pystdlib_data,
        ),
    )
    assert train.main([config, f'--out_dir={tmp_path / "a"}']) == 1
    line = capsys.readouterr().err.strip()
    assert (
        line.startswith('error: the ledger counts')
        and 'blocks.0.attn.gain.weight is (2,) in model.py' in line
    )
    assert '--force' in line and len(line.splitlines()) == 1
    assert train.main([config, f'--out_dir={tmp_path / "b"}', '--force']) == 0
    summary = json.loads((tmp_path / 'b' / 'summary.json').read_text())
    assert 'blocks.0.attn.gain.weight' in summary['ledger_unverified']
    assert 'LEDGER UNVERIFIED (--force)' in (tmp_path / 'b' / 'report.md').read_text()
