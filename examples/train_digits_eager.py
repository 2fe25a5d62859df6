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
from train_digits_mlp import batches, load_digits, make_model, parse_args, report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv, __doc__, "digits_eager_loss.png",
                      "write model and optimizer state here (.npz)")

    tg.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = make_model()
    optimizer = tg.optim.Adam(model.parameters(), lr=args.lr)

    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    for _, idx in batches(args, len(x_train), losses):
        x, y = tg.tensor(x_train[idx]), tg.tensor(y_train[idx])
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0

    model.eval()                      # dropout off; no_grad: no graph for backward
    with tg.no_grad():
        predicted = tg.argmax(model(tg.tensor(x_test)), axis=-1).numpy()
    accuracy = float(np.mean(predicted == y_test))
    if args.save:
        tg.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save)
    return report(args, losses, len(losses), seconds, accuracy)


if __name__ == "__main__":
    main()
