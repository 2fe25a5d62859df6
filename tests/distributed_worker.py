"""Run by tests/test_distributed.py under `mpiexec -n N` (not collected by pytest).

    train     data-parallel training (Tensor API with DistributedDataParallel, and a jitted
              pure step with allreduce_grads) must end with the parameters single-process
              training on the global batch reaches; rank 0 prints `RESULT {json}`
    mismatch  rank 1 builds a wider model: broadcast must fail on every rank, naming it
    raise     rank 1 raises mid-training while rank 0 waits in an all-reduce: all must exit
    exit      rank 1 calls sys.exit(3) mid-training while rank 0 waits in an all-reduce: rank
              0 must raise RankExited naming rank 1 and code 3, and the job must fail
    end       rank 1's script ends before DistributedDataParallel's broadcast that the other
              ranks wait in: they must raise RankExited, not wait forever
    late      rank 1 ends just after an all-reduce while rank 0 works on: a clean exit
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

import tracegrad as tg
import tracegrad.distributed as dist
import tracegrad.nn.functional as F

N, D, H, C = 96, 12, 16, 4
BATCH, STEPS, LR = 32, 6, 0.1


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    return x, (x[:, :C].argmax(1) + (x[:, -1] > 1)).astype(np.int64) % C


def make_model(seed: int, hidden: int = H) -> tg.nn.Module:
    tg.manual_seed(seed)
    return tg.nn.Sequential(tg.nn.Linear(D, hidden), tg.nn.Tanh(), tg.nn.Linear(hidden, C))


def train_tensor(model: tg.nn.Module, sampler: dist.DistributedSampler, sync: bool,
                 fail_rank: int = -1, exit_code: int | None = None) -> dict[str, np.ndarray]:
    x, y = data()
    optimizer = tg.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        sampler.set_epoch(step // len(sampler))
        idx = list(sampler)[step % len(sampler)]
        if step == 2 and dist.get_rank() == fail_rank:
            if exit_code is not None:
                sys.exit(exit_code)
            raise RuntimeError(f"deliberate failure on rank {fail_rank}")
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tg.tensor(x[idx])), tg.tensor(y[idx]))
        loss.backward()
        if sync:
            model.sync_gradients()
        optimizer.step()
    return {k.removeprefix("module."): v for k, v in model.param_dict().items()}


def train_pure(params: dict, sampler: dist.DistributedSampler) -> dict[str, np.ndarray]:
    x, y = data()
    model = make_model(0)

    def loss_fn(p, xb, yb):
        return F.cross_entropy(model.apply(p, xb), yb)

    grad_step = tg.jit(tg.value_and_grad(loss_fn))
    update = tg.jit(lambda p, g, s: tg.optim.adam_update(p, g, s, lr=0.01))
    state = tg.optim.adam_init(params)
    for step in range(STEPS):
        sampler.set_epoch(step // len(sampler))
        idx = list(sampler)[step % len(sampler)]
        _, grads = grad_step(params, x[idx], y[idx])
        grads = dist.allreduce_grads(grads)
        params, state = update(params, grads, state)
    return params


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def train() -> None:
    world = dist.init()
    # every rank starts from different weights: DDP must broadcast rank 0's
    ddp = dist.DistributedDataParallel(make_model(seed=world.rank))
    tensor_params = train_tensor(ddp, dist.DistributedSampler(N, BATCH, seed=1), sync=True)
    single = dist.DistributedSampler(N, BATCH, seed=1, rank=0, world_size=1)
    tensor_ref = train_tensor(make_model(0), single, sync=False)

    start = dist.broadcast(make_model(seed=world.rank).param_dict())
    pure_params = train_pure(start, dist.DistributedSampler(N, BATCH, seed=1))
    pure_ref = train_pure(make_model(0).param_dict(), single)

    everyone = world.comm.allgather((tensor_params, pure_params))
    result = {
        "world": world.size,
        "tensor_vs_single": max_diff(tensor_params, tensor_ref),
        "pure_vs_single": max_diff(pure_params, pure_ref),
        "across_ranks": max(max(max_diff(t, tensor_params), max_diff(p, pure_params))
                            for t, p in everyone),
        "moved": max_diff(tensor_ref, make_model(0).param_dict()),
    }
    if world.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def mismatch() -> None:
    world = dist.init()
    dist.DistributedDataParallel(make_model(0, hidden=H + (world.rank == 1)))
    print(f"rank {world.rank}: no error", flush=True)


def fail() -> None:
    dist.init()
    ddp = dist.DistributedDataParallel(make_model(0))
    train_tensor(ddp, dist.DistributedSampler(N, BATCH, seed=1), sync=True, fail_rank=1)


def exit_mid_training() -> None:
    dist.init()
    ddp = dist.DistributedDataParallel(make_model(0))
    train_tensor(ddp, dist.DistributedSampler(N, BATCH, seed=1), sync=True, fail_rank=1,
                 exit_code=3)


def end_before_broadcast() -> None:
    world = dist.init()
    if world.rank == 1:
        return
    dist.DistributedDataParallel(make_model(0))


def end_after_allreduce() -> None:
    world = dist.init()
    total = dist.allreduce_sum(np.ones(1 << 20, np.float32))
    if world.rank == 0:
        time.sleep(0.5)       # rank 1 has exited by now: its notice must not fail rank 0
        print(f"rank 0 done: {float(total[0])}", flush=True)


if __name__ == "__main__":
    {"train": train, "mismatch": mismatch, "raise": fail, "exit": exit_mid_training,
     "end": end_before_broadcast, "late": end_after_allreduce}[sys.argv[1]]()
