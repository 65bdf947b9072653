"""
processes.py: the processes of a run. torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (one process per GPU, any number
of nodes); a plain `python train.py` is rank 0 of 1. CUDA when present (NCCL between GPUs), else the CPU (gloo).
Also the few collectives every tool shares: a line from rank 0, a barrier, a mean over ranks.
"""

import dataclasses
import os

import torch
import torch.distributed as dist


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
