"""Run the BENCH.md workloads for tracegrad and every installed anchor; print medians and
ratios (tracegrad / anchor, same run) and write them as JSON.

    python bench/run.py                 # all workloads
    python bench/run.py mlp_step small  # some of them
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import THREADS, pin_threads  # noqa: E402

pin_threads()

import wl_compile  # noqa: E402
import wl_dynamic  # noqa: E402
import wl_ew_chain  # noqa: E402
import wl_mlp  # noqa: E402
import wl_small  # noqa: E402

WORKLOADS = {
    "mlp_step": (wl_mlp.run, "jax.jit", 0.9),
    "ew_chain": (wl_ew_chain.run, "torch.compile", 0.5),
    "small": (wl_small.run, "jax.jit", 0.5),
    "compile": (wl_compile.run, "jax.jit", 0.05),
    "dynamic": (wl_dynamic.run, "torch", 0.5),
}


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def main(names: list[str]) -> dict:
    results = {}
    for name in names or list(WORKLOADS):
        fn, target_anchor, target = WORKLOADS[name]
        print(f"[{name}] running...", flush=True)
        times = fn()
        ours = {k: v for k, v in times.items() if k.startswith("tracegrad")}
        main_ours = max(ours.values())     # every variant must meet the target: the slowest
        print(f"{name:10s} target: tracegrad <= {target}x {target_anchor}")
        for k, v in sorted(times.items(), key=lambda kv: kv[1]):
            ratio = f"{main_ours / v:6.2f}x" if not k.startswith("tracegrad") else ""
            print(f"  {k:26s} {_fmt(v):>10s}   tracegrad/{k}: {ratio}" if ratio else
                  f"  {k:26s} {_fmt(v):>10s}")
        anchor = times.get(target_anchor)
        met = None if anchor is None else main_ours / anchor <= target
        verdict = "n/a (anchor missing)" if met is None else ("MET" if met else "missed")
        print(f"  -> {main_ours / anchor if anchor else float('nan'):.3f}x {target_anchor}: "
              f"{verdict}\n", flush=True)
        results[name] = {"seconds": times, "target_anchor": target_anchor, "target": target,
                         "ratio": None if anchor is None else main_ours / anchor, "met": met}
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "threads": THREADS, "python": platform.python_version()}
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    print(f"wrote {os.path.join(out_dir, 'results.json')}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
