"""Views read only by kernels: the kernel reads the view's source through the numpy equivalent.

A Llama training step runs ~230 view nodes (`t` of every weight an `mm` reads, `view` and
`_unsafe_view` around each matmul, the heads' `transpose`), each a NeuronTensor made from the
host data (~10 us). A view whose every reader is a row kernel (compile/rowstep.py: it reads
numpy arrays of any strides) or, for a reshape, a flat fused kernel (the same flat memory when
its source is contiguous) needs no tensor: the kernel step takes the source and applies the
view to its numpy array (`.T`, `reshape`, `swapaxes`, `transpose`, `expand_dims`), and the
view's own step is dropped. Counted as `views_absorbed` (per graph, at compile time).

A kernel that falls back to eager first makes the views it absorbed (`materialize`), so its
nodes rerun over the same environment as before.

>>> import numpy as np
>>> apply_views(np.arange(6.0).reshape(2, 3), (("T",), ("reshape", (3, 2)))).shape
(3, 2)
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

aten = torch.ops.aten

# view op -> how to read its arguments as a numpy transform
_ROW_VIEWS = {aten.t.default, aten.view.default, aten._unsafe_view.default,
              aten.transpose.int, aten.permute.default, aten.unsqueeze.default}
_FLAT_VIEWS = {aten.view.default, aten._unsafe_view.default}


def _transform(node: Node) -> tuple | None:
    """The numpy form of one view node, or None (an argument is a run-time value)."""
    a = node.args
    if any(isinstance(x, Node) or (isinstance(x, (list, tuple)) and any(
            isinstance(y, Node) for y in x)) for x in a[1:]) or node.kwargs:
        return None
    t = node.target
    if t is aten.t.default:
        return ("T",)
    if t in (aten.view.default, aten._unsafe_view.default):
        if not all(isinstance(s, int) for s in a[1]):
            return None
        return ("reshape", tuple(a[1]))
    if t is aten.transpose.int:
        return ("swap", int(a[1]), int(a[2]))
    if t is aten.permute.default:
        return ("perm", tuple(int(d) for d in a[1]))
    if t is aten.unsqueeze.default:
        return ("unsq", int(a[1]))
    return None


def apply_views(arr: np.ndarray, chain: tuple) -> np.ndarray:
    """The array the views of `chain` make of `arr` (a numpy view; a reshape numpy cannot
    express as one copies, which a kernel's read-only operand allows)."""
    for tr in chain:
        kind = tr[0]
        if kind == "T":
            arr = arr.T
        elif kind == "reshape":
            arr = arr.reshape(tr[1])
        elif kind == "swap":
            arr = arr.swapaxes(tr[1], tr[2])
        elif kind == "perm":
            arr = arr.transpose(tr[1])
        else:
            arr = np.expand_dims(arr, tr[1])
    return arr


def absorb_views(steps: list, out_users: set) -> int:
    """Drop the view steps whose every reader is a kernel that can apply them (see the module
    docstring); rewrites those kernels' inputs in place. Returns the number of views dropped."""
    # 1. who reads each node: kernel steps (as which inputs) and everything else
    readers: dict = {}
    for kind, x in steps:
        if kind == "rows":
            for j, node, _mode in x.ins:
                readers.setdefault(node, []).append(("rows", x, j))
            for a in x.scalar_args:
                if isinstance(a, Node):
                    readers.setdefault(a, []).append(("other", x, None))
        elif kind == "fused":
            for j, (k, node) in enumerate(x.bufs):
                if k == "in":
                    readers.setdefault(node, []).append(("fused", x, j))
            for a in x.scalar_args:
                if isinstance(a, Node):
                    readers.setdefault(a, []).append(("other", x, None))
        else:
            node = x.node if kind == "host" else x
            for a in node.all_input_nodes:
                readers.setdefault(a, []).append(("other", x, None))
    # 2. a view all of whose readers can apply it (a view read by another view has an
    #    eager reader: it stays, and the view of it may be absorbed over it)
    dropped = set()
    for kind, x in steps:
        if kind != "node" or x in out_users or x.op != "call_function":
            continue
        tr = _transform(x) if x.target in _ROW_VIEWS else None
        src = x.args[0] if x.args else None
        if tr is None or not isinstance(src, Node) or _static_shape(x) is None:
            continue
        rs = readers.get(x, [])
        flat_ok = x.target in _FLAT_VIEWS
        if not rs or any(r[0] == "other" or (r[0] == "fused" and not flat_ok) for r in rs):
            continue
        dropped.add(x)
        for what, step, j in rs:
            if what == "rows":
                _retarget_rows(step, j, x, src, (tr,))
            else:
                _retarget_fused(step, j, x, src)
    if dropped:
        steps[:] = [(k, x) for k, x in steps if not (k == "node" and x in dropped)]
    return len(dropped)


def _static_shape(node: Node) -> tuple | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


def _retarget_rows(step, j: int, view: Node, base: Node, chain: tuple) -> None:
    views = dict(getattr(step, "in_views", {}))
    views[j] = chain
    step.in_views = views
    # the shapes run() reads off operands (the frame's source, an mm's operands)
    shapes = dict(getattr(step, "view_shapes", {}))
    shapes[view] = _static_shape(view)
    step.view_shapes = shapes
    step.ins = [(jj, base if jj == j else n, m) for jj, n, m in step.ins]
    step.bufs = [(k, base, m) if jj == j else (k, n, m)
                 for jj, (k, n, m) in enumerate(step.bufs)]
    step.made_views = _merge(getattr(step, "made_views", ()), (view,))


def _retarget_fused(step, j: int, view: Node, base: Node) -> None:
    step.bufs = [(k, base) if jj == j else (k, n) for jj, (k, n) in enumerate(step.bufs)]
    # an output whose shape came from the view: the view's static shape
    shape = _static_shape(view)
    step.out_meta = [(jj, node, dtype, index, src, shape if src is not None and src[1] is view
                      else static) for jj, node, dtype, index, src, static in step.out_meta]
    step.made_views = _merge(getattr(step, "made_views", ()), (view,))


def _merge(a: tuple, b: tuple) -> tuple:
    return a + tuple(n for n in b if n not in a)


def materialize(step, env: dict, run_node) -> None:
    """Make the views a kernel step absorbed (before its nodes rerun eagerly)."""
    for v in getattr(step, "made_views", ()):
        if v not in env:
            run_node(v, env)


__all__ = ["absorb_views", "apply_views", "materialize"]
