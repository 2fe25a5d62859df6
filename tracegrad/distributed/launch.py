"""Finding the MPI launcher: the `mpiexec` installed next to this Python (the MPICH wheels
put it there) before any on PATH, so a virtualenv's MPI matches its mpi4py."""
from __future__ import annotations

import os
import shutil
import sys


def find_mpiexec() -> str | None:
    """Path of `mpiexec` (or `mpirun`) for this interpreter, or None if there is none.
    TRACEGRAD_MPIEXEC overrides the search."""
    override = os.environ.get("TRACEGRAD_MPIEXEC")
    if override:
        return shutil.which(override)
    here = os.path.dirname(sys.executable)
    for path in (here, None):
        for name in ("mpiexec", "mpirun"):
            found = shutil.which(name, path=path)
            if found:
                return found
    return None
