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
    ckpt_every: int = 1000
    keep_ckpts: int = 3
    spike_factor: float = 3.0    # a loss above mean + spike_factor * std of the recent window is a spike
    spike_window: int = 50
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
        raise ConfigError(f"--{key}={text}: expected a {type(default).__name__}") from None


def load_config(path=None, overrides=()):
    """Read a config file (plain Python assignments) and `--key=value` overrides into (ModelConfig, TrainConfig).

    The file runs in a fresh namespace, never in our globals; names starting with '_' and modules are ignored."""
    values = {}
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path} (the configs are in configs/)")
        namespace = {}
        with open(path) as f:
            exec(compile(f.read(), path, 'exec'), namespace)
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
# GPUs: dense BF16 peak FLOP/s (no sparsity) and memory, keyed by the name a config uses.

@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float   # dense BF16 tensor-core FLOP/s
    memory_bytes: int


GPUS = {
    'H200': GPU('H200 SXM', 989e12, 141 * 10**9),
}


def gpu_spec(name):
    if name in GPUS:
        return GPUS[name]
    close = difflib.get_close_matches(name, list(GPUS), n=1, cutoff=0.3)
    hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(GPUS)}"
    raise ConfigError(f"unknown gpu '{name}': {hint}")
