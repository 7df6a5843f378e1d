"""A plan's kernel steps (compile/planned.py): the argument tuple of one kernel, kept from the
call that learned the plan, what a repeat call fills in (operands from outside the arena, the
values that escape, the scalars), its guards, and the charges of a launch made without
`launch()` (the kernel object is the one launch() resolved).

>>> _layout(np.zeros((2, 3)).T)
'F'
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch.fx import Node

from ..blas import blas_threads
from ..buffers import _POOLED_BYTES
from ..fastpath import _NP_DTYPES, _entry_point
from ..lower.common import DEVICE_DTYPES
from ..simulator import _POOL_MIN_BYTES, SIM, _round
from ..stats import STATS
from ..tensor import NeuronTensor
from .absorb import apply_views
from .forms import _alloc
from .rowstep import _view3d
from .stats import CSTATS

_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided   # (not pinned.py's wrapper)
_SMALL: dict = {}        # (shape, dtype, index) -> (stride, rounded size, numpy dtype) of a
#                          small store
_FROM_NUMPY = torch.from_numpy
_NP_EMPTY = np.empty
# True: a small store's host memory from numpy's allocator, its numpy views kept on the tensor
# (NeuronTensor._npc, as the eager fast path's outputs): the step's own output views and any
# later step's operand views of it skip Tensor.numpy(); False: torch.empty_strided and .numpy()
# per use (in-process A/B; docs/COMPILE.md, Session 12)
NPC = [True]
_SMALL_BYTES = min(_POOL_MIN_BYTES, _POOLED_BYTES)


def _alloc_store(shape, dtype, index):
    """A fresh contiguous neuron tensor for a value a planned kernel step stores and that
    escapes: for a small one, buffers.alloc's small path with its per-call work done once per
    shape (strides, the rounded size: the block from the core's `alloc_small`, the same
    accounting as `alloc(want_storage=False)`, its full path on memory pressure); a larger one
    takes forms._alloc (the core's caching pool)."""
    key = (shape, dtype, index)
    got = _SMALL.get(key)
    if got is None:
        if dtype not in DEVICE_DTYPES:
            return _alloc(shape, dtype, index)
        got = small_form(shape, dtype, index)
    if got is None:
        return _alloc(shape, dtype, index)
    if got[2] is None or not NPC[0]:
        return NeuronTensor(_EMPTY_STRIDED(shape, got[0], dtype=dtype),
                            SIM.cores[index].alloc_small(got[1]), index)
    # (numpy's allocator and one from_numpy: cheaper than torch.empty_strided and .numpy())
    full = _NP_EMPTY(shape, got[2])
    data = _FROM_NUMPY(full)
    t = NeuronTensor(data, SIM.cores[index].alloc_small(got[1]), index)
    t._npc = (data, full, full.reshape(-1))
    return t


def small_form(shape, dtype, index):
    """(strides, rounded size, numpy dtype) of a small store of this shape (kept in _SMALL),
    or None: a large one (or a dtype the device does not hold) takes forms._alloc."""
    key = (shape, dtype, index)
    if key in _SMALL:
        return _SMALL[key]
    if dtype not in DEVICE_DTYPES:
        return None
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(int(n), 1)
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * dtype.itemsize
    got = _SMALL[key] = (tuple(reversed(stride)), _round(nbytes),
                         _NP_DTYPES.get(dtype)) if nbytes < _SMALL_BYTES else None
    return got


def _np(t) -> np.ndarray:
    """t's host view as numpy (fastpath.full_np without storing: a step's operand)."""
    c = t._npc
    if c is not None and c[0] is t._data:
        return c[1]
    return t._data.numpy()


def _flat_out(t) -> np.ndarray:
    """A fresh store's flat numpy view (kept on it by _alloc_store, else made)."""
    c = t._npc
    if c is not None and c[0] is t._data and c[2] is not None:
        return c[2]
    return t._data.numpy().reshape(-1)


ALLOC = [_alloc_store]   # how a fresh (escaping) value is allocated (a test counts calls here)


def _layout(a: np.ndarray) -> str:
    f = a.flags
    return "C" if f.c_contiguous else ("F" if f.f_contiguous else "A")


class _NotFast(Exception):
    pass


def _scalar(v):
    """A kernel scalar argument as Numba takes it (a 0-d tensor or numpy value, a symbolic size,
    a bool or None)."""
    if isinstance(v, (torch.Tensor, np.generic)):
        return v.item()
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return v.node.pytype(v)
    if isinstance(v, bool) or v is None:
        return bool(v)
    return v


class _Fast:
    """The argument tuple of one kernel step, what a call fills in, and its charges."""

    def _common(self, plan, step, kernel, params, flops, nbytes, first_scalar, scalar_args):
        self.kernel, self.flops, self.nbytes = kernel, flops, nbytes
        self.n_nodes = step.n_nodes
        self.scalars = []
        for k, a in enumerate(scalar_args):
            if isinstance(a, Node):
                pos = first_scalar + k
                self.scalars.append((pos, a, type(params[pos])))
        self.tmpl = list(params)
        for pos, _a, _t in self.scalars:
            self.tmpl[pos] = None
        self.n_arena = 0
        # the kernel's compiled entry point for the learned argument types (a generated plan,
        # compile/planrun.py, calls it: every call passes those types, its guards see to it);
        # not with an int scalar from the environment (a huge one would be another Numba type)
        self.entry = None if any(t is int for _p, _a, t in self.scalars) else \
            _entry_point(kernel, tuple(params))

    def _fill_scalars(self, args, env) -> bool:
        for pos, a, typ in self.scalars:
            v = _scalar(env[a])
            if type(v) is not typ:
                return False
            args[pos] = v
        return True

    def _launch(self, args, core) -> None:
        self.kernel(*args)
        STATS.launches += 1
        STATS.memory_hits += 1
        SIM.cores[core].launch(self.flops, self.nbytes, "vector")
        CSTATS.fused_kernel_launches += 1
        CSTATS.fused_nodes += self.n_nodes
        CSTATS.direct_launches += 1


class FastFused(_Fast):
    def __init__(self, plan, step, kernel, params, flops, nbytes, blas, F) -> None:
        nb = len(step.bufs)
        self._common(plan, step, kernel, params, flops, nbytes, nb, step.scalar_args)
        self.ins, self.outs = [], []
        for j, (kind, node) in enumerate(step.bufs):
            a = params[j]
            if plan.arena.holds(a):
                continue
            self.tmpl[j] = None
            if kind == "in":
                self.ins.append((j, node, a.shape[0], a.dtype, node.op == "placeholder"))
            else:
                if node not in plan.shapes:
                    raise _NotFast("a fused store with no recorded shape")
                self.outs.append((j, node) + plan.shapes[node])
        self.absorbed = step.absorbed
        self.cache = [None] * len(self.ins)

    def operand(self, k: int, t):
        """Input k's flat numpy operand from its tensor `t` (as run takes it) when its kept
        view did not match (the generated plan checked it), or None: the guard failed."""
        j, node, n, dt, keep = self.ins[k]
        if type(t) is not NeuronTensor:
            return None
        d = t._data
        a = _np(t)
        if a.dtype != dt or a.size != n or not a.flags.c_contiguous:
            return None
        a = a.reshape(-1)
        if keep:
            self.cache[k] = (weakref.ref(t), d, d.data_ptr(), a)
        return a

    def run(self, env: dict, core: int) -> bool:
        args = self.tmpl.copy()
        cache = self.cache
        for k, (j, node, _n, _dt, _keep) in enumerate(self.ins):
            t = env[node]
            c = cache[k]
            if c is not None and c[0]() is t and t._data is c[1] and c[1].data_ptr() == c[2]:
                args[j] = c[3]
                continue
            a = self.operand(k, t)
            if a is None:
                return False
            args[j] = a
        if self.scalars and not self._fill_scalars(args, env):
            return False
        alloc = ALLOC[0]
        made = []
        for j, node, shape, dtype, index in self.outs:
            t = alloc(shape, dtype, index)
            made.append((node, t))
            args[j] = _flat_out(t)
        self._launch(args, core)
        for node, t in made:
            env[node] = t
        for src, dst, cp in self.absorbed:
            env[src] = env[cp] = env[dst]
        return True


class FastRows(_Fast):
    def __init__(self, plan, step, kernel, params, flops, nbytes, blas, F) -> None:
        nb = len(step.bufs)
        self._common(plan, step, kernel, params, flops, nbytes, 2 + nb, step.scalar_args)
        self.F = F
        self.blas = tuple(blas)
        self.R, C = params[0], params[1]
        in_views = getattr(step, "in_views", None) or {}
        self.ins, self.outs = [], []
        for j, node, mode in step.ins:
            a = params[2 + j]
            if plan.arena.holds(a):
                continue
            self.tmpl[2 + j] = None
            self.ins.append((2 + j, node, mode, in_views.get(j), a.shape, a.dtype, _layout(a),
                             node.op == "placeholder"))
        for j, node, mode, is_mm, dtype, index in step.outs:
            a = params[2 + j]
            if plan.arena.holds(a):
                continue
            self.tmpl[2 + j] = None
            if node not in plan.shapes:
                raise _NotFast("a row store with no recorded shape")
            shape = plan.shapes[node][0]
            flat = (self.R, C) if (is_mm or mode == "full") else (
                (C,) if mode in ("col", "colkd") else (self.R,))   # (a column total: [C])
            put = not is_mm or node in step.stored_set
            self.outs.append((2 + j, node, shape, dtype, index, flat, put))
        self.cache = [None] * len(self.ins)
        # the common operand: C-contiguous of the frame's own (row) shape, a plain reshape
        self.quick = []
        for _pos, _node, mode, _chain, shape, _dt, lay, _keep in self.ins:
            q = None
            if mode != "mat" and F is not None and lay == "C":
                cc = F[-1] if mode == "full" else 1
                src = tuple(F) if mode == "full" else tuple(F[:-1]) + (
                    () if mode == "rowflat" else (1,))
                if shape == (1, self.R, cc):
                    q = (src, shape)
            self.quick.append(q)

    def operand(self, k: int, t):
        """Input k's numpy operand from its tensor `t` (as run takes it) when its kept view did
        not match (the generated plan checked it), or None: the plan's guard failed."""
        if type(t) is not NeuronTensor:
            return None
        d = t._data
        src = _np(t)
        arr = self.shaped(k, src)
        # a graph input's operand view is kept while the same tensor comes back (a parameter:
        # every step), never a copy (a stale value)
        if arr is not None and self.ins[k][7] and np.may_share_memory(arr, src):
            self.cache[k] = (weakref.ref(t), d, d.data_ptr(), arr)
        return arr

    def shaped(self, k: int, arr):
        """Input k's kernel operand made of its tensor's numpy view `arr` (run's views, checks
        and guards), or None."""
        _pos, _node, mode, chain, shape, dt, lay, _keep = self.ins[k]
        if chain is not None:
            arr = apply_views(arr, chain)
        q = self.quick[k]
        if q is not None and arr.shape == q[0] and arr.dtype == dt and arr.flags.c_contiguous:
            return arr.reshape(q[1])
        if mode == "mat":
            if arr.ndim != 2:
                return None
            if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
                arr = np.ascontiguousarray(arr)
        else:
            arr = _view3d(arr, mode, self.F, self.R)
            if arr is None:
                return None
        if arr.shape != shape or arr.dtype != dt or _layout(arr) != lay:
            return None
        return arr

    def run(self, env: dict, core: int) -> bool:
        args = self.tmpl.copy()
        R, F = self.R, self.F
        cache = self.cache
        for k, (pos, node, mode, chain, shape, dt, lay, keep) in enumerate(self.ins):
            t = env[node]
            c = cache[k]
            if c is not None and c[0]() is t and t._data is c[1] and c[1].data_ptr() == c[2]:
                args[pos] = c[3]
                continue
            if type(t) is not NeuronTensor:
                return False
            d = t._data
            arr = src = _np(t)
            if chain is not None:
                arr = apply_views(arr, chain)
            q = self.quick[k]
            if q is not None and arr.shape == q[0] and arr.dtype == dt and \
                    arr.flags.c_contiguous:
                args[pos] = arr = arr.reshape(q[1])
                if keep and (chain is None or np.may_share_memory(arr, src)):
                    cache[k] = (weakref.ref(t), d, d.data_ptr(), arr)
                continue
            if mode == "mat":
                if arr.ndim != 2:
                    return False
                if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
                    arr = np.ascontiguousarray(arr)
            else:
                arr = _view3d(arr, mode, F, R)
                if arr is None:
                    return False
            if arr.shape != shape or arr.dtype != dt or _layout(arr) != lay:
                return False
            args[pos] = arr
            # a graph input's operand view is kept while the same tensor comes back (a
            # parameter: every step), never a copy (a stale value)
            if keep and np.may_share_memory(arr, src):
                cache[k] = (weakref.ref(t), d, d.data_ptr(), arr)
        if self.scalars and not self._fill_scalars(args, env):
            return False
        alloc = ALLOC[0]
        made = {}
        for pos, node, shape, dtype, index, flat, _put in self.outs:
            t = made.get(node)
            if t is None:
                t = made[node] = alloc(shape, dtype, index)
            args[pos] = _flat_out(t).reshape(flat)
        for fl in self.blas:
            blas_threads(fl)
        self._launch(args, core)
        CSTATS.row_kernel_launches += 1
        for _pos, node, _shape, _dtype, _index, _flat, put in self.outs:
            if put:
                env[node] = made[node]
        return True
