# LLaMA-7B's shape (Touvron et al. 2023): 6,738,415,616 parameters, the book's ledger 1 example.
# The training keys set the book's ledger 4 scenario: 2 x A800-80G, ZeRO-3, recomputation, micro-batch 8,
# so `python ledger.py configs/llama_7b.py --loss=full` gives the ledger's own estimate to hold against the book's
# ~66 GB per GPU (the book's loss keeps the full logits; the chunked default holds 61.3 GiB).
arch = 'llama'
n_layer = 32
n_head = 32
n_embd = 4096
ffn_hidden = 11008  # LLaMA's 8H/3 rounded up to a multiple of 256
vocab_size = 32000  # LLaMA's SentencePiece vocabulary
block_size = 2048
tie_embeddings = False

train_tokens = 1_000_000_000_000  # LLaMA-7B saw 1T tokens
out_dir = 'out/llama_7b'
batch_tokens = 4_194_304  # LLaMA: 4M tokens per step
lr = 3e-4  # LLaMA-7B's peak learning rate
gpu = 'A800'
n_gpu = 2
parallel = 'fsdp'
recompute = True
micro_batch = 8
