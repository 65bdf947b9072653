"""
bench_loop.py: the reference for train.py's speed, a plain PyTorch loop of the same model and batch.

    python bench_loop.py configs/pystdlib_cpu.py 30       # tokens/s of a nanoGPT-style loop, 30 steps
    python train.py configs/pystdlib_cpu.py --max_steps=30 --eval_every=1000 --ckpt_every=1000 \
        --sample_tokens=0 --log_every=5 --out_dir=out/bench   # train.py's loop: report.md has its tokens/s

Same model (model.GPT), same micro-batch and accumulation, AdamW and clipping at 1.0, fp32 on the CPU; random
sequence offsets into the first train shard as nanoGPT does; no checkpoints, eval, logging or ledger. The first
5 steps are warm-up and not timed, as in train.py. A benchmark, not a test: the README has its figures.
"""
import sys
import time

import numpy as np
import torch

import prepare
from config import load_config
from model import GPT

model_cfg, train_cfg = load_config(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
T, B = model_cfg.block_size, train_cfg.micro_batch
accumulation = train_cfg.batch_tokens // (B * T)
torch.manual_seed(train_cfg.seed)
model = GPT(model_cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
tokens = prepare.open_shard(prepare.list_shards(train_cfg.data, 'train')[0])
rng = np.random.default_rng(train_cfg.seed)

for step in range(steps):
    if step == 5:
        start = time.perf_counter()
    for _ in range(accumulation):
        starts = rng.integers(0, len(tokens) - T - 1, B)
        sequences = torch.from_numpy(np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64))
        _, loss = model(sequences[:, :-1], sequences[:, 1:])
        (loss / accumulation).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
elapsed = time.perf_counter() - start
print(f"plain loop: {(steps - 5) * accumulation * B * T / elapsed:,.0f} tokens/s over steps 6-{steps} "
      f"({model_cfg.arch}, {sum(p.numel() for p in model.parameters()):,} params, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads)")
