# The CPU miniature of a mixture of experts: configs/pystdlib_cpu.py's Llama (4 layers x 256) with its last three
# FFNs made DeepSeekMoE layers of the same active width: 8 routed experts of 192, 3 per token, and one shared
# expert, so a token uses 4 x 192 = 768 = the dense model's H' (plus a 8 x 256 router per layer), while each layer
# holds 9 x 192. The ledger: total parameters, the active ones, FLOPs from the active, model states from the total:
#   python ledger.py configs/pystdlib_moe.py
#   python train.py configs/pystdlib_moe.py      # needs `python prepare.py pystdlib`
# experiments/moe_vs_dense.py trains it beside the dense model for the same wall-clock (README: the table).
arch = 'llama'
n_layer = 4
n_head = 4
n_embd = 256
vocab_size = 8192
block_size = 256
n_experts = 8
top_k = 3
expert_hidden = 192
n_shared_experts = 1
# DeepSeek-V3 keeps its first 3 layers dense: the first layer's routing learns little
n_dense_layers = 1
route_scale = 1.0

out_dir = 'out/pystdlib_moe'
data = 'data/pystdlib'
train_tokens = 2_621_440
batch_tokens = 8_192
micro_batch = 16
lr = 2e-3
warmup_frac = 0.05
router_bias_speed = 0.001  # DeepSeek-V3's gamma
aux_loss_coef = 0.0  # the bias alone balances (DeepSeek-V3 adds 0.0001 of the sequence-wise loss)
compile = False  # the routing's host read breaks the graph in every MoE layer: eager, like the comparison's dense run
mfu = 0.18
log_every = 10
eval_every = 80
eval_tokens = 65_536
ckpt_every = 160
keep_ckpts = 2
sample_tokens = 200
