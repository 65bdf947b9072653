"""
ledger.py: the book's four sums (parameters, FLOPs, days, memory, plus data and cost) for a config.

Pure Python, no torch at module level: `python ledger.py configs/llama_7b.py` runs with the standard
library alone. It is also the home of the config vocabulary shared by train.py, model.py and sample.py.
"""
import dataclasses
import difflib
import json
import math
import os
import sys
from dataclasses import dataclass, field

# -----------------------------------------------------------------------------------------------------
# Config vocabulary (DESIGN.md). A config file is plain Python that assigns keys; `--key=value` overrides
# one key after the file, parsed to the type of its default. Unknown keys name the closest known key.


class ConfigError(ValueError):
    """Bad input in a config: the message is one line that says what is wrong and what to do."""


@dataclass
class ModelConfig:
    arch: str = 'llama'          # 'llama' (RMSNorm, RoPE, SwiGLU, no bias) or 'gpt2' (LayerNorm, learned pos, GELU)
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0           # key/value heads for GQA; 0 means n_head (plain multi-head attention)
    n_embd: int = 768
    ffn_hidden: int = 0          # FFN width H'; 0 means the family default (gpt2: 4H; llama: 8H/3 rounded up to 256)
    vocab_size: int = 50304      # padded to a multiple of 128 in the configs, for speed
    block_size: int = 1024       # context length T (training sequence length)
    tie_embeddings: bool = False # share the input embedding with the output projection (GPT-2 does)
    bias: bool = False           # biases in Linear layers and LayerNorms (gpt2 only; llama has none)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def ffn_width(self):
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.arch == 'gpt2':
            return 4 * self.n_embd
        return 256 * math.ceil(8 * self.n_embd / 3 / 256)  # LLaMA's rule: 2/3 of 4H, rounded up to 256


@dataclass
class TrainConfig:
    # run and data
    out_dir: str = 'out'
    data: str = 'data/pystdlib'  # a folder made by prepare.py, or 'synthetic' (random tokens, for benchmarks)
    seed: int = 1337
    train_tokens: int = 26_000_000_000  # tokens the run is planned to see (sets the number of steps)
    max_steps: int = 0           # stop after this many steps (0: run to train_tokens); the schedule still spans train_tokens
    dataset_tokens: int = 0      # tokens available in the dataset, for the ledger's "is it enough" (0: unknown)
    # batch: global batch in tokens, reached by micro_batch sequences x grad accumulation x world size
    batch_tokens: int = 524_288
    micro_batch: int = 16        # sequences per GPU per forward/backward
    batch_ramp_tokens: int = 0   # ramp the batch from batch_ramp_start to batch_tokens over this many tokens (0: off)
    batch_ramp_start: int = 32_768
    # optimizer and schedule (BOOK: AdamW 0.9/0.95/1e-8, wd 0.1 on matrices, clip 1.0, warmup 0.1-0.5%, decay to 10%)
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    schedule: str = 'cosine'     # 'cosine' or 'wsd' (warmup-stable-decay)
    warmup_frac: float = 0.003   # fraction of steps spent in linear warmup
    decay_frac: float = 0.2      # wsd only: fraction of steps spent in the final linear decay
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    # precision, speed, memory, parallelism
    dtype: str = 'auto'          # 'auto' (bfloat16 autocast on CUDA, float32 on CPU), 'bfloat16' or 'float32'
    compile: bool = True
    recompute: bool = False      # activation recomputation per block (the ledger switches to 8P)
    parallel: str = 'ddp'        # 'ddp', 'zero1', 'zero2' or 'fsdp' (ZeRO-3)
    # logging, eval, checkpoints, spike guard
    log_every: int = 10
    eval_every: int = 250
    eval_tokens: int = 1_048_576
    sample_every: int = 0        # 0: no samples during training
    sample_tokens: int = 0       # tokens per text sample, at sample_every steps and at the end of the run (0: none)
    ckpt_every: int = 1000
    keep_ckpts: int = 3
    spike_factor: float = 3.0    # a loss above mean + spike_factor * std of the recent window is a spike
    spike_window: int = 50
    spike_min_std: float = 0.02  # floor on that std, as a fraction of the mean: late in a run the loss is so steady
                                 # (std ~0.01) that 3 std would read ordinary noise as spikes
    max_rollbacks: int = 5
    # the ledger's assumptions for time, money and memory
    gpu: str = 'H200'
    n_gpu: int = 1               # GPUs the ledger plans for (train.py uses the real world size)
    mfu: float = 0.40            # assumed model FLOPs utilisation (the seed's 40%)
    usd_per_gpu_hour: float = 3.5


CONFIG_CLASSES = (ModelConfig, TrainConfig)


def _known_keys():
    return {f.name: cls for cls in CONFIG_CLASSES for f in dataclasses.fields(cls)}


def _unknown_key_error(key, where):
    close = difflib.get_close_matches(key, list(_known_keys()), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else "see ModelConfig and TrainConfig in ledger.py for the keys"
    return ConfigError(f"unknown config key '{key}' in {where}: {hint}")


def _parse_value(key, text, default):
    """Parse a --key=value string to the type of the key's default."""
    try:
        if isinstance(default, bool):
            if text.lower() in ('1', 'true', 'yes', 'on'):
                return True
            if text.lower() in ('0', 'false', 'no', 'off'):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(float(text)) if ('e' in text.lower() or '.' in text) and float(text).is_integer() else int(text)
        if isinstance(default, float):
            return float(text)
        return text
    except ValueError:
        raise ConfigError(f"--{key}={text}: expected a value of type {type(default).__name__}") from None


def load_config(path=None, overrides=()):
    """Read a config file (plain Python assignments) and `--key=value` overrides into (ModelConfig, TrainConfig).

    The file runs in a fresh namespace, never in our globals; names starting with '_' and modules are ignored."""
    values = {}
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path} (the configs are in configs/)")
        namespace = {}
        with open(path) as f:
            source = f.read()
        try:
            exec(compile(source, path, 'exec'), namespace)
        except Exception as e:  # a typo in a config file is bad input too: one line, no traceback
            raise ConfigError(f"{path} does not run: {type(e).__name__}: {e}") from None
        for key, value in namespace.items():
            if key.startswith('_') or type(value).__name__ == 'module':
                continue
            if key not in _known_keys():
                raise _unknown_key_error(key, path)
            values[key] = value
    defaults = {f.name: f.default for cls in CONFIG_CLASSES for f in dataclasses.fields(cls)}
    for item in overrides:
        if not item.startswith('--') or '=' not in item:
            raise ConfigError(f"cannot read argument '{item}': overrides are written --key=value")
        key, text = item[2:].split('=', 1)
        if key not in defaults:
            raise _unknown_key_error(key, 'the command line')
        values[key] = _parse_value(key, text, defaults[key])
    for key, value in values.items():  # ints written as 26e9 in a config file are accepted when whole
        if isinstance(defaults[key], int) and not isinstance(defaults[key], bool) and isinstance(value, float) \
                and value.is_integer():
            values[key] = int(value)
    configs = []
    for cls in CONFIG_CLASSES:
        names = {f.name for f in dataclasses.fields(cls)}
        configs.append(cls(**{k: v for k, v in values.items() if k in names}))
    model, train = configs
    validate(model, train)
    return model, train


def validate(model, train):
    """Shape and value checks shared by every entry point; each failure is one ConfigError line."""
    if model.arch not in ('llama', 'gpt2'):
        raise ConfigError(f"arch must be 'llama' or 'gpt2', not '{model.arch}'")
    for key in ('n_layer', 'n_head', 'n_embd', 'vocab_size', 'block_size'):
        if getattr(model, key) <= 0:
            raise ConfigError(f"{key} must be positive, got {getattr(model, key)}")
    for key in ('n_kv_head', 'ffn_hidden'):
        if getattr(model, key) < 0:
            raise ConfigError(f"{key} must be positive (or 0 for the default), got {getattr(model, key)}")
    if model.n_embd % model.n_head:
        raise ConfigError(f"n_embd ({model.n_embd}) must be divisible by n_head ({model.n_head})")
    if model.n_head % model.kv_heads:
        raise ConfigError(f"n_head ({model.n_head}) must be divisible by n_kv_head ({model.kv_heads})")
    if model.arch == 'llama' and model.head_dim % 2:
        raise ConfigError(f"RoPE needs an even head size, got n_embd/n_head = {model.head_dim}")
    for key in ('train_tokens', 'batch_tokens', 'micro_batch', 'n_gpu', 'log_every', 'eval_every', 'ckpt_every',
                'keep_ckpts'):
        if getattr(train, key) <= 0:
            raise ConfigError(f"{key} must be positive, got {getattr(train, key)}")
    for key in ('max_steps', 'dataset_tokens', 'usd_per_gpu_hour'):
        if getattr(train, key) < 0:
            raise ConfigError(f"{key} must be positive (or 0), got {getattr(train, key)}")
    if not 0 < train.mfu <= 1:
        raise ConfigError(f"mfu must be in (0, 1], got {train.mfu}")
    if train.parallel not in ('ddp', 'zero1', 'zero2', 'fsdp'):
        raise ConfigError(f"parallel must be one of ddp, zero1, zero2, fsdp, not '{train.parallel}'")
    if train.dtype not in ('auto', 'bfloat16', 'float32'):
        raise ConfigError(f"dtype must be 'auto', 'bfloat16' or 'float32', not '{train.dtype}'")
    if train.schedule not in ('cosine', 'wsd'):
        raise ConfigError(f"schedule must be 'cosine' or 'wsd', not '{train.schedule}'")
    gpu_spec(train.gpu)


# -----------------------------------------------------------------------------------------------------
# GPUs: dense BF16 tensor-core peak (no 2:4 sparsity) and memory, keyed by the name a config uses (any case).
# Peaks: vendor datasheets (NVIDIA H100/H200/A100/B200, AMD MI300X), the table of issue 2. A800 is the A100
# with slower NVLink, same compute. Memory: what the driver reports (nvidia-smi "MiB" total, rocm-smi bytes),
# the ceiling torch's allocator works under; torch.cuda.get_device_properties().total_memory reads about
# 0.5 GiB less, which the ledger's fixed overhead covers. The "80 GB" cards hold 80 GiB (A100) or 79.6 GiB (H100).

@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float   # dense BF16 tensor-core FLOP/s
    memory_bytes: int


MIB = 2**20
GIB = 2**30
GPUS = {
    'H200': GPU('H200 SXM 141GB', 989e12, 143771 * MIB),       # nvidia-smi: 143771MiB
    'H200-NVL': GPU('H200 NVL 141GB', 835e12, 143771 * MIB),   # same 141 GB HBM3e stack as the SXM part
    'H100': GPU('H100 SXM 80GB', 989e12, 81559 * MIB),         # nvidia-smi: 81559MiB
    'H100-PCIe': GPU('H100 PCIe 80GB', 756e12, 81559 * MIB),
    'H100-NVL': GPU('H100 NVL 94GB', 835e12, 95830 * MIB),     # nvidia-smi: 95830MiB
    'A100': GPU('A100 SXM 80GB', 312e12, 81920 * MIB),         # nvidia-smi: 81920MiB
    'A800': GPU('A800 80GB', 312e12, 81920 * MIB),
    'MI300X': GPU('MI300X 192GB', 1307e12, 205_822_885_888),    # rocm-smi: VRAM Total Memory (B)
    'B200': GPU('B200 180GB', 2250e12, 183359 * MIB),          # nvidia-smi: 183359MiB
}


def gpu_spec(name):
    """The GPU table's entry for a config's `gpu` name, case-insensitive; ConfigError naming the known ones."""
    by_lower = {key.lower(): key for key in GPUS}
    if name.lower() in by_lower:
        return GPUS[by_lower[name.lower()]]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.5)
    hint = f"did you mean '{by_lower[close[0]]}'? " if close else ''
    raise ConfigError(f"unknown gpu '{name}': {hint}known: {', '.join(GPUS)} (add yours to GPUS in ledger.py)")


# -----------------------------------------------------------------------------------------------------
# Ledger 1: parameters, exact, counted the way model.py builds the model (== sum(p.numel())).
# Llama with n_kv_head = n_head, untied: the book's P = 2VH + H + L(4H^2 + 3HH' + 2H); LLaMA-7B -> 6,738,415,616.

def count_params(model):
    """Parameter counts by part. 'matmul' is what takes part in matrix multiplies: every Linear weight including
    the output projection (counted even when tied: the lookup is free, the projection is not); it excludes the
    embedding lookups, norms and biases. 'blocks_matmul' is the part of it inside the transformer blocks."""
    H, L, V, T = model.n_embd, model.n_layer, model.vocab_size, model.block_size
    F, kv_width = model.ffn_width, model.kv_heads * model.head_dim
    bias = model.arch == 'gpt2' and model.bias  # llama has no biases anywhere
    attention_weights = H * (H + 2 * kv_width) + H * H          # q, k, v (GQA: k, v are kv_width wide) and output
    attention_biases = (H + 2 * kv_width) + H if bias else 0
    if model.arch == 'llama':
        ffn_weights = 3 * H * F                                 # SwiGLU: gate and up H -> H', down H' -> H
        ffn_biases = 0
        norm = H                                                # RMSNorm: weight only
    else:
        ffn_weights = 2 * H * F                                 # GELU MLP: up H -> H', down H' -> H
        ffn_biases = F + H if bias else 0
        norm = 2 * H if bias else H                             # LayerNorm: weight (+ bias)
    per_layer = attention_weights + attention_biases + ffn_weights + ffn_biases + 2 * norm
    counts = {
        'embedding': V * H,
        'position': T * H if model.arch == 'gpt2' else 0,       # learned positions (gpt2); RoPE has none
        'attention': L * (attention_weights + attention_biases),
        'ffn': L * (ffn_weights + ffn_biases),
        'norms': (2 * L + 1) * norm,                            # two per block and the final one
        'output': 0 if model.tie_embeddings else V * H,         # lm_head; tied: shares the embedding's tensor
        'per_layer': per_layer,
        'blocks_matmul': L * (attention_weights + ffn_weights),
    }
    counts['matmul'] = counts['blocks_matmul'] + V * H
    counts['total'] = sum(counts[k] for k in ('embedding', 'position', 'attention', 'ffn', 'norms', 'output'))
    return counts


# -----------------------------------------------------------------------------------------------------
# Ledger 2: compute. A matmul (n x m) @ (m x p) costs 2nmp FLOPs, so a weight used once per token costs 2 FLOPs
# per parameter forward and 4 backward (gradients for the input and for the weight): the book's 6P per token,
# 8P with activation recomputation (one extra forward). Two conventions, both reported:
#   book:   6P (8P with recompute), every parameter as if it were a matmul weight; ignores attention
#   matmul: 6 * N_matmul + 12 * L * H * T (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's estimate_mfu):
#           the Linear weights (output projection included, input embedding lookup not) plus attention's
#           QK^T and AV, 2 * 2 * T * H FLOPs per token per layer forward, x3 for forward+backward, counted
#           non-causal (the masked half is counted as done, as PaLM does). MFU uses this one.
# Attention's share of the linear layers in the blocks is 12LHT / (6 * 12LH^2) = T/(6H) when the block holds
# 12H^2 matmul parameters (GPT-2's 4H MLP, or SwiGLU at 8H/3): negligible while T << H.
# hardware: what the GPU executes, matmul convention. Without recompute it is 'matmul'. With recompute
# (torch.utils.checkpoint per block, use_reentrant=False) backward reruns each block's forward, but not all of
# the book's extra 2P: lm_head is never rerun (it is outside the blocks), and non-reentrant checkpoint stops the
# rerun as soon as every tensor backward needs is back: down_proj's input is the last one, so down_proj's own
# matmul (H' x H) is skipped. Eager: 6N_matmul + 12LHT + 2(N_blocks - LHH') + 4LHT, FlopCounterMode's count
# exactly (test_model.py). A block compiled on its own (train.py: FSDP/ZeRO-2 with compile) is one autograd
# node that saves only after its whole graph ran, so the rerun includes down_proj: + 2LHH'. A whole compiled
# model (1 GPU, DDP, ZeRO-1) traces the checkpoints and its partitioner skips down_proj in all blocks but one
# (+ 2HH', within 1/L of eager; measured, not counted here). LLaMA-7B: matmul 4.29e10, eager 5.40e10 (1.26x),
# compiled blocks 5.69e10 (1.33x); the book's 8P 5.39e10; 8N_matmul + 16LHT would say 5.72e10.

def flops_per_token(model, recompute=False, compiled_blocks=False):
    """Training FLOPs per token (forward + backward) under the conventions above. compiled_blocks: each block
    is torch.compile'd on its own, so the recompute reruns the whole block (see above)."""
    params = count_params(model)
    L, H, T = model.n_layer, model.n_embd, model.block_size
    attention = 12 * L * H * T
    matmul = 6 * params['matmul'] + attention
    rerun_matmul = params['blocks_matmul'] - (0 if compiled_blocks else L * H * model.ffn_width)  # no down_proj
    matmul_recompute = matmul + 2 * rerun_matmul + attention // 3   # + the blocks' forward again (2N, 4LHT)
    return {
        'book': (8 if recompute else 6) * params['total'],
        'matmul': matmul,                                          # model FLOPs: what MFU counts (PaLM)
        'matmul_causal': 6 * params['matmul'] + attention // 2,    # only the unmasked half of QK^T and AV
        'hardware': matmul_recompute if recompute else matmul,     # what the GPU executes
        'attention': attention,
        'attention_share': attention / (6 * params['blocks_matmul']),
        'attention_share_approx': T / (6 * H),
    }


# -----------------------------------------------------------------------------------------------------
# Ledger 3: time and money. days = total FLOPs / (n_gpu * peak * MFU) / 86400. The book's LLaMA-65B check:
# 8CP = 8 * 1.4e12 * 6.5e10 = 7.28e23 FLOPs on 2048 A100 at an effective 2e14 FLOP/s -> 20.6 days (paper: 21).

SECONDS_PER_DAY = 86400


def train_days(total_flops, n_gpu, peak_flops, mfu):
    return total_flops / (n_gpu * peak_flops * mfu) / SECONDS_PER_DAY


# -----------------------------------------------------------------------------------------------------
# Ledger 4a: model states (mixed precision + Adam; the book's eq. 6.11-6.15, from ZeRO, Rajbhandari et al. 2020).
# Per parameter: 16-bit weight 2 + 16-bit gradient 2 + fp32 master weight, momentum, variance 4 each = 16 bytes.
# ZeRO shards them over the N data-parallel GPUs: ZeRO-1 the optimizer states (4P + 12P/N), ZeRO-2 also the
# gradients (2P + 14P/N), ZeRO-3/FSDP also the weights (16P/N). PyTorch autocast keeps fp32 weights and fp32
# gradients instead (4P + 4P + Adam's 8P): the same 16P unsharded; the ledger uses the book's split throughout.

def model_state_bytes(n_params, parallel='ddp', n_gpu=1):
    """Bytes of weights, gradients and optimizer states per GPU, by strategy ('ddp', 'zero1', 'zero2', 'fsdp')."""
    shards = {'ddp': (1, 1, 1), 'zero1': (1, 1, n_gpu), 'zero2': (1, n_gpu, n_gpu), 'fsdp': (n_gpu, n_gpu, n_gpu)}
    if parallel not in shards:
        raise ConfigError(f"parallel must be one of {', '.join(shards)}, not '{parallel}'")
    weights_over, grads_over, optimizer_over = shards[parallel]
    states = {
        'weights': 2 * n_params / weights_over,        # 16-bit weights
        'grads': 2 * n_params / grads_over,            # 16-bit gradients
        'optimizer': 12 * n_params / optimizer_over,   # fp32 master weights, Adam momentum and variance
    }
    states['total'] = states['weights'] + states['grads'] + states['optimizer']
    return states


# -----------------------------------------------------------------------------------------------------
# Ledger 4b: activations, calibrated against model.py: test_model.py records every tensor autograd saves for
# backward (torch.autograd.graph.saved_tensors_hooks, each storage once) and holds these sums to it, for both
# families, with and without recomputation, at fp32 and under bf16 autocast. Bytes per token, per layer:
#   a = activation bytes (matmul and attention outputs: 2 under bf16, 4 in fp32)
#   r = residual bytes (the residual stream and the norms: 4 under autocast, whose fp32 weights make the
#       embedding and every residual add fp32; 2 when FSDP2 casts the weights themselves to bf16)
#   norm:      its input r*H and fp32 statistics (LayerNorm mean and 1/std: 8; RMSNorm 1/rms: 4); CPU's RMSNorm
#              is composite and also keeps x/rms (r*H more); CUDA's is one fused kernel (fused_norm=True)
#   attention: input a*H (the norm output, or its bf16 copy), the fused qkv output a*(n_head + 2*n_kv_head)*d
#              (v is a view of it, so the whole buffer stays), llama's rotated q and k a*(n_head + n_kv_head)*d,
#              the output a*H (o_proj input) and, flash kernel, the fp32 log-sum-exp 4*n_head. The math kernel
#              instead keeps q, k, v expanded to every head 3*a*H and the softmax probabilities a*n_head*T
#   ffn:       input a*H; gpt2: up a*H' and GELU a*H'; llama: gate|up 2*a*H', silu(gate) a*H', product a*H'
#   layer:     2 norms + attention + ffn. Outside the blocks: the token ids (int64, 8 bytes each for the input
#              and the targets; gpt2 also the T positions), the final norm and lm_head's input a*H.
# Under autocast every Linear also saves the bf16 copy of its weight (autocast casts each weight once per
# forward; backward needs it for the input gradient): 2 bytes x the matmul parameters, held until backward.
# With recomputation (torch.utils.checkpoint per block) only each block's input r*H is kept; in the backward one
# block at a time is re-run, and its activations (and its bf16 weights) are live again while its gradient is
# taken. LLaMA-7B, micro-batch 8 x 2048, FSDP bf16, recompute: 32 layers x 16384 tokens x 2 x 4096 = 4 GiB of
# block inputs + 2.5 GiB for the block being recomputed + 0.25 GiB final norm = 6.7 GiB (the book: 6.20 GB).
# These are eager-mode sums; under torch.compile the partitioner chooses what to save (it recomputes cheap
# pointwise ops), usually a little less.

def activation_bytes(model, micro_batch, recompute, dtype_bytes=2, attention='flash', residual_bytes=4,
                     fused_norm=True):
    """Bytes autograd holds for backward at its peak (loss buffers aside: logits_bytes), for one GPU's
    micro-batch of full sequences. attention: 'flash' (flash/cuDNN/efficient and CPU's flash kernel) or 'math'."""
    if attention not in ('flash', 'math'):
        raise ConfigError(f"attention must be 'flash' or 'math', not '{attention}'")
    a, r = dtype_bytes, residual_bytes
    H, L, F, T = model.n_embd, model.n_layer, model.ffn_width, model.block_size
    n_head, n_kv_head, d = model.n_head, model.kv_heads, model.head_dim
    tokens = micro_batch * T
    if model.arch == 'gpt2':
        norm = r * H + 8
        ffn = a * H + 2 * a * F
    else:
        norm = r * H + 4 + (0 if fused_norm else r * H)
        ffn = a * H + 4 * a * F
    if attention == 'flash':
        rotated = a * (n_head + n_kv_head) * d if model.arch == 'llama' else 0
        attn = a * H + a * (n_head + 2 * n_kv_head) * d + rotated + 4 * n_head + a * H
    else:
        attn = a * H + 3 * a * H + a * n_head * T + a * H
    layer = 2 * norm + attn + ffn
    autocast = a < r  # weights in fp32, matmuls in bf16: each Linear keeps a bf16 copy of its weight
    params = count_params(model)
    block_weights = 2 * params['blocks_matmul'] // L if autocast else 0
    parts = {
        'token_ids': tokens * 16 + (8 * T if model.arch == 'gpt2' else 0),
        'head': tokens * (norm + a * H),
    }
    if recompute:
        parts['block_inputs'] = tokens * L * r * H
        parts['recomputed_block'] = tokens * (layer - r * H) + block_weights
        parts['bf16_weights'] = 2 * model.vocab_size * H if autocast else 0  # lm_head only: blocks are re-run
    else:
        parts['blocks'] = tokens * L * layer
        parts['bf16_weights'] = L * block_weights + (2 * model.vocab_size * H if autocast else 0)
    parts['total'] = sum(parts.values())
    return parts


def logits_bytes(model, micro_batch, dtype_bytes=2):
    """The logits and cross-entropy buffers at their peak (the start of the backward), micro_batch x T x V
    elements each: lm_head's output (activation dtype; forward returns it, so the caller holds it), the fp32
    log-softmax the loss saves (model.py takes the loss from fp32 logits), and in the backward the fp32 gradients
    of the log-softmax and of the logits, alive together. 14 bytes per element under bf16, 16 in fp32. This is
    the buffer that ran nanochat out of memory on an 80 GB H100: at its 32 x 2048 x 65536, one fp32 copy is 16 GiB."""
    elements = micro_batch * model.block_size * model.vocab_size
    parts = {
        'logits': elements * dtype_bytes,
        'log_softmax': elements * 4,
        'grad_log_softmax': elements * 4,
        'grad_logits': elements * 4,
    }
    parts['total'] = sum(parts.values())
    return parts


# -----------------------------------------------------------------------------------------------------
# Ledger 4c: the total per GPU = model states + activations + logits + a fixed overhead, against the GPU's memory.
# The overhead is an ESTIMATE, not a measurement: the book's PyTorch kernels (0.81 GB) and fragmentation
# (0.5-1 GB), rounded up to 2 GiB for the CUDA context, cuBLAS/flash workspaces and torch.compile's buffers.
# torch.cuda.max_memory_allocated sees everything but the overhead ('allocated'); nvidia-smi sees the 'total'.

OVERHEAD_BYTES = 2 * GIB


def activation_dtype_bytes(train):
    """2 for bf16 autocast ('auto' plans for the GPU, where train.py autocasts to bf16), 4 for float32."""
    return 4 if train.dtype == 'float32' else 2


def memory_per_gpu(model, train, n_gpu=None, micro_batch=None):
    """Bytes per GPU by part, the total, the GPU's memory, the headroom, and whether it fits."""
    n_gpu = n_gpu or train.n_gpu
    micro_batch = micro_batch or train.micro_batch
    dtype_bytes = activation_dtype_bytes(train)
    # the residual stream: fp32 under autocast; bf16 where FSDP2 casts the weights (train.py: zero2/fsdp, N > 1)
    residual_bytes = 2 if dtype_bytes == 2 and train.parallel in ('zero2', 'fsdp') and n_gpu > 1 else 4
    states = model_state_bytes(count_params(model)['total'], train.parallel, n_gpu)
    memory = {
        'weights': states['weights'], 'grads': states['grads'], 'optimizer': states['optimizer'],
        'model_states': states['total'],
        'activations': activation_bytes(model, micro_batch, train.recompute, dtype_bytes,
                                        residual_bytes=residual_bytes)['total'],
        'logits': logits_bytes(model, micro_batch, dtype_bytes)['total'],
        'overhead': OVERHEAD_BYTES,
    }
    memory['allocated'] = memory['model_states'] + memory['activations'] + memory['logits']
    memory['total'] = memory['allocated'] + memory['overhead']
    memory['gpu_memory'] = gpu_spec(train.gpu).memory_bytes
    memory['headroom'] = memory['gpu_memory'] - memory['total']
    memory['fits'] = memory['headroom'] >= 0
    return memory


def max_micro_batch(model, train, n_gpu=None):
    """The largest micro-batch (sequences per GPU) whose total fits the GPU; 0 if not even one does."""
    if not memory_per_gpu(model, train, n_gpu, 1)['fits']:
        return 0
    low, high = 1, 2
    while memory_per_gpu(model, train, n_gpu, high)['fits']:  # memory grows with the micro-batch: bracket, bisect
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if memory_per_gpu(model, train, n_gpu, middle)['fits'] else (low, middle)
    return low


def gpus_for_model_states(n_params, gpu_memory_bytes):
    """The book's rule of thumb for full-parameter training: 16P bytes sharded over N GPUs (ZeRO-3) must fit,
    so N >= 16P / memory; the recommendation rounds up to a power of two (1, 2, 4, 8 per node, then whole
    nodes), which leaves room for activations: 13B -> 3 (floor), 4 recommended; 30B -> 8; 65B -> 16 (80 GB)."""
    floor = math.ceil(16 * n_params / gpu_memory_bytes)
    return floor, 2 ** math.ceil(math.log2(floor))


# -----------------------------------------------------------------------------------------------------
# Data and tokens (seed 000). Chinchilla (Hoffmann et al. 2022): compute-optimal tokens ~ 20 x params.
# Token storage: uint16 (2 bytes) while every id fits, i.e. vocab <= 65,536 (the book writes < 65,536), else
# uint32. FineWeb-Edu parquet is ~3-4 bytes/token compressed. A checkpoint with Adam is 12P bytes (fp32 weights,
# momentum, variance); a bf16 export of the weights alone is 2P.
# Expected loss from a fitted scaling law L(N, D) = E + A/N^alpha + B/D^beta. Both fits are for THEIR data
# (MassiveText) and tokenizer, so they give the shape of the curve, not our loss in nats per GPT-2 token.

CHINCHILLA_TOKENS_PER_PARAM = 20
CHINCHILLA_FITS = {
    'hoffmann2022': dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),            # Hoffmann et al. 2022
    'epoch2024': dict(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658),      # Besiroglu et al. (Epoch AI) 2024
}


def chinchilla_loss(n_params, n_tokens, fit='hoffmann2022'):
    c = CHINCHILLA_FITS[fit]
    return c['E'] + c['A'] / n_params ** c['alpha'] + c['B'] / n_tokens ** c['beta']


def token_bytes(vocab_size):
    return 2 if vocab_size <= 2**16 else 4


def data_ledger(n_params, vocab_size, train_tokens, dataset_tokens=0):
    """Tokens per parameter against Chinchilla, whether the dataset is enough, storage, checkpoints, loss fits."""
    stored_tokens = dataset_tokens or train_tokens
    data = {
        'train_tokens': train_tokens,
        'tokens_per_param': train_tokens / n_params,
        'chinchilla_tokens': CHINCHILLA_TOKENS_PER_PARAM * n_params,
        'chinchilla_multiple': train_tokens / (CHINCHILLA_TOKENS_PER_PARAM * n_params),
        'chinchilla_params_for_tokens': train_tokens / CHINCHILLA_TOKENS_PER_PARAM,
        'dataset_tokens': dataset_tokens or None,
        'enough_data': dataset_tokens >= train_tokens if dataset_tokens else None,
        'epochs': train_tokens / dataset_tokens if dataset_tokens else None,
        'token_bytes': token_bytes(vocab_size),
        'shard_bytes': stored_tokens * token_bytes(vocab_size),
        'parquet_bytes_low': stored_tokens * 3,
        'parquet_bytes_high': stored_tokens * 4,
        'checkpoint_bytes': 12 * n_params,
        'export_bytes': 2 * n_params,
        'expected_loss': {fit: chinchilla_loss(n_params, train_tokens, fit) for fit in CHINCHILLA_FITS},
    }
    return data


# -----------------------------------------------------------------------------------------------------
# The whole ledger for a config, as one JSON-able dict (train.py writes it to out_dir/ledger.json).

def predict(model, train, n_gpu=None):
    """Every sum of the ledger for (ModelConfig, TrainConfig) on n_gpu GPUs (default: train.n_gpu)."""
    n_gpu = n_gpu or train.n_gpu
    gpu = gpu_spec(train.gpu)
    params = count_params(model)
    compiled_blocks = train.compile and n_gpu > 1 and train.parallel in ('zero2', 'fsdp')  # train.py's build_model
    flops = flops_per_token(model, train.recompute, compiled_blocks)
    tokens = min(train.train_tokens, train.max_steps * train.batch_tokens) if train.max_steps else train.train_tokens
    # train.mfu is the fraction of peak the GPUs spend on matmul FLOPs, recomputation included ('hardware': it sets
    # tokens_per_s and days); MFU proper (PaLM, what train.py measures) counts only the model's FLOPs ('matmul'),
    # so with recompute the predicted MFU is lower by matmul / hardware (LLaMA-7B: 1 / 1.33).
    hardware_flops_per_s = n_gpu * gpu.peak_flops * train.mfu
    tokens_per_s = hardware_flops_per_s / flops['hardware']
    days = tokens * flops['hardware'] / hardware_flops_per_s / SECONDS_PER_DAY
    memory = memory_per_gpu(model, train, n_gpu)
    return {
        'model': dataclasses.asdict(model),
        'train': dataclasses.asdict(train),
        'gpu': dataclasses.asdict(gpu),
        'n_gpu': n_gpu,
        'params': params,
        'flops_per_token': flops,
        'compiled_blocks': compiled_blocks,
        'tokens': tokens,
        'steps': math.ceil(tokens / train.batch_tokens),
        'grad_accum': train.batch_tokens / (train.micro_batch * model.block_size * n_gpu),
        'total_flops': tokens * flops['hardware'],
        'model_flops': tokens * flops['matmul'],
        'book_flops': tokens * flops['book'],
        'mfu_assumed': train.mfu,
        'mfu': train.mfu * flops['matmul'] / flops['hardware'],
        'tokens_per_s': tokens_per_s,
        'step_seconds': train.batch_tokens / tokens_per_s,
        'days': days,
        'days_book': train_days(tokens * flops['book'], n_gpu, gpu.peak_flops, train.mfu),
        'gpu_hours': days * 24 * n_gpu,
        'cost_usd': days * 24 * n_gpu * train.usd_per_gpu_hour,
        'memory': memory,
        'memory_per_gpu_bytes': memory['total'],
        'fits': memory['fits'],
        'max_micro_batch': max_micro_batch(model, train, n_gpu),
        'data': data_ledger(params['total'], model.vocab_size, tokens, train.dataset_tokens),
    }


# -----------------------------------------------------------------------------------------------------
# The printed ledger: each number with its formula and source, in the book's order.

def _si(x):
    """1336502272 -> '1.34B'; 26e9 -> '26.0B'."""
    for scale, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
        if abs(x) >= scale:
            return f'{x / scale:.3g}{suffix}'
    return f'{x:.3g}'


def _sci(x):
    return f'{x:.3g}' if abs(x) < 1e5 else f'{x:.3e}'.replace('e+', 'e')


def _days(days):
    return f'{days:,.0f}' if days >= 100 else f'{days:.3g}'


def _gib(n_bytes):
    return f'{n_bytes / GIB:,.2f} GiB'


def _gb(n_bytes):
    return f'{n_bytes / 1e12:,.2f} TB' if n_bytes >= 1e12 else f'{n_bytes / 1e9:,.1f} GB'


def _row(label, value, note=''):
    return f'  {label:<34} {value:>18}   {note}'.rstrip()


def format_report(prediction):
    """The ledger as text: parameters, compute, time and money, memory, data, expected loss."""
    p = prediction
    m, t, params, flops, memory, data = p['model'], p['train'], p['params'], p['flops_per_token'], p['memory'], p['data']
    model = ModelConfig(**m)  # for the derived widths
    H, L, V, T, F = model.n_embd, model.n_layer, model.vocab_size, model.block_size, model.ffn_width
    kv_heads = model.kv_heads
    attention_kind = 'MHA' if kv_heads == m['n_head'] else f'GQA, {kv_heads} kv heads'
    lines = [
        f"ledger: {m['arch']}, {L} layers, H={H}, {m['n_head']} heads ({attention_kind}), H'={F}, V={V}, T={T}, "
        f"{'tied' if m['tie_embeddings'] else 'untied'}{', biases' if m['arch'] == 'gpt2' and m['bias'] else ''}",
        f"plan: {_si(p['tokens'])} tokens on {p['n_gpu']} x {p['gpu']['name']}, batch {t['batch_tokens']:,} tokens "
        f"= {t['micro_batch']} x {T} x {p['n_gpu']} GPU x {p['grad_accum']:.4g} accumulation, {p['steps']:,} steps",
        '',
        "Ledger 1: parameters (exact, the way model.py builds them: = sum(p.numel()))",
        _row('token embedding', f"{params['embedding']:,}", 'V*H'),
    ]
    if params['position']:
        lines.append(_row('position embedding', f"{params['position']:,}", 'T*H (learned, gpt2)'))
    if m['arch'] == 'llama':
        lines += [_row('attention', f"{params['attention']:,}", 'L*(2H^2 + 2H*kv_width): q, o and GQA-sized k, v'),
                  _row('ffn (SwiGLU)', f"{params['ffn']:,}", "L*3HH'"),
                  _row('norms (RMSNorm)', f"{params['norms']:,}", '(2L + 1)*H')]
    else:
        bias = ' + biases' if m['bias'] else ''
        lines += [_row('attention', f"{params['attention']:,}", f'L*(2H^2 + 2H*kv_width{bias})'),
                  _row('ffn (GELU MLP)', f"{params['ffn']:,}", f"L*(2HH'{bias})"),
                  _row('norms (LayerNorm)', f"{params['norms']:,}", f"(2L + 1)*H{' * 2 (weight, bias)' if m['bias'] else ''}")]
    lines += [
        _row('output projection', f"{params['output']:,}", 'tied: shares the embedding' if m['tie_embeddings'] else 'V*H'),
        _row('per layer', f"{params['per_layer']:,}", "4H^2 + 3HH' + 2H when MHA (the book)"
             if m['arch'] == 'llama' else "4H^2 + 2HH' + 2H (+ 7H + H' biases)"),
        _row('total P', f"{params['total']:,}", f"{_si(params['total'])}"),
        _row('in matmuls N_matmul', f"{params['matmul']:,}",
             f"{params['matmul'] / params['total']:.1%} of P: Linear weights incl. the output projection"),
        '',
        'Ledger 2: compute per token, forward + backward (a matmul (n x m)(m x p) is 2nmp FLOPs)',
        _row(f"book: {'8P (recompute)' if t['recompute'] else '6P'}", _sci(flops['book']),
             'BOOK ledger 2: forward 2P + backward 4P' + (' + one recomputed forward 2P' if t['recompute'] else '')),
        _row('matmul: 6N_matmul + 12LHT', _sci(flops['matmul']),
             'PaLM/nanoGPT, non-causal attention, embedding lookup not counted; MFU uses this'),
        _row('matmul, causal: 6N_matmul + 6LHT', _sci(flops['matmul_causal']), 'only the unmasked half of attention'),
    ]
    if t['recompute']:
        rerun = "2N_blocks" if p['compiled_blocks'] else "2(N_blocks-LHH')"
        lines.append(_row(f"executed: +{rerun}+4LHT", _sci(flops['hardware']), 'matmul + the blocks rerun in '
                          'backward: ' + ('whole (each block compiled on its own)' if p['compiled_blocks']
                                          else "all but down_proj (H'H), never lm_head")))
    book_p = '8P' if t['recompute'] else '6P'
    lines += [
        _row('attention share of block matmuls', f"{flops['attention_share']:.1%}",
             f"12LHT / 6N_blocks; the book's T/(6H) = {flops['attention_share_approx']:.1%}"),
        _row(f"executed for {_si(p['tokens'])} tokens", _sci(p['total_flops']),
             f"book {'8' if t['recompute'] else '6'}PD: {_sci(p['book_flops'])}"),
        '',
        f"Ledger 3: time and money (days = FLOPs / (n_gpu * peak * MFU) / 86400)",
        _row('GPU', f"{p['n_gpu']} x {p['gpu']['name'].split()[0]}",
             f"dense BF16 peak {p['gpu']['peak_flops'] / 1e12:,.0f} TFLOP/s each (vendor datasheet)"),
        _row('assumed utilisation', f"{p['mfu_assumed']:.0%}", 'of peak (seed 000: 40% for a tuned Llama with '
             'flash attention and torch.compile; real runs 30-70%)'),
        _row('throughput', f"{p['tokens_per_s']:,.0f} tok/s", f"n_gpu * peak * MFU / executed FLOPs per token; "
             f"{p['step_seconds']:.3g} s per step"),
        _row('days', _days(p['days']), 'executed FLOPs: the matmul count (with attention)'
             + (' + the recomputed forward' if t['recompute'] else '')),
        _row(f"days, book {book_p}D", _days(p['days_book']), "FLOPs by the book's convention (the seed's table)"),
        _row('GPU-hours', f"{p['gpu_hours']:,.0f}", 'days x 24 x n_gpu'),
        _row('cost', f"${p['cost_usd']:,.0f}", f"at ${t['usd_per_gpu_hour']}/GPU-hour (book {book_p}D: "
             f"${p['cost_usd'] * p['days_book'] / p['days']:,.0f}; seed 000: $3-4 per H200-hour)"),
    ]
    if t['recompute']:
        lines.append(_row('predicted MFU (PaLM)', f"{p['mfu']:.1%}", 'assumed x matmul / executed: recomputation '
                          'is work MFU does not count'))
    states = {'ddp': '16P', 'zero1': '4P + 12P/N', 'zero2': '2P + 14P/N', 'fsdp': '16P/N (ZeRO-3)'}[t['parallel']]
    dtype = 'fp32' if t['dtype'] == 'float32' else 'bf16'
    fits = 'fits' if p['fits'] else 'DOES NOT FIT'
    lines += [
        '',
        f"Ledger 4: memory per GPU ({t['parallel']}, N={p['n_gpu']}: {states}; micro-batch {t['micro_batch']} x {T}, "
        f"{dtype} activations, {'full recomputation' if t['recompute'] else 'no recomputation'}, flash attention)",
        _row('weights', _gib(memory['weights']), f"16-bit, 2P{'/N' if t['parallel'] == 'fsdp' else ''}"),
        _row('gradients', _gib(memory['grads']), f"16-bit, 2P{'/N' if t['parallel'] in ('zero2', 'fsdp') else ''}"),
        _row('optimizer states', _gib(memory['optimizer']),
             f"fp32 master weights + Adam m, v: 12P{'' if t['parallel'] == 'ddp' else '/N'}"),
        _row('activations', _gib(memory['activations']), 'estimate of what autograd saves (block inputs only with '
             'recompute)' if t['recompute'] else 'estimate of what autograd saves for backward'),
        _row('logits and cross-entropy', _gib(memory['logits']), 'B*T*V x (bf16 logits + fp32 log-softmax '
             '+ 2 fp32 grads)' if dtype == 'bf16' else 'B*T*V x 4 bytes x 4'),
        _row('fixed overhead', _gib(memory['overhead']), 'ESTIMATE: CUDA context, kernels 0.81 GB and fragmentation '
             '0.5-1 GB (book)'),
        _row('total', _gib(memory['total']), f"of {_gib(memory['gpu_memory'])}: {fits}, headroom "
             f"{_gib(memory['headroom'])}"),
        _row('largest micro-batch that fits', f"{p['max_micro_batch']}", f"sequences of {T} tokens per GPU" + (
            '' if p['fits'] else f": try --micro_batch={p['max_micro_batch']}" if p['max_micro_batch'] else
            ': not even one; try --recompute=1, or --parallel=fsdp over more GPUs')),
        '',
        'Data and tokens (seed 000)',
        _row('Chinchilla-optimal tokens', _si(data['chinchilla_tokens']), '20 x P (Hoffmann et al. 2022)'),
        _row('this plan', f"{data['tokens_per_param']:.3g} tok/param",
             f"{data['chinchilla_multiple']:.2g} x Chinchilla; {_si(data['train_tokens'])} tokens are optimal for "
             f"{_si(data['chinchilla_params_for_tokens'])} params"),
    ]
    if data['dataset_tokens']:
        lines.append(_row('dataset', _si(data['dataset_tokens']) + ' tokens',
                          f"{'enough' if data['enough_data'] else 'NOT enough'}: {data['epochs']:.3g} epochs"))
    stored = 'dataset' if data['dataset_tokens'] else 'training tokens'
    lines += [
        _row('token shards', _gb(data['shard_bytes']), f"{data['token_bytes']} bytes/token "
             f"({'uint16: vocab <= 65,536' if data['token_bytes'] == 2 else 'uint32: vocab > 65,536'}), the {stored}"),
        _row('source parquet', f"{_gb(data['parquet_bytes_high'])}", f"~3-4 bytes/token compressed (FineWeb-Edu): "
             f"{_gb(data['parquet_bytes_low'])} to {_gb(data['parquet_bytes_high'])}"),
        _row('checkpoint', _gb(data['checkpoint_bytes']), '12P: fp32 weights + Adam m, v; bf16 export 2P = '
             + _gb(data['export_bytes'])),
        '',
        'Expected loss L = E + A/N^alpha + B/D^beta: THEIR fits on their data (MassiveText) and tokenizer, not ours',
    ]
    for fit, label in (('hoffmann2022', 'Hoffmann et al. 2022'), ('epoch2024', 'Epoch AI 2024 replication')):
        c = CHINCHILLA_FITS[fit]
        lines.append(_row(label, f"{data['expected_loss'][fit]:.3f} nats",
                          f"E {c['E']}, A {c['A']}, B {c['B']}, alpha {c['alpha']}, beta {c['beta']}"))
    return '\n'.join(lines)


def format_comparison(prediction, measured):
    """A markdown table of predicted vs measured. measured may hold any of 'params', 'tokens_per_s' (all GPUs),
    'mfu', 'peak_memory_bytes' (max_memory_allocated), 'peak_reserved_bytes' (max_memory_reserved), 'days';
    missing ones (or None) print as '-'. measured['device'] and ['device_type'] ('cuda', 'cpu'), when given,
    say where the run was measured."""
    p = prediction
    heading = [f"Predicted for {p['n_gpu']} x {p['gpu']['name']} at an assumed {p['mfu_assumed']:.0%} MFU "
               f"(ledger.py); measured on {measured.get('device', 'an unnamed device')}.", '']
    if measured.get('device_type') == 'cpu':
        heading[1:1] = ['On the CPU the GPU prediction is a reference, not a forecast: throughput and days compare '
                        'that GPU with this CPU, memory is the process\'s peak RSS, and MFU is not measured.']
    rows = [  # (what, key, predicted, format)
        ('parameters', 'params', p['params']['total'], lambda x: f'{x:,.0f}'),
        ('throughput, tokens/s (all GPUs)', 'tokens_per_s', p['tokens_per_s'], lambda x: f'{x:,.0f}'),
        ('MFU (6N_matmul + 12LHT per token)', 'mfu', p['mfu'], lambda x: f'{x:.1%}'),
        ('peak memory allocated per GPU', 'peak_memory_bytes', p['memory']['allocated'], _gib),
        ('peak memory reserved per GPU (+ overhead)', 'peak_reserved_bytes', p['memory']['total'], _gib),
        (f"days for {_si(p['tokens'])} tokens", 'days', p['days'], lambda x: f'{x:.3g}'),
    ]
    lines = heading + ['| quantity | predicted | measured | measured / predicted |', '| --- | ---: | ---: | ---: |']
    for what, key, predicted, fmt in rows:
        value = measured.get(key)
        if value is None:
            lines.append(f'| {what} | {fmt(predicted)} | - | - |')
        else:
            ratio = f'{value / predicted:.3f}' if predicted else '-'
            lines.append(f'| {what} | {fmt(predicted)} | {fmt(value)} | {ratio} |')
    return '\n'.join(lines)


# -----------------------------------------------------------------------------------------------------
# The book's worked examples (BOOK.md), recomputed: the book's figure beside the ledger's, compared at the
# book's precision (the format spec). test_ledger.py checks every one.

LLAMA_7B = ModelConfig(arch='llama', n_layer=32, n_head=32, n_embd=4096, ffn_hidden=11008, vocab_size=32000,
                       block_size=2048)


def book_examples():
    """A list of dicts: section, what, formula, book (as written), book_value, value (the ledger's), precision
    (the format spec the two agree at), matches."""
    h200, a800 = GPUS['H200'], GPUS['A800']
    p7b = count_params(LLAMA_7B)
    def seed_days(params, tokens):  # seed 000: 6ND on one H200 at MFU 0.40
        return train_days(6 * params * tokens, 1, h200.peak_flops, 0.40)
    flops_65b = 8 * 1.4e12 * 6.5e10
    seconds_65b = flops_65b / (2048 * 2e14)
    memory_7b = model_state_bytes(p7b['total'], 'fsdp', 2)['total'] / GIB
    total_7b = memory_7b + 6.20 + 3.91 + 6  # the book's activations, softmax intermediates, other: taken as given
    examples = [
        ('Ledger 1', 'LLaMA-7B parameters', "2VH + H + L(4H^2 + 3HH' + 2H), V 32000, L 32, H 4096, H' 11008",
         '6,738,415,616', 6738415616, p7b['total'], ',d'),
        ('Ledger 1', 'LLaMA-7B: share of params in linear layers', 'N_matmul / P (book: > 95%)',
         '> 95%', 0.95, p7b['matmul'] / p7b['total'], '>'),
        ('Ledger 2', 'LLaMA-7B on 1B tokens', '6 x P x C', '4.04e19', 4.04e19, 6 * p7b['total'] * 1e9, '.3g'),
        ('Ledger 3', 'LLaMA-65B training FLOPs', '8CP, C 1.4e12, P 6.5e10 (recompute)', '7.28e23', 7.28e23,
         flops_65b, '.3g'),
        ('Ledger 3', 'LLaMA-65B seconds', '8CP / (2048 x 2e14 effective)', '1.78e6', 1.78e6, seconds_65b, '.3g'),
        ('Ledger 3', 'LLaMA-65B days (paper: 21)', 'seconds / 86400', '20.6', 20.6,
         train_days(flops_65b, 2048, GPUS['A100'].peak_flops, 2e14 / GPUS['A100'].peak_flops), '.3g'),
        ('Ledger 3', 'one H200: 0.76B params, 25B tokens', '6ND / (989e12 x 0.40) / 86400', '~3.3', 3.3,
         seed_days(0.76e9, 25e9), '.2g'),
        ('Ledger 3', 'one H200: 1.3B params, 26B tokens', '6ND / (989e12 x 0.40) / 86400', '5.93 (~6)', 5.93,
         seed_days(1.3e9, 26e9), '.3g'),
        ('Ledger 3', 'one H200: 1.3B params, 50B tokens', '6ND / (989e12 x 0.40) / 86400', '11.4 (~11)', 11.4,
         seed_days(1.3e9, 50e9), '.3g'),
        ('Ledger 3', 'one H200: 7B params, 140B tokens', '6ND / (989e12 x 0.40) / 86400', '~172', 172,
         seed_days(7e9, 140e9), '.3g'),
        ('Ledger 3', 'one H200: 13B params, 260B tokens', '6ND / (989e12 x 0.40) / 86400', '593 (~590)', 593,
         seed_days(13e9, 260e9), '.3g'),
        ('Ledger 3', 'cost of the 1.3B/26B run, USD', 'days x 24 x $3.5/H200-hour ($3-4: '
         f'{seed_days(1.3e9, 26e9) * 24 * 3:.0f}-{seed_days(1.3e9, 26e9) * 24 * 4:.0f})', '~$500', 500,
         seed_days(1.3e9, 26e9) * 24 * 3.5, '.1g'),
        ('Ledger 4', 'LLaMA-7B model states per GPU, GiB', '16P/2 (ZeRO-3 on 2 x A800-80G); 50.205, the book '
         'truncates', '50.20', 50.20, memory_7b, '.3g'),
        ('Ledger 4', 'LLaMA-7B total per GPU, GB', "16P/2 + the book's 6.20 + 3.91 + ~6", '~66', 66, total_7b, '.2g'),
        ('Ledger 4', 'LLaMA-7B spare on an 80 GB card, GB', '80 - total', '~14', 14, a800.memory_bytes / GIB - total_7b,
         '.2g'),
        ('Ledger 4', '13B: model states, GB', '16P', '208', 208, 16 * 13e9 / 1e9, '.3g'),
        ('Ledger 4', '13B: fewest 80 GB GPUs', 'ceil(16P / 80 GB)', '3', 3,
         gpus_for_model_states(13e9, a800.memory_bytes)[0], 'd'),
        ('Ledger 4', '13B: recommended GPUs', 'rounded up to a power of two', '4', 4,
         gpus_for_model_states(13e9, a800.memory_bytes)[1], 'd'),
        ('Ledger 4', '30B: recommended GPUs', 'ceil(16P / 80 GB) = 6, to a power of two', '8', 8,
         gpus_for_model_states(30e9, a800.memory_bytes)[1], 'd'),
        ('Ledger 4', '65B: recommended GPUs', 'ceil(16P / 80 GB) = 13, to a power of two', '16', 16,
         gpus_for_model_states(65e9, a800.memory_bytes)[1], 'd'),
        ('Ledger 4', '175B: model states alone, TB', '16P', '~2.8', 2.8, 16 * 175e9 / 1e12, '.2g'),
        ('Data', '175B: Chinchilla-optimal tokens, T', '20 x P', '3.5', 3.5, 20 * 175e9 / 1e12, '.2g'),
        ('Data', 'GPT-3 tokens per parameter', '300B / 175B', '~1.7', 1.7, 300e9 / 175e9, '.2g'),
        ('Data', '25B tokens are optimal for, B params', 'D / 20', '~1.25', 1.25, 25e9 / 20 / 1e9, '.3g'),
        ('Data', '0.76B params: optimal tokens, B', '20 x P', '15.2', 15.2, 20 * 0.76e9 / 1e9, '.3g'),
        ('Data', 'Llama-3-8B tokens per parameter', '15T / 8B (~95x Chinchilla from the rounded 1,900)', '~1,900',
         1900, 15e12 / 8e9, '.2g'),
        ('Data', 'bytes per token, vocab 50,257 (GPT-2)', 'uint16 while vocab <= 65,536', '2', 2, token_bytes(50257),
         'd'),
        ('Data', 'bytes per token, vocab 128,256 (Llama 3)', 'uint32 above', '4', 4, token_bytes(128256), 'd'),
        ('Data', '250B tokens at 2 bytes/token, GB', 'D x 2', '500', 500, 250e9 * token_bytes(50257) / 1e9, '.3g'),
        ('Data', '25B tokens as parquet, GB', 'D x ~4 bytes/token (3-4)', '~100', 100, 25e9 * 4 / 1e9, '.2g'),
        ('Data', '1.3B Adam checkpoint, GB', '12P: fp32 weights + Adam m, v', '~16', 16, 12 * 1.3e9 / 1e9, '.2g'),
    ]
    results = []
    for section, what, formula, book, book_value, value, precision in examples:
        if precision == '>':
            matches, shown = value > book_value, f'{value:.1%}'
        else:
            matches = format(round(value) if precision == 'd' or precision == ',d' else value, precision) == \
                format(book_value, precision)
            shown = format(round(value), precision) if precision in ('d', ',d') else f'{value:.4g}'
        results.append(dict(section=section, what=what, formula=formula, book=book, book_value=book_value,
                            value=value, shown=shown, precision=precision, matches=matches))
    return results


def format_book():
    lines = ["BOOK.md's worked examples, recomputed by the ledger (book's figure | ledger's | agree at the book's "
             "precision)"]
    section = None
    for example in book_examples():
        if example['section'] != section:
            section = example['section']
            lines += ['', section]
        lines.append(f"  {example['what']:<46} {example['book']:>14} | {example['shown']:>14} | "
                     f"{'ok' if example['matches'] else 'DIFFERS'}   {example['formula']}")
    return '\n'.join(lines)


# -----------------------------------------------------------------------------------------------------
# CLI: python ledger.py CONFIG [--key=value ...] [--json] | python ledger.py --book

USAGE = 'usage: python ledger.py CONFIG [--key=value ...] [--json]   or   python ledger.py --book'


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ('-h', '--help'):
        print(__doc__.strip() + '\n\n' + USAGE)
        return 0
    try:
        if '--book' in argv:
            if argv != ['--book']:
                raise ConfigError('--book takes no other arguments')
            print(format_book())
            return 0
        as_json = '--json' in argv
        args = [a for a in argv if a != '--json']
        if not args:
            raise ConfigError(f'no config given ({USAGE})')
        path = None if args[0].startswith('--') else args[0]
        model, train = load_config(path, args[1:] if path else args)
        prediction = predict(model, train)
        print(json.dumps(prediction, indent=2) if as_json else format_report(prediction))
        return 0
    except ConfigError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
