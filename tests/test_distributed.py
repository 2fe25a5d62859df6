"""tg.distributed: collectives, sharding and DDP in-process (a one-process world and a fake
communicator), then real data-parallel runs under `mpiexec -n 2` and `-n 4` on loopback
(tests/distributed_worker.py), skipped when mpi4py or an MPI launcher is missing."""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.distributed as dist
from tracegrad.distributed import world as W

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


class Done:
    """A request of the fake communicator: already complete."""

    def Wait(self):
        pass


class FakeComm:
    """Two ranks holding identical data: an all-reduce doubles, an all-gather repeats (or
    serves `others`, pickled, as rank 1's contribution)."""

    def __init__(self, others=None):
        self.calls: list[tuple] = []
        self.others = None if others is None else pickle.dumps(others)

    def Iallreduce(self, sendbuf, buf, op):
        self.calls.append(("Allreduce", buf.dtype, buf.size))
        buf *= 2
        return Done()

    def Ibcast(self, buf, root):
        self.calls.append(("Bcast", buf.dtype, buf.size))
        return Done()

    def Iallgather(self, mine, sizes):
        sizes[:] = [mine[0], mine[0] if self.others is None else len(self.others)]
        return Done()

    def Iallgatherv(self, mine, recv):
        out, _ = recv
        theirs = mine.tobytes() if self.others is None else self.others
        out[:] = np.frombuffer(mine.tobytes() + theirs, np.uint8)
        return Done()


@pytest.fixture
def fake_world(monkeypatch):
    def make(others=None):
        comm = FakeComm(others)
        mpi = SimpleNamespace(IN_PLACE=object(), SUM="sum")
        monkeypatch.setattr(W, "_world", W.World(0, 2, comm=comm, MPI=mpi))
        return comm
    return make


def test_single_process_world_without_launcher(monkeypatch):
    monkeypatch.setattr(W, "_world", None)
    for var in W.LAUNCHER_VARS + ("TRACEGRAD_MPI",):
        monkeypatch.delenv(var, raising=False)
    w = dist.init()
    assert (w.rank, w.size, w.comm) == (0, 1, None) and dist.get_world_size() == 1
    tree = {"w": np.ones((2, 3), np.float32), "b": [tg.tensor([1.0, 2.0]), np.arange(3)]}
    out = dist.allreduce_mean(tree)
    np.testing.assert_array_equal(out["w"], tree["w"])
    assert isinstance(out["b"][0], tg.Tensor) and out["b"][0].tolist() == [1.0, 2.0]
    assert dist.broadcast(tree)["b"][1].tolist() == [0, 1, 2]


def test_launcher_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(W, "_world", None)
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(RuntimeError, match=r"PMI_SIZE set.*mpi4py is not installed.*\[mpi\]"):
        dist.init()


def test_allreduce_fuses_one_buffer_per_dtype(fake_world):
    comm = fake_world()
    grads = {f"l{i}": np.full((i + 1, 3), i, np.float32) for i in range(5)}
    grads["t"] = tg.tensor(np.ones(4, np.float32))
    grads["d"] = [np.ones(2), np.zeros((2, 2))]
    summed = dist.allreduce_sum(grads)
    assert sorted(comm.calls, key=str) == [("Allreduce", np.dtype(np.float32), 49),
                                           ("Allreduce", np.dtype(np.float64), 6)]
    np.testing.assert_array_equal(summed["l3"], np.full((4, 3), 6, np.float32))
    assert summed["l3"].dtype == np.float32 and isinstance(summed["t"], tg.Tensor)
    mean = dist.allreduce_grads(grads)
    np.testing.assert_array_equal(mean["l4"], grads["l4"])
    np.testing.assert_array_equal(mean["t"].numpy(), np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"leaf \['mask'\] has dtype bool"):
        dist.allreduce_sum({"mask": np.ones(2, bool)})


def _signature(tree):
    leaves, td = tg.tree_flatten(tree)
    arrays = [np.asarray(x) for x in leaves]
    return repr(td), dist.leaf_paths(td), [(a.shape, a.dtype.str) for a in arrays]


def test_broadcast_names_the_mismatching_leaf(fake_world):
    mine = {"fc1.weight": np.zeros((4, 3), np.float32), "fc1.bias": np.zeros(3, np.float32)}
    theirs = dict(mine, **{"fc1.weight": np.zeros((5, 3), np.float32)})
    fake_world(_signature(theirs))
    with pytest.raises(ValueError, match=r"leaf \['fc1.weight'\] is float32\[5, 3\] on rank 1 "
                                         r"but float32\[4, 3\] on the root \(rank 0\)"):
        dist.broadcast(mine)
    fake_world(_signature(dict(mine, **{"fc1.bias": np.zeros(3)})))
    with pytest.raises(TypeError, match=r"\['fc1.bias'\] is float64\[3\] on rank 1"):
        dist.broadcast(mine)
    fake_world(_signature({"fc1.weight": mine["fc1.weight"]}))
    with pytest.raises(ValueError, match="rank 1 has a different structure"):
        dist.broadcast(mine)
    comm = fake_world()
    out = dist.broadcast(mine)
    assert [c[0] for c in comm.calls] == ["Bcast"] and out["fc1.bias"].shape == (3,)


def test_leaf_paths():
    _, td = tg.tree_flatten({"a": [np.ones(1), (np.ones(1), None)], "b": np.ones(1)})
    assert dist.leaf_paths(td) == ["['a'][0]", "['a'][1][0]", "['b']"]


@pytest.mark.parametrize("n,world", [(10, 3), (7, 4), (2, 4), (128, 2)])
def test_shard_partitions_evenly(n, world):
    parts = [range(n)[dist.shard(n, r, world)] for r in range(world)]
    assert [i for p in parts for i in p] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_sampler_shards_the_global_batch():
    single = list(dist.DistributedSampler(50, 8, seed=3, rank=0, world_size=1))
    per_rank = [list(dist.DistributedSampler(50, 8, seed=3, rank=r, world_size=4))
                for r in range(4)]
    assert len(single) == 6
    for b, batch in enumerate(single):
        np.testing.assert_array_equal(np.concatenate([p[b] for p in per_rank]), batch)
    with pytest.raises(ValueError, match="not divisible by the 3 ranks"):
        dist.DistributedSampler(50, 8, rank=0, world_size=3)


def test_ddp_single_process_is_the_module():
    tg.manual_seed(0)
    net = tg.nn.Linear(3, 2)
    ddp = dist.DistributedDataParallel(net)
    x = tg.tensor(np.ones((4, 3), np.float32))
    ddp(x).sum().backward()
    before = net.weight.grad.numpy().copy()
    ddp.sync_gradients()
    np.testing.assert_array_equal(net.weight.grad.numpy(), before)
    assert len(list(ddp.parameters())) == 2 and ddp.module is net


def test_ddp_sync_averages_grads_and_keeps_unused_none(fake_world):
    comm = fake_world()
    net = tg.nn.Sequential(tg.nn.Linear(3, 2), tg.nn.Linear(2, 2))
    ddp = dist.DistributedDataParallel(net, broadcast_buffers=False)
    comm.calls.clear()
    net[0](tg.tensor(np.ones((4, 3), np.float32))).sum().backward()
    g = net[0].weight.grad.numpy().copy()
    ddp.sync_gradients()
    assert len(comm.calls) == 1               # all grads and the counters in one buffer
    np.testing.assert_allclose(net[0].weight.grad.numpy(), g)   # (g + g) / 2
    assert net[1].weight.grad is None


# -- real MPI runs -------------------------------------------------------------------------

def _mpi_launcher() -> str:
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install -e '.[mpi]')")
    mpiexec = dist.find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec/mpirun found (pip install -e '.[mpi]')")
    return mpiexec


@pytest.fixture(scope="module")
def mpiexec():
    launcher = _mpi_launcher()
    probe = [launcher, "-n", "2", sys.executable, "-c",
             "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"]
    try:
        r = subprocess.run(probe, capture_output=True, text=True, timeout=30, env=_env())
    except subprocess.TimeoutExpired:
        pytest.skip(f"{launcher} -n 2 did not start two ranks within 30 s")
    if r.returncode != 0:
        pytest.skip(f"MPI cannot run two ranks here: {(r.stderr or r.stdout)[-300:]}")
    return launcher


def _env() -> dict[str, str]:
    """This environment minus any MPI launcher's variables (pytest itself may run in one)."""
    return {k: v for k, v in os.environ.items() if k not in W.LAUNCHER_VARS}


def _run(mpiexec: str, n: int, mode: str, timeout: int = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([mpiexec, "-n", str(n), sys.executable, WORKER, mode],
                              capture_output=True, text=True, timeout=timeout, env=_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n {n} {mode} hung (no exit within {timeout} s): "
                    f"{e.stderr!r:.2000}")


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_equals_single_process_global_batch(mpiexec, n):
    r = _run(mpiexec, n, "train")
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    assert res["world"] == n and res["moved"] > 0.01
    assert res["tensor_vs_single"] < 1e-5, res
    assert res["pure_vs_single"] < 1e-5, res
    assert res["across_ranks"] == 0.0, res


def test_mismatched_shapes_fail_at_broadcast_on_every_rank(mpiexec):
    r = _run(mpiexec, 2, "mismatch")
    assert r.returncode != 0 and "no error" not in r.stdout
    assert "leaf ['0.bias'] is float32[17] on rank 1 but float32[16] on the root" in r.stderr
    assert "aborting all 2 ranks" in r.stderr


def test_a_failing_rank_stops_every_rank(mpiexec):
    r = _run(mpiexec, 2, "raise")
    assert r.returncode != 0
    assert "RuntimeError: deliberate failure on rank 1" in r.stderr
    assert "rank 1 of 2 failed" in r.stderr and "aborting all 2 ranks" in r.stderr


# a run takes 1-3 s; a hang (MPI_Finalize on the exited rank, the collective on the others)
# is cut off at 30 s
def test_a_rank_calling_sys_exit_fails_the_others_naming_it(mpiexec):
    r = _run(mpiexec, 2, "exit", timeout=30)
    assert r.returncode == 3, r.stdout + r.stderr
    assert ("RankExited: rank 1 of 2 exited with code 3 (sys.exit) while rank 0 waited for it "
            "in allreduce_sum") in r.stderr, r.stderr
    assert "aborting all 2 ranks" in r.stderr


def test_a_rank_whose_script_ends_early_fails_the_others(mpiexec):
    r = _run(mpiexec, 3, "end", timeout=30)
    assert r.returncode != 0, r.stdout + r.stderr
    assert ("RankExited: rank 1 of 3 exited without calling sys.exit (its script ended"
            in r.stderr), r.stderr
    assert "waited for it in broadcast (collective #1; rank 1 took part in 0)" in r.stderr


def test_a_rank_ending_after_its_last_collective_is_a_clean_exit(mpiexec):
    r = _run(mpiexec, 2, "late", timeout=30)
    assert r.returncode == 0 and "rank 0 done: 2.0" in r.stdout, r.stdout + r.stderr
    assert "RankExited" not in r.stderr


def test_train_ddp_example_runs_on_two_ranks(mpiexec):
    pytest.importorskip("sklearn")
    example = os.path.join(os.path.dirname(os.path.dirname(WORKER)), "examples", "train_ddp.py")
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, example, "--steps", "60"],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rank(s), global batch 64 (32 per rank)" in r.stdout
    accuracy = float(r.stdout.rsplit("test accuracy ", 1)[1].split("%")[0])
    assert accuracy > 75, r.stdout
