"""
test_compiled_memory.py: what a compiled run keeps, per parallel mode. One process, DDP and ZeRO-1 compile the whole
model, so the loss is inductor's (the logits and their gradient, 2 x 2 bytes a logit in bf16); under FSDP2 (zero2,
fsdp) train.py compiles each block alone and the root (final norm, lm_head, loss) runs eager: the loss keeps eager's
fp32 log-softmax and gradients, 12 bytes a logit, as the ledger now counts.
"""

import torch

import ledger
from config import ModelConfig, TrainConfig
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


def test_under_fsdp2_the_loss_is_eager_and_the_ledger_counts_it_so(monkeypatch):
    monkeypatch.setenv('TORCHINDUCTOR_COMPILE_THREADS', '1')
    config = ModelConfig(
        arch='llama', n_layer=2, n_head=2, n_embd=32, vocab_size=384, block_size=16
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
    # the eager loss saved its fp32 log-softmax: B x T x V x 4 bytes (bf16 logits would be 2)
    assert 4 * elements in saved.values()
    # the ledger: eager loss buffers under FSDP2, compiled ones where the whole model is compiled
    device = ledger.GPUS['H100']
    for parallel, n_gpu, compiled_loss in (
        ('fsdp', 2, False),
        ('zero2', 2, False),
        ('ddp', 2, True),
        ('fsdp', 1, True),
    ):
        train = TrainConfig(
            parallel=parallel, compile=True, micro_batch=micro_batch, batch_tokens=2 * 16 * n_gpu
        )
        memory = ledger.memory_per_gpu(config, train, n_gpu, device=device)
        expected = ledger.logits_bytes(config, micro_batch, 2, compiled=compiled_loss)['total']
        assert memory['logits'] == expected == (4 if compiled_loss else 12) * elements, (
            parallel,
            n_gpu,
        )
