# The seed's 1.3B run on one 8 x H100 80GB node: the model, data and recipe of configs/h200_1b3.py (same keys,
# written out: a config is a flat file), with the global batch spread over 8 GPUs.
#   torchrun --standalone --nproc_per_node=8 train.py configs/h100x8_1b3.py
#   python ledger.py configs/h100x8_1b3.py  # the bill first: ~0.81 days on 8 GPUs at 40% MFU, with communication
# 524,288 tokens per step = 8 GPUs x 16 sequences x 2048 tokens x 2 accumulation steps.
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 128 (fits uint16 shards)
block_size = 2048
tie_embeddings = False

out_dir = 'out/h100x8_1b3'
data = 'data/fineweb_edu'  # python prepare.py fineweb_edu
train_tokens = 26_000_000_000  # Chinchilla: 20 tokens per parameter
dataset_tokens = 100_000_000_000  # sample-100BT
batch_tokens = 524_288
# 58.7 of 79.7 GiB a GPU; the ledger's largest that fits is 21 (5% kept free), so 32 does not
micro_batch = 16
lr = 3e-4
warmup_frac = 0.003
compile = True
# ZeRO-2 via FSDP2: gradients and AdamW states sharded (2P + 14P/8 bytes, not 16P)
parallel = 'zero2'
gpu = 'H100'
n_gpu = 8
log_every = 10
eval_every = 500
ckpt_every = 1000  # ~16 GB each (12P); keep_ckpts = 3 of them
