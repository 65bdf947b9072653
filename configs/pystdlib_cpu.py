# The CPU default: a small Llama (4 layers x 256, 7.6M parameters, more than half of them the two 8192 x 256
# embedding matrices) on the Python standard library, about 5 minutes of training on 2 CPU cores.
#   python prepare.py pystdlib                   # ~8M tokens, our own 8192-token BPE, ~10 s
#   python train.py configs/pystdlib_cpu.py      # val ~1.2 bits per byte; a sample of Python at the end
# Chosen by `python experiments/sweep.py` (docs/measured.md: the table): at a fixed five minutes, this shape and
# batch beat wider and deeper models (they see too few tokens) and a larger batch.
# Everything else (the recipe, the ledger, checkpoints) is what the GPU configs use; only the sizes shrink.
arch = 'llama'
n_layer = 4
n_head = 4  # head size 64
n_embd = 256
vocab_size = 8192  # prepare.py pystdlib's default BPE vocab (a multiple of 128 already)
block_size = 256

out_dir = 'out/pystdlib_cpu'
data = 'data/pystdlib'
# Four minutes of training steps at the speed the live ledger predicts for this machine (its step
# probe, compiled as the run; once runs have trained here, the median of their speeds): with AMX
# ~330 steps (2.7M tokens, ~0.34 epoch of the 7.8M train tokens). --train_tokens=N plans by tokens.
train_minutes = 4
batch_tokens = 8_192  # 2 micro-batches of 16 x 256: small batches, many steps, for a short CPU run
micro_batch = 16
# The recipe the race chose (`python experiments/sweep.py --race`, docs/measured.md): Muon for the blocks' matrices
# (AdamW's LR carried over by match_rms_adamw) at its best LR of six, and nanochat's weightless QK-norm; ReLU² and
# the logit soft cap did not beat it over two seeds.
optimizer = 'muon'
lr = 8e-3  # Muon's best (AdamW's was 4e-3); cosine to 10% after 16 warmup steps
qk_norm = 'weightless'  # exports as a Qwen3ForCausalLM with gains of 1
warmup_frac = 0.05
compile = True  # inductor on the CPU: ~30 s to compile, then ~1.7x the eager speed (README)
# dtype 'auto' (the default): bf16 where this CPU's bf16 matmuls beat fp32 (measured at start-up), else fp32
mfu = 0.18  # `python ledger.py`'s assumption (a Xeon with AMX, bf16); train.py measures this CPU's (live_ledger.py)
log_every = 10
eval_every = 80
eval_tokens = 65_536  # 256 val sequences
ckpt_every = 160
keep_ckpts = 2
sample_tokens = 200  # a text sample at the end (temperature 0.8, top-k 200)
