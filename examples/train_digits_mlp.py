"""Train an MLP on scikit-learn's bundled handwritten digits (8x8 images, 10 classes; no
download) with one `tg.jit`-compiled training step: forward, backward and the Adam update
trace into a single graph, with the parameters and optimizer state as pytrees.

    python examples/train_digits_mlp.py                 # ~97% test accuracy
    python examples/train_digits_mlp.py --steps 50      # a quick run (CI does this)

Writes a loss curve to digits_mlp_loss.png when matplotlib is installed.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Iterator

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], a seeded random split."""
    from sklearn.datasets import load_digits as sk_digits
    data = sk_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(128, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def progress(total: int, quiet: bool) -> Any:
    """A tqdm bar when tqdm is installed, else a minimal stand-in with the same methods."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, disable=quiet, unit="step", dynamic_ncols=True)
    except ImportError:
        class Bar:
            def update(self, n: int) -> None: ...
            def set_postfix(self, **kw: Any) -> None: ...
            def close(self) -> None: ...
        return Bar()


def batches(args: Any, n: int, losses: list[float]) -> Iterator[tuple[int, np.ndarray]]:
    """(step, indices) of each training batch: epochs of shuffled full batches (one compiled
    shape), at most `args.steps`, with a progress bar showing the recent `losses`."""
    per_epoch = n // args.batch_size
    total = per_epoch * args.epochs
    if args.steps:
        total = min(total, args.steps) if args.epochs else args.steps
    rng = np.random.default_rng(args.seed)
    bar = progress(total, args.quiet)
    t0 = time.perf_counter()
    step = 0
    while step < total:
        order = rng.permutation(n)
        for b in range(per_epoch):
            if step >= total:
                break
            yield step, order[b * args.batch_size:(b + 1) * args.batch_size]
            step += 1
            bar.update(1)
            if step % 10 == 0 or step == total:
                rate = step * args.batch_size / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{np.mean(losses[-10:]):.4f}",
                                samples_per_s=f"{rate:,.0f}")
    bar.close()


def plot_losses(losses: list[float], path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = np.arange(1, len(losses) + 1)
    window = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, losses, alpha=0.3, label="loss per step")
    ax.plot(steps[window - 1:], smooth, label=f"moving average ({window} steps)")
    ax.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="digits MLP, tracegrad")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None, doc: str, plot: str, save_help: str) -> Any:
    """The command line both digits examples share."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRACEGRAD_EXAMPLE_STEPS",
                                                                     0)),
                   help="stop after this many steps (0: run all epochs)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=plot, help="loss-curve PNG ('' for none)")
    p.add_argument("--save", default="", help=save_help)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def report(args: Any, losses: list[float], step: int, seconds: float,
           accuracy: float) -> dict[str, Any]:
    """Plot the loss curve if asked, print the summary line, return the run's results."""
    plot = plot_losses(losses, args.plot) if args.plot else None
    if not args.quiet:
        print(f"{step} steps in {seconds:.1f} s ({step * args.batch_size / seconds:,.0f} "
              f"samples/s); final loss {np.mean(losses[-10:]):.4f}; "
              f"test accuracy {100 * accuracy:.2f}%"
              + (f"; loss curve in {plot}" if plot else ""))
    return {"accuracy": accuracy, "losses": losses, "steps": step, "seconds": seconds,
            "plot": plot}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv, __doc__, "digits_mlp_loss.png",
                      "write the trained state_dict here (.npz)")

    tg.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = make_model()
    params = model.param_dict()                 # {"0.weight": array, ...}: a pytree
    opt_state = tg.optim.adam_init(params)

    def loss_fn(params, x, y, seed):
        logits = model.apply(params, x, training=True, seed=seed)   # pure; seed -> dropout
        return F.cross_entropy(logits, y)

    @tg.jit
    def train_step(params, opt_state, x, y, seed, lr):
        loss, grads = tg.value_and_grad(loss_fn)(params, x, y, seed)
        params, opt_state = tg.optim.adam_update(params, grads, opt_state, lr=lr)
        return params, opt_state, loss

    @tg.jit
    def predict(params, x):
        return tg.argmax(model.apply(params, x, training=False), axis=-1)

    losses: list[float] = []
    t0 = time.perf_counter()
    for step, idx in batches(args, len(x_train), losses):
        params, opt_state, loss = train_step(params, opt_state, x_train[idx], y_train[idx],
                                             np.int64(step), np.float32(args.lr))
        losses.append(float(loss))
    seconds = time.perf_counter() - t0
    accuracy = float(np.mean(predict(params, x_test) == y_test))

    model.load_state_dict(params, strict=False)   # the trained values back into the module
    if args.save:
        tg.save(model.state_dict(), args.save)
    return report(args, losses, len(losses), seconds, accuracy)


if __name__ == "__main__":
    main()
