"""Matmul lowerings: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot (and in-place add*_).

Every op becomes one `gemm(out, a, b, bias, beta, alpha, batch)` call, one launch: vectors are
(K, 1) or (1, K) matrices (Numba's np.dot then picks BLAS gemv/dot), and the bias/scale epilogue
runs in the same kernel as the product. Float operands reach BLAS without a copy when they are
C- or F-contiguous (a transposed weight from nn.Linear is F-contiguous); only genuinely strided
operands are copied, by the cast kernel, into a contiguous scratch.

>>> import torch, eager_neuron
>>> w = torch.ones(3, 2, device="neuron")
>>> torch.nn.functional.linear(torch.ones(1, 2, device="neuron"), w).tolist()
[[2.0, 2.0, 2.0]]
"""

from __future__ import annotations

import numpy as np
import torch

from .. import cost, errors
from ..blas import blas_threads  # noqa: F401 -- also lower/conv.py's
from ..cache.families import MATMUL_BLAS, MATMUL_HALF, MATMUL_LOOP
from ..context import _TLS as _ctx_tls
from ..kernels import compile as kc
from ..kernels import matmul as kmm
from ..launch import launch
from .cast import cast, cast_steps, launches
from .common import HALF, NP_TYPE

VERSION = 1              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 16   # integer loop: multiply-adds below which prange costs more than it saves
_BLAS = frozenset({torch.float32, torch.float64})
_LOOP = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
# NOTE: kernels are named by shape class, not by aten op: mm, mv, dot, addmm and the linear
# backward all run the same 2-D kernel when their epilogue and layouts agree.
_KERNEL_OP = {"none": "mm", "bmm": "bmm", "sum": "addbmm"}


def _np(t: torch.Tensor):
    """Zero-copy numpy view. Under NeuronMode an operand may be a CPU tensor that requires grad:
    detach it (same memory) rather than let .numpy() refuse."""
    return t.detach().numpy() if t.requires_grad else t.numpy()




def _dense(t: torch.Tensor) -> torch.Tensor:
    """A C-contiguous scratch copy (host-backed, like an SBUF tile), written by the cast kernel."""
    out = torch.empty(t.shape, dtype=t.dtype)
    cast(t, out)
    return out


def _mat2(t: torch.Tensor):
    """A 2-D operand BLAS can read as is (C or F; with MKL also rows or columns unit-stride at
    a leading dimension covering the other extent: a [CLS] token's rows x[:, 0]), else a
    contiguous copy."""
    arr = _np(t)
    if arr.flags.c_contiguous or arr.flags.f_contiguous or (_mkl() and _addressable(arr)):
        return arr
    return _np(_dense(t))


def _mkl() -> bool:
    from ..kernels.matmul import mkl_symbols

    return bool(mkl_symbols())


def _addressable(arr) -> bool:
    """Can kernels/blas.py's xgemm read this 2-D array in place (its _blas_view rule)?"""
    if arr.ndim != 2 or arr.size == 0:
        return False
    (r, c), item = arr.shape, arr.itemsize
    s0, s1 = arr.strides
    if s0 % item or s1 % item:
        return False
    s0, s1 = s0 // item, s1 // item
    ld_n = c if r <= 1 else s0
    ld_t = r if c <= 1 else s1
    return ((c <= 1 or s1 == 1) and ld_n >= max(c, 1)) or \
        ((r <= 1 or s0 == 1) and ld_t >= max(r, 1))


def _mat3(t: torch.Tensor, allow_shared: bool):
    """(array, mode) for a batched operand; see kernels/matmul.py for the modes."""
    arr = _np(t)
    if arr.flags.c_contiguous:
        return arr, "n"
    tt = _np(t.transpose(1, 2))
    if tt.flags.c_contiguous:
        return tt, "t"
    if allow_shared and t.stride(0) == 0:      # one matrix expanded over the batch
        m = _np(t[0])
        if m.flags.c_contiguous or m.flags.f_contiguous:
            return m, "b"
    return _np(_dense(t)), "n"


def _shares(x: torch.Tensor, others) -> bool:
    ptr = x.untyped_storage().data_ptr()
    return any(o is not None and o.untyped_storage().data_ptr() == ptr for o in others)


def _scalar(v, dtype: torch.dtype):
    """alpha/beta as a kernel argument of the array's kind (a float32 kernel stays float32)."""
    if dtype.is_floating_point:
        return np.float32(v) if dtype == torch.float32 else float(v)
    return int(v)


def _check_shapes(op: str, out, a, b, bias) -> None:
    """The CPU's shape checks, made before anything runs. PyTorch's meta function accepts some
    calls the CPU refuses (an addmm bias that does not broadcast to (M, N) gets an output shaped
    like the bias), and BLAS handed such shapes writes nothing (MKL prints 'Parameter 8 was
    incorrect') while the op would return an uninitialized buffer."""
    m_n = (a.shape[-2], b.shape[-1])
    target = (*out.shape[:-2], *m_n)
    if tuple(out.shape[-2:]) == m_n and a.shape[-1] == b.shape[-2] and (
            bias is None or torch.broadcast_shapes(bias.shape, target) == target):
        return
    if bias is not None:
        torch.empty(bias.shape, device="meta").expand(target)   # raises the CPU's own words
    raise RuntimeError(f"{op}: mat1 and mat2 shapes cannot be multiplied "
                       f"({'x'.join(map(str, a.shape))} and {'x'.join(map(str, b.shape))})")


def gemm(op: str, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias=None, beta=1,
         alpha=1, batch: str = "none") -> tuple | None:
    """out = beta * bias + alpha * (a @ b), one launch: returned as launch()'s positional
    arguments for the caller to make, or None when there is nothing left to launch (empty, or
    a scratch result this call launched and copied into out).

    batch "none": a (M, K), b (K, N), out (M, N); "bmm": a (B, M, K), b (B, K, N), out (B, M, N);
    "sum": like "bmm" but out (M, N) sums the B products. bias broadcasts to out's shape.
    """
    _check_shapes(op, out, a, b, bias)
    dtype = out.dtype
    if a.dtype != dtype or b.dtype != dtype or (bias is not None and bias.dtype != dtype):
        raise NotImplementedError(f"{op}: mixed dtypes {a.dtype}, {b.dtype} -> {dtype}")
    if dtype not in _BLAS and dtype not in _LOOP and (dtype not in HALF or batch == "sum"):
        raise NotImplementedError(f"{op}: no matmul kernel for {dtype}")
    if out.numel() == 0:
        return None
    # 1. epilogue: beta == 0 ignores bias entirely (NaN/inf in it too), as PyTorch does
    if bias is None or beta == 0:
        epilogue = "none" if alpha == 1 else "scale"
    else:
        epilogue = "bias"
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-1]
    nb = a.shape[0] if batch != "none" else 1
    if dtype in HALF:   # one kernel on the half types' bits (float32 temporaries, one rounding)
        blas_threads(2.0 * m * n * k)
        return _request(_half_kernel(out, a, b, bias, beta, alpha, batch, epilogue), out,
                        (nb, m, n, k), epilogue, "bf16")   # (float16 at bfloat16's rate too)
    # 2. in-place ops (addmm_) and odd output layouts: compute into scratch, then copy
    direct = _np(out).flags.c_contiguous and not _shares(out, (a, b, bias))
    res = out if direct else torch.empty(out.shape, dtype=dtype)
    scalars = ()
    if epilogue == "bias":
        scalars = (_np(bias.expand(out.shape)), _scalar(beta, dtype), _scalar(alpha, dtype))
    elif epilogue == "scale":
        scalars = (_scalar(alpha, dtype),)
    # 3. the kernel: BLAS for floats, a loop for integers
    if dtype in _BLAS:
        if batch == "none":
            arrays, modes = (_mat2(a), _mat2(b)), ("n", "n")
        else:
            (xa, ma), (xb, mb) = _mat3(a, batch == "bmm"), _mat3(b, batch == "bmm")
            arrays, modes = (xa, xb), (ma, mb)
        key = (
            "matmul", _KERNEL_OP[batch],
            VERSION,     # this family's renderer version
            "blas",      # np.dot (BLAS) vs the integer loop
            modes,       # per batched operand: n | t (read transposed) | b (shared matrix)
            epilogue,    # none | scale | bias
        )

        def render():
            return MATMUL_BLAS.render(key)   # from the key alone (cache/families.py)

        args = (_np(res),) + arrays + scalars
        blas_threads(2.0 * m * n * k)
    else:
        # NOTE: every operand as a 3-D strided view: no copies, one loop nest for all batches
        res3, a3, b3 = res, a, b
        if batch != "bmm":
            res3 = res.unsqueeze(0)
        if batch == "none":
            a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
        if epilogue == "bias":
            bias3 = bias.expand(out.shape)
            bias3 = bias3 if batch == "bmm" else bias3.unsqueeze(0)
            scalars = (_np(bias3),) + scalars[1:]
        parallel = nb * m * n * k >= PARALLEL_MIN and kc.parallel_allowed()
        store = NP_TYPE[dtype]   # accumulated in int64 (cache/families.py MATMUL_LOOP)
        key = ("matmul", _KERNEL_OP[batch], VERSION, "loop", epilogue, store, parallel)

        def render():
            return MATMUL_LOOP.render(key)   # from the key alone (cache/families.py)

        args = (_np(res3), _np(a3), _np(b3)) + scalars
    req = _request((key, render, args), out, (nb, m, n, k), epilogue, "fp32")
    if res is out:
        return req   # the lowering launches it: dispatch -> lowering -> launch
    launch(*req)
    cast(res, out)
    return None


def _half_layout(t: torch.Tensor, rank: int) -> str:
    """The memory order of a half operand's float32 temporary (kernels/matmul.py _half_temp):
    the operand's own where BLAS reads it as is (C, F; "t": 3-D with each matrix transposed),
    else C."""
    if rank == 2:
        return "F" if not t.is_contiguous() and t.t().is_contiguous() else "C"
    return "t" if not t.is_contiguous() and t.transpose(1, 2).is_contiguous() else "C"


def _request(kernel: tuple, out, sizes: tuple, epilogue: str, dtype_class: str) -> tuple:
    """launch()'s arguments for gemm's (key, render, args): the product's work and traffic."""
    itemsize = out.element_size()
    flops, bytes_moved = cost.matmul_work(*sizes, itemsize, itemsize, itemsize)
    if epilogue == "bias":   # the bias read at the output's size
        bytes_moved += out.numel() * itemsize
    return (*kernel, flops, bytes_moved, "tensor", dtype_class)


def _half_kernel(out, a, b, bias, beta, alpha, batch: str, epilogue: str) -> tuple:
    """(key, render, args) of gemm's bfloat16/float16 kernel (kernels/matmul.py
    render_blas_half): the operands' bits loaded exactly into float32 temporaries, the float32
    product and epilogue, the result rounded once. The upcast route computed the same in four
    launches (casts up, the float32 kernel, a cast down); the CPU's half matmuls also
    accumulate in float32 and round once."""
    rank = 2 if batch == "none" else 3
    scalars = ()
    if epilogue == "bias":
        scalars = (_np(bias.expand(out.shape).view(torch.int16)), np.float32(beta),
                   np.float32(alpha))
    elif epilogue == "scale":
        scalars = (np.float32(alpha),)
    key = ("matmul", _KERNEL_OP[batch], VERSION, "half",
           "bf16" if out.dtype == torch.bfloat16 else "f16",
           (_half_layout(a, rank), _half_layout(b, rank)), epilogue)

    def render():
        return MATMUL_HALF.render(key)   # from the key alone (cache/families.py)

    return key, render, tuple(_np(t.view(torch.int16)) for t in (out, a, b)) + scalars


# ---------------------------------------------------------------------------------------------
# lowerings: each maps its schema onto gemm's shapes
# ---------------------------------------------------------------------------------------------

def lower_mm(func, a, outs):
    req = gemm("mm", outs[0], a["self"], a["mat2"])
    if req is not None:
        launch(*req)


def lower_addmm(func, a, outs):
    req = gemm("addmm", outs[0], a["mat1"], a["mat2"], a["self"], a["beta"], a["alpha"])
    if req is not None:
        launch(*req)


def lower_bmm(func, a, outs):
    req = gemm("bmm", outs[0], a["self"], a["mat2"], batch="bmm")
    if req is not None:
        launch(*req)


def lower_baddbmm(func, a, outs):
    req = gemm("baddbmm", outs[0], a["batch1"], a["batch2"], a["self"], a["beta"], a["alpha"],
               batch="bmm")
    if req is not None:
        launch(*req)


# bfloat16/float16 operands reach these lowerings as such (gemm's one-launch half kernel)
lower_mm.handles_half = lower_addmm.handles_half = True
lower_bmm.handles_half = lower_baddbmm.handles_half = True


def lower_addbmm(func, a, outs):
    req = gemm("addbmm", outs[0], a["batch1"], a["batch2"], a["self"], a["beta"], a["alpha"],
               batch="sum")
    if req is not None:
        launch(*req)


def lower_mv(func, a, outs):
    # (M, K) @ (K, 1) -> (M, 1): np.dot sees n == 1 and calls gemv
    req = gemm("mv", outs[0].unsqueeze(1), a["self"], a["vec"].unsqueeze(1))
    if req is not None:
        launch(*req)


def lower_addmv(func, a, outs):
    out = outs[0].unsqueeze(1)
    bias = a["self"].expand(outs[0].shape).unsqueeze(1)
    req = gemm("addmv", out, a["mat"], a["vec"].unsqueeze(1), bias, a["beta"], a["alpha"])
    if req is not None:
        launch(*req)


def lower_dot(func, a, outs):
    if a["self"].dtype == torch.bool:   # the CPU's dot has no bool instance
        raise errors.NotImplementedForDtype("dot", torch.bool)
    # (1, K) @ (K, 1) -> (1, 1): np.dot sees m == n == 1 and calls BLAS dot
    req = gemm("dot", outs[0].reshape(1, 1), a["self"].unsqueeze(0), a["tensor"].unsqueeze(1))
    if req is not None:
        launch(*req)


def _trilinear(func, a, outs):
    """_trilinear (nn.functional.bilinear and its backward): the three operands, unsqueezed at
    their expand dims, multiplied on the device with broadcasting, then summed over sumdim.
    The product is host-backed scratch (like run_upcast's temporaries). Half types: as the
    CPU rounds them (_trilinear_half). Steps: the requests the lowering launches."""
    from .elementwise import LOWERINGS as EW
    from .reduce import acc_type, red_dims, reduce

    aten = torch.ops.aten
    out = outs[0]
    ts = []
    for name, expand in (("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")):
        t = a[name]
        for d in sorted(a[expand]):   # ATen unsqueezes in increasing dim order
            t = t.unsqueeze(d)
        ts.append(t)
    if out.dtype in HALF:
        yield from _trilinear_half(a, out, ts)
        return
    sumdim = list(a["sumdim"])
    prod = torch.empty(torch.broadcast_shapes(*(t.shape for t in ts)), dtype=out.dtype) \
        if sumdim else out
    # the elementwise and reduce families' requests, launched by the lowering
    mul = EW["aten::mul"].prepare
    req = mul(aten.mul.Tensor, {"self": ts[0], "other": ts[1]}, [prod])
    if req is not None:
        yield req
    req = mul(aten.mul.Tensor, {"self": prod, "other": ts[2]}, [prod])
    if req is not None:
        yield req
    if sumdim:   # the request sum.dim_IntList's lowering builds
        req = reduce("sum", prod, [out], red_dims(prod, sumdim), False,
                     load_t=NP_TYPE[out.dtype], acc_t=acc_type(out.dtype), what="sum")
        if req is not None:
            yield req


def _trilinear_half(a, out, ts):
    """bfloat16/float16 _trilinear as the CPU's Linear.cpp rounds it: (i1 * i2) summed over the
    sumdims i3 lacks, rounded to the half type (a half bmm, float32 sums); times i3 summed over
    the other sumdims, rounded again; when the unroll dim is summed, those slices added one by
    one in the half type (output.add_). Float32 scratch holding half values; the products of
    two half values are exact in float32."""
    from .elementwise import LOWERINGS as EW
    from .half import _up_steps
    from .reduce import reduce

    aten = torch.ops.aten
    mul, add = EW["aten::mul"].prepare, EW["aten::add"].prepare
    ups = []
    for t in ts:
        ups.append((yield from _up_steps(t)))
    ts = ups
    sumdim, u = set(a["sumdim"]), a.get("unroll_dim", 1)
    expand3 = set(a["expand3"])
    d12 = [d for d in sorted(sumdim) if d in expand3 and d != u]
    d23 = [d for d in sorted(sumdim) if d not in expand3 and d != u]

    def product_sum(x, y, dims):
        """round_half(sum over dims of x * y), keepdim, as float32 scratch."""
        prod = torch.empty(torch.broadcast_shapes(x.shape, y.shape), dtype=torch.float32)
        req = mul(aten.mul.Tensor, {"self": x, "other": y}, [prod])
        if req is not None:
            yield req
        if dims:
            s = torch.empty([1 if d in dims else n for d, n in enumerate(prod.shape)],
                            dtype=torch.float32)
            req = reduce("sum", prod, [s], dims, True, load_t="np.float32",
                         acc_t="np.float32", what="sum")
            if req is not None:
                yield req
            prod = s
        h = torch.empty(prod.shape, dtype=out.dtype)
        yield from cast_steps(prod, h)
        return (yield from _up_steps(h))

    buf = yield from product_sum(ts[0], ts[1], d12)
    res = yield from product_sum(buf, ts[2], d23)
    if u in sumdim:   # output.add_(buf) per unroll slice, each add rounded to the half type
        acc = res.narrow(u, 0, 1)
        for k in range(1, res.shape[u]):
            tmp = torch.empty(acc.shape, dtype=torch.float32)
            req = add(aten.add.Tensor, {"self": acc, "other": res.narrow(u, k, 1), "alpha": 1},
                      [tmp])
            if req is not None:
                yield req
            h = torch.empty(acc.shape, dtype=out.dtype)
            yield from cast_steps(tmp, h)
            acc = yield from _up_steps(h)
        res = acc
    yield from cast_steps(res.reshape(out.shape), out)   # exact: res holds half values


lower_trilinear = launches(_trilinear)
lower_trilinear.handles_half = True


def dynamic_grouped_mm(func, a, index=-1):
    """_grouped_mm (MoE experts: transformers' grouped experts, F.grouped_mm): one gemm per
    group of `offs` (cumulative ends, read on the host as CUDA's kernel does per group).

    2-D x 3-D: rows [s, e) of self times mat2[g]; 2-D x 2-D (its weight gradient): out[g] =
    self[:, s:e] @ mat2[s:e]; 3-D x 2-D: columns [s, e) of out = self[g] @ mat2[:, s:e];
    3-D x 3-D: bmm. Rows or columns past offs[-1] and empty groups are zero (the CPU leaves
    them unwritten). DYNAMIC only because torch's meta kernel demands CUDA's bfloat16; here
    float32/float64 run too (what a float32 MoE model sends).
    """
    from ..buffers import alloc
    from .elementwise import LOWERINGS as EW
    from .mask import core_index

    x, w, offs = a["self"], a["mat2"], a.get("offs")
    if a.get("bias") is not None:
        raise NotImplementedError("_grouped_mm with a bias")
    dtype = a.get("out_dtype") or x.dtype
    if x.dtype != dtype or w.dtype != dtype or dtype not in _BLAS:
        raise NotImplementedError(f"_grouped_mm: {x.dtype} x {w.dtype} -> {dtype}")
    if x.dim() not in (2, 3) or w.dim() not in (2, 3) or x.shape[-1] != w.shape[-2] \
            or (offs is None) != (x.dim() == 3 and w.dim() == 3):
        raise RuntimeError(f"_grouped_mm: operands {tuple(x.shape)} x {tuple(w.shape)} with "
                           f"offs {None if offs is None else tuple(offs.shape)}: expected 2-D "
                           "or 3-D operands, offs exactly when one of them is 2-D")
    if x.dim() == 2 and w.dim() == 3:
        shape = (x.shape[0], w.shape[2])
    elif x.dim() == 2:
        shape = (offs.shape[0], x.shape[0], w.shape[1])
    elif w.dim() == 2:
        shape = (x.shape[1], w.shape[1])
    else:
        shape = (x.shape[0], x.shape[1], w.shape[2])
    stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    out, block = alloc(core_index(index), shape, stride, dtype)
    if offs is None:
        req = gemm("_grouped_mm", out, x, w, batch="bmm")
        if req is not None:
            launch(*req)
        return [(out, block)]
    case = f"{x.dim()}x{w.dim()}"
    groups = {"2x3": w.shape[0], "3x2": x.shape[0]}.get(case, offs.shape[0])
    if offs.dim() != 1 or offs.shape[0] > groups:   # the kernel would index past the operand
        raise RuntimeError(f"_grouped_mm: offs of shape {tuple(offs.shape)} for {groups} "
                           "groups: expected a 1-D tensor of one cumulative end per group")
    if dtype in _BLAS and offs.dtype in (torch.int32, torch.int64) and _mkl() and \
            all(t.shape[0] and _addressable(_np(t if t.dim() == 2 else t[0])) for t in (x, w)):
        # one launch: the kernel reads offs (nothing read on the host, so the fast path may
        # learn the call: fastpath_capture.dynamic_capturable); each row (2x3), column (3x2)
        # or inner index (2x2) meets one group's matrix
        m, k, n = (x.shape[-2], x.shape[-1], w.shape[-1])
        flops = 2.0 * m * k * n
        nbytes = float((x.numel() + w.numel() + out.numel()) * x.element_size())
        blas_threads(flops)
        launch(("matmul", "grouped", VERSION, case), lambda: kmm.render_grouped(case),
               (_np(out), _np(x), _np(w), _np(offs)), flops=flops, bytes_moved=nbytes,
               engine="tensor")
        return [(out, block)]
    ctx = getattr(_ctx_tls, "ctx", None)
    if ctx is not None:
        ctx.capture = None   # the group ends read on the host: never replayed
    ends = [int(v) for v in _np(offs).tolist()]
    EW["aten::zero_"](torch.ops.aten.zero_.default, {"self": out}, [out])
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            if x.dim() == 2 and w.dim() == 3:
                req = gemm("_grouped_mm", out[start:end], x[start:end], w[g])
                if req is not None:
                    launch(*req)
            elif x.dim() == 2:
                req = gemm("_grouped_mm", out[g], x[:, start:end], w[start:end])
                if req is not None:
                    launch(*req)
            else:
                req = gemm("_grouped_mm", out[:, start:end], x[g], w[:, start:end])
                if req is not None:
                    launch(*req)
        start = max(start, end)
    return [(out, block)]


DYNAMIC = {"aten::_grouped_mm": dynamic_grouped_mm}


# in-place variants (addmm_, baddbmm_, addbmm_, addmv_) are read off the schemas (ops.py)
LOWERINGS = {
    "aten::_trilinear": lower_trilinear,
    "aten::mm": lower_mm,
    "aten::addmm": lower_addmm,
    "aten::bmm": lower_bmm,
    "aten::baddbmm": lower_baddbmm,
    "aten::addbmm": lower_addbmm,
    "aten::mv": lower_mv,
    "aten::addmv": lower_addmv,
    "aten::dot": lower_dot,
}
