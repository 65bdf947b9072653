# GPT-3 Large's shape in the gpt2 family (Brown et al. 2020, table 2.1): 24 layers, 1536 wide, 16 heads,
# context 2048, learned positions, biases, tied embeddings: 760M parameters. The seed's earlier run (on an
# MI300X: try --gpu=MI300X); on one H200 its 25B tokens are the seed's ~3.3-day row.
arch = 'gpt2'
n_layer = 24
n_head = 16
n_embd = 1536
vocab_size = 50304  # GPT-2 tokenizer, padded to a multiple of 128
block_size = 2048
bias = True
tie_embeddings = True

out_dir = 'out/gpt2_760m'
data = 'data/fineweb_edu'
train_tokens = 25_000_000_000
# the seed's question: are 25B FineWeb-Edu tokens enough? (for 760M: yes)
dataset_tokens = 25_000_000_000
batch_tokens = 524_288  # GPT-3 Large: 0.5M tokens per step
micro_batch = 16
lr = 2.5e-4  # GPT-3 Large's peak learning rate
compile = True
gpu = 'H200'
