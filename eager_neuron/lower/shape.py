"""Shape lowerings: cat, constant_pad_nd, flip, roll, repeat, tril/triu, slice/select/diagonal
scatter (sort / argsort / top-k are the sort family's, lower/sort.py).

flip, roll, repeat, constant_pad_nd and tril/triu are one `remap` kernel (kernels/shape.py):
each output element reads a source coordinate computed per dimension. cat and the *_scatter ops
are device copies into views of the output (remap too, or the cast kernel across dtypes).

>>> import torch, eager_neuron
>>> x = torch.arange(4.).to("neuron")
>>> torch.cat([x.flip(0), x.roll(1)]).cpu().tolist()
[3.0, 2.0, 1.0, 0.0, 3.0, 0.0, 1.0, 2.0]
"""

from __future__ import annotations

import numpy as np
import torch

from ..decomps import select_at, slice_bounds
from ..kernels import shape as ksh
from ..launch import launch
from .cast import cast as copy_into
from .cast import cast_steps
from .common import HALF, NP_TYPE, coalesce

aten = torch.ops.aten


def np_view(t: torch.Tensor, shape=None, stride=None) -> np.ndarray:
    """Zero-copy numpy view, optionally re-strided; half floats travel as their int16 bits."""
    if shape is not None:
        t = t.as_strided(shape, stride, t.storage_offset())
    if t.dtype in HALF:
        t = t.view(torch.int16)
    return t.numpy()


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def axis_views(loop_shape, dim: int, parts) -> list:
    """numpy views of each (tensor, axis size) over loop_shape with `dim` moved last and the
    other dims coalesced across all parts: kernels loop over outer dims and one axis."""
    outer = [d for d in range(len(loop_shape)) if d != dim]
    oshape = tuple(loop_shape[d] for d in outer)
    cshape, cstr = coalesce(oshape, [tuple(t.stride(d) for d in outer) for t, _ in parts])
    return [np_view(t, cshape + (n,), s + (t.stride(dim),)) for (t, n), s in zip(parts, cstr)]


def _as_1d(*ts):
    return [t.view(1) if t.dim() == 0 else t for t in ts]


# ---------------------------------------------------------------------------------------------
# remap: flip, roll, repeat, constant_pad_nd, tril/triu
# ---------------------------------------------------------------------------------------------

def _merge(out, src, modes: str, params, pinned: int):
    """Drop size-1 identity dims and merge adjacent identity dims contiguous in both out and
    src: fewer loop ranks mean fewer kernels and longer inner loops. The last `pinned` dims
    stay as they are (tril/triu index them)."""
    dims = []   # [mode, param, out size, out stride, src size, src stride]
    rank = len(modes)
    for d in range(rank):
        mode, fixed = modes[d], d >= rank - pinned
        if mode == "i" and not fixed and out.shape[d] == 1:
            continue
        last = dims[-1] if dims else None
        if (mode == "i" and not fixed and last is not None and last[0] == "i"
                and last[3] == out.stride(d) * out.shape[d]
                and last[5] == src.stride(d) * src.shape[d]):
            last[2] *= out.shape[d]
            last[3] = out.stride(d)
            last[4] *= src.shape[d]
            last[5] = src.stride(d)
            continue
        dims.append(["T" if fixed else mode, params[d], out.shape[d], out.stride(d),
                     src.shape[d], src.stride(d)])
    return dims or [["i", 0, 1, 0, 1, 0]]


def remap_request(out: torch.Tensor, src: torch.Tensor, modes: str, params, value=0,
                  cond=None, diagonal: int = 0) -> tuple | None:
    """The launch of out[i..] = src[j..] with j per dim from `modes` (see kernels/shape.py) and
    `params` (runtime, per dim); `cond` masks to the tril/triu of the last two dims at
    `diagonal`. As launch()'s positional arguments (None: nothing to do): this family's
    lowerings launch it themselves (dispatch -> lowering -> launch)."""
    if out.numel() == 0:
        return None
    if out.dtype in HALF and value != 0:
        raise NotImplementedError("non-zero fill of a half tensor without upcast")
    dims = _merge(out, src, modes, params, 2 if cond else 0)
    rank = len(dims)
    m = np.array([ksh.MODES["i" if d[0] == "T" else d[0]] for d in dims], np.int64)
    p = np.array([d[1] for d in dims] + [diagonal, ksh.TRI[cond]], np.int64)
    o = np_view(out, tuple(d[2] for d in dims), tuple(d[3] for d in dims))
    sv = np_view(src, tuple(d[4] for d in dims), tuple(d[5] for d in dims))
    cast = NP_TYPE.get(out.dtype, "np.int16")
    key = ("shape", "remap",
           rank,    # loop rank after merging (modes, parameters and the mask are runtime)
           cast)    # store type of the fill value
    return (key, lambda: ksh.render_remap(rank, cast),
            (o, sv, m, p, o.dtype.type(int(value) if isinstance(value, bool) else value)),
            0.0, nbytes(out) + nbytes(src))


def remap(out: torch.Tensor, src: torch.Tensor, modes: str, params, value=0, cond=None,
          diagonal: int = 0) -> None:
    """remap_request's launch, made (for lowerings of other families)."""
    req = remap_request(out, src, modes, params, value, cond, diagonal)
    if req is not None:
        launch(*req)


def copy_request(src: torch.Tensor, dst: torch.Tensor) -> tuple | None:
    """dst[...] = src: the remap kernel's launch when dtypes and shapes agree (for the caller
    to make); else the cast kernel converts here and there is nothing left (None)."""
    if src.dtype == dst.dtype and src.shape == dst.shape:
        return remap_request(dst, src, "i" * dst.dim(), [0] * dst.dim())
    copy_into(src, dst)
    return None


def copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src (copy_request, launched)."""
    req = copy_request(src, dst)
    if req is not None:
        launch(*req)


def lower_flip(func, a, outs):
    self, out = _as_1d(a["self"], outs[0])
    flipped = {d % self.dim() for d in a["dims"]}
    modes = "".join("f" if d in flipped else "i" for d in range(self.dim()))
    req = remap_request(out, self, modes, [n - 1 for n in self.shape])
    if req is not None:
        launch(*req)


def lower_roll(func, a, outs):
    self, out = _as_1d(a["self"], outs[0])
    shifts, dims = list(a["shifts"]), list(a["dims"])
    if not dims:
        # NOTE: roll without dims rolls the flattened tensor: only a view when contiguous
        if len(shifts) != 1 or not (self.is_contiguous() and out.is_contiguous()):
            raise NotImplementedError("roll without dims of a non-contiguous tensor")
        self, out, dims = self.reshape(-1), out.view(-1), [0]
    if len(shifts) != len(dims):
        raise NotImplementedError("roll with mismatched shifts and dims")
    total = [0] * self.dim()
    for s, d in zip(shifts, dims):
        total[d % self.dim()] += s
    modes = "".join("r" if t and n else "i" for t, n in zip(total, self.shape))
    req = remap_request(out, self, modes, [t % n if n else 0 for t, n in zip(total, self.shape)])
    if req is not None:
        launch(*req)


def lower_repeat(func, a, outs):
    self, out, reps = a["self"], outs[0], list(a["repeats"])
    src = self.reshape((1,) * (len(reps) - self.dim()) + tuple(self.shape))  # a view
    out, src = _as_1d(out, src)
    modes = "".join("i" if r == 1 else "m" for r in reps) or "i"
    req = remap_request(out, src, modes, [0] * src.dim())
    if req is not None:
        launch(*req)


def lower_constant_pad_nd(func, a, outs):
    self, out = _as_1d(a["self"], outs[0])
    pad = list(a["pad"])
    before = [0] * self.dim()
    for i in range(len(pad) // 2):
        before[self.dim() - 1 - i] = pad[2 * i]
    padded = {self.dim() - 1 - i for i in range(len(pad) // 2)
              if pad[2 * i] or pad[2 * i + 1]}
    modes = "".join("p" if d in padded else "i" for d in range(self.dim()))
    req = remap_request(out, self, modes, before, a["value"])
    if req is not None:
        launch(*req)


def _backward_pad(func, a, outs):
    """slice_backward (unit step) and select_backward: zeros with the gradient at its place,
    one remap kernel writing the whole output (was a decomposition: a zero pad through the
    funnel, ~25 us a call, 48 a Mamba step). The output is the meta's (contiguous, as the
    CPU's new_zeros); any other pattern declines to the decomposition (its own errors)."""
    g, out = a["grad_output"], outs[0]
    sizes = [int(n) for n in a["input_sizes"]]
    nd = len(sizes)
    if nd == 0:
        raise NotImplementedError("backward pad of a 0-d input")
    if "index" in a:   # select_backward: the gradient lacks `dim`
        at = select_at(g, sizes, a["dim"], a["index"])
        if at is None:
            raise NotImplementedError("select_backward of another shape")
        d, i = at
        g, lo, hi = g.unsqueeze(d), i, i + 1
    else:
        if a["step"] != 1:
            raise NotImplementedError("slice_backward with a step")
        d = a["dim"] % nd
        lo, hi = slice_bounds(sizes[d], a["start"], a["end"])
    if list(g.shape) != sizes[:d] + [hi - lo] + sizes[d + 1:] or list(out.shape) != sizes:
        raise NotImplementedError("a gradient that does not fill the slice")
    before = [0] * nd
    before[d] = lo
    req = remap_request(out, g, "".join("p" if k == d else "i" for k in range(nd)), before, 0)
    if req is not None:
        launch(*req)


_backward_pad.handles_half = True   # bits moved, zeros filled: exact in any float type


def _tri(cond):
    def lower(func, a, outs):
        self, out = a["self"], outs[0]
        if self.dim() < 2:
            raise RuntimeError(f"{cond}: input tensor must have at least 2 dimensions")
        req = remap_request(out, self, "i" * self.dim(), [0] * self.dim(), cond=cond,
                            diagonal=a["diagonal"])
        if req is not None:
            launch(*req)
    lower.__name__ = f"lower_{cond}"
    return lower


# ---------------------------------------------------------------------------------------------
# cat and the *_scatter ops: device copies into views of the output
# ---------------------------------------------------------------------------------------------

def lower_cat(func, a, outs):
    out = outs[0]
    if not isinstance(a["dim"], int):   # cat.names shares the op name
        raise NotImplementedError("named dimensions")
    dim = a["dim"] % max(out.dim(), 1)
    offset = 0
    for t in a["tensors"]:
        if t.dim() == 1 and t.numel() == 0 and out.dim() != 1:
            continue   # legacy empty 1-D tensors are skipped, as torch does
        n = t.shape[dim]
        if t.numel():
            req = copy_request(t, out.narrow(dim, offset, n))
            if req is not None:
                launch(*req)
        offset += n


def lower_stack(func, a, outs):
    """stack: each input copied into its slot of the output (was a decomposition: an unsqueeze
    through the funnel per input, then cat: ~90 us for a dozen)."""
    out = outs[0]
    dim = a["dim"] % out.dim()
    for i, t in enumerate(a["tensors"]):
        if t.numel():
            dst = out.select(dim, i)
            if t.dim() == 0:
                t, dst = t.view(1), dst.view(1)
            req = copy_request(t, dst)
            if req is not None:
                launch(*req)


# bits moved as they are (same dtype: the remap kernel on int16 views), or converted by the
# cast kernels (copy_request): half inputs need no float32 round trip
lower_cat.handles_half = lower_stack.handles_half = True


def _copy_then(view_fn):
    def lower(func, a, outs):
        out, self = outs[0], a["self"]
        if out is not self:
            req = copy_request(self, out)
            if req is not None:
                launch(*req)
        dst = view_fn(out, a)
        if dst.numel():
            req = copy_request(a["src"], dst)
            if req is not None:
                launch(*req)
    return lower


lower_slice_scatter = _copy_then(
    lambda out, a: aten.slice.Tensor(out, a["dim"], a["start"], a["end"], a["step"]))
lower_select_scatter = _copy_then(lambda out, a: out.select(a["dim"], a["index"]))
lower_diagonal_scatter = _copy_then(
    lambda out, a: out.diagonal(a["offset"], a["dim1"], a["dim2"]))
# NOTE: ATen clones self and views the clone: the offset counts in the clone's storage, which
# starts where out's does (a fresh buffer), so None means out's own offset
def as_strided_dst(out, a):
    """as_strided_scatter's destination view of out; like ATen's copy_ into it, one whose
    elements share memory (a stride 0) is refused."""
    dst = out.as_strided(a["size"], a["stride"], out.storage_offset() if
                         a["storage_offset"] is None else a["storage_offset"])
    if dst.numel() > 1 and torch._debug_has_internal_overlap(dst) == 1:
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    return dst


lower_as_strided_scatter = _copy_then(as_strided_dst)


def lower_hash_tensor(func, a, outs):
    """hash_tensor mode 0 (xor_sum): each element's 64 bits (floats as float64, integers and
    bool as int64) xor-ed over `dim`; the uint64 result is written through its int64 view.
    The bits go to a contiguous scratch with the reduced dims last, so rows are (kept, reduced)."""
    from .reduce import red_dims

    x, out = a["self"], outs[0]
    if a["mode"] != 0:
        raise NotImplementedError(f"hash_tensor mode {a['mode']}")
    red = red_dims(x, a["dim"])
    kept = [d for d in range(x.dim()) if d not in red]
    order = kept + red
    wide = torch.float64 if x.is_floating_point() else torch.int64
    bits = torch.empty([x.shape[d] for d in order], dtype=wide)
    for req in cast_steps(x.permute(order), bits):
        launch(*req)
    k = 1
    for d in kept:
        k *= x.shape[d]
    o = out.view(torch.int64).view(-1)
    if o.numel() == 0:
        return
    rows = bits.view(torch.int64).view(k, -1)
    launch(("shape", "xor_rows"), ksh.render_xor_rows, (o.numpy(), rows.numpy()),
           bytes_moved=nbytes(x, out))


# ---------------------------------------------------------------------------------------------
LOWERINGS = {
    "aten::cat": lower_cat,
    "aten::stack": lower_stack,
    "aten::constant_pad_nd": lower_constant_pad_nd,
    "aten::flip": lower_flip,
    "aten::roll": lower_roll,
    "aten::repeat": lower_repeat,
    "aten::tril": _tri("tril"),
    "aten::triu": _tri("triu"),
    "aten::tril_": _tri("tril"),
    "aten::triu_": _tri("triu"),
    "aten::slice_scatter": lower_slice_scatter,
    "aten::select_scatter": lower_select_scatter,
    "aten::diagonal_scatter": lower_diagonal_scatter,
    "aten::as_strided_scatter": lower_as_strided_scatter,
    "aten::hash_tensor": lower_hash_tensor,
    "aten::slice_backward": _backward_pad,
    "aten::select_backward": _backward_pad,
}
