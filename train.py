"""
train.py: pretrain a GPT-2 or Llama model from a config file, on one CPU or on many GPUs.

    python train.py configs/pystdlib_cpu.py                            # a small Llama on the CPU, minutes
    torchrun --nproc_per_node=1 train.py configs/h200_1b3.py           # the book's 1.3B run on one H200
    torchrun --standalone --nproc_per_node=8 train.py configs/h100x8_1b3.py
    python train.py CONFIG --max_steps=100 --lr=3e-4 --resume          # overrides, then continue from ckpt/LATEST

Flags besides --key=value: --resume (continue from out_dir/ckpt/LATEST), --resume=PATH (from that checkpoint
folder), --allow_change=KEY,... (let a resumed run change keys that break an exact continuation, such as lr),
--force (start even when the ledger predicts the run does not fit in the device's memory). Ctrl-C or a SIGTERM
(a scheduler's preemption) finishes the step, writes a checkpoint and prints the command that resumes.

The file reads in the order a run happens: 1. arguments and processes, 2. batch arithmetic and the LR schedule,
3. data, 4. model, parallelism and optimizer, 5. the live ledger, 6. the run itself: set up, train_step (one
optimizer step), check_point (read back the losses, spike guard, log, eval, checkpoint, sample), roll_back, and
the loop in main() that ties them together. Outputs in out_dir: metrics.jsonl, ledger.json, ledger.md,
summary.json, report.md, ckpt/ (checkpoint.py).
"""
import contextlib
import dataclasses
import gc
import importlib.metadata
import json
import math
import os
import resource
import shlex
import shutil
import signal
import statistics
import sys
import time

# The CUDA caching allocator reads its settings once, so they are set before torch is imported. Expandable segments
# let freed blocks grow and merge instead of fragmenting: at h200_1b3's 106 of 141 GiB, with multi-GB loss buffers
# of changing shapes, fragmentation is what turns a fit into an out-of-memory (nanochat and torchtitan set it too).
# torch 2.10 renamed the variable; 2.9 still ignored the new name for this setting (pytorch #183387).
if not (os.environ.get('PYTORCH_ALLOC_CONF') or os.environ.get('PYTORCH_CUDA_ALLOC_CONF')):
    torch_release = tuple(int(part) for part in importlib.metadata.version('torch').split('.')[:2])
    os.environ['PYTORCH_ALLOC_CONF' if torch_release >= (2, 10) else 'PYTORCH_CUDA_ALLOC_CONF'] = \
        'expandable_segments:True'

import numpy as np  # noqa: E402 (after the allocator's settings)
import torch  # noqa: E402
import torch.distributed as dist

import checkpoint
import eval as hellaswag  # eval.py: HellaSwag accuracy (the module, named for its job; not the builtin)
import files
import ledger
import objectives
import plot
import prepare
from config import DEFAULTS, ConfigError, UserError, cli, load_config
from model import GPT
from prepare import DataError

USAGE = "usage: python train.py CONFIG [--key=value ...] [--resume[=CKPT_DIR]] [--allow_change=KEY,...] [--force]"


class TrainingStopped(UserError):
    """The run cannot go on (too many loss spikes, the ledger and the model disagree): one line, exit 1."""
    exit_code = 1


# -----------------------------------------------------------------------------------------------------
# 1. Arguments and processes. torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (one process per GPU, any number of
# nodes); a plain `python train.py` is rank 0 of 1. CUDA when present (NCCL between GPUs), else CPU (gloo).
# A world of one needs no process group and no wrapper, whatever `parallel` says.

def parse_args(argv):
    """argv -> (config path, overrides, resume, force, keys allowed to change on resume); resume is False, True (the
    latest) or a checkpoint folder."""
    config_path, overrides, resume, force, allowed = None, [], False, False, set()
    for arg in argv:
        if arg == '--resume':
            resume = True
        elif arg.startswith('--resume='):
            resume = arg.split('=', 1)[1]
        elif arg == '--force':
            force = True
        elif arg.startswith('--allow_change='):
            allowed |= {key for key in arg.split('=', 1)[1].split(',') if key}
            unknown = sorted(allowed - set(CONTINUATION_KEYS))
            if unknown:
                raise ConfigError(f"--allow_change={','.join(unknown)}: only these keys need it: "
                                  f"{', '.join(CONTINUATION_KEYS)}")
        elif arg.startswith('--'):
            overrides.append(arg)
        elif config_path is None:
            config_path = arg
        else:
            raise ConfigError(f"unexpected argument '{arg}': {USAGE}")
    if config_path is None:
        raise ConfigError(f"no config file given: {USAGE}")
    return config_path, overrides, resume, force, allowed


@dataclasses.dataclass
class Cluster:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_master(self):
        return self.rank == 0


def setup_cluster():
    rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    local_rank = int(os.environ.get('LOCAL_RANK', 0))
    if torch.cuda.is_available():
        device = torch.device('cuda', local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device('cpu')
    return Cluster(rank, world_size, local_rank, device)


def join_process_group(cluster):
    """After the input checks, so that a bad config is one line from every rank, not a rendezvous timeout."""
    if cluster.world_size > 1 and not dist.is_initialized():
        if cluster.device.type == 'cuda':  # NCCL bound to this rank's GPU
            dist.init_process_group('nccl', device_id=cluster.device)
        else:
            dist.init_process_group('gloo')


def log(cluster, message):
    if cluster.is_master:
        print(message, flush=True)


def barrier(cluster):
    if cluster.world_size > 1:
        dist.barrier()


def reduce_mean(values, cluster):
    """Mean over ranks of a tensor (gloo has no AVG, so SUM then divide)."""
    if cluster.world_size > 1:
        dist.all_reduce(values)
        values /= cluster.world_size
    return values


# -----------------------------------------------------------------------------------------------------
# 2. Batch arithmetic and the LR schedule (the book's training recipe).
# One micro-step is a forward/backward of micro_batch sequences of block_size tokens on every rank, so it covers
# micro_batch x block_size x world_size tokens; gradient accumulation repeats it until batch_tokens, the global
# batch, is reached. The global batch is fixed by the config: more ranks means fewer micro-steps, not a bigger batch.

def tokens_per_micro_step(model_cfg, train, world_size):
    """Tokens one micro-step covers on all ranks; ConfigError if the global batch is not a whole number of them."""
    tokens = train.micro_batch * model_cfg.block_size * world_size
    if train.batch_tokens % tokens:
        raise ConfigError(
            f"batch_tokens ({train.batch_tokens:,}) is not a multiple of micro_batch x block_size x world size "
            f"= {train.micro_batch} x {model_cfg.block_size} x {world_size} = {tokens:,}: change batch_tokens, "
            f"micro_batch or the number of processes")
    return tokens


def batch_tokens_at(tokens_seen, train, micro_step_tokens):
    """The global batch for the next step. GPT-3 style ramp: linear in tokens seen from batch_ramp_start to
    batch_tokens over the first batch_ramp_tokens, rounded down to whole micro-steps (GPT-3 went 32K -> 3.2M
    tokens over its first 4-12B tokens). A small early batch is enough while the gradient is large and coherent."""
    if train.batch_ramp_tokens <= 0 or tokens_seen >= train.batch_ramp_tokens:
        return train.batch_tokens
    start, full = train.batch_ramp_start, train.batch_tokens
    ramped = start + (full - start) * tokens_seen / train.batch_ramp_tokens
    return max(micro_step_tokens, int(ramped) // micro_step_tokens * micro_step_tokens)


def planned_steps(train, micro_step_tokens):
    """Optimizer steps to see train_tokens: the length the schedule spans (max_steps may stop the run earlier)."""
    steps, tokens = 0, 0
    while tokens < min(train.train_tokens, train.batch_ramp_tokens):  # the ramp, step by step (thousands at most)
        tokens += batch_tokens_at(tokens, train, micro_step_tokens)
        steps += 1
    return steps + max(0, math.ceil((train.train_tokens - tokens) / train.batch_tokens))


def warmup_steps(total_steps, train):
    return max(1, round(train.warmup_frac * total_steps))


def wsd_decay(total_steps, train):
    """wsd: (the first decayed step, the steps of the decay): the last decay_frac of total_steps."""
    decay = max(1, round(train.decay_frac * total_steps))
    return total_steps - decay, decay


def stable_steps(total_steps, train):
    """wsd: the checkpoints (steps done) a cooldown branch may start from: warmup complete, the next step still at
    the peak. h200_1b3_overtrain: steps 572 to 152,587 of 190,735."""
    return range(warmup_steps(total_steps, train), wsd_decay(total_steps, train)[0])


def lr_at(step, total_steps, train, cooldown=None):
    """LR for 0-based step `step` of `total_steps`. Linear warmup over warmup_frac of the steps (the book: 0.1-0.5%)
    from lr/warmup to the peak at step warmup-1; then either cosine decay (GPT-3, LLaMA) or warmup-stable-decay
    (constant, then a linear decay over the last decay_frac of the steps), both ending at min_lr_ratio x peak (10%)
    on the last step. cooldown: a branch's (first step, steps), a wsd decay of its own in place of the run's."""
    warmup = warmup_steps(total_steps, train)
    peak, floor = train.lr, train.lr * train.min_lr_ratio
    if step < warmup:
        return peak * (step + 1) / warmup
    if train.schedule == 'wsd':
        decay_start, decay = cooldown or wsd_decay(total_steps, train)  # the last step reaches the floor
        if step < decay_start:
            return peak
        return peak + (floor - peak) * min(1.0, (step - decay_start + 1) / decay)
    progress = min(1.0, (step - warmup + 1) / max(1, total_steps - warmup))  # 1.0 on the last step
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# -----------------------------------------------------------------------------------------------------
# 3. Data. Shards come from prepare.py (llm.c format, read through prepare's reader). A training example is a
# sequence of block_size + 1 tokens: inputs are the first block_size, targets the last block_size.
# The order is a pure function of (seed, position): `position` counts the sequences the whole run (all ranks)
# has consumed, and sequence k of the stream is found without replaying the ones before it. So a checkpoint
# needs only that one integer, and the stream does not depend on the world size: on every micro-step the
# global batch is cut into world_size disjoint slices, rank r taking slice r (see micro_batch_arrays).

class ShardStream:
    """The train split as an endless stream of sequences in a fixed order from the seed.

    A shard of n tokens holds (n - 1) // T sequences starting at multiples of T; neighbours share one token (the
    last target of one is the first input of the next, as in llm.c), so no token is wasted. Epoch e visits the
    shards in a seeded permutation and each shard's sequences in their own seeded permutation (llm.c's
    shuffle); the permutations are O(shard) memory, never O(dataset), even for 100B tokens."""

    def __init__(self, shards, block_size, seed):
        self.shards, self.block_size, self.seed = shards, block_size, seed
        self.counts = np.array([(len(s) - 1) // block_size for s in shards], dtype=np.int64)
        self.per_epoch = int(self.counts.sum())
        self._epoch_plans, self._permutations = {}, {}

    def _epoch_plan(self, epoch):
        if epoch not in self._epoch_plans:
            self._epoch_plans = {}  # keep one epoch's plan: the stream only moves forward
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            self._epoch_plans[epoch] = order, np.cumsum(self.counts[order])
        return self._epoch_plans[epoch]

    def _permutation(self, epoch, shard):
        key = (epoch, shard)
        if key not in self._permutations:
            if len(self._permutations) >= 4:
                self._permutations.clear()
            self._permutations[key] = np.random.default_rng([self.seed, epoch, shard + 1]).permutation(
                int(self.counts[shard]))
        return self._permutations[key]

    def sequence(self, k):
        epoch, index = divmod(k, self.per_epoch)
        order, ends = self._epoch_plan(epoch)
        j = int(np.searchsorted(ends, index, side='right'))  # the j-th shard of this epoch holds it
        shard = int(order[j])
        local = index - (int(ends[j - 1]) if j else 0)
        start = int(self._permutation(epoch, shard)[local]) * self.block_size
        return self.shards[shard][start:start + self.block_size + 1]

    def batch(self, first, count):
        """Sequences first .. first+count-1 of the stream, as an int64 array (count, block_size + 1)."""
        return np.stack([self.sequence(k) for k in range(first, first + count)]).astype(np.int64)


class SyntheticStream:
    """data = 'synthetic': uniform random tokens, sequence k drawn from its own generator seeded by (seed, k), so
    any slice of the stream is reproducible. For benchmarks without a dataset (the loss stays near ln V)."""

    def __init__(self, vocab_size, block_size, seed, split):
        self.vocab_size, self.block_size, self.seed, self.split = vocab_size, block_size, seed, split

    def batch(self, first, count):
        return np.stack([np.random.default_rng([self.seed, self.split, k]).integers(
            0, self.vocab_size, self.block_size + 1, dtype=np.int64) for k in range(first, first + count)])


def padded_vocab(vocab_size):
    return 128 * math.ceil(vocab_size / 128)


def open_data(model_cfg, train):
    """-> (train stream, val sequences (n, T+1), meta or None). Missing data, or data whose vocabulary does not
    match the model, is one DataError line that names the prepare command."""
    if train.data == 'synthetic':
        val = SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=1)
        n_val = max(1, train.eval_tokens // model_cfg.block_size)
        stream = SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=0)
        return stream, val.batch(0, n_val), None
    train_paths = prepare.list_shards(train.data, 'train')  # DataError naming `python prepare.py ...` when none
    val_paths = prepare.list_shards(train.data, 'val')
    meta = prepare.load_meta(train.data)
    data_vocab = meta['vocab_size']
    # The model's vocab may be the data's padded up to a multiple of 128 (the spare rows are never targets);
    # smaller cannot hold the tokens, larger means the data was made with another tokenizer.
    if not data_vocab <= model_cfg.vocab_size <= padded_vocab(data_vocab):
        raise DataError(
            f"vocab mismatch: {train.data} was tokenized with {meta['tokenizer']} ({data_vocab:,} tokens) but the "
            f"model has vocab_size={model_cfg.vocab_size:,}: set vocab_size = {padded_vocab(data_vocab)}, or make "
            f"another folder with a tokenizer of the model's size (--tokenizer gpt2, neox or bpe:V; this one came "
            f"from `{prepare.prepare_command(train.data)}`)")
    prepare.check_token_ids(train.data, meta, model_cfg.vocab_size)  # an id past the embedding is one line here
    stream = ShardStream([prepare.open_shard(p) for p in train_paths], model_cfg.block_size, train.seed)
    if stream.per_epoch == 0:
        raise DataError(f"the train shards in {train.data} hold fewer than block_size + 1 = "
                        f"{model_cfg.block_size + 1} tokens each: prepare more data or lower block_size")
    # The val set is fixed: the first eval_tokens of the val split, cut into consecutive sequences.
    needed, parts = train.eval_tokens + 1, []
    for path in val_paths:
        shard = prepare.open_shard(path)
        parts.append(np.asarray(shard[:needed - sum(len(p) for p in parts)], dtype=np.int64))
        if sum(len(p) for p in parts) >= needed:
            break
    tokens = np.concatenate(parts)
    T = model_cfg.block_size
    n_val = (len(tokens) - 1) // T
    if n_val == 0:
        raise DataError(f"the val split of {train.data} holds {len(tokens)} tokens, fewer than block_size + 1 = "
                        f"{T + 1}: prepare more data or lower block_size")
    val = np.stack([tokens[i * T:i * T + T + 1] for i in range(n_val)])
    return stream, val, meta


def micro_batch_arrays(stream, position, micro_step, cluster, micro_batch, objective=objectives.CLM):
    """Rank r's inputs and targets for micro-step m of the step that starts at stream `position`. The step's
    sequences are position .. position + accum x world x micro_batch - 1; micro-step m, rank r takes the slice
    (m x world + r) x micro_batch of length micro_batch. So the ranks' slices are disjoint and together are
    exactly what one process with world x the accumulation reads (test_distributed.py checks it). The objective
    makes (inputs, targets) of each sequence from its tokens and its index in the stream alone (objectives.py):
    for clm, (s[:-1], s[1:]); a resumed run and any world size transform every sequence alike."""
    first = position + (micro_step * cluster.world_size + cluster.rank) * micro_batch
    return objective(stream.batch(first, micro_batch), first)


def to_device(array, device):
    tensor = torch.from_numpy(array)
    if device.type == 'cuda':  # pinned host memory lets the copy run asynchronously with the GPU's work
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


# -----------------------------------------------------------------------------------------------------
# 4. Model, parallelism, optimizer.
# The model is built on the meta device (no memory, no init) then materialised on the device and initialised
# from the seed: the same weights on every rank, whatever the world size, which is what makes 2 ranks train like
# 1 (it needs the full fp32 model on each device for a moment: fine up to ~30B on 80 GB GPUs).

FSDP_MODES = ('zero2', 'fsdp')  # the modes built on FSDP2's fully_shard


def build_model(model_cfg, train, cluster, dtype):
    """-> (model to call, raw GPT). Under FSDP the raw GPT is the sharded root itself. dtype: the compute dtype."""
    torch.manual_seed(train.seed)
    with torch.device('meta'):
        model = GPT(model_cfg)
    model.to_empty(device=cluster.device)
    model.init_weights()
    model.recompute = train.recompute  # activation checkpointing per block: one extra forward, 8P FLOPs
    if cluster.world_size == 1:
        if train.compile:
            model.compile()  # in place: the state dict keeps its names (no `_orig_mod.` prefix)
        return model, model
    if train.parallel in ('ddp', 'zero1'):
        from torch.nn.parallel import DistributedDataParallel
        if train.compile:
            model.compile()
        device_ids = [cluster.local_rank] if cluster.device.type == 'cuda' else None
        # broadcast_buffers=False: the only buffers are the RoPE tables, constants that every rank computes itself.
        # gradient_as_bucket_view=True: the .grad tensors are views of DDP's all-reduce buckets, so the gradients
        # take 4P bytes once, not twice (the ledger's model states count them so).
        return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False,
                                       gradient_as_bucket_view=True), model
    # FSDP2: shard each block, then the root (embeddings, final norm, lm_head: a tied weight stays in this one unit
    # with both its users). ZeRO-3 ('fsdp') frees each block's gathered weights after its forward and gathers them
    # again for backward; ZeRO-2 ('zero2') keeps them from forward to backward, so only gradients and optimizer
    # states stay sharded (the book's 2P + 14P/N).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(cluster.device.type, (cluster.world_size,))
    mp_policy = MixedPrecisionPolicy()  # fp32 everywhere
    if dtype == 'bfloat16':  # bf16 weights for the matmuls, gradients reduced in fp32
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = train.parallel == 'fsdp'
    for block in model.blocks:
        if train.compile:
            block.compile()  # per block, in place, as torchtune does under FSDP2: the blocks share one graph
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    return model, model


def adamw_options(train, world_size):
    """AdamW's settings: the book's betas 0.9/0.95 and eps 1e-8, and the fused kernel (one kernel for every tensor:
    5x faster than the per-tensor loop on a 2-core CPU, measured; on GPUs the standard choice) everywhere but under
    ZeRO-1: ZeroRedundancyOptimizer.load_state_dict moves AdamW's step counts to the CPU on purpose, and the fused
    CUDA kernel then fails on mixed devices (pytorch #124133), so every resume and spike rollback would crash on a
    GPU. ZeRO-1 takes the foreach kernel instead."""
    zero1 = train.parallel == 'zero1' and world_size > 1
    return dict(lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps, fused=not zero1, foreach=zero1)


def build_optimizer(model, train, cluster):
    """AdamW with weight decay only on matrices (Linear weights and the embedding): decaying gains and biases pulls
    them to zero for no benefit. ZeRO-1 shards the AdamW states over the ranks (ledger.zero1_partition follows its
    assignment)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': train.weight_decay},
              {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
    options = adamw_options(train, cluster.world_size)
    if train.parallel == 'zero1' and cluster.world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **options)
    return torch.optim.AdamW(groups, **options)


def clip_gradients(params, max_norm):
    """Scale all gradients so their global L2 norm is at most max_norm (the book: 1.0; 0: no clipping). Under FSDP
    the gradients are DTensor shards: the norm of the shards is a partial sum that full_tensor() reduces over the
    ranks (as torchtitan does). Returns the norm before clipping, on the device (reading it would sync)."""
    from torch.distributed.tensor import DTensor
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


# -----------------------------------------------------------------------------------------------------
# 5. The live ledger: the prediction for the device this run is on, before step 1; the measurements on log steps;
# summary.json (predicted and measured side by side, at each eval and at the end) and report.md rendered from it.

def live_device(cluster, model_cfg, train):
    """The ledger's Device for the hardware this run is on (ledger.measure_device: a GPU by its name, else a GEMM
    probe), measured on rank 0 and shared, so every rank predicts alike. On the CPU the runtime overhead is rank 0's
    resident memory before the model's tensors exist, and the RAM is shared by the processes on this machine."""
    device = None
    if cluster.is_master:
        device = ledger.measure_device('auto', train.dtype)
        if device.kind == 'cpu':
            with torch.device('meta'):  # what building the model loads besides its tensors (meta kernels import
                GPT(model_cfg)          # sympy and torch's symbolic shapes: ~75 MB) belongs to the runtime
            device = dataclasses.replace(
                device, overhead_bytes=ledger.resident_bytes(), shared_by=int(os.environ.get('LOCAL_WORLD_SIZE', 1)),
                overhead_source='measured: resident memory of this process before the model was built')
    if cluster.world_size > 1:
        shared = [device]
        dist.broadcast_object_list(shared, src=0)
        device = shared[0]
    return device


SDPA_BACKENDS = {0: 'math', 1: 'flash attention', 2: 'memory-efficient attention', 3: 'cuDNN attention'}


def sdpa_backend(model_cfg, device, dtype):
    """The kernel F.scaled_dot_product_attention picks for this run's shapes and dtype, asked the way SDPA itself
    asks (torch._fused_sdp_choice). Flash, memory-efficient and cuDNN keep only the output and the log-sum-exp for
    backward, as the ledger assumes; math materialises the T x T scores of every head."""
    head_dim, T = model_cfg.head_dim, model_cfg.block_size
    q, k, v = (torch.empty(1, heads, T, head_dim, device=device, dtype=getattr(torch, dtype), requires_grad=True)
               for heads in (model_cfg.n_head, model_cfg.kv_heads, model_cfg.kv_heads))
    choice = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=model_cfg.kv_heads != model_cfg.n_head)
    return SDPA_BACKENDS.get(choice, f'backend {choice}')


def peak_memory(cluster):
    """-> (peak, peak reserved) bytes: the CUDA caching allocator's, or on the CPU the process's peak resident
    memory (and None)."""
    if cluster.device.type == 'cuda':
        return torch.cuda.max_memory_allocated(cluster.device), torch.cuda.max_memory_reserved(cluster.device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None  # kilobytes on Linux


class Metrics:
    """The measured half of the ledger, and rank 0's outputs: ledger.json and ledger.md (the prediction),
    metrics.jsonl (one line per log step, eval and rollback), summary.json and report.md.

    Speed is timed over the steps between log steps, the device synchronised before the clock is read (else it
    times how fast Python queues kernels, not how fast they run), the clock paused around eval, checkpoints and
    samples. The first interval after a start or a rollback holds the compile and warm-up steps: it is logged
    but left out of the run's figures in summary.json."""

    def __init__(self, cluster, train, prediction, params_built, append, bytes_per_token=None):
        self.cluster, self.prediction, self.out_dir = cluster, prediction, train.out_dir
        self.bytes_per_token = bytes_per_token  # the data's (meta.json): losses in bits per byte too
        # MFU counts the model's matmul FLOPs, 6 N_matmul + 12 L H T per token (PaLM's convention, no recompute)
        self.flops_per_token = prediction['flops_per_token']['matmul']
        self.peak_flops = prediction['gpu']['peak_flops']
        where = torch.cuda.get_device_name(cluster.device) if cluster.device.type == 'cuda' else \
            f'the CPU ({torch.get_num_threads()} threads per process)'
        self.measured = {'device': f'{cluster.world_size} x {where}', 'torch': torch.__version__,
                         'params': params_built, 'bytes_per_token': bytes_per_token}
        self.run_tokens, self.run_seconds = 0, 0.0  # over the intervals after the first
        self.interval_tokens, self.interval_seconds, self.started, self.warmup = 0, 0.0, None, True
        self.metrics_path = os.path.join(train.out_dir, 'metrics.jsonl')
        if cluster.is_master:
            os.makedirs(train.out_dir, exist_ok=True)
            files.save_json(os.path.join(train.out_dir, 'ledger.json'), prediction)
            files.write_text_atomic(os.path.join(train.out_dir, 'ledger.md'), ledger.format_report(prediction) + '\n')
            if not append:
                open(self.metrics_path, 'w').close()

    def _now(self):
        if self.cluster.device.type == 'cuda':
            torch.cuda.synchronize(self.cluster.device)
        return time.perf_counter()

    def start_clock(self):
        self.started = self._now()

    def stop_clock(self):
        if self.started is not None:
            self.interval_seconds += self._now() - self.started
            self.started = None

    def restart(self):
        """After a rollback: drop the interval, the next one warms up again."""
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, True

    def mfu(self, tokens_per_s):
        return self.flops_per_token * tokens_per_s / (self.cluster.world_size * self.peak_flops)

    def days(self, tokens_per_s):
        return self.prediction['tokens'] / tokens_per_s / ledger.SECONDS_PER_DAY  # the planned tokens at this speed

    def record(self, entry):
        """Append one JSON line (on log, eval and rollback steps only: opening the file each time is free)."""
        if self.cluster.is_master:
            with open(self.metrics_path, 'a') as f:
                f.write(json.dumps(entry) + '\n')

    def log_step(self, result, total_steps, tokens_seen, loss, grad_norm):
        tokens_per_s = self.interval_tokens / self.interval_seconds
        peak, _ = peak_memory(self.cluster)
        bpb = ledger.bits_per_byte(loss, self.bytes_per_token)
        self.record({'step': result.step, 'tokens': tokens_seen, 'loss': loss, 'bpb': bpb, 'lr': result.lr,
                     'grad_norm': grad_norm, 'batch_tokens': result.batch_tokens, 'tokens_per_s': tokens_per_s,
                     'mfu': self.mfu(tokens_per_s), 'days': self.days(tokens_per_s), 'peak_memory_bytes': peak,
                     'warmup': self.warmup})
        log(self.cluster, f"step {result.step:>6}/{total_steps} | loss {loss:.4f}"
                          + (f" ({bpb:.3f} bpb)" if bpb is not None else '') + f" | lr {result.lr:.2e} | "
                          f"norm {grad_norm:.2f} | {tokens_per_s:,.0f} tok/s | MFU {self.mfu(tokens_per_s):.1%} | "
                          f"{self.days(tokens_per_s):.3g} days | peak mem {peak / 2**30:.2f} GiB"
                          + (" | warm-up" if self.warmup else ""))
        if self.warmup and self.cluster.device.type == 'cuda':
            # from here the peak is the steady state's, not the compile's (autotuning tries kernels with buffers of
            # their own); on the CPU the process's peak resident memory cannot be reset
            torch.cuda.reset_peak_memory_stats(self.cluster.device)
        if not self.warmup:
            self.run_tokens += self.interval_tokens
            self.run_seconds += self.interval_seconds
            run_speed = self.run_tokens / self.run_seconds
            self.measured.update(tokens_per_s=run_speed, mfu=self.mfu(run_speed), days=self.days(run_speed))
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, False

    def write_summary(self, step, tokens_seen, val_loss=None):
        """summary.json and report.md, from the same numbers (ledger.summarize), and the loss curve (plot.py's
        loss.png, shown in report.md; a run without matplotlib goes on without it)."""
        if not self.cluster.is_master:
            return
        self.measured['peak_memory_bytes'], self.measured['peak_reserved_bytes'] = peak_memory(self.cluster)
        self.measured.update(step=step, tokens_seen=tokens_seen)
        if val_loss is not None:
            self.measured['val_loss'] = val_loss
        summary = ledger.summarize(self.prediction, self.measured)
        files.save_json(os.path.join(self.out_dir, 'summary.json'), summary)
        picture = plot.draw_run(self.out_dir)
        files.write_text_atomic(os.path.join(self.out_dir, 'report.md'), ledger.format_comparison(summary) + '\n' + (
            '\n![train and val loss against tokens seen](loss.png)\n' if picture else
            '\n(no loss.png: `pip install matplotlib`, then `python plot.py RUN_DIR` draws it)\n'))


# -----------------------------------------------------------------------------------------------------
# 6. The run: set up, then the loop in main(): train_step (one optimizer step, nothing read back from the device),
# and on log, eval, checkpoint and sample steps check_point (the one host-device sync: the pending losses, the
# spike guard, then log, eval, checkpoint, sample), which hands a spike to roll_back.

@dataclasses.dataclass
class RunState:
    """What a checkpoint carries besides the weights and the optimizer (checkpoint.py writes it)."""
    step: int = 0               # optimizer steps done
    tokens_seen: int = 0        # tokens trained on (skipped data not counted)
    position: int = 0           # sequences of the train stream consumed, by all ranks together
    rollbacks: int = 0
    loss_window: list = dataclasses.field(default_factory=list)  # recent good losses, for the spike guard
    skipped: list = dataclasses.field(default_factory=list)      # [first, end) sequence ranges skipped after spikes


@dataclasses.dataclass
class StepResult:
    """One optimizer step, as train_step leaves it: loss and grad_norm are still on the device."""
    step: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    position: int               # the data position after this step
    lr: float
    batch_tokens: int


@dataclasses.dataclass
class Run:
    """What the loop works with. bench.py builds one too (synthetic data, no outputs) and times train_step."""
    model_cfg: object
    train: object
    cluster: Cluster
    autocast: object            # bf16 autocast, or a null context (fp32, or FSDP2's own mixed precision)
    stream: object              # the train data: ShardStream or SyntheticStream
    model: torch.nn.Module      # what the loop calls: DDP, FSDP2 or the model itself
    raw_model: GPT              # the GPT inside (for samples and checkpoints)
    optimizer: torch.optim.Optimizer
    params: list                # the trainable parameters, listed once: no per-step walk over the modules
    micro_step_tokens: int      # tokens of one micro-step on all ranks together
    total_steps: int            # the steps the schedule spans (train_tokens)
    stop_step: int              # where this run stops (max_steps may stop it early; a branch where its decay ends)
    state: RunState = dataclasses.field(default_factory=RunState)
    val: np.ndarray = None      # the fixed val sequences, (n, block_size + 1)
    meta: dict = None           # the data folder's meta.json (None for synthetic data)
    metrics: Metrics = None
    last_checkpoint: str = None # the rollback target
    tokenizer: object = None    # for text samples and HellaSwag, when the run makes them
    hellaswag: list = None      # HellaSwag's items (eval.py), when hellaswag_every is set
    objective: objectives.Objective = dataclasses.field(default_factory=lambda: objectives.CLM)  # objectives.build
    cooldown: tuple = None      # a cooldown branch: (its first step, its steps), the decay lr_at runs
    branch_points: dict = dataclasses.field(default_factory=dict)  # a wsd main run: {step: branch length} to keep
    argv: list = dataclasses.field(default_factory=list)  # train.py's arguments, for the commands it prints


def check_out_dir(train, resume, stop_step, cluster):
    """-> the checkpoint to resume from (None: start), or 'done' when out_dir already holds this run, complete.
    Checkpoints already in out_dir are continued only when asked, never overwritten silently."""
    if resume:
        path = checkpoint.find(resume) if isinstance(resume, str) else checkpoint.latest(train.out_dir)
        if path is None:
            raise ConfigError(f"--resume: no complete checkpoint at {checkpoint.root(train.out_dir)}: run without "
                              f"--resume to start")
        return checkpoint.verified(path)
    found = checkpoint.latest(train.out_dir)
    if found:
        finished = checkpoint.step_of(found)
        if finished >= stop_step:  # like a rerun of prepare.py on a complete folder: nothing left to do
            log(cluster, f"{train.out_dir}: this run is complete (checkpoint at step {finished:,}, planned "
                         f"{stop_step:,}): nothing to train; delete the folder or set --out_dir to train again")
            return 'done'
        raise ConfigError(f"{train.out_dir} already holds checkpoints: pass --resume to continue that run, or set "
                          f"--out_dir to another folder")
    return None


# Keys whose change breaks an exact continuation: the data and its order, the schedule, the optimizer, the
# numerics. Others (max_steps, logging, eval and checkpoint intervals, the spike guard, the ledger's assumptions,
# micro_batch and the world size: the same global batch) may change freely on resume, and are logged if they do.
CONTINUATION_KEYS = ('data', 'seed', 'train_tokens', 'batch_tokens', 'batch_ramp_tokens', 'batch_ramp_start', 'lr',
                     'min_lr_ratio', 'schedule', 'warmup_frac', 'decay_frac', 'weight_decay', 'beta1', 'beta2', 'eps',
                     'grad_clip', 'dtype', 'cooldown_from', 'cooldown_tokens', 'objective', 'fim_rate',
                     'fim_spm_rate', 'ul2_s_rate', 'ul2_r_rate', 'ul2_x_rate')


def check_resumable(path, model_cfg, train, allowed, cluster, action='resume'):
    """A checkpoint continues only the model it was written for, in its own parallel mode's format; a change to
    a CONTINUATION_KEYS key needs --allow_change=KEY (then it is logged, old and new). A key the checkpoint does not
    hold (it is older than the key) had its default. action: what the log lines call the continuation."""
    saved = checkpoint.read_state(path)
    if saved['model_config'] != dataclasses.asdict(model_cfg):
        changed = [k for k, v in dataclasses.asdict(model_cfg).items() if saved['model_config'].get(k) != v]
        raise ConfigError(f"{path} was written for another model ({', '.join(changed)} differ): resume with the "
                          f"config it was trained with")
    if saved['train_config']['parallel'] != train.parallel:
        raise ConfigError(f"{path} was written with parallel={saved['train_config']['parallel']}: resume with "
                          f"--parallel={saved['train_config']['parallel']}")
    then = {k: saved['train_config'].get(k, DEFAULTS[k]) for k in DEFAULTS if hasattr(train, k)}
    changes = {k: (then[k], v) for k, v in dataclasses.asdict(train).items()
               if k != 'dataset_tokens' and then[k] != v}
    refused = [k for k in changes if k in CONTINUATION_KEYS and k not in allowed]
    if refused:
        listed = ', '.join(f'{k} {changes[k][0]!r} -> {changes[k][1]!r}' for k in refused)
        raise ConfigError(f"resuming {path} with a changed {listed}: that breaks the exact continuation (data order, "
                          f"schedule or optimizer); pass --allow_change={','.join(refused)} if you mean it")
    for key, (old, new) in changes.items():
        log(cluster, f"{action}: {key} changed from {old!r} to {new!r}")


# Cooldown branches (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
# Durations", sec. 3; MiniCPM, Hu et al. 2024). A cosine run's LR at every step depends on where the run ends, so
# the loss after 1x, 2x and 4x Chinchilla's tokens takes three runs from scratch: 7x in all. A wsd run holds the
# peak LR until its last decay_frac, so a checkpoint from that stable phase, decayed in a short run of its own, is a
# finished run of that length; Hägele et al. find a linear decay over 10-20% of the steps matches cosine of the same
# length. One wsd run to 4x and two branches cost 4 + 0.2 x (1 + 2) = 4.6x. The main run names its branches'
# lengths in `cooldowns` and keeps its checkpoint at (1 - decay_frac) x each in out_dir/branch_points (hard links to
# the files in ckpt/: no bytes copied, and keep_ckpts prunes only ckpt/). A branch (--cooldown_from=that checkpoint
# --cooldown_tokens=N) starts from its weights, AdamW states, data position and step, so it reads on where the main
# run stopped reading, decays the LR from the peak to min_lr_ratio x peak over N tokens, and writes its own out_dir
# (by default the main run's + '_cooldown_26B', named for the tokens it ends at); it resumes like any run.

BRANCH_POINTS = 'branch_points'  # out_dir/branch_points/step_N: the stable checkpoints that branches start from


def branch_points(train, micro_step_tokens):
    """A wsd run's `cooldowns` -> {step: length}: the branch of a length starts from the checkpoint after which the
    run has seen (1 - decay_frac) x length tokens, so it decays over decay_frac of its length as the main run does.
    h200_1b3_overtrain: 26B and 52B start at steps 39,673 and 79,346 (20.8B and 41.6B tokens). A branch takes none."""
    if not train.cooldowns or train.cooldown_from:
        return {}
    if train.schedule != 'wsd':
        raise ConfigError(f"cooldowns need schedule = 'wsd': a {train.schedule} run's LR falls at every step, so no "
                          f"checkpoint of it is a stable point to branch from")
    stable = stable_steps(planned_steps(train, micro_step_tokens), train)
    points = {}
    for length in train.cooldowns:
        start = round((1 - train.decay_frac) * length)
        step = planned_steps(dataclasses.replace(train, train_tokens=start), micro_step_tokens)
        if step not in stable:
            raise ConfigError(f"cooldowns: the branch of {length:,} tokens would start at step {step:,} ({start:,} "
                              f"tokens), outside this run's stable phase (steps {stable.start:,} to "
                              f"{stable.stop - 1:,}): a length must be shorter than train_tokens "
                              f"({train.train_tokens:,}) and start after the warmup")
        points[step] = length
    return points


def branch_point_path(out_dir, step):
    return os.path.join(out_dir, BRANCH_POINTS, f'step_{step:07d}')


def branch_out_dir(out_dir, end_tokens):
    """A branch's default out_dir: out/h200_1b3_overtrain -> out/h200_1b3_overtrain_cooldown_26B."""
    return f"{os.path.normpath(out_dir)}_cooldown_{ledger._si(end_tokens)}"


def branch_flags(out_dir, step, cooldown_tokens):
    """The flags that make the main run's command its branch from the checkpoint kept at `step`."""
    return [f'--cooldown_from={branch_point_path(out_dir, step)}', f'--cooldown_tokens={cooldown_tokens}']


def keep_branch_point(run):
    """The checkpoint just written at a branch point, hard-linked into out_dir/branch_points (a tmp_ folder renamed
    when complete, as checkpoint.save does), and the command that runs its branch."""
    step, length = run.state.step, run.branch_points[run.state.step]
    kept = branch_point_path(run.train.out_dir, step)
    if run.cluster.is_master:
        tmp = os.path.join(os.path.dirname(kept), 'tmp_' + os.path.basename(kept))
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run.last_checkpoint, tmp, copy_function=os.link)
        shutil.rmtree(kept, ignore_errors=True)  # the same step written again, after a rollback
        os.rename(tmp, kept)
        command = train_command(run.argv, run.cluster, {'--resume', '--max_steps', '--allow_change'},
                                *branch_flags(run.train.out_dir, step, length - run.state.tokens_seen))
        log(run.cluster, f"step {step}: {run.state.tokens_seen:,} tokens, the start of the {ledger._si(length)} "
                         f"cooldown branch, kept in {kept}; run the branch with: {command}")


def cooldown_branch(train, micro_step_tokens):
    """A branch's checks and place, before anything is written: -> (train with the branch's out_dir, (its first
    step, its steps)). The main run's checkpoint (its train_state: kilobytes) is read at every start and resume: it
    must be a stable-phase checkpoint of a wsd run that is no branch itself."""
    path = train.cooldown_from
    if train.cooldown_tokens <= 0:
        raise ConfigError(f"cooldown_tokens must be positive for a branch, got {train.cooldown_tokens:,}: the tokens "
                          f"of its decay (10-20% of those seen at the branch point: Hägele et al. 2024)")
    if not os.path.isfile(os.path.join(path, checkpoint.MANIFEST)):
        raise ConfigError(f"--cooldown_from={path} is not a checkpoint folder (with a {checkpoint.MANIFEST}): give "
                          f"one a wsd run kept, out_dir/{BRANCH_POINTS}/step_N, or one of its out_dir/ckpt/step_N")
    saved = checkpoint.read_state(checkpoint.verified(path))
    main, step, tokens = saved['train_config'], saved['run']['step'], saved['run']['tokens_seen']
    if main.get('cooldown_from'):
        raise ConfigError(f"{path} is a cooldown branch's checkpoint, already decaying: branch from the main run's "
                          f"checkpoints ({main['cooldown_from']} is one)")
    if main['schedule'] != 'wsd':
        raise ConfigError(f"{path} was written by a {main['schedule']} run: a branch starts from the stable phase of "
                          f"a wsd run (a {main['schedule']} run's LR falls at every step)")
    main_train = dataclasses.replace(train, **{k: v for k, v in main.items() if hasattr(train, k)})
    stable = stable_steps(planned_steps(main_train, micro_step_tokens), main_train)
    if step not in stable:
        raise ConfigError(f"{path} is step {step:,} of a wsd run that holds the peak LR from step {stable.start:,} "
                          f"to {stable.stop - 1:,}: at step {step:,} it is "
                          f"{'still warming up' if step < stable.start else 'already decaying'}; branch from a "
                          f"checkpoint in between")
    end_tokens = tokens + train.cooldown_tokens
    end_step = planned_steps(dataclasses.replace(train, train_tokens=end_tokens), micro_step_tokens)
    main_out_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if os.path.abspath(train.out_dir) in (os.path.abspath(main['out_dir']), main_out_dir):  # never the main's
        train = dataclasses.replace(train, out_dir=branch_out_dir(train.out_dir, end_tokens))
    return train, (step, end_step - step)


def setup(argv, held=None):
    """Config, processes, data, the live ledger, model, optimizer, resume: -> a Run, or None when there is nothing
    to do. Every input check comes before the process group and the model, so bad input costs a second. `held`
    (an ExitStack) keeps, for the run, rank 0's lock on out_dir (one writer per folder: a second run there is one
    line naming the first) and the translation of a full disk under out_dir into one line; without it (a tool or a
    test that inspects a run's state), neither."""
    locking = held is not None
    held = held or contextlib.ExitStack()  # a tool's own, never closed: so no lock goes into it
    config_path, overrides, resume, force, allowed_changes = parse_args(argv)
    model_cfg, train = load_config(config_path, overrides)
    cluster = setup_cluster()
    micro_step_tokens = tokens_per_micro_step(model_cfg, train, cluster.world_size)
    cooldown = None
    if train.cooldown_from:  # a branch: its checks, and its own out_dir, before anything is written
        train, cooldown = cooldown_branch(train, micro_step_tokens)
    elif train.cooldown_tokens:
        raise ConfigError('cooldown_tokens goes with --cooldown_from: the stable checkpoint the branch decays from')
    if cluster.is_master and locking:  # under torchrun, a rank that stops here takes the others down with it
        held.enter_context(files.folder_lock(train.out_dir, shlex.join(['train.py'] + list(argv))))
    total_steps = planned_steps(train, micro_step_tokens)
    points = branch_points(train, micro_step_tokens)
    end_step = sum(cooldown) if cooldown else total_steps
    stop_step = min(end_step, train.max_steps) if train.max_steps else end_step
    stream, val, meta = open_data(model_cfg, train)
    objective = objectives.build(train, meta)  # its keys, and the data folder's special tokens, checked here
    if meta and not train.dataset_tokens:  # the ledger's "is the dataset big enough" uses the real count
        train = dataclasses.replace(train, dataset_tokens=meta['train_tokens'])
    resume_from = check_out_dir(train, resume, stop_step, cluster)
    if resume_from == 'done':
        return None
    if resume_from:
        check_resumable(resume_from, model_cfg, train, allowed_changes, cluster)
    elif cooldown:  # the branch continues the main run: the same checks, and its own keys may differ
        check_resumable(train.cooldown_from, model_cfg, train, allowed_changes | {'cooldown_from', 'cooldown_tokens'},
                        cluster, action='branch')
    elif allowed_changes:
        raise ConfigError('--allow_change goes with --resume or --cooldown_from: it names the keys a continued run '
                          'may change')
    join_process_group(cluster)

    torch.manual_seed(train.seed)
    if cluster.device.type == 'cuda':
        torch.set_float32_matmul_precision('high')  # fp32 matmuls (outside bf16 autocast) may use TF32

    # The ledger for this exact run: this device, this world size, the model as it will be built.
    device = live_device(cluster, model_cfg, train)
    dtype = ledger.run_dtype(train, device)  # 'auto': bf16 on a GPU, on a CPU whichever its probe found faster
    fsdp = train.parallel in FSDP_MODES and cluster.world_size > 1
    # autocast: bf16 matmuls, fp32 weights and reductions. FSDP2 gets the same from its MixedPrecisionPolicy.
    autocast = torch.autocast(cluster.device.type, dtype=torch.bfloat16) if dtype == 'bfloat16' and not fsdp \
        else contextlib.nullcontext()
    if train.gpu.lower() not in ('auto', device.name.lower()):
        log(cluster, f"the config plans for gpu={train.gpu} (`python ledger.py {config_path}` prints that bill); "
                     f"this run is on {device.name}: the live ledger predicts for it")
    billed = dataclasses.replace(train, train_tokens=train.cooldown_tokens, max_steps=0) if cooldown else train
    prediction = ledger.predict(model_cfg, billed, n_gpu=cluster.world_size, device=device)  # a branch: its decay
    held.enter_context(files.disk_errors(train.out_dir, needed_bytes=prediction['data']['checkpoint_bytes']))
    log(cluster, ledger.format_short(prediction, f"{os.path.join(train.out_dir, 'ledger.md')}, or python ledger.py "
                                                 f"{config_path}"))
    memory = prediction['memory']
    if not memory['fits'] and not force:
        raise ConfigError(f"the ledger predicts {memory['total'] / 2**30:.1f} GiB per process but {device.name} has "
                          f"{memory['gpu_memory'] / 2**30:.1f} GiB for it: lower micro_batch, set recompute=True or "
                          f"parallel=fsdp, or pass --force to start anyway")
    attention = sdpa_backend(model_cfg, cluster.device, dtype)
    log(cluster, f"attention: SDPA runs {attention} for {model_cfg.block_size} tokens in {dtype}"
                 + (': it keeps T x T scores per head, more than the ledger counts (it assumes a flash-type kernel)'
                    if attention == 'math' else ''))
    log(cluster, f"precision: {dtype} compute" + (' (the faster on this CPU, measured)' if train.dtype == 'auto' and
                                                   cluster.device.type == 'cpu' else '')
                 + ", fp32 weights, gradients and AdamW states")
    if objective is not objectives.CLM:
        log(cluster, f"objective: {train.objective}: about {prediction['data']['loss_fraction']:.0%} of the positions "
                     f"carry loss (the others' targets are {objectives.IGNORE_INDEX}: given, not predicted); tokens/s "
                     f"and MFU count every position; the val loss is plain next-token prediction on every position")

    model, raw_model = build_model(model_cfg, train, cluster, dtype)
    built = sum(p.numel() for p in raw_model.parameters())  # DTensor.numel() is the full size: sharding-proof
    if built != prediction['params']['total']:
        raise TrainingStopped(f"the ledger counts {prediction['params']['total']:,} parameters but the built model "
                              f"has {built:,}: ledger.count_params and model.py disagree (run test_model.py)")
    optimizer = build_optimizer(model, train, cluster)
    run = Run(model_cfg, train, cluster, autocast, stream, model, raw_model, optimizer,
              params=[p for p in model.parameters() if p.requires_grad], micro_step_tokens=micro_step_tokens,
              total_steps=total_steps, stop_step=stop_step, val=val, meta=meta, last_checkpoint=resume_from,
              metrics=Metrics(cluster, train, prediction, built, append=bool(resume_from),
                              bytes_per_token=meta.get('bytes_per_token') if meta else None),
              cooldown=cooldown, branch_points=points, argv=list(argv), objective=objective)
    start_from = resume_from or train.cooldown_from  # a branch starts from the main run's checkpoint
    if start_from:
        saved = checkpoint.load(start_from, model, optimizer)
        run.state = RunState(**saved['run'])
        log(cluster, f"{'resumed' if resume_from else 'branched'} from {start_from}: step {run.state.step}, "
                     f"{run.state.tokens_seen:,} tokens, data position {run.state.position:,} sequences (written by "
                     f"{saved['world_size']} process(es), read by {cluster.world_size}: the position is global, the "
                     f"stream continues where it stopped)")
    if cooldown and not resume_from:
        log(cluster, f"cooldown: the LR falls linearly from {train.lr:.3g} to {train.lr * train.min_lr_ratio:.3g} over "
                     f"steps {cooldown[0] + 1:,} to {end_step:,} ({train.cooldown_tokens:,} tokens; the ledger above "
                     f"bills these), to {run.state.tokens_seen + train.cooldown_tokens:,} tokens seen; out_dir "
                     f"{train.out_dir}")
    if not resume_from:  # something to roll back to in this run's own folder: step 0, or where the branch starts
        save_checkpoint(run)
    if (train.sample_tokens or train.hellaswag_every) and meta:
        run.tokenizer = prepare.load_tokenizer(train.data)
    if train.hellaswag_every:
        if run.tokenizer is None:
            raise ConfigError('hellaswag_every needs text: a data folder made by prepare.py, not synthetic tokens')
        run.hellaswag = hellaswag.hellaswag_items(world_size=cluster.world_size)[:train.hellaswag_items or None]
    log(cluster, f"training: {total_steps:,} steps planned for {train.train_tokens:,} tokens, this run stops at "
                 f"step {stop_step:,}; global batch {train.batch_tokens:,} tokens = {train.micro_batch} sequences x "
                 f"{model_cfg.block_size} tokens x {cluster.world_size} process(es) x "
                 f"{train.batch_tokens // micro_step_tokens} accumulation steps; "
                 f"parallel={train.parallel if cluster.world_size > 1 else 'none (1 process)'}")
    return run


def save_checkpoint(run):
    train_state = {'run': dataclasses.asdict(run.state), 'model_config': dataclasses.asdict(run.model_cfg),
                   'train_config': dataclasses.asdict(run.train)}
    run.last_checkpoint = checkpoint.save(run.train.out_dir, run.state.step, run.model, run.optimizer, train_state,
                                          keep=run.train.keep_ckpts)
    if run.state.step in run.branch_points:
        keep_branch_point(run)


def train_step(run):
    """One optimizer step: accumulate gradients over micro-steps, clip, update. Nothing is read back from the
    device: the loss and the gradient norm stay there until the next check point."""
    state, train, cluster = run.state, run.train, run.cluster
    lr = lr_at(state.step, run.total_steps, train, run.cooldown)
    for group in run.optimizer.param_groups:
        group['lr'] = lr
    batch_tokens = batch_tokens_at(state.tokens_seen, train, run.micro_step_tokens)
    accumulation = batch_tokens // run.micro_step_tokens
    loss_sum = torch.zeros((), device=cluster.device)
    for micro_step in range(accumulation):
        x, y = micro_batch_arrays(run.stream, state.position, micro_step, cluster, train.micro_batch, run.objective)
        x, y = to_device(x, cluster.device), to_device(y, cluster.device)
        # DDP all-reduces gradients on every backward unless told not to: only the last micro-step syncs.
        # (FSDP2 reduce-scatters every micro-step and accumulates sharded gradients, keeping its memory low.)
        last = micro_step == accumulation - 1
        with run.model.no_sync() if hasattr(run.model, 'no_sync') and not last else contextlib.nullcontext():
            with run.autocast:
                _, loss = run.model(x, y)  # training gets no logits back: none stay alive into the next forward
            (loss / accumulation).backward()  # the step's mean over micro-batches (DDP/FSDP also average ranks)
        loss_sum += loss.detach()
    grad_norm = clip_gradients(run.params, train.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    state.position += accumulation * cluster.world_size * train.micro_batch
    state.tokens_seen += batch_tokens
    state.step += 1
    return StepResult(state.step, loss_sum / accumulation, grad_norm, state.position, lr, batch_tokens)


@torch.no_grad()
def evaluate(run):
    """Mean loss over the fixed val sequences. Rank r takes the r-th of world_size equal slices (all ranks run
    the same number of forwards, which FSDP's collectives need); the sums are reduced over the ranks."""
    val, cluster, micro_batch = run.val, run.cluster, run.train.micro_batch
    run.model.eval()
    per_rank = len(val) // cluster.world_size
    if per_rank >= micro_batch:  # whole micro-batches only: one more shape would mean one more compile
        per_rank -= per_rank % micro_batch
    mine = val[cluster.rank * per_rank:(cluster.rank + 1) * per_rank] if per_rank else val[:1]
    totals = torch.zeros(2, device=cluster.device, dtype=torch.float64)
    for i in range(0, len(mine), micro_batch):
        chunk = mine[i:i + micro_batch]
        x = to_device(np.ascontiguousarray(chunk[:, :-1]), cluster.device)
        y = to_device(np.ascontiguousarray(chunk[:, 1:]), cluster.device)
        with run.autocast:
            _, loss = run.model(x, y)
        totals[0] += loss.double() * len(chunk)
        totals[1] += len(chunk)
    run.model.train()
    if cluster.world_size > 1:
        dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


@torch.no_grad()
def sample_text(run):
    """A short text from the end-of-text token (a document start), temperature 0.8, top-k 200 (nanoGPT's
    defaults). Under FSDP every rank must run the forwards (they gather weights together). Eager mode: generation
    changes the sequence length every token, which would recompile a compiled model each time."""
    cluster, train = run.cluster, run.train
    every_rank = train.parallel in FSDP_MODES and cluster.world_size > 1
    if not (every_rank or cluster.is_master):
        return None
    devices = [cluster.device] if cluster.device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices), torch.compiler.set_stance('force_eager'), run.autocast:
        torch.manual_seed(train.seed + run.state.step)  # the same on every rank, so FSDP ranks stay in step
        start = torch.full((1, 1), run.meta['eot_id'], dtype=torch.long, device=cluster.device)
        run.raw_model.eval()
        tokens = run.raw_model.generate(start, train.sample_tokens, temperature=0.8, top_k=200)
        run.raw_model.train()
    return run.tokenizer.decode(tokens[0, 1:].tolist())


def find_spike(pending, values, window, train):
    """Walk the checked steps in order. The first whose loss is not finite, or above mean + spike_factor x std of
    the window of recent good losses (std floored at spike_min_std x mean), is a spike: -> (its StepResult, loss,
    why). The good ones before it join the window (kept in checkpoints: resume decides alike)."""
    for result, (loss, _) in zip(pending, values):
        if not math.isfinite(loss):
            return result, loss, 'not finite'
        if len(window) >= train.spike_window:
            mean = statistics.fmean(window)
            std = max(statistics.pstdev(window), train.spike_min_std * mean)
            if loss > mean + train.spike_factor * std:
                return result, loss, f'> mean {mean:.4f} + {train.spike_factor} x std {std:.4f}'
        window.append(loss)
        del window[:-train.spike_window]
    return None


def roll_back(run, spike):
    """The book's rule (PaLM's rewind and skip): back to the last good checkpoint, and skip the data from there to
    the end of the spiking step, so the batches that led into the spike are not seen again."""
    result, loss, why = spike
    train, rollbacks = run.train, run.state.rollbacks + 1
    if rollbacks > train.max_rollbacks:
        raise TrainingStopped(f"loss spike at step {result.step} (loss {loss:.4f} {why}) after {run.state.rollbacks} "
                              f"rollbacks (max_rollbacks): the run is unstable; lower lr, check the data, or raise "
                              f"max_rollbacks")
    saved = checkpoint.load(run.last_checkpoint, run.model, run.optimizer)
    run.state = RunState(**saved['run'])
    skipped = [run.state.position, result.position]
    run.state.rollbacks, run.state.position = rollbacks, result.position
    run.state.skipped.append(skipped)
    log(run.cluster, f"step {result.step}: loss spike (loss {loss:.4f} {why}): rollback {rollbacks}/"
                     f"{train.max_rollbacks} to {os.path.basename(run.last_checkpoint)}, skipping sequences "
                     f"[{skipped[0]:,}, {skipped[1]:,}) of the data stream")
    run.metrics.record({'event': 'rollback', 'step': result.step, 'loss': loss, 'to_step': run.state.step,
                        'skipped': skipped, 'rollbacks': rollbacks})
    run.metrics.restart()


def check_point(run, pending, due):
    """Read back the pending steps' losses and norms (the only host-device sync), guard against spikes, then log,
    eval, checkpoint and sample as due."""
    state, train = run.state, run.train
    values = reduce_mean(torch.stack([torch.stack((r.loss, r.grad_norm.float())) for r in pending]), run.cluster)
    values = values.tolist()
    spike = find_spike(pending, values, state.loss_window, train)
    if spike:
        return roll_back(run, spike)
    last, (loss, grad_norm) = pending[-1], values[-1]
    if due.log:
        shown_end = run.stop_step if run.cooldown else run.total_steps  # a branch's own end, not the main run's
        run.metrics.log_step(last, shown_end, state.tokens_seen, loss, grad_norm)
    if due.hellaswag:
        with torch.compiler.set_stance('force_eager'):  # rows of every length: no recompiles
            accuracy, stderr, items = hellaswag.hellaswag_accuracy(run.raw_model, run.tokenizer, run.hellaswag,
                                                                   run.cluster.device, run.autocast, run.cluster.rank,
                                                                   run.cluster.world_size)
        run.metrics.record({'step': state.step, 'tokens': state.tokens_seen, 'hellaswag': accuracy,
                            'hellaswag_stderr': stderr, 'hellaswag_items': items})
        log(run.cluster, f"step {state.step}: HellaSwag {accuracy:.2%} +- {stderr:.2%} over {items:,} items "
                         f"(chance: 25%)")
    if due.eval:
        val_loss = evaluate(run)
        val_bpb = ledger.bits_per_byte(val_loss, run.metrics.bytes_per_token)
        run.metrics.record({'step': state.step, 'tokens': state.tokens_seen, 'val_loss': val_loss, 'val_bpb': val_bpb})
        log(run.cluster, f"step {state.step}: val loss {val_loss:.4f}"
                         + (f", {val_bpb:.4f} bits per byte" if val_bpb is not None else ''))
        run.metrics.write_summary(state.step, state.tokens_seen, val_loss)
    if due.checkpoint:
        save_checkpoint(run)
    if due.sample and state.step < run.stop_step:
        log(run.cluster, f"step {state.step} sample:\n{sample_text(run)}")


class Stop:
    """SIGINT and SIGTERM (a cluster scheduler's preemption is a SIGTERM; torchrun passes both on to every rank) end
    the run cleanly: the current step finishes, a checkpoint is written, one line gives the command that resumes,
    and the exit code is 128 + the signal's number. The same signal again exits at once (a checkpoint being written
    then stays a tmp_ folder that nothing reads). The ranks agree on the step to stop after with a one-number
    all-reduce on the host each step (a gloo group: no device sync), so none waits in a collective for another."""

    def __init__(self, cluster):
        self.signal, self.group, self.world_size = None, None, cluster.world_size
        if cluster.world_size > 1:  # every rank creates the group at the same point (a collective)
            self.group = dist.new_group(backend='gloo') if cluster.device.type == 'cuda' else dist.group.WORLD
        self.previous = {s: signal.signal(s, self.receive) for s in (signal.SIGINT, signal.SIGTERM)}

    def receive(self, signum, frame):
        name = signal.Signals(signum).name
        if signum == self.signal:
            print(f"{name} again: exiting now, without a checkpoint of the steps since the last one", file=sys.stderr,
                  flush=True)
            os._exit(128 + signum)
        if self.signal is None:
            self.signal = signum
            if int(os.environ.get('RANK', 0)) == 0:
                print(f"{name}: finishing this step, then a checkpoint ({name} again exits at once)", file=sys.stderr,
                      flush=True)

    def agreed(self):
        """The signal number any rank has received, else 0: every rank gets the same answer after the same step."""
        if self.world_size == 1:
            return self.signal or 0
        flag = torch.tensor([self.signal or 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag)

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def train_command(argv, cluster, drop, *flags):
    """The command that runs train.py again, on this world size: argv less the flags named in drop (--key and
    --key=...), plus flags. With drop {'--resume'} and the flag --resume, the command that continues this run."""
    args = [a for a in argv if a.split('=', 1)[0] not in drop] + list(flags)
    if cluster.world_size == 1:
        return shlex.join(['python', 'train.py'] + args)
    nodes = cluster.world_size // int(os.environ.get('LOCAL_WORLD_SIZE', cluster.world_size))
    launcher = f"torchrun --nproc_per_node={cluster.world_size // nodes}" + (
        f" --nnodes={nodes} (and the rendezvous options you started with)" if nodes > 1 else '')
    return f"{launcher} {shlex.join(['train.py'] + args)}"


@dataclasses.dataclass
class Due:
    log: bool
    eval: bool
    checkpoint: bool
    sample: bool
    hellaswag: bool = False

    @classmethod
    def at(cls, run, stopping=False):
        """What the step just done calls for; stopping (a signal): log it and checkpoint it, nothing else."""
        step, train, done = run.state.step, run.train, run.state.step == run.stop_step
        if stopping:
            return cls(log=True, eval=False, checkpoint=checkpoint.step_of(run.last_checkpoint) != step, sample=False)
        return cls(log=step % train.log_every == 0 or done, eval=step % train.eval_every == 0 or done,
                   checkpoint=step % train.ckpt_every == 0 or done or step in run.branch_points,
                   sample=bool(train.sample_every and step % train.sample_every == 0 and run.tokenizer),
                   hellaswag=bool(train.hellaswag_every and (step % train.hellaswag_every == 0 or done)))

    def any(self):
        return self.log or self.eval or self.checkpoint or self.sample or self.hellaswag


def loop(run):
    """The training loop: steps until stop_step, a check point when one is due, a clean stop on a signal."""
    stop = Stop(run.cluster)  # from here SIGINT and SIGTERM end the run with a checkpoint
    try:
        gc.collect()
        gc.freeze()  # the start-up objects will live all run: keep the collector from scanning them again
        pending = []  # the steps not read back yet: their losses and norms are still on the device
        chinchilla = run.metrics.prediction['data']['chinchilla_tokens']  # 20 x P
        run.metrics.start_clock()
        while run.state.step < run.stop_step:
            pending.append(train_step(run))
            run.metrics.interval_tokens += pending[-1].batch_tokens
            if run.state.tokens_seen >= chinchilla > run.state.tokens_seen - pending[-1].batch_tokens:
                log(run.cluster, f"step {run.state.step}: {run.state.tokens_seen:,} tokens seen passes the "
                                 f"Chinchilla point 20 x P = {chinchilla:,} (compute-optimal for this model): from "
                                 f"here it over-trains")
            stopping = stop.agreed()
            due = Due.at(run, stopping)
            if not due.any():
                continue  # the hot path: nothing read back from the device
            run.metrics.stop_clock()
            check_point(run, pending, due)
            pending = []
            if stopping:
                run.metrics.write_summary(run.state.step, run.state.tokens_seen)
                barrier(run.cluster)
                if run.cluster.is_master:
                    print(f"stopped by {signal.Signals(stopping).name} after step {run.state.step}: checkpoint "
                          f"{run.last_checkpoint} is complete; resume with: "
                          f"{train_command(run.argv, run.cluster, {'--resume'}, '--resume')}",
                          file=sys.stderr, flush=True)
                return 128 + stopping
            run.metrics.start_clock()
        run.metrics.stop_clock()
        if run.tokenizer is not None:
            log(run.cluster, f"sample after {run.state.step} steps:\n{sample_text(run)}")
        log(run.cluster, f"done: {run.state.step} steps, {run.state.tokens_seen:,} tokens; {run.train.out_dir}/"
                         f"report.md has the predicted-vs-measured table")
        barrier(run.cluster)  # no rank tears the process group down while another still talks to it (gloo aborts)
        return 0
    finally:
        stop.restore()


@cli
def main(argv):
    run = None
    try:
        with contextlib.ExitStack() as held:  # rank 0's lock on out_dir; a full disk there as one line
            run = setup(argv, held)
            return 0 if run is None else loop(run)
    finally:
        # The model, its DDP reducer and the optimizer go first, while the process group and the interpreter are
        # whole: gloo work left to the interpreter's teardown can abort the process (pytorch/pytorch#179291).
        del run
        gc.unfreeze()
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == '__main__':
    sys.exit(main())
