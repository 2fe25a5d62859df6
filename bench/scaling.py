"""Scaling series, tracegrad against jax.jit side by side: ew_chain at 2^10 ... 2^24 elements
and mlp_step at batch 1 ... 1024. Prints a table, writes bench/out/scaling.json and plots
bench/scaling.png (matplotlib), so the crossover points are visible. At each size the two are
timed in alternating rounds (`paired`), so both see the same stretches of a shared machine.

    python bench/scaling.py            # both series
    python bench/scaling.py ew_chain   # one of them
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, optional, pin_threads  # noqa: E402

pin_threads()

import numpy as np  # noqa: E402

import wl_ew_chain  # noqa: E402
import wl_mlp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EW_SIZES = [1 << k for k in range(10, 25)]
MLP_BATCHES = [1 << k for k in range(0, 11)]


def _reps(seconds_guess: float) -> int:
    return int(min(200, max(5, 0.5 / max(seconds_guess, 1e-6))))


ROUNDS = 5


def paired(fns: dict[str, Callable[[], object]], reps: int, warmup: int) -> dict[str, float]:
    """Median seconds per call of each function, measured in ROUNDS alternating rounds of
    reps / ROUNDS calls each: on a shared machine whose speed drifts, every framework sees
    the same stretches of it (back to back, one framework could get a slow one)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    per = max(1, -(-reps // ROUNDS))
    for _ in range(ROUNDS):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _tracegrad():
    import tracegrad as tg
    # one jitted function sees every size: without this, sizes after the first would be
    # tiered (interpreted until hot); the series measures compiled code, as jax.jit's does
    tg.config.tiering = False
    return tg


def ew_chain_series() -> dict[str, list[float]]:
    tg = _tracegrad()
    jax = optional("jax")

    def f_tg(x):
        return tg.sum(tg.tanh(x) * tg.sigmoid(x) + tg.exp(-x * x) * tg.log1p(x * x)
                      + tg.sin(x) * tg.cos(x))
    step = tg.jit(tg.value_and_grad(f_tg))
    out: dict[str, list[float]] = {"tracegrad": [], "jax.jit": []}
    if jax is not None:
        jnp = jax.numpy

        def f_jax(x):
            return jnp.sum(jnp.tanh(x) * jax.nn.sigmoid(x) + jnp.exp(-x * x)
                           * jnp.log1p(x * x) + jnp.sin(x) * jnp.cos(x))
        jstep = jax.jit(jax.value_and_grad(f_jax))
    for n in EW_SIZES:
        x = wl_ew_chain._x(n)
        fns = {"tracegrad": lambda: step(x)}
        if jax is not None:
            xj = jnp.asarray(x)
            fns["jax.jit"] = lambda: block(jstep(xj))
        for k, t in paired(fns, _reps(n * 2e-8), warmup=2).items():
            out[k].append(t)
        k = n.bit_length() - 1
        print(f"  ew_chain n=2^{k:<2d} tracegrad {out['tracegrad'][-1] * 1e3:9.3f} ms"
              + (f"   jax.jit {out['jax.jit'][-1]*1e3:9.3f} ms" if jax is not None else ""),
              flush=True)
    return out


def mlp_series() -> dict[str, list[float]]:
    _tracegrad()
    jax = optional("jax")
    params = wl_mlp.init()
    step = wl_mlp.tracegrad_step()
    out: dict[str, list[float]] = {"tracegrad": [], "jax.jit": []}
    if jax is not None:
        jnp = jax.numpy

        jstep = wl_mlp.jax_step(jax)
        jp = [jnp.asarray(p) for p in params]
    for batch in MLP_BATCHES:
        x, y = wl_mlp.data(batch)
        fns = {"tracegrad": lambda: step(params, x, y)}
        if jax is not None:
            xj, yj = jnp.asarray(x), jnp.asarray(y.astype(np.int32))
            fns["jax.jit"] = lambda: block(jstep(jp, xj, yj))
        for k, t in paired(fns, _reps(batch * 5e-5), warmup=3).items():
            out[k].append(t)
        print(f"  mlp_step batch={batch:<5d} tracegrad {out['tracegrad'][-1]*1e3:9.3f} ms"
              + (f"   jax.jit {out['jax.jit'][-1]*1e3:9.3f} ms" if jax is not None else ""),
              flush=True)
    return out


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(k, v) for k, v in (("ew_chain", EW_SIZES), ("mlp_step", MLP_BATCHES))
              if k in results]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (name, xs) in zip(axes[0], panels):
        for fw, times in results[name].items():
            if times:
                ax.loglog(xs, [t * 1e3 for t in times], "o-", label=fw, base=2)
        ax.set_xlabel("elements" if name == "ew_chain" else "batch")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(f"{name}: tracegrad vs jax.jit, {os.environ.get('BENCH_THREADS', '2')} "
                     "threads")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(names: list[str]) -> dict:
    series = {"ew_chain": ew_chain_series, "mlp_step": mlp_series}
    results = {}
    for name in names or list(series):
        print(f"[{name}]", flush=True)
        results[name] = series[name]()
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "scaling.json"), "w") as f:
        json.dump({"ew_chain_sizes": EW_SIZES, "mlp_batches": MLP_BATCHES, **results}, f,
                  indent=2)
    plot(results, os.path.join(HERE, "scaling.png"))
    print(f"wrote {os.path.join(HERE, 'scaling.png')}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
