"""Graph -> LLVM IR: fusion planning, loop nests, reductions, matmul and vector math."""
from .module import ENTRY, Layout, Lowered, lower_graph
from .plan import Group, Plan, plan_graph

__all__ = ["ENTRY", "Group", "Layout", "Lowered", "Plan", "lower_graph", "plan_graph"]
