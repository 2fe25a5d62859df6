"""`DistributedDataParallel`: data parallelism for the Tensor API. Every rank holds the same
model (broadcast from the root at construction), runs forward and `loss.backward()` on its
own shard of the batch, and `sync_gradients()` replaces each `.grad` by its mean over ranks
in one fused all-reduce, so the optimizer steps identically everywhere.

Why no overlap of the all-reduce with backward: a tracegrad backward records the gradient
IR and runs it as one native call, so every gradient appears at the same moment; there is
no partial backward to hide communication behind."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..nn.module import Module
from ..nn.parameter import assign
from ..tracer.tensor import Tensor
from .collectives import allreduce_sum, broadcast
from .world import World, init


def broadcast_parameters(module: Module, root: int = 0) -> None:
    """Overwrite `module`'s parameters and buffers on every rank with `root`'s, in place,
    after checking every rank built the same shapes (the error names the parameter)."""
    slots = dict(module.named_parameters())
    slots.update(module.named_buffers())
    values = broadcast({k: v.detach().numpy() if isinstance(v, Tensor) else v
                        for k, v in slots.items()}, root)
    for k, v in values.items():
        assign(slots[k], v)


class DistributedDataParallel(Module):
    """Wrap `module` for data-parallel training (PyTorch's `DistributedDataParallel` role):

        model = dist.DistributedDataParallel(make_model())     # same weights on all ranks
        optimizer = tg.optim.Adam(model.parameters(), lr=1e-3)
        for idx in sampler:                                    # this rank's shard
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            model.sync_gradients()                             # mean of .grad over ranks
            optimizer.step()

    Calling the wrapper calls the module; `wrapper.module` is the module itself."""

    world: World

    def __init__(self, module: Module, root: int = 0, broadcast_buffers: bool = True):
        super().__init__()
        self.module = module
        self.world = init()
        if self.world.size > 1:
            if broadcast_buffers:
                broadcast_parameters(module, root)
            else:
                values = broadcast(module.param_dict(), root)
                for name, p in module.named_parameters():
                    assign(p, values[name])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def sync_gradients(self) -> None:
        """Average every parameter's `.grad` over the ranks (one message per dtype). A rank
        on which a parameter got no gradient contributes zeros; a parameter no rank gave a
        gradient keeps `.grad = None`."""
        if self.world.size == 1:
            return
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return
        grads = [np.zeros(p.shape, p.dtype) if p.grad is None else p.grad.detach().numpy()
                 for p in params]
        # one counter per parameter rides in the same buffer: which ranks had a gradient
        has = np.array([p.grad is not None for p in params], params[0].dtype)
        summed, counts = allreduce_sum((grads, has))
        scale = np.asarray(1.0 / self.world.size)
        for p, g, n in zip(params, summed, counts, strict=True):
            if n > 0:
                g *= scale.astype(g.dtype)
                p.grad = Tensor._leaf(g)
