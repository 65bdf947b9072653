# Fine-tune a published model on your own text, on the CPU, in a few minutes (README: the worked example). The model
# keys come from init_from's config.json (a Hugging Face model folder or Hub repo id); block_size may be shorter.
#   python prepare.py files notes.txt --out data/finetune_cpu --tokenizer hf/pystdlib_cpu   # the model's tokenizer
#   python train.py configs/finetune_cpu.py                                                  # or --init_from=REPO_ID
#   python sample.py out/finetune_cpu
init_from = './hf/pystdlib_cpu'  # export.py's folder (README); './': a folder here, where 'owner/name' is a Hub id
block_size = 256

out_dir = 'out/finetune_cpu'
data = 'data/finetune_cpu'
train_tokens = 163_840  # 40 steps of 4096 tokens
batch_tokens = 4_096  # 16 sequences of 256: one micro-batch
micro_batch = 16
lr = 3e-4  # a fine-tune: a fraction of the 8e-3 the model was pretrained with; cosine to 10%
warmup_frac = 0.1
compile = False  # 40 steps: eager is faster than compiling first
mfu = 0.18  # as configs/pystdlib_cpu.py (the same model on the same CPU)
log_every = 5
eval_every = 10
eval_tokens = 2_048  # 8 val sequences: the val split is 10% of a small text
ckpt_every = 20
keep_ckpts = 1
sample_tokens = 200
