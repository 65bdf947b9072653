"""
processes.py: the processes of a run and how the model is spread over them. torchrun sets RANK, WORLD_SIZE and
LOCAL_RANK (one process per GPU, any number of nodes); a plain `python train.py` is rank 0 of 1. CUDA when present
(NCCL between GPUs), else the CPU (gloo). Also the few collectives every tool shares (a line from rank 0, a
barrier, a mean over ranks), and parallelize: DDP, ZeRO-1's DDP, or FSDP2 for ZeRO-2 and ZeRO-3.
"""

import dataclasses
import datetime
import gc
import os
import signal

import torch
import torch.distributed as dist

from ledgergpt import config


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
    """After the input checks, so that a bad config is one line, not a rendezvous timeout. A rank that failed them
    never comes: torchrun then sends the others SIGTERM, which a Python handler would only see once the rendezvous
    returned (after its timeout; torchrun's SIGKILL comes 30 s after), so SIGTERM kills a waiting rank at once
    (nothing of the run is written yet; its out_dir lock is taken over as a dead process's)."""
    if cluster.world_size > 1 and not dist.is_initialized():
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            if cluster.device.type == 'cuda':  # NCCL bound to this rank's GPU
                dist.init_process_group('nccl', device_id=cluster.device)
            else:
                dist.init_process_group('gloo')
        finally:
            signal.signal(signal.SIGTERM, previous)


def leave_process_group():
    """The end of every command torchrun starts (train.py, evals.py, bench.py), once it has dropped its model and
    optimizer: they are collected while the process group and the interpreter are whole (a model's DDP reducer and
    its gloo work left to the interpreter's teardown can abort the process: "terminate called without an active
    exception", pytorch/pytorch#179291), then the process group is destroyed."""
    gc.unfreeze()  # train.py froze its start-up objects: collect them too
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def first_to_fail():
    """Whether this rank is its torchrun job's first to fail, counted in the store of torchrun's agent (one add, no
    process group needed: most failures come before there is one). Without that store (another launcher), rank 0
    speaks for all, as every rank reaches the same verdict on a config; the store unreachable, this rank speaks."""
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True':
        return int(os.environ.get('RANK', 0)) == 0
    try:
        store = dist.TCPStore(
            os.environ['MASTER_ADDR'],
            int(os.environ['MASTER_PORT']),
            is_master=False,
            timeout=datetime.timedelta(seconds=10),
        )
        return (
            store.add(f"ledgergpt/failed/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}", 1) == 1
        )
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


# -----------------------------------------------------------------------------------------------------
# The model over the processes (train.py's build_model calls this once the model is built and initialised).


def compile_as_run(model, train, world_size):
    """Compile in place as the run does, if it does: the whole model where it is not sharded (one process, ddp,
    zero1), each block under FSDP2 (zero2, fsdp: the root and the loss stay eager). The step probe compiles so too
    (live_ledger._time_steps), so it times the run's kernels."""
    from ledgergpt.config import sharded

    if not train.compile:
        return
    if sharded(train.parallel, world_size):
        for block in model.blocks:
            block.compile()  # per block, as torchtune does under FSDP2: the blocks share one graph
    else:
        model.compile()  # in place: the state dict keeps its names (no `_orig_mod.` prefix)


def parallelize(model, train, cluster, dtype):
    """-> the module the loop calls: the model itself (one process), DDP (ddp, zero1) or the FSDP2 root itself
    (zero2, fsdp), compiled as train.compile says. dtype: the compute dtype."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from ledgergpt.config import sharded

    compile_as_run(model, train, cluster.world_size)
    if not sharded(train.parallel, cluster.world_size):
        if cluster.world_size == 1:
            return model
        device_ids = [cluster.local_rank] if cluster.device.type == 'cuda' else None
        # broadcast_buffers=False: the only buffers are the RoPE tables, constants every rank computes itself.
        # gradient_as_bucket_view=True: the .grad tensors are views of DDP's all-reduce buckets, so the gradients
        # take 4P bytes once, not twice (the ledger's model states count them so).
        return DistributedDataParallel(
            model, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    # FSDP2: shard each block, then the root (embeddings, final norm, lm_head: a tied weight stays in this one
    # unit with both its users). ZeRO-3 ('fsdp') frees each block's gathered weights after its forward and
    # gathers them again for backward; ZeRO-2 ('zero2') keeps them from forward to backward, so only gradients
    # and optimizer states stay sharded (the book's 2P + 14P/N). The root is kept either way: backward starts
    # with its lm_head.
    mesh = init_device_mesh(cluster.device.type, (cluster.world_size,))
    mp_policy = MixedPrecisionPolicy()  # fp32 everywhere
    if dtype == 'bfloat16':  # bf16 weights for the matmuls, gradients reduced in fp32
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(
            block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=train.parallel == 'fsdp'
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    return model
