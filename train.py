"""
train.py: pretrain a GPT-2 or Llama model from a config file, on one CPU or on many GPUs.

    python train.py configs/pystdlib_cpu.py                            # a small Llama on the CPU, minutes
    torchrun --nproc_per_node=1 train.py configs/h200_1b3.py           # the book's 1.3B run on one H200
    torchrun --standalone --nproc_per_node=8 train.py configs/h100x8_1b3.py
    python train.py CONFIG --max_steps=100 --lr=3e-4 --resume          # overrides, then continue from ckpt/LATEST

Flags besides --key=value: --resume (continue from out_dir/ckpt/LATEST), --resume=PATH (from that checkpoint
folder), --force (start even when the ledger predicts the run does not fit in the device's memory).

The file reads in the order a run happens:
  1. arguments and config          5. model, parallelism (ddp, zero1, zero2, fsdp), optimizer
  2. processes and devices         6. checkpoints (atomic, resumable bit-exactly, rollback target)
  3. batch arithmetic, LR schedule 7. the live ledger (predicted before step 1, measured on log steps)
  4. data (shards or synthetic)    8. the loop: accumulate, clip, step, spike guard, log, eval, checkpoint
Outputs in out_dir: metrics.jsonl, ledger.json, report.md, ckpt/step_NNNNNNN/ and ckpt/LATEST.
"""
import contextlib
import dataclasses
import gc
import json
import math
import os
import random
import resource
import shutil
import statistics
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import ledger
import prepare
from ledger import ConfigError
from model import GPT
from prepare import DataError

USAGE = "usage: python train.py CONFIG [--key=value ...] [--resume[=CKPT_DIR]] [--force]"


class TrainingStopped(RuntimeError):
    """The run cannot go on (too many loss spikes, the ledger and the model disagree): one line, exit 1."""


# -----------------------------------------------------------------------------------------------------
# 1. Arguments and config. The config file and --key=value overrides go through ledger.load_config, the same
# loader ledger.py and sample.py use, so a key means one thing everywhere.

def parse_args(argv):
    """argv -> (config path, overrides, resume, force); resume is False, True (the latest) or a checkpoint folder."""
    config_path, overrides, resume, force = None, [], False, False
    for arg in argv:
        if arg == '--resume':
            resume = True
        elif arg.startswith('--resume='):
            resume = arg.split('=', 1)[1]
        elif arg == '--force':
            force = True
        elif arg.startswith('--'):
            overrides.append(arg)
        elif config_path is None:
            config_path = arg
        else:
            raise ConfigError(f"unexpected argument '{arg}': {USAGE}")
    if config_path is None:
        raise ConfigError(f"no config file given: {USAGE}")
    return config_path, overrides, resume, force


# -----------------------------------------------------------------------------------------------------
# 2. Processes and devices. torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (one process per GPU, any number of
# nodes); a plain `python train.py` is rank 0 of 1. CUDA when present (NCCL between GPUs), else CPU (gloo).
# A world of one needs no process group and no wrapper, whatever `parallel` says.

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


# -----------------------------------------------------------------------------------------------------
# 3. Batch arithmetic and the LR schedule (BOOK, training recipe).
# One micro-step is a forward/backward of micro_batch sequences of block_size tokens on every rank, so it covers
# micro_batch x block_size x world_size tokens; gradient accumulation repeats it until batch_tokens, the global
# batch, is reached. The global batch is fixed by the config: more ranks means fewer micro-steps, not a bigger batch.

def micro_step_tokens(model_cfg, train, world_size):
    tokens = train.micro_batch * model_cfg.block_size * world_size
    if train.batch_tokens % tokens:
        raise ConfigError(
            f"batch_tokens ({train.batch_tokens:,}) is not a multiple of micro_batch x block_size x world size "
            f"= {train.micro_batch} x {model_cfg.block_size} x {world_size} = {tokens:,}: change batch_tokens, "
            f"micro_batch or the number of processes")
    return tokens


def batch_tokens_at(tokens_seen, train, step_tokens):
    """The global batch for the next step. GPT-3 style ramp: linear in tokens seen from batch_ramp_start to
    batch_tokens over the first batch_ramp_tokens, rounded down to whole micro-steps (GPT-3 went 32K -> 3.2M
    tokens over its first 4-12B tokens). A small early batch is enough while the gradient is large and coherent."""
    if train.batch_ramp_tokens <= 0 or tokens_seen >= train.batch_ramp_tokens:
        return train.batch_tokens
    start, full = train.batch_ramp_start, train.batch_tokens
    ramped = start + (full - start) * tokens_seen / train.batch_ramp_tokens
    return max(step_tokens, int(ramped) // step_tokens * step_tokens)


def planned_steps(train, step_tokens):
    """Optimizer steps to see train_tokens: the length the schedule spans (max_steps may stop the run earlier)."""
    steps, tokens = 0, 0
    while tokens < min(train.train_tokens, train.batch_ramp_tokens):  # the ramp, step by step (thousands at most)
        tokens += batch_tokens_at(tokens, train, step_tokens)
        steps += 1
    return steps + max(0, math.ceil((train.train_tokens - tokens) / train.batch_tokens))


def lr_at(step, total_steps, train):
    """LR for 0-based step `step` of `total_steps`. Linear warmup over warmup_frac of the steps (the book: 0.1-0.5%)
    from lr/warmup to the peak at step warmup-1; then either cosine decay (GPT-3, LLaMA) or warmup-stable-decay
    (constant, then a linear decay over the last decay_frac of the steps), both ending at min_lr_ratio x peak (10%)
    on the last step."""
    warmup = max(1, round(train.warmup_frac * total_steps))
    peak, floor = train.lr, train.lr * train.min_lr_ratio
    if step < warmup:
        return peak * (step + 1) / warmup
    if train.schedule == 'wsd':
        decay = max(1, round(train.decay_frac * total_steps))
        decay_start = total_steps - decay  # the first decayed step; the last step reaches the floor
        if step < decay_start:
            return peak
        return peak + (floor - peak) * min(1.0, (step - decay_start + 1) / decay)
    progress = min(1.0, (step - warmup + 1) / max(1, total_steps - warmup))  # 1.0 on the last step
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# -----------------------------------------------------------------------------------------------------
# 4. Data. Shards come from prepare.py (llm.c format, read through prepare's reader). A training example is a
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
        tokenizer = 'gpt2' if 50257 <= model_cfg.vocab_size <= 50304 else f'bpe:{model_cfg.vocab_size}'
        raise DataError(
            f"vocab mismatch: {train.data} was tokenized with {meta['tokenizer']} ({data_vocab} tokens) but the "
            f"model has vocab_size={model_cfg.vocab_size}: set vocab_size = {padded_vocab(data_vocab)}, or prepare "
            f"data with the model's tokenizer: python prepare.py {meta['source']} --tokenizer {tokenizer} --out DIR")
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


def micro_batch_arrays(stream, position, micro_step, cluster, micro_batch):
    """Rank r's inputs and targets for micro-step m of the step that starts at stream `position`. The step's
    sequences are position .. position + accum x world x micro_batch - 1; micro-step m, rank r takes the slice
    (m x world + r) x micro_batch of length micro_batch. So the ranks' slices are disjoint and together are
    exactly what one process with world x the accumulation reads (test_distributed.py checks it)."""
    first = position + (micro_step * cluster.world_size + cluster.rank) * micro_batch
    sequences = stream.batch(first, micro_batch)
    return np.ascontiguousarray(sequences[:, :-1]), np.ascontiguousarray(sequences[:, 1:])


def to_device(array, device):
    tensor = torch.from_numpy(array)
    if device.type == 'cuda':  # pinned host memory lets the copy run asynchronously with the GPU's work
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


# -----------------------------------------------------------------------------------------------------
# 5. Model, parallelism, optimizer.
# The model is built on the meta device (no memory, no init) then materialised on the device and initialised
# from the seed: the same weights on every rank, whatever the world size, which is what makes 2 ranks train like
# 1 (it needs the full fp32 model on each device for a moment: fine up to ~30B on 80 GB GPUs).

FSDP_MODES = ('zero2', 'fsdp')  # the modes built on FSDP2's fully_shard; checkpoints go through DCP


def precision(train, device):
    """-> bfloat16 or float32 compute dtype. Weights, grads and Adam state stay fp32 either way (the book's mixed
    precision: bf16 forward/backward, fp32 master weights). 'auto' is bf16 on CUDA and fp32 on the CPU, where
    bf16 matmuls are slower than fp32 on most chips."""
    if train.dtype == 'auto':
        return torch.bfloat16 if device.type == 'cuda' else torch.float32
    return torch.bfloat16 if train.dtype == 'bfloat16' else torch.float32


def build_model(model_cfg, train, cluster, compute_dtype):
    """-> (model to call, raw GPT). Under FSDP the raw GPT is the sharded root itself."""
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
        # broadcast_buffers=False: the only buffers are the RoPE tables, constants that every rank computes itself
        return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False), model
    # FSDP2: shard each block, then the root (embeddings, final norm, lm_head). ZeRO-3 ('fsdp') frees each block's
    # gathered weights after its forward and gathers them again for backward; ZeRO-2 ('zero2') keeps them from
    # forward to backward, so only gradients and optimizer states stay sharded (the ledger's 2P + 14P/N).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(cluster.device.type, (cluster.world_size,))
    mp_policy = MixedPrecisionPolicy()  # fp32 everywhere
    if compute_dtype == torch.bfloat16:  # bf16 weights for the matmuls, gradients reduced in fp32
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = train.parallel == 'fsdp'
    for block in model.blocks:
        if train.compile:
            block.compile()  # per block, in place, as torchtune does under FSDP2: the blocks share one graph
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    return model, model


def build_optimizer(model, train, cluster):
    """AdamW (betas 0.9/0.95, eps 1e-8: the book's recipe). Weight decay only on matrices (Linear weights and the
    embedding): decaying gains and biases pulls them to zero for no benefit. Fused kernel on CUDA. ZeRO-1 shards
    the AdamW states (12P bytes of fp32 master, momentum, variance) over the ranks."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': train.weight_decay},
              {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
    kwargs = dict(lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps)
    if cluster.device.type == 'cuda':
        kwargs['fused'] = True
    if train.parallel == 'zero1' and cluster.world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kwargs)
    return torch.optim.AdamW(groups, **kwargs)


def clip_gradients(params, max_norm):
    """Scale all gradients so their global L2 norm is at most max_norm (1.0). Under FSDP the gradients are
    DTensor shards: the norm of the shards is a partial sum that full_tensor() reduces over the ranks (as
    torchtitan does). Returns the norm before clipping, on the device (reading it would sync)."""
    from torch.distributed.tensor import DTensor
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


# -----------------------------------------------------------------------------------------------------
# 6. Checkpoints: out_dir/ckpt/step_NNNNNNN/, written to tmp_step_NNNNNNN/ and renamed once complete, then the
# LATEST pointer is replaced (also by rename). A process killed mid-write leaves a tmp_ folder that nothing reads,
# and LATEST still names the previous complete checkpoint. Two formats, by parallel mode:
#   ddp, zero1:  rank 0 writes model.pt and optimizer.pt, full tensors (ZeRO-1 first gathers its shards to rank 0)
#   zero2, fsdp: torch.distributed.checkpoint (DCP): every rank writes its own shards; loading reshards them to
#                whatever world size reads them
# and in both, train_state.pt: step, tokens seen, data position, spike-guard window, RNG states of every rank,
# and the config. Resuming on another world size: the weights load as above; the data position is global (see
# section 4), so the stream continues at the same sequence and the global batch is unchanged.

@dataclasses.dataclass
class RunState:
    step: int = 0               # optimizer steps done
    tokens_seen: int = 0        # tokens trained on (skipped data not counted)
    position: int = 0           # sequences of the train stream consumed, by all ranks together
    rollbacks: int = 0
    loss_window: list = dataclasses.field(default_factory=list)  # recent good losses, for the spike guard
    skipped: list = dataclasses.field(default_factory=list)      # [first, end) sequence ranges skipped after spikes


def checkpoint_root(train):
    return os.path.join(train.out_dir, 'ckpt')


def complete_checkpoints(train):
    root = checkpoint_root(train)
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if d.startswith('step_'))


def latest_checkpoint(train):
    """The folder LATEST names, else the newest complete step_ folder, else None."""
    pointer = os.path.join(checkpoint_root(train), 'LATEST')
    if os.path.isfile(pointer):
        with open(pointer) as f:
            path = os.path.join(checkpoint_root(train), f.read().strip())
        if os.path.isdir(path):
            return path
    found = complete_checkpoints(train)
    return found[-1] if found else None


def rng_states(cluster):
    state = {'python': random.getstate(), 'numpy': np.random.get_state(), 'torch': torch.get_rng_state()}
    if cluster.device.type == 'cuda':
        state['cuda'] = torch.cuda.get_rng_state(cluster.device)
    if cluster.world_size == 1:
        return [state]
    gathered = [None] * cluster.world_size
    dist.all_gather_object(gathered, state)
    return gathered


def dcp_state(model, optimizer, with_optimizer=True):
    """The sharded state dicts DCP saves and loads. An optimizer that has not stepped yet has no state, and
    get_state_dict would create one with a zero-lr step (AdamW's step count becomes 1, changing its bias
    correction): so the step-0 checkpoint holds the model alone."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
    if not with_optimizer:
        return {'model': get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {'model': model_state, 'optimizer': optimizer_state}


@contextlib.contextmanager
def quiet_single_process_dcp():
    with warnings.catch_warnings():  # DCP in one process warns that it assumes one process: that is the intent
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')
        yield


def save_checkpoint(state, model, raw_model, optimizer, model_cfg, train, cluster):
    """Write step_NNNNNNN (every rank takes part) and return its path."""
    import torch.distributed.checkpoint as dcp
    root = checkpoint_root(train)
    name = f'step_{state.step:07d}'
    final, tmp = os.path.join(root, name), os.path.join(root, 'tmp_' + name)
    if cluster.is_master:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    barrier(cluster)
    if train.parallel in FSDP_MODES:
        with quiet_single_process_dcp():
            dcp.save(dcp_state(model, optimizer, with_optimizer=state.step > 0), checkpoint_id=tmp)
    else:
        if hasattr(optimizer, 'consolidate_state_dict'):  # ZeRO-1: every rank sends its shard of the states
            optimizer.consolidate_state_dict(to=0)
        if cluster.is_master:
            torch.save(raw_model.state_dict(), os.path.join(tmp, 'model.pt'))
            torch.save(optimizer.state_dict(), os.path.join(tmp, 'optimizer.pt'))
    rngs = rng_states(cluster)
    if cluster.is_master:
        torch.save({'run': dataclasses.asdict(state), 'rng': rngs, 'world_size': cluster.world_size,
                    'model_config': dataclasses.asdict(model_cfg), 'train_config': dataclasses.asdict(train)},
                   os.path.join(tmp, 'train_state.pt'))
        if os.path.isdir(final):  # the same step written again (after a rollback): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        prepare.write_text_atomic(os.path.join(root, 'LATEST'), name + '\n')
        # keep the last keep_ckpts up to this one; newer ones (left by a run this one resumed from an earlier
        # checkpoint) stay until this run writes their steps again
        for old in [c for c in complete_checkpoints(train) if c <= final][:-train.keep_ckpts]:
            shutil.rmtree(old)
        for leftover in os.listdir(root):  # tmp_ folders of writes that were killed
            if leftover.startswith('tmp_'):
                shutil.rmtree(os.path.join(root, leftover))
    barrier(cluster)
    return final


def load_checkpoint(path, model, raw_model, optimizer, model_cfg, train, cluster):
    """Restore model, optimizer and RNG states in place; return the RunState."""
    import torch.distributed.checkpoint as dcp
    # train_state.pt is ours (python and numpy RNG states are not plain tensors): a full unpickle is intended.
    saved = torch.load(os.path.join(path, 'train_state.pt'), weights_only=False)
    if saved['model_config'] != dataclasses.asdict(model_cfg):
        changed = [k for k, v in dataclasses.asdict(model_cfg).items() if saved['model_config'].get(k) != v]
        raise ConfigError(f"{path} was written for another model ({', '.join(changed)} differ): resume with the "
                          f"config it was trained with")
    if saved['train_config']['parallel'] != train.parallel:
        raise ConfigError(f"{path} was written with parallel={saved['train_config']['parallel']}: resume with "
                          f"--parallel={saved['train_config']['parallel']}")
    if train.parallel in FSDP_MODES:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
        with_optimizer = saved['run']['step'] > 0
        state = dcp_state(model, optimizer, with_optimizer)
        with quiet_single_process_dcp():
            dcp.load(state, checkpoint_id=path)
        if with_optimizer:
            set_state_dict(model, optimizer, model_state_dict=state['model'], optim_state_dict=state['optimizer'])
        else:
            set_model_state_dict(model, state['model'])
            optimizer.state.clear()  # as built: AdamW creates its state on the first step
    else:
        raw_model.load_state_dict(torch.load(os.path.join(path, 'model.pt'), map_location=cluster.device))
        # every rank reads the full optimizer state (to the CPU: load_state_dict moves it to the parameters'
        # device); ZeRO-1 keeps its own partition of it
        optimizer.load_state_dict(torch.load(os.path.join(path, 'optimizer.pt'), map_location='cpu'))
    if saved['world_size'] == cluster.world_size:  # RNG streams are per rank; another world size starts fresh ones
        rng = saved['rng'][cluster.rank]
        random.setstate(rng['python'])
        np.random.set_state(rng['numpy'])
        torch.set_rng_state(rng['torch'])
        if 'cuda' in rng and cluster.device.type == 'cuda':
            torch.cuda.set_rng_state(rng['cuda'], cluster.device)
    return RunState(**saved['run']), saved['world_size']


def barrier(cluster):
    if cluster.world_size > 1:
        dist.barrier()


# -----------------------------------------------------------------------------------------------------
# 7. The live ledger: the prediction before step 1, the measurements on log steps, report.md side by side.

def device_memory_bytes(cluster):
    """-> (bytes one process may use, what they are). CUDA: the GPU's memory. CPU: the machine's RAM shared by
    the processes on this node (the ledger's figure assumes bf16 on a GPU, so on the CPU it is a rough guide)."""
    if cluster.device.type == 'cuda':
        props = torch.cuda.get_device_properties(cluster.device)
        return props.total_memory, f'{props.name} memory'
    ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    processes = int(os.environ.get('LOCAL_WORLD_SIZE', 1))
    return ram // processes, f'RAM / {processes} process(es) on this machine'


def device_peak_flops(cluster, train):
    """The peak bf16 FLOP/s MFU divides by: the ledger's GPU whose name appears in the device's name, else the
    config's `gpu`. None on the CPU (no peak in the table: MFU is not reported)."""
    if cluster.device.type != 'cuda':
        return None
    name = torch.cuda.get_device_name(cluster.device).lower()  # e.g. 'NVIDIA H100 80GB HBM3', 'NVIDIA H200 NVL'
    matches = [key for key in ledger.GPUS if key.lower().replace('-', ' ') in name]
    return ledger.GPUS[max(matches, key=len)].peak_flops if matches else ledger.gpu_spec(train.gpu).peak_flops


def peak_memory(cluster):
    """-> (peak allocated, peak reserved) bytes: the CUDA caching allocator's, or the process's peak RSS."""
    if cluster.device.type == 'cuda':
        return torch.cuda.max_memory_allocated(cluster.device), torch.cuda.max_memory_reserved(cluster.device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    return rss, rss


class Metrics:
    """The measured half of the ledger, and rank 0's outputs: ledger.json, metrics.jsonl, report.md, log lines.

    Speed is timed over the steps between log steps, the device synchronised before the clock is read (else it
    times how fast Python queues kernels, not how fast they run), the clock paused around eval, checkpoints and
    samples. The first interval after a start or a rollback holds the compile and warm-up steps: it is logged
    but left out of the run's figures in report.md."""

    def __init__(self, model_cfg, train, cluster, prediction, n_params, append):
        self.cluster, self.prediction, self.out_dir = cluster, prediction, train.out_dir
        # MFU counts the model's matmul FLOPs, 6 N_matmul + 12 L H T per token (PaLM's convention, no recompute)
        self.flops_per_token = ledger.flops_per_token(model_cfg, recompute=train.recompute)['matmul']
        self.peak_flops = device_peak_flops(cluster, train)  # None on the CPU: no MFU
        where = torch.cuda.get_device_name(cluster.device) if cluster.device.type == 'cuda' else \
            f'the CPU ({torch.get_num_threads()} threads per process)'
        self.measured = {'params': n_params, 'device_type': cluster.device.type,
                         'device': f'{cluster.world_size} x {where}, torch {torch.__version__}'}
        self.run_tokens, self.run_seconds = 0, 0.0  # over the intervals after the first
        self.interval_tokens, self.interval_seconds, self.started, self.warmup = 0, 0.0, None, True
        self.metrics_path = os.path.join(train.out_dir, 'metrics.jsonl')
        if cluster.is_master:
            os.makedirs(train.out_dir, exist_ok=True)
            prepare.write_text_atomic(os.path.join(train.out_dir, 'ledger.json'),
                                      json.dumps(prediction, indent=2) + '\n')
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
        if self.peak_flops is None:
            return None
        return self.flops_per_token * tokens_per_s / (self.cluster.world_size * self.peak_flops)

    def record(self, entry):
        """Append one JSON line (on log, eval and rollback steps only: opening the file each time is free)."""
        if self.cluster.is_master:
            with open(self.metrics_path, 'a') as f:
                f.write(json.dumps(entry) + '\n')

    def log_step(self, step, total_steps, tokens_seen, loss, grad_norm, lr, batch_tokens):
        tokens_per_s = self.interval_tokens / self.interval_seconds
        mfu = self.mfu(tokens_per_s)
        days = self.prediction['tokens'] / tokens_per_s / 86400  # the planned tokens at this speed
        allocated, _ = peak_memory(self.cluster)
        self.record({'step': step, 'tokens': tokens_seen, 'loss': loss, 'lr': lr, 'grad_norm': grad_norm,
                     'batch_tokens': batch_tokens, 'tokens_per_s': tokens_per_s, 'mfu': mfu, 'days': days,
                     'peak_memory_bytes': allocated, 'warmup': self.warmup})
        log(self.cluster, f"step {step:>6}/{total_steps} | loss {loss:.4f} | lr {lr:.2e} | norm {grad_norm:.2f} | "
                          f"{tokens_per_s:,.0f} tok/s | MFU {'n/a (CPU)' if mfu is None else f'{mfu:.1%}'} | "
                          f"{days:.2f} days | peak mem {allocated / 2**30:.2f} GiB"
                          + (" | warm-up" if self.warmup else ""))
        if not self.warmup:
            self.run_tokens += self.interval_tokens
            self.run_seconds += self.interval_seconds
            run_speed = self.run_tokens / self.run_seconds
            self.measured.update(tokens_per_s=run_speed, mfu=self.mfu(run_speed),
                                 days=self.prediction['tokens'] / run_speed / 86400)
        self.interval_tokens, self.interval_seconds, self.warmup = 0, 0.0, False

    def write_report(self):
        if self.cluster.is_master:
            self.measured['peak_memory_bytes'], self.measured['peak_reserved_bytes'] = peak_memory(self.cluster)
            prepare.write_text_atomic(os.path.join(self.out_dir, 'report.md'),
                                      ledger.format_comparison(self.prediction, self.measured) + '\n')


# -----------------------------------------------------------------------------------------------------
# 8. The loop.

def reduce_mean(values, cluster):
    """Mean over ranks of a 1-D tensor (gloo has no AVG, so SUM then divide)."""
    if cluster.world_size > 1:
        dist.all_reduce(values)
        values /= cluster.world_size
    return values


@torch.no_grad()
def evaluate(model, val, train, cluster, autocast):
    """Mean loss over the fixed val sequences. Rank r takes the r-th of world_size equal slices (all ranks run
    the same number of forwards, which FSDP's collectives need); the sums are reduced over the ranks."""
    model.eval()
    per_rank = len(val) // cluster.world_size
    if per_rank >= train.micro_batch:  # whole micro-batches only: one more shape would mean one more compile
        per_rank -= per_rank % train.micro_batch
    mine = val[cluster.rank * per_rank:(cluster.rank + 1) * per_rank] if per_rank else val[:1]
    totals = torch.zeros(2, device=cluster.device, dtype=torch.float64)
    for i in range(0, len(mine), train.micro_batch):
        chunk = mine[i:i + train.micro_batch]
        x = to_device(np.ascontiguousarray(chunk[:, :-1]), cluster.device)
        y = to_device(np.ascontiguousarray(chunk[:, 1:]), cluster.device)
        with autocast:
            _, loss = model(x, y)
        totals[0] += loss.double() * len(chunk)
        totals[1] += len(chunk)
    model.train()
    if cluster.world_size > 1:
        dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


@torch.no_grad()
def sample_text(raw_model, tokenizer, meta, train, cluster, autocast, step):
    """A short text from the end-of-text token (a document start), temperature 0.8, top-k 200 (nanoGPT's
    defaults). Under FSDP every rank must run the forwards (they gather weights together). Eager mode: generation
    changes the sequence length every token, which would recompile a compiled model each time."""
    every_rank = train.parallel in FSDP_MODES and cluster.world_size > 1
    if not (every_rank or cluster.is_master):
        return None
    devices = [cluster.device] if cluster.device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices), torch.compiler.set_stance('force_eager'), autocast:
        torch.manual_seed(train.seed + step)  # the same on every rank, so FSDP ranks stay in step
        start = torch.full((1, 1), meta['eot_id'], dtype=torch.long, device=cluster.device)
        raw_model.eval()
        tokens = raw_model.generate(start, train.sample_tokens, temperature=0.8, top_k=200)
        raw_model.train()
    return tokenizer.decode(tokens[0, 1:].tolist())


def find_spike(pending, values, window, train):
    """Walk the checked steps in order. The first whose loss is not finite, or above mean + spike_factor x std of
    the window of recent good losses (std floored at spike_min_std x mean), is a spike: -> (step, loss, data
    position after it, why). The good ones before it join the window (kept in checkpoints: resume decides alike)."""
    for (step, _, _, end), (loss, _) in zip(pending, values):
        if not math.isfinite(loss):
            return step, loss, end, 'not finite'
        if len(window) >= train.spike_window:
            mean = statistics.fmean(window)
            std = max(statistics.pstdev(window), train.spike_min_std * mean)
            if loss > mean + train.spike_factor * std:
                return step, loss, end, f'> mean {mean:.4f} + {train.spike_factor} x std {std:.4f}'
        window.append(loss)
        del window[:-train.spike_window]
    return None


def train_run(argv):
    config_path, overrides, resume, force = parse_args(argv)
    model_cfg, train = ledger.load_config(config_path, overrides)
    cluster = setup_cluster()
    step_tokens = micro_step_tokens(model_cfg, train, cluster.world_size)
    total_steps = planned_steps(train, step_tokens)
    stop_step = min(total_steps, train.max_steps) if train.max_steps else total_steps
    stream, val, meta = open_data(model_cfg, train)
    if meta and not train.dataset_tokens:  # the ledger's "is the dataset big enough" uses the real count
        train = dataclasses.replace(train, dataset_tokens=meta['train_tokens'])

    # Checkpoints already in out_dir: continue them only when asked, never overwrite them silently.
    resume_from = None
    if resume:
        resume_from = resume if isinstance(resume, str) else latest_checkpoint(train)
        if resume_from is None or not os.path.isfile(os.path.join(resume_from, 'train_state.pt')):
            raise ConfigError(f"--resume: no complete checkpoint at {resume_from or checkpoint_root(train)}: run "
                              f"without --resume to start")
    elif complete_checkpoints(train):
        finished = int(os.path.basename(latest_checkpoint(train)).split('_')[1])
        if finished >= stop_step:  # like a rerun of prepare.py on a complete folder: nothing left to do
            log(cluster, f"{train.out_dir}: this run is complete (checkpoint at step {finished:,}, planned "
                         f"{stop_step:,}): nothing to train; delete the folder or set --out_dir to train again")
            return 0
        raise ConfigError(f"{train.out_dir} already holds checkpoints: pass --resume to continue that run, or set "
                          f"--out_dir to another folder")
    join_process_group(cluster)

    torch.manual_seed(train.seed)
    if cluster.device.type == 'cuda':
        torch.set_float32_matmul_precision('high')  # fp32 matmuls (outside bf16 autocast) may use TF32
    compute_dtype = precision(train, cluster.device)
    use_fsdp = train.parallel in FSDP_MODES and cluster.world_size > 1
    # autocast: bf16 matmuls, fp32 weights and reductions. FSDP2 gets the same from its MixedPrecisionPolicy.
    autocast = (torch.autocast(cluster.device.type, dtype=torch.bfloat16)
                if compute_dtype == torch.bfloat16 and not use_fsdp else contextlib.nullcontext())

    # The ledger for this exact run: the model as built, this world size.
    prediction = ledger.predict(model_cfg, train, n_gpu=cluster.world_size)
    log(cluster, ledger.format_report(prediction))
    predicted_memory = prediction['memory_per_gpu_bytes']
    available, what = device_memory_bytes(cluster)
    log(cluster, f"memory: predicted {predicted_memory / 2**30:.2f} GiB per process, {what}: "
                 f"{available / 2**30:.2f} GiB")
    if predicted_memory > available and not force:
        raise ConfigError(f"the ledger predicts {predicted_memory / 2**30:.1f} GiB per process but {what} is "
                          f"{available / 2**30:.1f} GiB: lower micro_batch, set recompute=True or parallel=fsdp, "
                          f"or pass --force to start anyway")
    cpu_note = ' (on the CPU: bf16 matmuls are slower than fp32 on most chips)' if cluster.device.type == 'cpu' else ''
    log(cluster, f"precision: {'bfloat16' if compute_dtype == torch.bfloat16 else 'float32'} compute{cpu_note}, "
                 f"fp32 weights, gradients and AdamW states")
    model, raw_model = build_model(model_cfg, train, cluster, compute_dtype)
    n_params = ledger.count_params(model_cfg)['total']
    built = sum(p.numel() for p in raw_model.parameters())  # DTensor.numel() is the full size: sharding-proof
    if built != n_params:
        raise TrainingStopped(f"the ledger counts {n_params:,} parameters but the built model has {built:,}: "
                              f"ledger.count_params and model.py disagree (run test_model.py)")
    optimizer = build_optimizer(model, train, cluster)
    params = [p for p in model.parameters() if p.requires_grad]  # once: no per-step walk over the modules
    chinchilla_tokens = 20 * n_params

    state = RunState()
    if resume_from:
        state, saved_world = load_checkpoint(resume_from, model, raw_model, optimizer, model_cfg, train, cluster)
        log(cluster, f"resumed from {resume_from}: step {state.step}, {state.tokens_seen:,} tokens, data position "
                     f"{state.position:,} sequences (written by {saved_world} process(es), read by "
                     f"{cluster.world_size}: the position is global, the stream continues where it stopped)")
        last_checkpoint = resume_from
    else:  # step 0: something to roll back to before the first periodic checkpoint
        last_checkpoint = save_checkpoint(state, model, raw_model, optimizer, model_cfg, train, cluster)
    metrics = Metrics(model_cfg, train, cluster, prediction, built, append=bool(resume_from))
    tokenizer = None
    if train.sample_tokens and meta:
        tokenizer = prepare.load_tokenizer(train.data)

    log(cluster, f"training: {total_steps:,} steps planned for {train.train_tokens:,} tokens, this run stops at "
                 f"step {stop_step:,}; global batch {train.batch_tokens:,} tokens = {train.micro_batch} sequences x "
                 f"{model_cfg.block_size} tokens x {cluster.world_size} process(es) x "
                 f"{train.batch_tokens // step_tokens} accumulation steps; "
                 f"parallel={train.parallel if cluster.world_size > 1 else 'none (1 process)'}")
    gc.collect()
    gc.freeze()  # the start-up objects will live all run: keep the collector from scanning them again

    pending = []  # (step, loss, grad norm, data position after it) of the steps not checked yet: device values
    metrics.start_clock()
    while state.step < stop_step:
        # --- one optimizer step: accumulate gradients over micro-steps, clip, update ---
        lr = lr_at(state.step, total_steps, train)
        for group in optimizer.param_groups:
            group['lr'] = lr
        batch_tokens = batch_tokens_at(state.tokens_seen, train, step_tokens)
        accumulation = batch_tokens // step_tokens
        step_loss = torch.zeros((), device=cluster.device)
        for micro_step in range(accumulation):
            x, y = micro_batch_arrays(stream, state.position, micro_step, cluster, train.micro_batch)
            x, y = to_device(x, cluster.device), to_device(y, cluster.device)
            # DDP all-reduces gradients on every backward unless told not to: only the last micro-step syncs.
            # (FSDP2 reduce-scatters every micro-step and accumulates sharded gradients, keeping its memory low.)
            last = micro_step == accumulation - 1
            no_sync = model.no_sync() if hasattr(model, 'no_sync') and not last else contextlib.nullcontext()
            with no_sync:
                with autocast:
                    _, loss = model(x, y)
                (loss / accumulation).backward()  # the mean over the step's micro-batches (and DDP/FSDP average ranks)
            step_loss += loss.detach()
        grad_norm = clip_gradients(params, train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.position += accumulation * cluster.world_size * train.micro_batch
        state.tokens_seen += batch_tokens
        state.step += 1
        metrics.interval_tokens += batch_tokens
        pending.append((state.step, step_loss / accumulation, grad_norm, state.position))
        if state.tokens_seen >= chinchilla_tokens > state.tokens_seen - batch_tokens:
            log(cluster, f"step {state.step}: {state.tokens_seen:,} tokens seen passes the Chinchilla point "
                         f"20 x P = {chinchilla_tokens:,} (compute-optimal for this model): from here it over-trains")

        done = state.step == stop_step
        log_now = state.step % train.log_every == 0 or done
        eval_now = state.step % train.eval_every == 0 or done
        ckpt_now = state.step % train.ckpt_every == 0 or done
        sample_now = bool(train.sample_every and state.step % train.sample_every == 0 and tokenizer)
        if not (log_now or eval_now or ckpt_now or sample_now):
            continue  # the hot path: nothing read back from the device

        # --- a check point: read the pending losses (the only host-device sync), spike guard, log ---
        metrics.stop_clock()
        values = reduce_mean(torch.stack([torch.stack((p[1], p[2].float())) for p in pending]), cluster).tolist()
        spike = find_spike(pending, values, state.loss_window, train)
        if spike:
            # The book's rule (PaLM's rewind and skip): back to the last good checkpoint, and skip the data from
            # there to the end of the spiking step, so the batches that led into the spike are not seen again.
            step, loss_value, end, why = spike
            if state.rollbacks >= train.max_rollbacks:
                raise TrainingStopped(f"loss spike at step {step} (loss {loss_value:.4f} {why}) after "
                                      f"{state.rollbacks} rollbacks (max_rollbacks): the run is unstable; lower lr, "
                                      f"check the data, or raise max_rollbacks")
            rollbacks, path = state.rollbacks + 1, last_checkpoint
            state, _ = load_checkpoint(path, model, raw_model, optimizer, model_cfg, train, cluster)
            skip = (state.position, end)
            state.rollbacks, state.position = rollbacks, end
            state.skipped.append(list(skip))
            log(cluster, f"step {step}: loss spike (loss {loss_value:.4f} {why}): rollback {rollbacks}/"
                         f"{train.max_rollbacks} to {os.path.basename(path)}, skipping sequences "
                         f"[{skip[0]:,}, {skip[1]:,}) of the data stream")
            metrics.record({'event': 'rollback', 'step': step, 'loss': loss_value, 'to_step': state.step,
                            'skipped': list(skip), 'rollbacks': rollbacks})
            pending = []
            metrics.restart()
            metrics.start_clock()
            continue
        pending = []
        if log_now:
            loss_value, norm_value = values[-1]
            metrics.log_step(state.step, total_steps, state.tokens_seen, loss_value, norm_value, lr, batch_tokens)
        if eval_now:
            val_loss = evaluate(model, val, train, cluster, autocast)
            metrics.record({'step': state.step, 'val_loss': val_loss})
            log(cluster, f"step {state.step}: val loss {val_loss:.4f}")
            metrics.write_report()
        if ckpt_now:
            last_checkpoint = save_checkpoint(state, model, raw_model, optimizer, model_cfg, train, cluster)
        if sample_now and not done:
            text = sample_text(raw_model, tokenizer, meta, train, cluster, autocast, state.step)
            log(cluster, f"step {state.step} sample:\n{text}")
        metrics.start_clock()

    metrics.stop_clock()
    if tokenizer is not None:
        text = sample_text(raw_model, tokenizer, meta, train, cluster, autocast, state.step)
        log(cluster, f"sample after {state.step} steps:\n{text}")
    log(cluster, f"done: {state.step} steps, {state.tokens_seen:,} tokens; {train.out_dir}/report.md has the "
                 f"predicted-vs-measured table")
    barrier(cluster)  # no rank tears the process group down while another still talks to it (gloo aborts then)
    return 0


def main(argv):
    rank = int(os.environ.get('RANK', 0))
    try:
        return train_run(argv)
    except (ConfigError, DataError) as e:
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        gc.unfreeze()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
