# The seed's 1.3B run (configs/h200_1b3.py: model, data, schedule) with Muon (Jordan et al. 2024; torch.optim.Muon)
# on the blocks' matrices and AdamW, as before, on the embeddings, lm_head and norms. lr and weight_decay carry over
# (muon_lr = 0: torch's match_rms_adamw scaling, Liu et al. 2025). `python ledger.py configs/h200_1b3_muon.py`:
#   model states 15.7 GiB, not 19.9: one fp32 momentum (4 bytes) a block parameter for AdamW's two (8): the book's
#     16P becomes about 12P (BOOK.md, Derivations: Muon's model states);
#   Newton-Schulz 5.39e13 FLOPs a step (1.2% of the step's 4.51e15), ~0.136 s of its 11.4 s at 40% MFU;
#   6.55 days and $550 for the same 26B tokens (AdamW: 6.47 days, $544), 77 of 140 GiB.
# What it may buy is THEIR figure, not ours: Liu et al. 2025 ("Muon is Scalable for LLM Training", Moonlight) fit
# scaling laws in which Muon reaches AdamW's loss with ~52% of the training FLOPs (about 2x the compute
# efficiency); Jordan et al. 2024 report 1.35x in the NanoGPT speedrun. Not measured here at this size.
arch = 'llama'
n_layer = 22
n_head = 16
n_embd = 2048
ffn_hidden = 5632  # 8H/3 rounded up to a multiple of 256
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 128 (fits uint16 shards)
block_size = 2048
tie_embeddings = False

data = 'data/fineweb_edu'  # python prepare.py fineweb_edu
train_tokens = 26_000_000_000
# sample-100BT: room for the seed's second experiment (over-train to 100B)
dataset_tokens = 100_000_000_000
batch_tokens = 524_288  # 256 sequences of 2048 = 16 micro-batches of 16
micro_batch = 16  # the ledger: fits in 141 GB with room (largest that fits: see the report)
lr = 3e-4  # between GPT-3 XL (2e-4 at 1M batch) and TinyLlama (4e-4); cosine to 10%
warmup_frac = 0.003  # ~150 steps of linear warmup
compile = True
gpu = 'H200'
n_gpu = 1
optimizer = 'muon'
out_dir = 'out/h200_1b3_muon'
