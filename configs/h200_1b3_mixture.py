# The seed's 1.3B run (configs/h200_1b3.py) on a weighted mixture in place of FineWeb-Edu alone: the planning note's
# suggested 60/15/10/5/5/5, adding code and math (its next step past ~3B parameters, or for breadth of evals). The
# folders share GPT-2's tokenizer (prepare.py's default for fineweb_edu and hub); each is made once, e.g.
#   python prepare.py fineweb_edu --sample 100BT --tokens 26.1e9
#   HF_TOKEN=hf_... python prepare.py hub bigcode/starcoderdata --config python --column content --out data/code
#   python prepare.py hub HuggingFaceTB/finemath --config finemath-3plus --out data/finemath
#   python prepare.py hub HuggingFaceTB/finemath --config infiwebmath-3plus/train --out data/infiwebmath
#   python prepare.py hub HuggingFaceTB/cosmopedia --config data/stories --out data/cosmopedia
#   python prepare.py hub wikimedia/wikipedia --config 20231101.en --out data/wikipedia
# (--config is the folder of the repo that holds the subset's parquet files: the dataset's Files tab shows it.)
#   python ledger.py configs/h200_1b3_mixture.py     # each source's tokens and epochs; a warning past 4 epochs
# The schedule interleaves the sources in a fixed pattern (mixture.py); each one's val set is scored on its own.
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 128 (fits uint16 shards)
block_size = 2048
tie_embeddings = False

out_dir = 'out/h200_1b3_mixture'
data = {
    'data/fineweb_edu': 0.60,  # web, educational
    'data/code': 0.15,  # StarCoder's Python
    'data/finemath': 0.10,  # FineMath 3+
    'data/infiwebmath': 0.05,  # InfiWebMath 3+ (FineMath's other half)
    'data/cosmopedia': 0.05,  # synthetic textbooks and stories
    'data/wikipedia': 0.05,  # English Wikipedia
}
train_tokens = 26_000_000_000
batch_tokens = 524_288  # 256 sequences of 2048 = 16 micro-batches of 16
micro_batch = 16
lr = 3e-4
warmup_frac = 0.003
eval_tokens = 6 * 262_144  # 262,144 val tokens per source
compile = True
gpu = 'H200'
n_gpu = 1
