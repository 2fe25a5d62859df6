"""The process group: which rank this process is among how many, from MPI (mpi4py) when
launched by `mpirun`/`mpiexec`/`srun`, else a world of one process. Owns the MPI import and
the per-rank thread count; joining a world of several ranks installs failures.py's hooks."""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from .failures import abort_on_uncaught, wait, watch_exits

# Variables that MPI launchers set in every process they start (MPICH/Intel hydra, Open MPI,
# PMIx, Slurm). Their presence means "there may be other ranks": a silent one-process
# fallback would then train N independent models.
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                 "MPI_LOCALNRANKS", "SLURM_PROCID")

INSTALL_HINT = "pip install 'tracegrad[mpi]'  (mpi4py and the MPICH wheels)"


@dataclass(frozen=True)
class World:
    """This process's place in the job. `comm` is the mpi4py communicator (None in a
    one-process world) and `MPI` the `mpi4py.MPI` module it came from; `local_rank` and
    `local_size` count the ranks on this host."""
    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1
    comm: Any = None
    MPI: Any = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        kind = "MPI" if self.comm is not None else "single process"
        return f"World(rank={self.rank}, size={self.size}, {kind})"


_world: World | None = None
_lock = threading.Lock()


def launched_by_mpi() -> bool:
    """Whether an MPI launcher started this process (or TRACEGRAD_MPI=1 forces MPI)."""
    forced = os.environ.get("TRACEGRAD_MPI")
    if forced is not None:
        return forced not in ("", "0")
    return any(v in os.environ for v in LAUNCHER_VARS)


def init(comm: Any = None, *, set_threads: bool = True, abort_on_error: bool = True) -> World:
    """Join the job and return its `World` (idempotent: later calls return the same one).

    Under `mpirun -n N python script.py` this is rank r of N over `MPI.COMM_WORLD` (or the
    mpi4py communicator `comm`); run plainly (`python script.py`) it is rank 0 of 1 and
    MPI is not touched, so the same script runs both ways. With `set_threads`, ranks that
    share a host split its cores between them (unless TRACEGRAD_NUM_THREADS is set). With
    `abort_on_error`, an uncaught exception on any rank prints its traceback and aborts
    every rank (MPI_Abort) instead of leaving the others waiting forever. Either way, a rank
    that exits (`sys.exit`, or its script ends) while another waits for it in a tracegrad
    collective (allreduce, broadcast, barrier) makes that one raise `RankExited`, naming
    the rank and its exit code; raw `world.comm` calls are not watched."""
    global _world
    with _lock:
        if _world is not None:
            if comm is not None and comm != _world.comm:
                raise RuntimeError("tracegrad.distributed.init() was already called with "
                                   "another communicator")
            return _world
        if comm is None and not launched_by_mpi():
            _world = World(0, 1)
            return _world
        _world = _mpi_world(comm)
    if _world.size > 1:
        if set_threads:
            _split_threads(_world.local_size)
        watch_exits(_world)
        if abort_on_error:
            abort_on_uncaught(_world)
    return _world


def get_world() -> World:
    """The current world, initializing it on first use."""
    return _world if _world is not None else init()


def get_rank() -> int:
    return get_world().rank


def get_world_size() -> int:
    return get_world().size


def barrier() -> None:
    """Wait until every rank gets here."""
    w = get_world()
    if w.comm is not None and w.size > 1:
        wait(w.comm.Ibarrier(), "barrier")


def mpi() -> Any:
    """The `mpi4py.MPI` module, with a clear error when it is not installed."""
    try:
        import mpi4py
    except ImportError as e:
        launched = [v for v in LAUNCHER_VARS if v in os.environ]
        why = (f"this process was started by an MPI launcher ({', '.join(launched)} set) "
               if launched else "MPI was requested ")
        raise RuntimeError(f"{why}but mpi4py is not installed; install it with "
                           f"{INSTALL_HINT}") from e
    if "mpi4py.MPI" not in sys.modules:
        # MPI is only ever called from the main thread (kernels run on the runtime's own
        # pool, never inside MPI), so "funneled" avoids the locking of "multiple".
        mpi4py.rc.thread_level = "funneled"
    from mpi4py import MPI
    return MPI


def _mpi_world(comm: Any) -> World:
    MPI = mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return World(comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size(),
                     comm, MPI)
    finally:
        local.Free()


def _split_threads(local_size: int) -> None:
    """N ranks on one host each running a pool of all its cores would oversubscribe it."""
    if os.environ.get("TRACEGRAD_NUM_THREADS") or local_size <= 1:
        return
    from ..runtime import set_num_threads
    set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
