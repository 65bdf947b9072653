"""
processes.py: a run's processes (torchrun's RANK, WORLD_SIZE, LOCAL_RANK; `python train.py` is rank
0 of 1), on CUDA (NCCL) or the CPU (gloo); the collectives every tool shares; and parallelize: DDP,
ZeRO-1's DDP, or FSDP2 for ZeRO-2 and ZeRO-3.
"""

import dataclasses
import datetime
import functools
import gc
import os
import signal

import torch
import torch.distributed as dist

from ledgergpt import config, sums
from ledgergpt.config import sharded


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
    device = torch.device('cuda', local_rank) if torch.cuda.is_available() else torch.device('cpu')
    if device.type == 'cuda':
        torch.cuda.set_device(device)
    return Cluster(rank, world_size, local_rank, device)


def join_process_group(cluster, timeout_s=1800):
    """After the input checks: a bad config is one line, not a rendezvous timeout. A rank that
    failed them never comes, and torchrun sends the others SIGTERM, which a Python handler would see
    only after the rendezvous's timeout: so SIGTERM kills a waiting rank at once (nothing of the run
    is written yet; its out_dir lock is taken over as a dead process's). timeout_s: a collective's
    wait for every rank (the key collective_timeout_s says why 30 minutes)."""
    if cluster.world_size > 1 and not dist.is_initialized():
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        on_gpu = cluster.device.type == 'cuda'  # NCCL bound to this rank's GPU, else gloo
        backend, device_id = ('nccl', cluster.device) if on_gpu else ('gloo', None)
        try:
            timeout = datetime.timedelta(seconds=timeout_s)
            dist.init_process_group(backend, device_id=device_id, timeout=timeout)
        finally:
            signal.signal(signal.SIGTERM, previous)


def leave_process_group():
    """The end of every command torchrun starts, once it has dropped its model and optimizer: they
    are collected while the process group is whole (a DDP reducer left to the interpreter's teardown
    can abort the process: pytorch/pytorch#179291), then the group is destroyed."""
    gc.unfreeze()  # train.py froze its start-up objects: collect them too
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def first_to_fail():
    """Whether this rank is its torchrun job's first to fail, counted in the store of torchrun's
    agent (most failures come before a process group). Without it, rank 0 speaks for all (every rank
    reaches the same verdict on a config); it unreachable, this rank."""
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True':
        return int(os.environ.get('RANK', 0)) == 0
    try:
        address, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
        timeout = datetime.timedelta(seconds=10)
        store = dist.TCPStore(address, port, is_master=False, timeout=timeout)
        restart = os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)
        return store.add(f'ledgergpt/failed/{restart}', 1) == 1
    except (RuntimeError, KeyError, ValueError):  # DistStoreError is a RuntimeError
        return True


cli = config.cli(reports=first_to_fail)  # the error wrapper of every command torchrun starts


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


# --------------------------------------------------------------------------------------------------
# The model over the processes (train.py's build_model calls this once the model is initialised).


def compile_as_run(model, train, world_size):
    """Compile in place as the run does, if it does: each block under FSDP2 (the root and the loss
    stay eager), else the whole model."""
    mode = sums.compile_mode(train, world_size)
    if mode == 'blocks':
        for block in model.blocks:
            block.compile()  # per block, as torchtune does under FSDP2: the blocks share one graph
    elif mode == 'model':
        model.compile()  # in place: the state dict keeps its names (no `_orig_mod.` prefix)


def parallelize(model, train, cluster, dtype):
    """-> the module the loop calls: the model (one process), DDP (ddp, zero1) or the FSDP2 root
    itself (zero2, fsdp), compiled as train.compile says. dtype: the compute dtype."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    compile_as_run(model, train, cluster.world_size)
    if not sharded(train.parallel, cluster.world_size):
        if cluster.world_size == 1:
            return model
        device_ids = [cluster.local_rank] if cluster.device.type == 'cuda' else None
        # broadcast_buffers=False: the only buffers are the RoPE tables, constants on every rank.
        # gradient_as_bucket_view=True: the .grad tensors are views of DDP's all-reduce buckets,
        # so the gradients take 4P bytes once, not twice (as the ledger counts them).
        return DistributedDataParallel(
            model, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    # FSDP2: shard each block, then the root (embeddings, final norm, lm_head: a tied weight stays
    # in one unit with both its users). fsdp (ZeRO-3) gathers a block again for backward, zero2
    # keeps it (the book's 2P + 14P/N), both the root: backward starts with its lm_head (BOOK.md,
    # Derivations: Ledger 5). bf16: bf16 weights for the matmuls, gradients in fp32.
    bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = MixedPrecisionPolicy(**(bf16 if dtype == 'bfloat16' else {}))
    mesh = init_device_mesh(cluster.device.type, (cluster.world_size,))
    shard = functools.partial(fully_shard, mesh=mesh, mp_policy=policy)
    for block in model.blocks:
        shard(block, reshard_after_forward=train.parallel == 'fsdp')
    shard(model, reshard_after_forward=False)
    return model
