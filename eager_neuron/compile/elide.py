"""Copies of a fresh value into fresh memory of its own layout: the value itself.

Compiled autograd (`torch._dynamo.config.compiled_autograd`) traces each `AccumulateGrad` as
dynamo's `accumulate_grad` polyfill, which copies every gradient into `empty_like(param)`
(the gradient layout contract) before `param.grad` takes it:

    %e = new_empty_strided(%g, [32, 12], [12, 1])      # the parameter's layout
    %c = copy(%e, %g)                                   # returned: param.grad = c

Eager's AccumulateGrad steals the gradient instead when nothing else holds it and its layout
already obeys the contract. The graph's `copy` is that case when `g` has the same shape,
strides, offset and dtype, its memory is made inside this graph (no input's, no other
output's) and nothing else reads `e`: `c` is then `g`, one allocation and one kernel less per
parameter (GPT-2 tiny: 28 of each per step). A `g` made by a view node (a bias gradient is
`view(sum(..., keepdim=True))`, a weight's `t(t(mm))`) is handed over as a new tensor over the
same memory (`unaliased`), never as a view: the interpreter's first call made such views
through torch's dispatcher (with a `_base`), the plan from host data (without), and dynamo
recompiled the optimizer's graph when `param.grad._base` changed between steps.

>>> import torch, eager_neuron
>>> from eager_neuron.compile.elide import fresh_copies
>>> fresh_copies(torch.fx.symbolic_trace(lambda x: x + 1))   # nothing to elide
0
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..tensor import NeuronTensor
from .codegen import _storage_of
from .forms import _VIEWS

aten = torch.ops.aten
ENABLED = True   # (a module flag: tools' in-process A/B builds steps with and without it)


_storage = _storage_of      # the memory a node's value lives in, or None (codegen's)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return (a.dtype == b.dtype and a.device == b.device and tuple(a.shape) == tuple(b.shape)
                and tuple(a.stride()) == tuple(b.stride())
                and a.storage_offset() == b.storage_offset() == 0
                and all(isinstance(s, int) for s in (*a.shape, *a.stride())))
    except Exception:    # noqa: BLE001 - a symbolic size: keep the copy
        return False


def unaliased(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in `t`'s memory as a tensor of its own (no view of another tensor); the
    target of an elided copy whose source is a view."""
    if type(t) is NeuronTensor:
        return NeuronTensor(t._data, t._block, t._index)
    return t.clone()


def fresh_copies(gm: GraphModule) -> int:
    """Replace `copy(new_empty_strided(...), g)` by `g` where that is the same tensor to its
    reader (see the module's docstring). Returns the number of copies removed."""
    graph = gm.graph
    nodes = list(graph.nodes)
    output = next((n for n in reversed(nodes) if n.op == "output"), None)
    if output is None:
        return 0
    # memory the caller gave (inputs, and anything a view of them shares)
    given = {s for n in nodes if n.op == "placeholder" for s in [_storage(n)] if s is not None}
    done = 0
    for node in nodes:
        if node.op != "call_function" or node.target is not aten.copy.default or node.kwargs:
            continue
        if len(node.args) != 2 or not all(isinstance(a, Node) for a in node.args):
            continue
        empty, src = node.args
        if empty.target is not aten.new_empty_strided.default or len(empty.users) != 1:
            continue
        cv, sv = node.meta.get("val"), src.meta.get("val")
        ss = _storage(src)
        if not isinstance(cv, torch.Tensor) or not isinstance(sv, torch.Tensor) or ss is None \
                or not _same_layout(cv, sv) or ss in given or src.op != "call_function":
            continue
        # the copy's only reader is the output, and no other output shares src's memory (two
        # gradients of one value, or the value saved for a backward, keep their copies)
        if set(node.users) != {output} or output.args[0].count(node) != 1:
            continue
        others = [a for a in output.all_input_nodes if a is not node]
        if any(_storage(a) == ss for a in others):
            continue
        if src.target in _VIEWS:
            node.target, node.args = unaliased, (src,)
        else:
            node.replace_all_uses_with(src)
            graph.erase_node(node)
        graph.erase_node(empty)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


__all__ = ["fresh_copies"]
