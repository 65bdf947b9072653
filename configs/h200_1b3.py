# The seed's recommended run: a ~1.3B Llama (RoPE, SwiGLU, RMSNorm, no biases, untied) on 26B tokens of
# FineWeb-Edu sample-100BT (Chinchilla: 20 tokens/param), one H200, bf16 + flash attention + torch.compile.
# Shape: TinyLlama's depth and width (22 x 2048, head size 128), full multi-head attention, GPT-2 tokenizer.
# `python ledger.py configs/h200_1b3.py`: 1.34B parameters, ~6 days (book 6ND), ~$500.
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 128 (fits uint16 shards)
block_size = 2048
tie_embeddings = False

out_dir = 'out/h200_1b3'
data = 'data/fineweb_edu'  # python prepare.py fineweb_edu
train_tokens = 26_000_000_000
# sample-100BT: room for the seed's second experiment (over-train to 100B)
dataset_tokens = 100_000_000_000
batch_tokens = 524_288  # 256 sequences of 2048 = 16 micro-batches of 16
micro_batch = 16  # the ledger: 81.7 of 140.4 GiB; 32 (the next that divides the batch) leaves 2.6 GiB, under 5%
lr = 3e-4  # between GPT-3 XL (2e-4 at 1M batch) and TinyLlama (4e-4); cosine to 10%
warmup_frac = 0.003  # ~150 steps of linear warmup
compile = True
gpu = 'H200'
n_gpu = 1
