"""
test_compiled_memory.py: what a compiled run keeps, per parallel mode. One process, DDP and ZeRO-1 compile the whole
model, so the loss is inductor's (the logits and their gradient, 2 x 2 bytes a logit in bf16); under FSDP2 (zero2,
fsdp) train.py compiles each block alone and the root (final norm, lm_head, loss) runs eager: the full loss keeps
eager's fp32 log-softmax and gradients, 12 bytes a logit, as the ledger now counts; the chunked loss (the default)
keeps no logit, only its fp32 gradients of h and of lm_head's weight.
"""

import pytest
import torch

from ledgergpt import sums
from ledgergpt.config import ModelConfig, TrainConfig
from model import GPT


def saved_storages(run):
    """{data_ptr: nbytes} of the storages autograd saves while run() executes."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return storages


@pytest.mark.parametrize('loss', ['full', 'chunked'])
def test_under_fsdp2_the_loss_is_eager_and_the_ledger_counts_it_so(loss, monkeypatch):
    monkeypatch.setenv('TORCHINDUCTOR_COMPILE_THREADS', '1')
    config = ModelConfig(
        arch='llama', n_layer=2, n_head=2, n_embd=64, vocab_size=384, block_size=16, loss=loss
    )
    model = GPT(config)
    for block in model.blocks:
        block.compile()  # as train.py's build_model does under FSDP2
    micro_batch = 2
    idx = torch.randint(config.vocab_size, (micro_batch, config.block_size))
    elements = micro_batch * config.block_size * config.vocab_size
    torch._dynamo.reset()
    try:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            saved = saved_storages(lambda: model(idx, idx, reduction='sum'))
    finally:
        torch._dynamo.reset()
    # the eager full loss saved its fp32 log-softmax: B x T x V x 4 bytes (bf16 logits would be 2); the chunked
    # loss no logit, but its fp32 gradients of h (B x T x H) and of lm_head's weight (V x H)
    tokens, H = micro_batch * config.block_size, config.n_embd
    if loss == 'full':
        assert 4 * elements in saved.values()
    else:
        assert {4 * tokens * H, 4 * config.vocab_size * H} <= set(saved.values())
        assert 4 * elements not in saved.values()
    # the ledger: eager loss buffers under FSDP2, compiled ones where the whole model is compiled
    device = sums.GPUS['H100']
    for parallel, n_gpu, compiled_loss in (
        ('fsdp', 2, False),
        ('zero2', 2, False),
        ('ddp', 2, True),
        ('fsdp', 1, True),
    ):
        train = TrainConfig(
            parallel=parallel, compile=True, micro_batch=micro_batch, batch_tokens=2 * 16 * n_gpu
        )
        memory = sums.memory_per_gpu(config, train, n_gpu, device=device)
        expected = sums.logits_bytes(config, micro_batch, 2, compiled=compiled_loss)
        full = (4 if compiled_loss else 12) * elements
        assert memory['logits'] == expected['total'], (parallel, n_gpu)
        assert expected['total'] == full if loss == 'full' else 'chunk_logits' in expected
