# Continued pretraining of a published 1.1B Llama (TinyLlama's shape: 22 x 2048, GQA with 4 kv heads, 32K vocab) on
# 2B tokens of your own text, one H200, every weight trained (full fine-tuning), bf16 + torch.compile. The model keys
# come from init_from's config.json; configs/tinyllama_1b holds a copy of TinyLlama's, so that
# `python ledger.py configs/h200_finetune_1b.py` prints the bill offline. On the machine, the weights from the Hub:
#   python prepare.py files my_text/*.jsonl --out data/finetune --tokenizer TinyLlama/TinyLlama_v1.1
#   python train.py configs/h200_finetune_1b.py --init_from=TinyLlama/TinyLlama_v1.1
init_from = 'configs/tinyllama_1b'

out_dir = 'out/h200_finetune_1b'
data = 'data/finetune'  # made with the model's own tokenizer (prepare.py --tokenizer, as above)
train_tokens = 2_000_000_000
batch_tokens = 262_144  # 128 sequences of 2048 = 8 micro-batches of 16
micro_batch = 16
lr = 5e-5  # a fine-tune: well below the 4e-4 TinyLlama was pretrained with, so the model is kept, not relearned
min_lr_ratio = 0.1
warmup_frac = 0.01  # ~76 steps
compile = True
gpu = 'H200'
n_gpu = 1
