"""Peak resident memory of a training step: tracegrad (jit) against torch eager.

Each (framework, model) runs in a fresh process: import, build the data, record RSS, then
run 20 steps and report the peak RSS (ru_maxrss) and the growth over the pre-step RSS, which
is what the step itself costs (the frameworks' import footprints differ by hundreds of MB);
tracegrad's growth includes compiling (LLVM) on the first step, also shown apart.

    python bench/memory.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {"mlp_step": (784, 512, 512, 10), "mlp20": (784,) + (512,) * 19 + (10,)}
BATCH = 128
STEPS = 20

_CHILD = r"""
import json, os, resource, sys
sys.path.insert(0, {here!r})
from common import pin_threads
pin_threads()
import numpy as np
import wl_mlp

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

sizes, fw = {sizes!r}, {fw!r}
params = wl_mlp.init(sizes)
x, y = wl_mlp.data({batch}, sizes)
if fw == "tracegrad":
    import tracegrad  # noqa: F401
    step = wl_mlp.tracegrad_step()
    run = lambda: step(params, x, y)
else:
    import torch
    torch.set_num_threads(2)
    run = wl_mlp.torch_step(torch, params, x, y)
before = rss_mb()
out = run()
first = rss_mb()
for _ in range({steps} - 1):
    out = run()
del out
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"before_mb": before, "first_mb": first, "peak_mb": peak}}))
"""


def measure(fw: str, sizes: tuple) -> dict:
    code = _CHILD.format(here=HERE, sizes=sizes, fw=fw, batch=BATCH, steps=STEPS)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> dict:
    out = {}
    print(f"{'model':10s} {'framework':10s} {'peak RSS':>10s} {'growth':>10s} "
          f"{'1st step':>10s}")
    for name, sizes in MODELS.items():
        for fw in ("tracegrad", "torch"):
            r = measure(fw, sizes)
            out[f"{name}/{fw}"] = r
            if "error" in r:
                print(f"{name:10s} {fw:10s} error: {r['error']}")
                continue
            growth = r["peak_mb"] - r["before_mb"]
            first = r["first_mb"] - r["before_mb"]
            print(f"{name:10s} {fw:10s} {r['peak_mb']:7.1f} MB {growth:7.1f} MB {first:7.1f} MB",
                  flush=True)
    return out


if __name__ == "__main__":
    main()
