# The CPU default: a small Llama (4 layers x 256, 7.6M parameters, more than half of them the two 8192 x 256
# embedding matrices) on the Python standard library, float32: about 6 minutes on 2 CPU cores (~3,500 tok/s).
#   python prepare.py pystdlib                   # ~8M tokens, our own 8192-token BPE, ~10 s
#   python train.py configs/pystdlib_cpu.py      # the loss falls from ln 8192 = 9.0 to about 5.5; a sample at the end
# Everything else (the recipe, the ledger, checkpoints) is what the GPU configs use; only the sizes shrink.
arch = 'llama'
n_layer = 4
n_head = 4                  # head size 64
n_embd = 256
vocab_size = 8192           # prepare.py pystdlib's default BPE vocab (a multiple of 128 already)
block_size = 256

out_dir = 'out/pystdlib_cpu'
data = 'data/pystdlib'
train_tokens = 1_048_576    # 128 steps of 8192 tokens: ~0.13 epoch of the 7.8M train tokens
batch_tokens = 8_192        # 2 micro-batches of 16 x 256: small batches, many steps, for a short CPU run
micro_batch = 16
lr = 2e-3                   # a small model takes a large LR; cosine to 10% after 6 warmup steps
warmup_frac = 0.05
compile = False             # torch.compile works on the CPU but its ~30 s compile is most of the gain here
dtype = 'float32'           # bf16 matmuls are slower than fp32 on most CPUs
log_every = 5
eval_every = 32
eval_tokens = 32_768        # 128 val sequences
ckpt_every = 64
keep_ckpts = 2
sample_tokens = 200         # a text sample at the end (temperature 0.8, top-k 200)
