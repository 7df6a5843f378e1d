"""Adaptive eager: a matmul joins the pending group; the fused kernel calls the matmul's kernel.

A joinable op (JOINABLE: the matmul family on float32/float64) is lowered as plain eager lowers
it, with its launches *staged* instead of run (the op context's launcher): what the group gets
is the exact kernel, key and arguments plain eager would have launched. The fused kernel of the
group calls that kernel between its loops, so a matmul and its epilogue (bias, activation,
residual add, scale: the elementwise ops recorded after it) and the elementwise ops before it
are one launch, and the values are plain eager's: the same kernel code runs on the same
arguments in the same order.

A staged launch joins only if each of its arrays lies inside one of the op's own operands or
outputs (whose device blocks the group pins until it launches); otherwise (a scratch copy of a
strided operand) the group launches and the staged launches run at once, as plain eager runs
them.

>>> import torch, eager_neuron
>>> a = torch.ones(4, 3, device="neuron"); b = torch.ones(3, 2, device="neuron")
>>> with eager_neuron.adaptive():
...     y = torch.relu(a @ b - 1.0)
...     v = y.sum().item()
>>> v
16.0
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from . import context as _context
from . import launch as _launch

# op name -> its OpOverload (schema names as dispatch's Plan.name spells them). A lowering
# listed here must do all its device work through launch() and read no device memory on the
# host: no value reads, no launch.checked (an error flag read before the staged kernel ran)
JOINABLE = {
    "aten::mm": torch.ops.aten.mm.default,
    "aten::addmm": torch.ops.aten.addmm.default,
    "aten::bmm": torch.ops.aten.bmm.default,
    "aten::baddbmm": torch.ops.aten.baddbmm.default,
    # device copies (lower/shape.py remap, lower/cast.py): exact, read nothing on the host
    # unless an operand has one element (see joinable)
    "aten::select_scatter": torch.ops.aten.select_scatter.default,
    "aten::slice_scatter": torch.ops.aten.slice_scatter.default,
    "aten::clone": torch.ops.aten.clone.default,
    # (not _to_copy: a host-kind op, its device transfers flush)
    # float sums and means over dims (lower/reduce.py: one launch on views of the operand and
    # the output, nothing read on the host): plain eager's own reduction kernel, so its float64
    # accumulation order and its bits, where an epilogue in the group's loops would add in
    # another order (adaptive._TORCH_FLOAT); a bias gradient's sum(0) or a loss's mean() no
    # longer ends the group
    "aten::sum.dim_IntList": torch.ops.aten.sum.dim_IntList,
    "aten::mean.dim": torch.ops.aten.mean.dim,
    "aten::sum": torch.ops.aten.sum.default,       # over every element (a loss)
    "aten::mean": torch.ops.aten.mean.default,
}
_MATMUL = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
_FLOATS = frozenset({torch.float32, torch.float64})
COUNTERS = {"staged": 0, "joined": 0, "declined": 0}


class Stager:
    """The op context's launcher while a joinable op is lowered: stages each launch into its
    own list (`staged`) instead of running it. A group launched meanwhile (memory pressure)
    runs under no context (adaptive._flush_locked), so its launches never reach a stager."""

    __slots__ = ("staged",)

    def __init__(self) -> None:
        self.staged: list = []

    def __call__(self, key, render, args, flops, bytes_moved, engine, dtype_class,
                 core) -> bool:
        # a small array the lowering made on the host (remap's modes and parameters): a copy,
        # so the lowering cannot change it before the group launches
        args = tuple(a.copy() if type(a) is np.ndarray and a.base is None and a.nbytes <= 4096
                     else a for a in args)
        self.staged.append((key, render, args, float(flops), float(bytes_moved), engine,
                            dtype_class))
        return True


def joinable(name: str, a: dict, outs: list) -> bool:
    """May this call join the group? One float32/float64 output, operands of its dtype,
    nothing empty. Not the copies of a one-element operand into a larger output: the
    elementwise lowering reads that element on the host (it would read it before the group
    wrote it). The matmul lowering reads no value on the host."""
    if name not in JOINABLE or len(outs) != 1:
        return False
    out = outs[0]
    n = out.numel()
    if out.dtype not in _FLOATS or n == 0:
        return False
    for v in a.values():
        if isinstance(v, torch.Tensor):
            if v.dtype != out.dtype:
                return False
            if v.numel() == 1 and n != 1 and name not in _MATMUL:
                return False
    return True


def stage(name: str, a: dict, outs: list) -> list:
    """Run the op's lowering with its launches staged; returns them (key, render, args, flops,
    bytes, engine, dtype class), in order. An error of the lowering propagates (nothing ran)."""
    plans = sys.modules[__package__ + ".plan"]   # loaded before any op runs (see adaptive_fast)
    plan = plans._PLANS.get(JOINABLE[name])
    if plan is None or plan.kind != "kernel":
        return None
    # the op's own context, with a launcher that stages instead of running
    cur = _context.current()
    stager = Stager()
    ctx = _context.OpContext(_launch.current_core(), launcher=stager) if cur is None else \
        _context.OpContext(cur.core, cur.mode, cur.recording, cur.blocks, stager)
    prev = _context.swap(ctx)
    try:
        plan.lower(JOINABLE[name], a, outs)
    finally:
        _context.swap(prev)
    staged = stager.staged
    COUNTERS["staged"] += len(staged)
    return staged


def _extent(ptr: int, shape, strides, itemsize: int) -> tuple:
    if any(s == 0 for s in shape):
        return ptr, ptr
    lo = hi = ptr
    for n, st in zip(shape, strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + itemsize


def spans(staged: list, tensors: list):
    """The byte spans of the staged launches' arrays, or None when one lies outside every
    operand/output tensor (a scratch buffer of the lowering: the launches run now)."""
    owners = []
    for t in tensors:
        if t.numel():
            owners.append(_extent(t.data_ptr(), t.shape, [s * t.element_size()
                                                          for s in t.stride()],
                                  t.element_size()))
    out = []
    for launch in staged:
        for arr in launch[2]:
            if type(arr) is not np.ndarray or arr.base is None:
                continue   # a scalar, or a host array the staged launch owns (see Stager)
            lo, hi = _extent(arr.__array_interface__["data"][0], arr.shape, arr.strides,
                             arr.itemsize)
            if hi <= lo:
                continue
            if not any(olo <= lo and hi <= ohi for olo, ohi in owners):
                return None
            out.append((lo, hi))
    return out


def guard(staged: tuple) -> tuple:
    """What a trace edge of one call is labelled with besides its overlaps: the kernel's key,
    its arguments' types and shapes/strides, its cost (the launch charges it)."""
    key, _render, args, flops, nbytes, engine, dtype_class = staged
    shapes = tuple((a.shape, a.strides) if type(a) is np.ndarray else None for a in args)
    return ("call", key, _launch.arg_types(args), shapes, flops, nbytes, engine, dtype_class)


def run_now(staged: list, core: int) -> None:
    """Run staged launches as plain eager would (the group was launched first)."""
    for key, render, args, flops, nbytes, engine, dtype_class in staged:
        _launch.launch(key, render, args, flops=flops, bytes_moved=nbytes, engine=engine,
                       dtype_class=dtype_class, core=core)
