"""Data-parallel mlp_step (784-512-512-10 tanh MLP, global batch 128) over MPI ranks:
throughput in samples/s at 1 and 2 ranks, and the share of the step spent in the gradient
all-reduce. Each rank runs the jitted value-and-grad on its 128/N samples, averages the
gradients with `tg.distributed.allreduce_grads` (one fused buffer), then the jitted SGD
update. The cores are split evenly: N ranks get cores/N kernel threads each.

    python bench/ddp.py                   # 1 and 2 ranks (launches mpiexec itself)
    python bench/ddp.py --ranks 1 2 4 --steps 200 --json bench/out/ddp.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH = 128


def worker(steps: int, warmup: int) -> None:
    import numpy as np

    import tracegrad as tg
    import tracegrad.distributed as dist
    import wl_mlp

    world = dist.init()
    params = dist.broadcast(wl_mlp.init())
    x, y = wl_mlp.data(BATCH)
    part = dist.shard(BATCH)
    x, y = x[part], y[part]

    def loss(params, x, y):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = tg.tanh(h @ params[i] + params[i + 1])
        return tg.nn.functional.cross_entropy(h @ params[-2] + params[-1], y)

    grad_step = tg.jit(tg.value_and_grad(loss))
    update = tg.jit(lambda ps, gs: [p - wl_mlp.LR * g for p, g in zip(ps, gs)])
    fused = wl_mlp.tracegrad_step()              # the single-process one-graph step
    phases: dict[str, list[float]] = {"grad": [], "allreduce": [], "update": [], "step": []}
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
        t0 = time.perf_counter()
        _, grads = grad_step(params, x, y)
        t1 = time.perf_counter()
        grads = dist.allreduce_grads(grads)
        t2 = time.perf_counter()
        params = update(params, grads)
        t3 = time.perf_counter()
        if i >= warmup:
            for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                phases[k].append(dt)
    # the all-reduce alone, ranks lined up by a barrier first: transfer cost without the
    # wait for a slower rank that the in-step figure includes
    alone = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.allreduce_grads(grads)
        alone.append(time.perf_counter() - t0)
    fused_s = None
    if world.size == 1:
        for _ in range(warmup):
            fused(params, x, y)
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fused(params, x, y)
            ts.append(time.perf_counter() - t0)
        fused_s = statistics.median(ts)
    med = {k: statistics.median(v) for k, v in phases.items()}
    everyone = world.comm.allgather(med) if world.comm is not None else [med]
    if world.rank == 0:
        slowest = max(everyone, key=lambda m: m["step"])
        print("RESULT " + json.dumps({
            "ranks": world.size, "threads_per_rank": tg.runtime.num_threads(),
            "grad_bytes": int(sum(np.asarray(p).nbytes for p in params)),
            **{f"{k}_ms": 1e3 * v for k, v in slowest.items()},
            "allreduce_alone_ms": 1e3 * statistics.median(alone),
            "samples_per_s": BATCH / slowest["step"],
            "allreduce_share": slowest["allreduce"] / slowest["step"],
            "fused_single_process_samples_per_s": BATCH / fused_s if fused_s else None,
        }), flush=True)


def launch(ranks: int, cores: int, steps: int, warmup: int) -> dict:
    import tracegrad.distributed as dist
    mpiexec = dist.find_mpiexec()
    if mpiexec is None:
        sys.exit("no mpiexec found: pip install -e '.[mpi]'")
    env = dict(os.environ, TRACEGRAD_NUM_THREADS=str(max(1, cores // ranks)))
    cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker",
           "--steps", str(steps), "--warmup", str(warmup)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores shared by the ranks (each gets cores/ranks threads)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.steps, args.warmup)
    results = []
    print(f"mlp_step 784-512-512-10, global batch {BATCH}, {args.cores} cores")
    print(f"{'ranks':>5} {'thr/rank':>8} {'samples/s':>10} {'step ms':>8} {'grad ms':>8} "
          f"{'allreduce ms':>12} {'update ms':>9} {'allreduce %':>11} {'alone ms':>8}")
    for n in args.ranks:
        r = launch(n, args.cores, args.steps, args.warmup)
        results.append(r)
        print(f"{n:5d} {r['threads_per_rank']:8d} {r['samples_per_s']:10,.0f} "
              f"{r['step_ms']:8.2f} {r['grad_ms']:8.2f} {r['allreduce_ms']:12.3f} "
              f"{r['update_ms']:9.2f} {100 * r['allreduce_share']:10.1f}% "
              f"{r['allreduce_alone_ms']:8.3f}", flush=True)
        if r["fused_single_process_samples_per_s"]:
            print(f"      (one process, forward+backward+update in one jitted graph: "
                  f"{r['fused_single_process_samples_per_s']:,.0f} samples/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
