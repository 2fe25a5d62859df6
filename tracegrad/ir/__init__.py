"""The IR: primitives, graphs, printer, verifier, reference interpreter, passes, autodiff."""
from .autodiff import backward_pass, forward_pass, jvp_graph, vjp_graph
from .builder import Builder, Traced, TracingError, bind, current_builder, user_source
from .core import Atom, Aval, Eqn, Graph, Lit, Var, aval_of, is_float, short_dtype
from .hashing import structural_hash
from .interpret import Program, interpret, program
from .loops import roll_loops
from .ops import OPS, DTypeError, OpDef, ShapeError
from .passes import cse, dce, fold_constants, optimize, rewrite, simplify
from .printer import format_graph, graph_to_dot
from .rules import JVP, VJP
from .verify import IRError, verify

__all__ = [
    "Atom", "Aval", "Builder", "DTypeError", "Eqn", "Graph", "IRError", "JVP", "Lit", "OPS",
    "OpDef", "Program", "ShapeError", "Traced", "TracingError", "VJP", "Var", "aval_of",
    "backward_pass", "bind", "cse", "current_builder", "dce", "fold_constants", "format_graph",
    "forward_pass", "graph_to_dot", "interpret", "is_float", "jvp_graph", "optimize", "program",
    "rewrite", "roll_loops", "short_dtype", "simplify", "structural_hash", "user_source",
    "verify", "vjp_graph",
]
