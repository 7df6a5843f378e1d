"""embedding_bag lowerings: _embedding_bag / _embedding_bag_forward_only (sum, mean, max;
per_sample_weights; offsets with or without include_last_offset; padding_idx), the dense
backward (_embedding_bag_backward with sparse=False, _embedding_bag_dense_backward) and
_embedding_bag_per_sample_weights_backward. One launch each (kernels/embedding_bag.py).

The auxiliary outputs (offset2bag, bag_size, max_indices) have the CPU's shapes and values, so
a program that reads them sees what the CPU gives. Half-precision weights run in float32 and
round once (dispatch's half path), as the CPU's float accumulation does.

>>> import torch, eager_neuron
>>> w = torch.arange(8.).view(4, 2).to("neuron")
>>> i = torch.tensor([0, 1, 3]).to("neuron")
>>> o = torch.tensor([0, 2]).to("neuron")
>>> torch.nn.functional.embedding_bag(i, w, o, mode="sum").cpu().tolist()
[[2.0, 4.0], [6.0, 7.0]]
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..kernels import compile as kc
from ..kernels import embedding_bag as keb
from ..launch import launch

VERSION = 1
PARALLEL_MIN = 1 << 15   # bag elements below which a prange launch costs more than it saves
_FLOAT = frozenset({torch.float32, torch.float64})
_INDEX = frozenset({torch.int64, torch.int32})


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy()


def _check_args(weight, indices, offsets, op: str) -> None:
    if weight.dtype not in _FLOAT:
        raise NotImplementedError(f"{op} on {weight.dtype}")
    if indices.dtype not in _INDEX or offsets.dtype not in _INDEX:
        raise NotImplementedError(f"{op}: indices {indices.dtype}, offsets {offsets.dtype}")
    if indices.dim() != 1 or offsets.dim() != 1 or weight.dim() != 2:
        raise NotImplementedError(f"{op}: indices {indices.dim()}-d, offsets {offsets.dim()}-d")


def _check_offsets(off: np.ndarray, n: int) -> None:
    """The CPU's checks on offsets (RuntimeError, as there), before any kernel indexes with them."""
    if off.shape[0] and off[0] != 0:
        raise RuntimeError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
            f"from position 0. However, got {int(off[0])}")
    if off.shape[0] and (np.any(np.diff(off) < 0) or off[-1] > n):
        raise RuntimeError(
            f"embedding_bag: offsets must be non-decreasing and at most the number of indices "
            f"({n}); got {off.tolist()[:8]}")


def _contig(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(_np(t))


def _parallel(work: int) -> bool:
    return work >= PARALLEL_MIN and kc.parallel_allowed()


def lower_embedding_bag(func, a, outs):
    weight, indices, offsets = a["weight"], a["indices"], a["offsets"]
    op = func._schema.name
    _check_args(weight, indices, offsets, op)
    mode = int(a["mode"])
    psw = a.get("per_sample_weights")
    pad = a.get("padding_idx")
    pad = -1 if pad is None or pad < 0 else int(pad)
    out, o2b, bag_size, max_idx = outs
    n = indices.shape[0]
    off = _contig(offsets)
    _check_offsets(off, n)
    if psw is not None and psw.dtype != weight.dtype:
        raise NotImplementedError(f"{op}: per_sample_weights {psw.dtype}, weight {weight.dtype}")
    psw_np = _np(psw) if psw is not None else np.zeros(1, _np(weight).dtype)
    err = np.zeros(3, np.int64)
    w_np = _np(weight)
    par = _parallel(n * weight.shape[1])
    mi = _np(max_idx)
    if mi.ndim == 1:   # sum/mean: a copy of bag_size, passed as (bags, 1) (one kernel type)
        mi = mi.reshape(-1, 1)
    launch(("embedding_bag", "forward", par, VERSION), lambda: keb.render("forward", par),
           (_np(out), w_np, _contig(indices), off, n, psw_np, psw is not None, mode, pad,
            _np(bag_size), mi, _np(o2b), err),
           flops=n * weight.shape[1], bytes_moved=(n + out.shape[0]) * weight.shape[1]
           * weight.element_size(), engine="vector")
    if err[0]:
        raise RuntimeError(f"Index {int(err[1])} of input takes value {int(err[2])} which is "
                           f"not in the valid range [0, {weight.shape[0]})")


def _cpu_meta(a, leaves):
    """The CPU's shapes for offset2bag / bag_size / max_indices (meta's CPU branch; our meta
    tensors are not on the CPU, so the registration takes its CUDA-like branch)."""
    weight, indices, offsets = a["weight"], a["indices"], a["offsets"]
    mode = int(a["mode"])
    psw = a.get("per_sample_weights")
    pad = a.get("padding_idx")
    pad = -1 if pad is None else pad
    nb = offsets.shape[0] - (1 if a.get("include_last_offset") else 0)
    fast = (weight.dtype in (torch.float32, torch.float16) and weight.stride(1) == 1
            and pad < 0 and (psw is None or psw.stride(0) == 1))
    idt = offsets.dtype
    o2b = (indices.shape[0],) if mode in (1, 2) or not fast else (0,)
    forward_only = "forward_only" in a.get("__op__", "")
    bag = (offsets.shape[0],) if forward_only else (nb,)
    maxi = (nb, weight.shape[1]) if mode == 2 else (nb,)
    return [leaves[0], (o2b, (1,), idt), (bag, (1,), idt),
            (maxi, (weight.shape[1], 1) if mode == 2 else (1,), idt)]


def _forward_only_meta(a, leaves):
    return _cpu_meta(dict(a, __op__="forward_only"), leaves)


lower_embedding_bag.cpu_meta = _cpu_meta


# NOTE: a functools.partial, not a def: no Python frame between dispatch and the lowering
lower_embedding_bag_forward_only = functools.partial(lower_embedding_bag)
lower_embedding_bag_forward_only.__name__ = "lower_embedding_bag_forward_only"
lower_embedding_bag_forward_only.cpu_meta = _forward_only_meta


def _dense_backward(op, gw, grad, indices, offsets, n_bags_rows, max_idx, psw, mode, pad,
                    scale_freq):
    if grad.dtype not in _FLOAT:
        raise NotImplementedError(f"{op} on {grad.dtype}")
    if indices.dtype not in _INDEX or offsets.dtype not in _INDEX:
        raise NotImplementedError(f"{op}: indices {indices.dtype}, offsets {offsets.dtype}")
    pad = -1 if pad is None or pad < 0 else int(pad)
    n = indices.shape[0]
    off = _contig(offsets)
    _check_offsets(off, n)
    psw_np = _np(psw) if psw is not None else np.zeros(1, _np(grad).dtype)
    if mode == 2:
        mi = _np(max_idx)
        if mi.ndim != 2:
            raise NotImplementedError(f"{op}: max mode without max_indices")
    else:
        mi = np.zeros((1, 1), np.int64)
    freq = np.zeros(gw.shape[0], np.int64)
    launch(("embedding_bag", "backward", VERSION), lambda: keb.render("backward"),
           (_np(gw), _np(grad), _contig(indices), off, n, psw_np, psw is not None, mode, pad,
            mi, freq, bool(scale_freq)),
           flops=n * grad.shape[1], bytes_moved=2 * n * grad.shape[1] * grad.element_size(),
           engine="vector")


def lower_embedding_bag_backward(func, a, outs):
    if a["sparse"]:
        raise NotImplementedError("_embedding_bag_backward with sparse=True (a sparse gradient)")
    _dense_backward(func._schema.name, outs[0], a["grad"], a["indices"], a["offsets"], None,
                    a["maximum_indices"], a["per_sample_weights"], int(a["mode"]),
                    a["padding_idx"], a["scale_grad_by_freq"])


def lower_embedding_bag_dense_backward(func, a, outs):
    # no offsets here: each index's bag comes from offset2bag (turned back into offsets)
    o2b = _np(a["offset2bag"]).astype(np.int64)
    nb = a["grad"].shape[0]
    if o2b.shape[0] != a["indices"].shape[0]:
        raise NotImplementedError("_embedding_bag_dense_backward without offset2bag")
    offsets = torch.from_numpy(np.searchsorted(o2b, np.arange(nb), side="left"))
    _dense_backward(func._schema.name, outs[0], a["grad"], a["indices"], offsets, None,
                    a["maximum_indices"], a["per_sample_weights"], int(a["mode"]),
                    a["padding_idx"], a["scale_grad_by_freq"])


def lower_psw_backward(func, a, outs):
    grad, weight, indices, offsets = a["grad"], a["weight"], a["indices"], a["offsets"]
    _check_args(weight, indices, offsets, func._schema.name)
    if int(a["mode"]) != 0:
        raise RuntimeError("embedding_bag_backward: per_sample_weights only supported for "
                           "mode='sum'")
    pad = a.get("padding_idx")
    pad = -1 if pad is None or pad < 0 else int(pad)
    off = _contig(offsets)
    _check_offsets(off, indices.shape[0])
    if outs[0].numel() == 0:
        return
    par = _parallel(indices.shape[0] * grad.shape[1])
    launch(("embedding_bag", "psw_backward", par, VERSION),
           lambda: keb.render("psw_backward", par),
           (_np(outs[0]), _np(grad), _np(weight), _contig(indices), off, pad),
           flops=2 * indices.shape[0] * grad.shape[1], engine="vector",
           bytes_moved=2 * indices.shape[0] * grad.shape[1] * grad.element_size())


def lower_embedding_renorm(func, a, outs):
    w, idx = outs[0], a["indices"]
    if w.dtype not in _FLOAT or w.dim() != 2:
        raise NotImplementedError(f"embedding_renorm_ on a {w.dim()}-d {w.dtype} weight")
    if idx.dtype not in _INDEX:
        raise NotImplementedError(f"embedding_renorm_ with {idx.dtype} indices")
    wv = _np(w)
    if not wv.flags.c_contiguous and not (wv.ndim == 2 and wv.strides[1] == wv.itemsize):
        raise NotImplementedError("embedding_renorm_ on a weight with strided rows")
    err = np.zeros(2, np.int64)
    seen = np.zeros(w.shape[0], np.uint8)
    ix = _contig(idx).reshape(-1)
    launch(("embedding_bag", "renorm", VERSION), lambda: keb.render("renorm"),
           (wv, ix, seen, float(a["max_norm"]), float(a["norm_type"]), err),
           flops=2 * ix.shape[0] * w.shape[1], engine="vector",
           bytes_moved=2 * ix.shape[0] * w.shape[1] * w.element_size())
    if err[0]:
        raise IndexError(f"embedding_renorm_: index {int(err[1])} is out of bounds for a "
                         f"weight with {w.shape[0]} rows")


LOWERINGS = {
    "aten::embedding_renorm_": lower_embedding_renorm,
    "aten::_embedding_bag": lower_embedding_bag,
    "aten::_embedding_bag_forward_only": lower_embedding_bag_forward_only,
    "aten::_embedding_bag_backward": lower_embedding_bag_backward,
    "aten::_embedding_bag_dense_backward": lower_embedding_bag_dense_backward,
    "aten::_embedding_bag_per_sample_weights_backward": lower_psw_backward,
}
