# A mixture of experts on one H200: ~1.05B parameters of which ~0.25B are active per token, on the 26B tokens of
# the dense plan (configs/h200_1b3.py), in the DeepSeekMoE shape: 16 layers x 1024 (head size 128), the first
# dense, the other 15 with 48 routed experts of 384 (3 per token) and one shared expert, router biases balancing
# the load (DeepSeek-V3's gamma 0.001). `python ledger.py configs/h200_moe.py`: FLOPs and days from the 0.25B
# active parameters, model states from the 1.05B total (the book's 16 x active beside it), the bill.
# The MFU below is an assumption, not a measurement: the experts run as a loop of small matmuls with one host read
# of the slice sizes per layer, slower than one dense FFN of the same FLOPs.
arch = 'llama'
n_layer = 16
n_head = 8
n_embd = 1024
vocab_size = 50304
block_size = 2048
tie_embeddings = False
n_experts = 48
top_k = 3
expert_hidden = 384
n_shared_experts = 1
n_dense_layers = 1
route_scale = 1.0

out_dir = 'out/h200_moe'
data = 'data/fineweb_edu'
train_tokens = 26_000_000_000
dataset_tokens = 100_000_000_000
batch_tokens = 524_288
micro_batch = 16
lr = 6e-4  # a quarter of the 1.3B's active size: a larger LR, as smaller dense models take
warmup_frac = 0.003
router_bias_speed = 0.001
aux_loss_coef = 0.0001  # DeepSeek-V3's alpha: against extreme imbalance within one sequence
compile = True  # the dense parts compile; each MoE layer runs eager (moe.py)
gpu = 'H200'
n_gpu = 1
mfu = 0.25
