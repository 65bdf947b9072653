# The seed's 1.3B run (configs/h200_1b3.py) with our own 32K BPE, trained on FineWeb-Edu itself, in place of GPT-2's
# tokenizer: the planning note's third choice, "your own 32K BPE (fits uint16)". 32,768 = 2^15 ids is a multiple of
# 128 already and fits uint16 shards (2 bytes a token). The two embedding matrices shrink from 50,304 to 32,768
# rows: 2 x 17,536 x 2048 = 71.8M fewer parameters, 1.26B in all. Same token budget (26B), same recipe.
#   python prepare.py fineweb_edu --sample 100BT --tokens 26.1e9 --tokenizer bpe:32768 --out data/fineweb_edu_bpe32k
#   python ledger.py configs/h200_1b3_bpe32k.py      # the bill: 1.26B parameters, 6.3 days, $530 on one H200
#   torchrun --nproc_per_node=1 train.py configs/h200_1b3_bpe32k.py
# Its losses are in nats per OUR token: compare with h200_1b3's in bits per byte (report.md has both).
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 32768  # our bpe:32768, padded to nothing: already a multiple of 128
block_size = 2048
tie_embeddings = False

out_dir = 'out/h200_1b3_bpe32k'
data = 'data/fineweb_edu_bpe32k'  # its own folder: shards of one tokenizer never mix with another's
train_tokens = 26_000_000_000
dataset_tokens = 100_000_000_000  # sample-100BT
batch_tokens = 524_288  # 256 sequences of 2048 = 16 micro-batches of 16
micro_batch = 16
lr = 3e-4
warmup_frac = 0.003
compile = True
gpu = 'H200'
n_gpu = 1
