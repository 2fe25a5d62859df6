"""PyTorch-style optimizers over Tensors (`zero_grad()`, `step()`), built on the pure updates:
each parameter group's step is one `tg.jit`-compiled call of the pure update, written back
into the parameters in place."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from ..nn import parameter as P
from ..tracer.jit import jit
from . import functional as OF


class Optimizer:
    """Base class: `param_groups` (dicts with "params" and hyperparameters), per-parameter
    `state`, `zero_grad()`, `step(closure=None)`, `state_dict()`, `load_state_dict()`."""

    init_state: Callable[[Any], dict]
    update: Callable[..., tuple]

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = defaults
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[int, dict] = {}
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)
        self._step_fn = jit(self._group_step, static_argnums=(3,))

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = dict(group)
        ps = group["params"]
        group["params"] = [ps] if P.is_tensor(ps) or isinstance(ps, np.ndarray) else list(ps)
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if P.is_tensor(p) and p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def _hyper(self, group: dict) -> tuple[tuple, dict]:
        """Hyperparameters split into static ones (flags, and zeros, which remove work from
        the graph) and dynamic floats (changing lr does not recompile)."""
        static, dynamic = [], {}
        for k in self.defaults:
            v = group[k]
            if isinstance(v, bool) or v == 0:
                static.append((k, v))
            else:
                # float64 leaves: a float32 lr would perturb float64 parameters
                dynamic[k] = (tuple(np.float64(x) for x in v) if isinstance(v, tuple)
                              else np.float64(v))
        return tuple(static), dynamic

    def _group_step(self, values: list, grads: list, states: list, static: tuple,
                    dynamic: dict) -> tuple[list, list]:
        kw = dict(static, **dynamic)
        outs = [type(self).update(v, g, s, **kw)
                for v, g, s in zip(values, grads, states, strict=True)]
        return [o[0] for o in outs], [o[1] for o in outs]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns `closure()` if given."""
        loss = None
        if closure is not None:
            from .. import tracer
            grad_mode = getattr(tracer, "grad_mode", None)
            if grad_mode is not None:
                with grad_mode.enable_grad():
                    loss = closure()
            else:
                loss = closure()
        for group in self.param_groups:
            ps = [p for p in group["params"] if P.grad_of(p) is not None]
            if not ps:
                continue
            values = [P.to_numpy(p) for p in ps]
            grads = [P.grad_of(p).astype(v.dtype, copy=False)
                     for p, v in zip(ps, values, strict=True)]
            states = [self.state.get(id(p)) or type(self).init_state(v)
                      for p, v in zip(ps, values, strict=True)]
            static, dynamic = self._hyper(group)
            new_values, new_states = self._step_fn(values, grads, states, static, dynamic)
            for p, v, s in zip(ps, new_values, new_states, strict=True):
                P.assign(p, v)
                self.state[id(p)] = s
        return loss

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: per-parameter state and groups refer to parameters by index."""
        index, groups, state = 0, [], {}
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                if id(p) in self.state:
                    state[index] = {k: np.array(v) for k, v in self.state[id(p)].items()}
                ids.append(index)
                index += 1
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"])
                for a, b in zip(groups, self.param_groups, strict=True)):
            raise ValueError("loaded state dict has a different number of parameter groups "
                             "or parameters than this optimizer")
        saved = {int(k): v for k, v in state_dict["state"].items()}
        for mine, theirs in zip(self.param_groups, groups, strict=True):
            mine.update({k: (tuple(v) if isinstance(v, list) else v)
                         for k, v in theirs.items() if k != "params"})
            for p, i in zip(mine["params"], theirs["params"], strict=True):
                if int(i) in saved:
                    self.state[id(p)] = {k: np.array(v) for k, v in saved[int(i)].items()}

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines + [")"])


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and weight decay."""

    init_state = staticmethod(OF.sgd_init)
    update = staticmethod(OF.sgd_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 maximize: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"Invalid hyperparameter: lr={lr}, momentum={momentum}, "
                             f"weight_decay={weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))


class Adam(Optimizer):
    """Adam (Kingma & Ba) with PyTorch's bias correction; `weight_decay` is L2 on the grad."""

    init_state = staticmethod(OF.adam_init)
    update = staticmethod(OF.adam_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, maximize: bool = False):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Invalid hyperparameter: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, maximize=maximize))


class AdamW(Adam):
    """Adam with decoupled weight decay (default 1e-2, as PyTorch)."""

    update = staticmethod(OF.adamw_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, maximize)
