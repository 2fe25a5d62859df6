"""IR inspection: `python -m tracegrad dump`, `graph.to_dot()` and `tg.viz.render`."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.__main__ import main, parse_spec

SCRIPT = textwrap.dedent("""\
    import tracegrad as tg
    import tracegrad.nn.functional as F

    def loss(w, x, y):
        return F.cross_entropy(tg.tanh(x @ w), y)

    @tg.jit
    def jitted(x):
        return tg.sum(tg.exp(x))

    if __name__ == "__main__":
        raise SystemExit("the dump must not run the script's main block")
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SCRIPT)
    return str(path)


def dump(capsys, *argv: str) -> str:
    assert main(["dump", *argv]) == 0
    return capsys.readouterr().out


def test_dump_prints_the_ir(script, capsys):
    out = dump(capsys, f"{script}:loss", "--arg", "f32[784,10]", "--arg", "f32[128,784]",
               "--arg", "i64[128]")
    assert out.startswith("{ lambda a:f32[784,10] b:f32[128,784] c:i64[128] .")
    assert "matmul b a" in out and "tanh" in out and out.rstrip().endswith("}")
    assert "(backward" not in out


def test_dump_grad_with_source_lines(script, capsys):
    out = dump(capsys, f"{script}:loss", "--arg", "f32[4,3]", "--arg", "f32[2,4]",
               "--arg", "i64[2]", "--grad", "--source")
    assert re.search(r"in \(\w+\) \}", out)          # one output: the gradient of w
    assert "# model.py:5 (backward of tanh)" in out
    two = dump(capsys, f"{script}:loss", "--arg", "f32[4,3]", "--arg", "f32[2,4]",
               "--arg", "i64[2]", "--grad", "--argnums", "0,1")
    assert re.search(r"in \(\w+ \w+\) \}", two)


def test_dump_llvm_asm_and_dot(script, capsys):
    args = [f"{script}:jitted", "--arg", "f32[16]"]
    llvm = dump(capsys, *args, "--llvm")
    asm = dump(capsys, *args, "--asm")
    assert llvm.strip() and asm.strip()
    if "no native backend" not in llvm:           # the dump loads tracegrad.runtime if it can
        assert "define" in llvm and "target triple" in llvm
        assert ".text" in asm or ".section" in asm
    dot = dump(capsys, *args, "--dot")
    assert dot.startswith("digraph") and "exp" in dot


def test_dump_errors(script):
    with pytest.raises(SystemExit, match="no 'nope'"):
        main(["dump", f"{script}:nope", "--arg", "f32[2]"])
    with pytest.raises(SystemExit, match="SCRIPT.py:FUNC"):
        main(["dump", script])


def test_arg_specs():
    assert parse_spec("f32[128,784]").shape == (128, 784)
    assert parse_spec("i64[3]").dtype == np.int64 and not parse_spec("i64[3]").any()
    assert parse_spec("f64").shape == () and parse_spec("bool[]").dtype == np.bool_
    with pytest.raises(Exception, match="expected DTYPE"):
        parse_spec("float[3]")


def test_python_dash_m(script):
    res = subprocess.run([sys.executable, "-m", "tracegrad", "dump", f"{script}:jitted",
                          "--arg", "f32[8]"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "exp" in res.stdout and "reduce_sum" in res.stdout


# ---- dot output ----------------------------------------------------------------------------

_NODE = re.compile(r'^\s*(\w+) \[label="((?:[^"\\]|\\.)*)"[^\]]*\];$')
_EDGE = re.compile(r'^\s*(\w+) -> (\w+)( \[label="[^"]*"\])?;$')


def parse_dot(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """A strict reader for the subset of DOT that `to_dot` writes; fails on anything else."""
    lines = text.strip().splitlines()
    assert lines[0] == "digraph G {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        if line.strip().endswith(("];", ";")) and ("rankdir" in line or "node [" in line):
            continue
        if m := _NODE.match(line):
            nodes[m[1]] = m[2]
        elif m := _EDGE.match(line):
            edges.append((m[1], m[2]))
        else:
            raise AssertionError(f"unparseable DOT line: {line!r}")
    for a, b in edges:
        assert a in nodes and b in nodes, (a, b)
    return nodes, edges


def gradient_graph():
    def loss(w, x):
        return tg.sum(tg.tanh(x @ w))
    w, x = np.ones((3, 2), np.float32), np.ones((4, 3), np.float32)
    return tg.make_ir(tg.value_and_grad(loss))(w, x)


def test_dot_parses_and_shows_ops_shapes_and_the_backward_split():
    graph = gradient_graph()
    text = graph.to_dot()
    nodes, edges = parse_dot(text)
    assert len(nodes) == len(graph.eqns) + len(graph.invars) + len(graph.outvars)
    assert any(label.startswith("tanh") and "f32[4,2]" in label for label in nodes.values())
    assert "fillcolor" in text                       # backward equations are shaded
    assert len(edges) >= len(graph.eqns)


def test_viz_render_writes_dot_without_graphviz(tmp_path, monkeypatch):
    graph = gradient_graph()
    monkeypatch.setitem(sys.modules, "graphviz", None)      # as if not installed
    out = tg.viz.render(graph, tmp_path / "g.svg")
    assert out == str(tmp_path / "g.dot")
    parse_dot(open(out).read())
    assert tg.viz.render(graph, tmp_path / "h.dot") == str(tmp_path / "h.dot")


def test_viz_accepts_lowered_functions(tmp_path):
    lowered = tg.jit(lambda x: tg.exp(x) * 2.0).lower(np.ones(3, np.float32))
    assert tg.viz.to_dot(lowered) == lowered.ir.to_dot()
    with pytest.raises(TypeError, match="tg.ir.Graph"):
        tg.viz.to_dot("not a graph")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot program not installed")
def test_viz_render_svg_with_graphviz(tmp_path):
    pytest.importorskip("graphviz")
    out = tg.viz.render(gradient_graph(), tmp_path / "g.svg")
    assert out.endswith(".svg") and "<svg" in open(out).read()


@pytest.mark.skipif(shutil.which("dot") is not None, reason="graphviz's dot program installed")
def test_viz_render_falls_back_when_dot_is_missing(tmp_path):
    out = tg.viz.render(gradient_graph(), tmp_path / "g.png")
    assert out == str(tmp_path / "g.dot")
