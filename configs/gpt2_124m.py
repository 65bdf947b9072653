# GPT-2 small (124M): 12 layers, 768 wide, 12 heads, learned positions, biases, tied embeddings.
# With vocab_size = 50257 it is OpenAI's 124,439,808 parameters; padded to 50304 (a multiple of 128) for speed,
# as nanoGPT and llm.c train it. Training keys: llm.c's GPT-2 (124M) reproduction on 10B tokens of FineWeb.
arch = 'gpt2'
n_layer = 12
n_head = 12
n_embd = 768
vocab_size = 50304
block_size = 1024
bias = True
tie_embeddings = True

out_dir = 'out/gpt2_124m'
data = 'data/fineweb_edu'
train_tokens = 10_000_000_000
dataset_tokens = 100_000_000_000  # FineWeb-Edu sample-100BT
batch_tokens = 524_288  # 2**19, GPT-3 small's 0.5M
micro_batch = 64
lr = 6e-4  # GPT-3 small's peak learning rate
gpu = 'H200'
