# The planning note's second experiment: the seed's 1.3B run (configs/h200_1b3.py: model, data, recipe) over-trained
# to 100B tokens of FineWeb-Edu sample-100BT, 3.7 x Chinchilla's 20 x P = 26.7B, to see where the loss flattens.
# Warmup-stable-decay in place of cosine (Hägele et al. 2024): the LR holds its peak until the last 20% of the run,
# so a checkpoint from before that, decayed in a short branch of its own, is a finished run of a shorter length.
# The run keeps its checkpoints at 20.8B and 41.6B tokens (keep_steps, out/h200_1b3_overtrain/ckpt): the starts of
# branches that decay over 5.2B and 10.4B tokens and end at 26B and 52B (1x and 2x Chinchilla); its own decay, from
# 80B, ends the 100B one. Three lengths for 115.6B tokens, where cosine runs of each would take 178B.
#   python prepare.py fineweb_edu --sample 100BT                 # the whole sample: ~100B tokens, ~200 GB of shards
#   python experiments/overtrain.py configs/h200_1b3_overtrain.py --plan   # the runs, their commands, the bill
#   python experiments/overtrain.py configs/h200_1b3_overtrain.py          # runs them in order (resumable)
#   python plot.py out/h200_1b3_overtrain --branches             # the loss, the branches, the Chinchilla point
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 128 (fits uint16 shards)
block_size = 2048
tie_embeddings = False

out_dir = 'out/h200_1b3_overtrain'
data = 'data/fineweb_edu'  # the seed run's folder, carried on to the whole sample
train_tokens = 100_000_000_000
dataset_tokens = 100_000_000_000  # sample-100BT: one epoch, no token seen twice
batch_tokens = 524_288
micro_batch = 16
lr = 3e-4  # the seed's peak; Hägele et al. find wsd's best peak near half of cosine's
warmup_frac = 0.003
schedule = 'wsd'
decay_frac = 0.2  # the last 20B tokens; each branch decays over 20% of its own length too
cooldowns = (26e9, 52e9)  # 1x and 2x Chinchilla (the seed's 26B)
compile = True
ckpt_every = 1000  # ~16 GB each (12P); keep_ckpts = 3 of them, the branch points besides
gpu = 'H200'
n_gpu = 1
