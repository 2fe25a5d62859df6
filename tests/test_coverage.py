"""Adding a primitive touches one entry per layer: these tests fail when an op in OPS lacks
its reference, shape rule, VJP or JVP rule, or (once codegen has a table) its lowering."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

from tracegrad import ir
from tracegrad.ir import JVP, OPS, VJP
from tracegrad.ir.rules import NO_GRAD


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_definition(name):
    op = OPS[name]
    assert op.name == name
    assert callable(op.rule) and callable(op.ref)
    assert op.kind in {"unary", "binary", "select", "compare", "reduce", "index", "shape",
                       "matmul", "create", "misc"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_vjp_and_jvp_rule(name):
    assert name in VJP, f"primitive {name!r} has no VJP rule in tracegrad/ir/rules.py"
    assert name in JVP, f"primitive {name!r} has no JVP rule in tracegrad/ir/rules.py"
    assert callable(VJP[name]) and callable(JVP[name])


def test_rule_tables_name_only_known_ops():
    assert set(VJP) <= set(OPS), set(VJP) - set(OPS)
    assert set(JVP) <= set(OPS), set(JVP) - set(OPS)
    assert NO_GRAD <= set(OPS)


def test_non_differentiable_ops_give_no_gradient():
    b = ir.Builder("t")
    x = b.new_input(ir.Aval((3,), np.dtype(np.float32)))
    with b.active():
        for name in ("lt", "eq", "sign", "stop_gradient"):
            ins = (x, x) if OPS[name].kind == "compare" else (x,)
            out = ir.bind(name, *ins)
            assert VJP[name](x, *ins, out=out) == (None,) * len(ins)
            assert JVP[name](*([x] * len(ins)), *ins, out=out) is None


def _lowering_tables() -> list[tuple[str, dict]]:
    """Tables in tracegrad.codegen named like LOWERINGS mapping op names to lowerings."""
    try:
        codegen = importlib.import_module("tracegrad.codegen")
    except Exception:   # noqa: BLE001 - codegen may be mid-rewrite or need llvmlite
        return []
    found = []
    modules = [codegen]
    for info in pkgutil.iter_modules(getattr(codegen, "__path__", [])):
        try:
            modules.append(importlib.import_module(f"tracegrad.codegen.{info.name}"))
        except Exception:   # noqa: BLE001, S112
            continue
    for mod in modules:
        for attr, value in inspect.getmembers(mod):
            if "LOWERING" in attr.upper() and isinstance(value, dict) and value:
                found.append((f"{mod.__name__}.{attr}", value))
    return found


def test_every_op_has_a_lowering():
    tables = _lowering_tables()
    if not tables:
        pytest.skip("tracegrad.codegen has no LOWERINGS table yet")
    lowered = set().union(*(set(t) for _, t in tables))
    missing = sorted(set(OPS) - lowered)
    assert not missing, (f"primitives without a lowering in "
                         f"{', '.join(n for n, _ in tables)}: {missing}")
