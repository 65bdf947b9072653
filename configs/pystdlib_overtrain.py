# The over-training experiment of configs/h200_1b3_overtrain.py in miniature, on a CPU in minutes:
#   python prepare.py pystdlib --tokenizer bpe:512 --out data/pystdlib_bpe512   # a small vocab, ~10 s
#   python experiments/overtrain.py configs/pystdlib_overtrain.py
# A 115,008-parameter Llama (2 layers x 64, embeddings tied: a 512 x 64 table is 29% of it) on the Python standard
# library: Chinchilla's 20 x P = 2.3M tokens. One wsd run to 4x, 9.2M tokens (under one epoch of the data), keeps its
# checkpoints at 0.8 x 1x and 0.8 x 2x for the branches that end at 1x and 2x; then cosine runs of all three lengths.
arch = 'llama'
n_layer = 2
n_head = 2  # head size 32
n_embd = 64
ffn_hidden = 128  # 2H: the default 8H/3 rounded up to 256 would be 4H
vocab_size = 512
block_size = 128
tie_embeddings = True

out_dir = 'out/pystdlib_overtrain'
data = 'data/pystdlib_bpe512'
train_tokens = 9_200_640  # 4 x 20 x P
batch_tokens = 8_192  # 64 sequences of 128: 1,123 steps
micro_batch = 64
lr = 3e-3
warmup_frac = 0.02
schedule = 'wsd'
decay_frac = 0.2
cooldowns = (2_300_160, 4_600_320)  # 1x and 2x Chinchilla
compile = False
dtype = 'float32'
log_every = 10
eval_every = 100
eval_tokens = 65_536  # 512 val sequences
ckpt_every = 200
keep_ckpts = 2
