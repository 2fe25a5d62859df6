"""Data-parallel training across processes and hosts on MPI (mpi4py): `tg.distributed`.

    import tracegrad.distributed as dist
    world = dist.init()                     # rank/size from mpirun; 1 process without it
    params = dist.broadcast(params)         # rank 0's initial values everywhere (checked)
    grads = dist.allreduce_grads(grads)     # mean over ranks, one fused buffer per dtype
    model = dist.DistributedDataParallel(model); ...; model.sync_gradients()

Run with `mpirun -n 2 python script.py`; MPI comes from the `mpi` extra
(`pip install 'tracegrad[mpi]'`: mpi4py and the MPICH wheels)."""
from .collectives import allreduce_grads, allreduce_mean, allreduce_sum, broadcast, leaf_paths
from .ddp import DistributedDataParallel, broadcast_parameters
from .failures import RankExited
from .launch import find_mpiexec
from .sharding import DistributedSampler, shard
from .world import World, barrier, get_rank, get_world, get_world_size, init, launched_by_mpi

__all__ = ["DistributedDataParallel", "DistributedSampler", "RankExited", "World",
           "allreduce_grads",
           "allreduce_mean", "allreduce_sum", "barrier", "broadcast", "broadcast_parameters",
           "find_mpiexec", "get_rank", "get_world", "get_world_size", "init",
           "launched_by_mpi", "leaf_paths", "shard"]
