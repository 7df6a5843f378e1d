"""Functional `_foreach_*` nodes (compiled optimizers) -> one aten node per tensor.

The partition then fuses each tensor's chain (an AdamW step's per-parameter updates share one
kernel spec, so one Numba compile whatever the model size).

>>> import torch, eager_neuron
>>> p = [torch.ones(2, device="neuron"), torch.ones(3, device="neuron")]
>>> f = torch.compile(lambda ps: torch._foreach_mul(ps, 3.0), backend="neuron")
>>> [t.tolist() for t in f(p)]
[[3.0, 3.0], [3.0, 3.0, 3.0]]
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from .codegen import LoweringError

aten = torch.ops.aten


_LISTS = ("List[", "Tensor[]", "Tensor(a!)[]", "Tensor(a)[]", "float[]", "Scalar[]",
          "complex[]", "int[]")


def _meta_of(v):
    if isinstance(v, Node):
        mv = v.meta.get("val")
        if isinstance(mv, torch.Tensor):
            if any(not isinstance(s, int) for s in mv.shape):
                raise LoweringError("symbolic shape")
            return torch.empty_strided(mv.shape, mv.stride(), dtype=mv.dtype, device="meta")
        raise LoweringError("non-tensor node operand")
    return v


def _per_tensor_overload(packet, args, kwargs, expect):
    for ov in packet.overloads():
        op = getattr(packet, ov)
        s = op._schema
        if s.is_mutable or "out" in ov or len(s.returns) != 1:
            continue
        try:
            r = op(*[_meta_of(a) for a in args], **{k: _meta_of(v) for k, v in kwargs.items()})
        except Exception:
            continue
        if isinstance(r, torch.Tensor) and r.dtype == expect.dtype and r.shape == expect.shape:
            return op
    return None


_RESOLVED: dict = {}


def _arg_sig(v, expect) -> tuple:
    """What picks a per-tensor overload: operand kinds and dtypes, not sizes."""
    if isinstance(v, Node):
        mv = v.meta.get("val")
        if isinstance(mv, torch.Tensor):
            return ("T", mv.dtype, mv.dim(), tuple(mv.shape) == tuple(expect.shape),
                    mv.numel() == 1 if isinstance(mv.numel(), int) else None)
        return ("N", type(mv).__name__)
    if isinstance(v, (list, tuple)):
        return ("L", len(v), tuple(_arg_sig(x, expect) for x in v))
    return ("S", type(v).__name__)


def _resolve_per_tensor(packet, call, expect):
    """The per-tensor overload for one element of a foreach node, and (how many arguments
    go positionally, the keyword names of the rest), or None when all are positional.
    Memoized by argument kinds and dtypes (not sizes): the meta probes cost ~10 ms per
    tensor, and an optimizer step has hundreds of tensors of a few kinds (this was 6 of the
    ~10 s the package added to a warm GPT-2 compile)."""
    key = (packet._qualified_op_name, expect.dtype, expect.dim(),
           tuple(_arg_sig(v, expect) for v in call))
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    # positional by the foreach schema's order; the per-tensor op may make the trailing ones
    # keyword-only (addcmul's value): try both
    op = _per_tensor_overload(packet, call, {}, expect)
    names: tuple | None = None
    if op is None:
        for kk in range(len(call) - 1, 0, -1):
            cands = [o for o in (getattr(packet, ov) for ov in packet.overloads())
                     if len(o._schema.arguments) > kk]
            for o in cands:
                kws = {a.name: v for a, v in zip(o._schema.arguments[kk:], call[kk:])}
                op = _per_tensor_overload(packet, call[:kk], kws, expect)
                if op is not None:
                    names = (kk, tuple(kws))
                    break
            if op is not None:
                break
    if op is None:
        raise LoweringError(f"no per-tensor op for {packet._qualified_op_name}")
    _RESOLVED[key] = (op, names)
    return op, names


def expand_foreach(gm: GraphModule) -> int:
    """Rewrite functional `_foreach_*` nodes into one node per tensor (returns how many)."""
    done = 0
    for node in list(gm.graph.nodes):
        t = node.target
        if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            continue
        name = t._schema.name
        if not name.startswith("aten::_foreach_") or t._schema.is_mutable:
            continue
        vals = node.meta.get("val")
        if not isinstance(vals, (list, tuple)) or not vals:
            continue
        if any(u.target is not operator.getitem for u in node.users):
            continue
        packet = getattr(aten, name[len("aten::_foreach_"):], None)
        if packet is None:
            continue
        schema_args = t._schema.arguments
        bound = []
        for i, arg in enumerate(schema_args):
            if i < len(node.args):
                v = node.args[i]
            elif arg.name in node.kwargs:
                v = node.kwargs[arg.name]
            elif arg.has_default_value():
                v = arg.default_value
            else:
                break
            bound.append((arg, v))
        else:
            per_nodes = []
            try:
                for i, expect in enumerate(vals):
                    call = [v[i] if str(arg.type).startswith(_LISTS) and isinstance(
                        v, (list, tuple)) else v for arg, v in bound]
                    op, names = _resolve_per_tensor(packet, call, expect)
                    kw = {}
                    if names is not None:
                        k, keys = names
                        kw = dict(zip(keys, call[k:]))
                        call = call[:k]
                    with gm.graph.inserting_before(node):
                        n = gm.graph.call_function(op, tuple(call), kw)
                    n.meta.update(node.meta)
                    n.meta["val"] = expect
                    per_nodes.append(n)
            except LoweringError:
                for n in per_nodes:
                    gm.graph.erase_node(n)
                continue
            for u in list(node.users):
                u.replace_all_uses_with(per_nodes[u.args[1]])
                gm.graph.erase_node(u)
            gm.graph.erase_node(node)
            done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
