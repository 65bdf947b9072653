"""
test_losses.py: the chunked cross-entropy (losses.py) against F.cross_entropy over the full logits: the same loss and
the same gradient of every parameter, within 1e-5 in fp32 and within bf16's rounding under bf16 autocast, for both
families, tied and untied, with ignored targets, summed and averaged, over several chunks (the last one short),
eager and under torch.compile. Under 2 gloo processes, in every parallel mode, test_distributed.py holds the chunked
runs to a full-loss run, and the ledger's buffers to the peak memory test_memory.py measures.
"""

import pytest
import torch
from test_model import batch, one_thread, tiny  # noqa: F401 (one_thread: one thread for tiny shapes)
from torch.utils.flop_counter import FlopCounterMode

import losses
from config import IGNORE_INDEX
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


def loss_and_grads(config, reduction, autocast=False, compiled=False):
    torch.manual_seed(0)
    model = GPT(config)
    idx, targets = batch(config, 2)
    targets[0, :7] = IGNORE_INDEX  # as prefix_lm and ul2 set them: a part of a row carries no loss
    targets[1, -1] = IGNORE_INDEX
    forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
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
