"""Values of a compiled graph that depend on no input: computed by the first run, then reused.

Hugging Face models build their attention masks and position ids inside the forward from
`arange`, `new_ones`, `cumsum`, `index` and comparisons of those (masking_utils): a dozen
eager nodes and a fused kernel or two per step (~2 ms of a GPT-2 tiny step, `arange` alone
~0.2 ms through dispatch) whose values only the graph's static shapes decide. A node is
*constant* when it is a deterministic aten op (not tagged `nondeterministic_seeded`, with a
result) all of whose operands are constants or `get_attr` constants. Constants are left out
when something may change their memory afterwards (an operand a schema writes to: `copy_`'s
destination, an in-place op) or hands it to the caller (a graph output, or a view on the way
to one: the caller owns that memory); such a value is recomputed every run, and what is built
from it into new memory is still constant. A step all of whose nodes are constants is skipped after
the first run; the constants that steps still running read are kept from the first run
(`Program.folded`). Under dynamic shapes a size is a graph input, so what depends on it is not
constant and runs every time.

>>> import torch, eager_neuron
>>> f = torch.compile(lambda x: x + torch.arange(4, device=x.device), backend="neuron")
>>> x = torch.zeros(4, device="neuron")
>>> _ = f(x); f(x).tolist()
[0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node


def _deterministic_op(node: Node) -> bool:
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    schema = t._schema
    return (torch.Tag.nondeterministic_seeded not in t.tags and not schema.is_mutable
            and len(schema.returns) > 0)


def _written(node: Node) -> set:
    """The operand nodes `node` may write to (its schema's mutable arguments)."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
        return set()
    out = set()
    for i, arg in enumerate(t._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        val = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, Node):
                out.add(v)
    return out


def _aliases(node: Node) -> bool:
    """Whether the node's result may share its operand's memory (a view)."""
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in t._schema.returns)


def _alias_closure(starts) -> set:
    """The nodes that may share memory with `starts`: through view-like ops, both ways."""
    seen: set = set()
    todo = list(starts)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and _aliases(n):
            todo.extend(n.all_input_nodes)
        todo.extend(u for u in n.users if u.op == "call_function" and _aliases(u))
    return seen


def constants(graph: torch.fx.Graph, output: Node) -> set:
    """The graph's constant nodes that may be kept from a run (see the module docstring).

    Two questions: is a node's *value* the same on every run (a deterministic op of such
    values), and may its *memory* be kept (nothing writes to it, the caller does not get it).
    Memory something may write to has no constant value (what a later reader sees depends on
    the write). A value the caller gets (GPT-2's position ids, returned for the embedding's
    backward) is recomputed every run, yet it is still the same value: an op that reads it and
    makes new memory (the `cat`, `cumsum` and `index` of the causal mask built from the
    position ids) is constant and kept."""
    nodes = list(graph.nodes)
    written: set = set()
    for node in nodes:
        written |= _written(node)
    unstable = _alias_closure(written)                 # no constant value
    handed = _alias_closure(output.all_input_nodes)    # constant value, memory not kept
    value: set = set()
    for node in nodes:
        if node in unstable:
            continue
        if node.op == "get_attr":
            value.add(node)
        elif node.op == "call_function" and _deterministic_op(node) and \
                all(a in value for a in node.all_input_nodes):
            value.add(node)
    return {n for n in value if n.op != "get_attr" and n not in handed}


def plan(steps: list, produced, reads, const: set) -> tuple:
    """(indices of the steps to skip once folded, the constants kept from the first run).

    `produced(kind, x)`/`reads(kind, x)` list the nodes a step computes / reads."""
    skip = set()
    for i, (kind, x) in enumerate(steps):
        made = produced(kind, x)
        if made and all(n in const for n in made):
            skip.add(i)
    kept = set()
    for i, (kind, x) in enumerate(steps):
        if i not in skip:
            kept.update(n for n in reads(kind, x) if n in const)
    return frozenset(skip), tuple(n for n in kept)


__all__ = ["constants", "plan"]
