"""The digits MLP of train_digits_mlp.py, written with the eager Tensor API, the way a
PyTorch user would: `model(x)`, `loss.backward()`, `optimizer.step()`. Each step re-records
its graph (any Python control flow works); tracegrad compiles forward and backward together
and reuses the code once the graph has been seen.

    python examples/train_digits_eager.py                # ~97% test accuracy
    python examples/train_digits_eager.py --steps 50     # a quick run (CI does this)
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F
from train_digits_mlp import load_digits, make_model, parse_args, progress, report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv, __doc__, "digits_eager_loss.png",
                      "write model and optimizer state here (.npz)")

    tg.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = make_model()
    optimizer = tg.optim.Adam(model.parameters(), lr=args.lr)

    steps_per_epoch = len(x_train) // args.batch_size
    total = steps_per_epoch * args.epochs
    if args.steps:
        total = min(total, args.steps)
    rng = np.random.default_rng(args.seed)
    losses: list[float] = []
    bar = progress(total, args.quiet)
    t0 = time.perf_counter()
    step = 0
    model.train()
    while step < total:
        order = rng.permutation(len(x_train))
        for b in range(steps_per_epoch):
            if step >= total:
                break
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = tg.tensor(x_train[idx]), tg.tensor(y_train[idx])
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            bar.update(1)
            if step % 10 == 0 or step == total:
                rate = step * args.batch_size / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{np.mean(losses[-10:]):.4f}",
                                samples_per_s=f"{rate:,.0f}")
    bar.close()
    seconds = time.perf_counter() - t0

    model.eval()                      # dropout off; no_grad: no graph for backward
    with tg.no_grad():
        predicted = tg.argmax(model(tg.tensor(x_test)), axis=-1).numpy()
    accuracy = float(np.mean(predicted == y_test))
    if args.save:
        tg.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save)
    return report(args, losses, step, seconds, accuracy)


if __name__ == "__main__":
    main()
