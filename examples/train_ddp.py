"""Data-parallel training of the digits MLP (train_digits_eager.py) over MPI ranks: every
rank holds the model, trains on its shard of each global batch, and averages gradients
with the others before each optimizer step, so N ranks take the steps one process would
take on the whole batch.

    mpirun -n 2 python examples/train_ddp.py              # 2 ranks on this machine
    mpirun -n 4 -f hostfile python examples/train_ddp.py  # 4 ranks across hosts (README)
    python examples/train_ddp.py                          # also runs as a world of one

MPI comes from `pip install -e '.[mpi]'` (mpi4py and the MPICH wheels).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import tracegrad as tg
import tracegrad.distributed as dist
import tracegrad.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits_mlp import load_digits, make_model  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRACEGRAD_EXAMPLE_STEPS",
                                                                     0)),
                   help="stop after this many steps (0: run all epochs)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all ranks)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default="", help="rank 0 writes the model here (.npz)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    world = dist.init()
    say = print if world.rank == 0 and not args.quiet else (lambda *a, **k: None)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    tg.manual_seed(args.seed)
    model = dist.DistributedDataParallel(make_model())    # rank 0's weights everywhere
    tg.manual_seed(args.seed + 1 + world.rank)            # but a different dropout per rank
    optimizer = tg.optim.Adam(model.parameters(), lr=args.lr)
    sampler = dist.DistributedSampler(len(x_train), args.batch_size, seed=args.seed)
    total = len(sampler) * args.epochs
    if args.steps:
        total = min(total, args.steps)
    say(f"{world.size} rank(s), global batch {args.batch_size} "
        f"({args.batch_size // world.size} per rank), {total} steps")

    losses: list[float] = []
    step, epoch, t0 = 0, 0, time.perf_counter()
    model.train()
    while step < total:
        sampler.set_epoch(epoch)
        for idx in sampler:
            if step >= total:
                break
            optimizer.zero_grad()
            loss = F.cross_entropy(model(tg.tensor(x_train[idx])), tg.tensor(y_train[idx]))
            loss.backward()
            model.sync_gradients()            # .grad = mean over ranks: the global gradient
            optimizer.step()
            losses.append(loss.item())        # this rank's shard; averaged for printing
            step += 1
            if step % 50 == 0 or step == total:
                mean_loss = dist.allreduce_mean(np.mean(losses[-10:]))
                say(f"step {step:5d}  loss {float(mean_loss):.4f}")
        epoch += 1
    seconds = time.perf_counter() - t0

    model.eval()                              # each rank scores its shard of the test set
    part = dist.shard(len(x_test))
    with tg.no_grad():
        logits = model(tg.tensor(x_test[part]))
    correct = np.sum(tg.argmax(logits, axis=-1).numpy() == y_test[part])
    accuracy = float(dist.allreduce_sum(np.int64(correct))) / len(x_test)
    if args.save and world.rank == 0:
        tg.save(model.module.state_dict(), args.save)
    rate = step * args.batch_size / seconds
    say(f"{step} steps in {seconds:.1f} s ({rate:,.0f} samples/s over {world.size} ranks); "
        f"test accuracy {100 * accuracy:.2f}%")
    return {"accuracy": accuracy, "losses": losses, "steps": step, "seconds": seconds,
            "world": world.size}


if __name__ == "__main__":
    main()
