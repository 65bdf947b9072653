"""
test_losses.py: the chunked cross-entropy (losses.py) against F.cross_entropy over the full logits: the same loss and
the same gradient of every parameter, within 1e-5 in fp32 and within bf16's rounding under bf16 autocast, for both
families, tied and untied, with ignored targets, summed and averaged, over several chunks (the last one short),
eager and under torch.compile; soft-capped logits (logit_softcap) as cross-entropy over the capped logits. Its peak
memory op by op is the ledger's buffers (and the cap's one more chunk). Under 2 gloo processes, in every parallel
mode, test_distributed.py holds the chunked runs to a full-loss run, and the ledger's buffers to the peak memory
test_memory.py measures.
"""

import functools

import pytest
import torch
import torch.nn.functional as F
from test_model import batch, one_thread, tiny  # noqa: F401 (one_thread: one thread for tiny shapes)
from torch.utils.flop_counter import FlopCounterMode

import helpers
from ledgergpt import config, losses, sums
from ledgergpt.config import IGNORE_INDEX, ConfigError, load_config
from model import GPT

FAMILIES = [
    dict(arch='llama'),
    dict(arch='llama', tie_embeddings=True),
    dict(arch='gpt2'),
    dict(arch='gpt2', tie_embeddings=False),
]


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
    """24-row chunks: a micro-batch of 2 x 32 rows is 3 of them, the last one 16 rows."""
    monkeypatch.setattr(losses, 'CHUNK_ROWS', 24)


def loss_and_grads(config, reduction, autocast=False, compiled=False, from_logits=False):
    """The loss and every parameter's gradient; from_logits: F.cross_entropy over the logits the model returns,
    autograd through them (the reference for a soft cap)."""
    torch.manual_seed(0)
    model = GPT(config)
    idx, targets = batch(config, 2)
    targets[0, :7] = IGNORE_INDEX  # as prefix_lm and ul2 set them: a part of a row carries no loss
    targets[1, -1] = IGNORE_INDEX
    forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        if from_logits:
            logits = forward(idx)[0].float().flatten(0, 1)
            loss = F.cross_entropy(
                logits, targets.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction
            )
        else:
            _, loss = forward(idx, targets, reduction=reduction)
    (loss * 1.5).backward()  # a scale, as train.py's world size / count
    torch._dynamo.reset()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize('reduction', ['sum', 'mean'])
@pytest.mark.parametrize('family', FAMILIES, ids=str)
def test_chunked_equals_the_full_loss_in_fp32(family, reduction):
    full, chunked = (loss_and_grads(tiny(**family, loss=loss), reduction) for loss in LOSS_NAMES)
    assert chunked[0] == pytest.approx(full[0].item(), rel=1e-6)
    assert full[1].keys() == chunked[1].keys()
    for name, grad in full[1].items():
        torch.testing.assert_close(chunked[1][name], grad, rtol=1e-5, atol=1e-5, msg=name)
    assert (
        full[1]['lm_head.weight' if 'lm_head.weight' in full[1] else 'tok_emb.weight'].abs().max()
        > 0
    )


@pytest.mark.parametrize('family', [FAMILIES[0], FAMILIES[2]], ids=str)
def test_chunked_equals_the_full_loss_under_bf16_autocast(family):
    """bf16 matmuls either way: the gradients agree to bf16's rounding, relative to each one's scale: 2^-6, two of
    its 2^-7 steps, as a rounding of the loss's gradient passes through the blocks' bf16 matmuls (a wrong gradient
    is off by its whole scale)."""
    full, chunked = (loss_and_grads(tiny(**family, loss=loss), 'sum', True) for loss in LOSS_NAMES)
    assert chunked[0] == pytest.approx(full[0].item(), rel=1e-3)
    for name, grad in full[1].items():
        scale = grad.abs().max().item()
        assert (chunked[1][name] - grad).abs().max().item() <= 2**-6 * scale, name


def test_chunked_compiles_into_one_graph_and_equals_eager():
    config = tiny(arch='gpt2')  # tied: lm_head's gradient joins the embedding's
    eager, compiled = (loss_and_grads(config, 'sum', compiled=c) for c in (False, True))
    assert compiled[0] == pytest.approx(eager[0].item(), rel=1e-6)
    for name, grad in eager[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_without_gradients_the_loss_alone():
    """eval: under no_grad the chunked loss takes no gradient (its matmul FLOPs are the full loss's, a third of
    its training ones) and equals the full loss; without targets the model returns the logits."""
    torch.manual_seed(0)
    model = GPT(tiny())
    idx, targets = batch(model.config, 2)
    counted = {}
    for loss in LOSS_NAMES:
        model.config = tiny(loss=loss)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            counted[loss] = (model(idx, targets)[1].item(), counter.get_total_flops())
    assert counted['chunked'][0] == pytest.approx(counted['full'][0], rel=1e-6)
    assert counted['chunked'][1] == counted['full'][1] > 0
    logits, loss = model(idx)  # without targets: the logits, as eval and generate need them
    assert loss is None and logits.shape == (2, model.config.block_size, model.config.vocab_size)


LOSS_NAMES = ('full', 'chunked')


# -----------------------------------------------------------------------------------------------------
# Soft-capped logits (logit_softcap: cap * tanh(z / cap), Gemma 2, nanochat), the chunked loss's alone.


@pytest.mark.parametrize('compiled', [False, True], ids=['eager', 'compiled'])
@pytest.mark.parametrize('family', [FAMILIES[0], FAMILIES[2]], ids=str)
def test_a_soft_cap_is_cross_entropy_over_the_capped_logits(family, compiled):
    """A cap of 0.1, below the tiny model's largest logits (~0.5), so that the tanh bends them: the chunked loss's loss
    and gradients are autograd's through cap * tanh(z / cap) and F.cross_entropy, within 1e-5 in fp32."""
    capped = tiny(**family, logit_softcap=0.1)
    reference = loss_and_grads(capped, 'sum', from_logits=True)
    chunked = loss_and_grads(capped, 'sum', compiled=compiled)
    assert chunked[0] == pytest.approx(reference[0].item(), rel=1e-6)
    for name, grad in reference[1].items():
        torch.testing.assert_close(chunked[1][name], grad, rtol=1e-5, atol=1e-5, msg=name)
    # what eval and generate see: bounded by the cap, where the same model's raw logits reach 3x past it
    idx = batch(capped, 1)[0]
    torch.manual_seed(0)
    raw = GPT(tiny(**family))(idx)[0]
    torch.manual_seed(0)
    logits = GPT(capped)(idx)[0]
    assert raw.abs().max() > 0.3 and logits.abs().max() <= 0.1 + 1e-6
    torch.testing.assert_close(logits, 0.1 * torch.tanh(raw / 0.1))


def test_a_soft_cap_needs_the_chunked_loss_and_a_positive_value():
    with pytest.raises(ConfigError, match="logit_softcap = 15 needs loss = 'chunked', not 'full'"):
        load_config(None, ['--logit_softcap=15', '--loss=full'])
    with pytest.raises(ConfigError, match=r'logit_softcap must be positive \(or 0: none\), got -1'):
        load_config(None, ['--logit_softcap=-1'])


@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16'])
def test_the_chunked_loss_holds_the_ledgers_buffers_and_a_cap_one_more_chunk(autocast, monkeypatch):
    """The peak bytes of the tensors the chunked loss creates, op by op (helpers.LiveBytes), over 64 tokens in three
    chunks (24 rows, the last 16) or one: the ledger's buffers (config.chunked_loss_buffers), h's gradient (its
    row's saved r*H) and under autocast the bf16 copies of lm_head's weight (the ledger's bf16 weight copies) and of
    a chunk's h, to within the per-token vectors (targets, mask: 24 bytes a token); a cap, one more fp32 chunk."""
    a = 2 if autocast else 4
    for rows in (24, 2048):
        monkeypatch.setattr(losses, 'CHUNK_ROWS', rows)
        monkeypatch.setattr(config, 'CHUNK_ROWS', rows)
        peak = {}
        for cap in (0.0, 0.5):
            c = tiny(block_size=64, logit_softcap=cap)
            torch.manual_seed(0)
            h = torch.randn(1, 64, c.n_embd, requires_grad=True)
            weight = torch.randn(c.vocab_size, c.n_embd, requires_grad=True)
            targets = torch.randint(c.vocab_size, (1, 64))
            loss = functools.partial(losses.chunked_cross_entropy, h, weight, targets, 'sum', c)
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
                peak[cap] = helpers.peak_live_bytes(loss)
            copies = (c.vocab_size + min(rows, 64)) * c.n_embd * 2 if autocast else 0
            held = sums.logits_bytes(c, 1, a)['total'] + 64 * c.n_embd * 4 + copies
            assert 0 <= peak[cap] - held <= 24 * 64, (rows, cap, peak[cap], held)
        assert peak[0.5] - peak[0.0] == min(rows, 64) * c.vocab_size * 4


def test_a_cap_too_low_to_learn_through_is_one_line():
    """A cap below 1 (1e-300, say) flattens every logit to +-cap: the loss stays flat and the
    gradient 0, so the run is refused before it starts."""
    with pytest.raises(ConfigError, match=r'logit_softcap = 1e-300 is below 1: the model cannot'):
        load_config(None, ['--logit_softcap=1e-300'])
    assert load_config(None, ['--logit_softcap=1'])[0].logit_softcap == 1
