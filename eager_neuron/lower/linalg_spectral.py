"""Linear-algebra lowerings, part two: QR (geqrf, orgqr, ormqr), eigh, SVD, pinv, lstsq and
matrix_exp. Same pattern as `linalg.py` (float64 scratch in, one batched kernel, cast out);
its own family (helpers from `linalg_base.py`).

geqrf and linalg_lstsq have no meta kernel in PyTorch, so they are DYNAMIC lowerings: they size
and allocate their outputs themselves, with the CPU's shapes and (column-major) strides.

>>> import torch, eager_neuron
>>> Q, R = torch.linalg.qr(torch.eye(2, device="neuron") * 2)
>>> R.diagonal().abs().tolist()
[2.0, 2.0]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..kernels import compile as kc
from ..kernels import linalg as klin
from .cast import cast_steps
from .linalg_base import (
    C128,
    F64,
    I32,
    VERSION,
    b1,
    b2,
    b3,
    batch_of,
    check_status,
    copy_steps,
    f64_steps,
    lowering,
    put,
    run,
    zkind,
)

_NONFINITE = "the input matrix contains non-finite values (inf or NaN); fix: check the input"


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _fcontig_strides(shape: tuple) -> tuple:
    """Batched column-major strides: what LAPACK-backed CPU kernels return."""
    if len(shape) < 2:
        return tuple(torch.empty(shape).stride())
    m, n = shape[-2:]
    batch, size = [], max(m * n, 1)
    for s in reversed(shape[:-2]):
        batch.insert(0, size)
        size *= max(s, 1)
    return tuple(batch) + (1, max(m, 1))


# ---------------------------------------------------------------------------------------------
# QR
# ---------------------------------------------------------------------------------------------

def dynamic_geqrf(func, a, index):
    """geqrf: sizes its outputs; a generator of launch requests dispatch makes (dispatch ->
    launch), returning the outputs."""
    from ..buffers import alloc

    A = a["self"]
    if A.dim() < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    m, n = A.shape[-2:]
    k = min(m, n)
    shape = tuple(A.shape)
    qr, qr_block = alloc(index, shape, _fcontig_strides(shape), A.dtype)
    tshape = shape[:-2] + (k,)
    tau, tau_block = alloc(index, tshape, tuple(torch.empty(tshape).stride()), A.dtype)
    if A.numel():
        x = yield from f64_steps(A)
        t64 = torch.empty(tshape, dtype=x.dtype)
        yield run(zkind("geqrf", x), (b3(x), b2(t64)), flops=2.0 * x.numel() * k)
        yield from put(x, qr)
        yield from put(t64, tau)
    return [(qr, qr_block), (tau, tau_block)]


def lower_householder_product(func, a, outs):
    A, tau, out = a["input"], a["tau"], outs[0]
    if out.numel() == 0:
        return
    k = tau.shape[-1]
    if A.is_complex() != tau.is_complex():
        raise RuntimeError(f"torch.linalg.householder_product: input and tau must have the same "
                           f"dtype, got {A.dtype} and {tau.dtype}")
    if k == 0:   # no reflectors: the first n columns of the identity
        yield from _identity_into(out)
        return
    q = yield from f64_steps(A)
    t64 = yield from f64_steps(tau)
    yield run("zungqr" if q.dtype == C128 else "orgqr", (b3(q), t64.numpy().reshape(-1, k)),
        flops=4.0 * q.numel() * k)
    yield from put(q, out)


def lower_ormqr(func, a, outs):
    A, tau, C, out = a["self"], a["input2"], a["input3"], outs[0]
    if out.numel() == 0:
        return
    k = tau.shape[-1]
    batch = tuple(out.shape[:-2])
    a64 = yield from f64_steps(A, batch + tuple(A.shape[-2:]))
    t64 = yield from f64_steps(tau, batch + (k,))
    x = yield from f64_steps(C, tuple(out.shape))
    if a64.dtype != x.dtype or t64.dtype != x.dtype:
        raise RuntimeError(f"torch.ormqr: input, tau and other must have one dtype, got "
                           f"{A.dtype}, {tau.dtype} and {C.dtype}")
    yield run(zkind("ormqr", x), (b3(a64), t64.numpy().reshape(-1, k), b3(x)),
        (bool(a["left"]), bool(a["transpose"])), flops=4.0 * x.numel() * k)
    yield from put(x, out)


def lower_qr(func, a, outs):
    A, mode, (Q, R) = a["A"], a["mode"], outs
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = tuple(A.shape[:-2])
    if _numel(batch) == 0 or R.numel() + Q.numel() == 0:
        return
    qc = 0 if mode == "r" else (m if mode == "complete" else k)
    rq = m if mode == "complete" else k
    x = yield from f64_steps(A)
    tau = torch.empty(batch + (k,), dtype=x.dtype)
    q = torch.empty(batch + (m, qc), dtype=x.dtype)
    r = torch.empty(batch + (rq, n), dtype=x.dtype)
    nb = _numel(batch)
    yield run(zkind("qr", x), (b3(x), tau.numpy().reshape(nb, k), q.numpy().reshape(nb, m, qc),
               r.numpy().reshape(nb, rq, n)), flops=4.0 * x.numel() * k)
    yield from put(r, R)
    if qc:
        yield from put(q, Q)


# ---------------------------------------------------------------------------------------------
# eigh, SVD, pinv
# ---------------------------------------------------------------------------------------------

def lower_eigh(func, a, outs):
    A, (w, v) = a["A"], outs
    n = A.shape[-1]
    batch = tuple(A.shape[:-2])
    nb = _numel(batch)
    if nb == 0 or n == 0:
        return
    want_v = bool(a["compute_v"]) and v.numel() > 0
    x = yield from f64_steps(A)
    w64 = torch.empty(batch + (n,), dtype=F64)   # eigenvalues are real, complex input or not
    v64 = torch.empty(batch + (n, n), dtype=x.dtype) if want_v else torch.empty(
        (nb, 1, 1), dtype=x.dtype)
    status = torch.empty((nb,), dtype=I32)
    yield run(zkind("eigh", x), (b3(x), w64.numpy().reshape(nb, n), b3(v64)),
        (a["UPLO"].upper() == "L", want_v, b1(status)), flops=9.0 * x.numel() * n)
    check_status(status, "linalg.eigh", _NONFINITE)
    yield from put(w64, w)
    if want_v:
        yield from put(v64, v)


def lower_svd(func, a, outs):
    A, (U, S, Vh) = a["A"], outs
    if a["driver"] is not None:
        raise RuntimeError("torch.linalg.svd: keyword argument `driver=` is only supported on "
                           "CUDA inputs with cuSOLVER backend.")
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = tuple(A.shape[:-2])
    nb = _numel(batch)
    if nb == 0:
        return
    full, want_uv = bool(a["full_matrices"]), bool(a["compute_uv"])
    if k == 0:
        # no singular values; full U and Vh of an empty matrix are identities
        for t in (U, Vh):
            if t.numel():
                yield from _identity_into(t)
        return
    x = yield from f64_steps(A)
    ur, vc = (m, n) if full else (k, k)
    s64 = torch.empty(batch + (k,), dtype=F64)   # singular values are real
    u64 = torch.empty(batch + (m, ur), dtype=x.dtype)
    vt64 = torch.empty(batch + (vc, n), dtype=x.dtype)
    status = torch.empty((nb,), dtype=I32)
    yield run(zkind("svd", x), (b3(x), u64.numpy().reshape(nb, m, ur), s64.numpy().reshape(nb, k),
                vt64.numpy().reshape(nb, vc, n)), (full, want_uv, b1(status)),
        flops=12.0 * x.numel() * k)
    check_status(status, "linalg.svd", _NONFINITE)
    yield from put(s64, S)
    if want_uv and U.numel():
        yield from put(u64, U)
        yield from put(vt64, Vh)


def _identity_into(t: torch.Tensor) -> None:
    """t = identity matrices (batched), via a zero fill and a diagonal view fill."""
    yield from copy_steps(torch.zeros((), dtype=t.dtype).expand(t.shape), t)
    d = t.diagonal(0, -2, -1)
    if d.numel():
        yield from copy_steps(torch.ones((), dtype=t.dtype).expand(d.shape), d)


def lower_pinv(func, a, outs):
    A, out = a["self"], outs[0]
    m, n = A.shape[-2:]
    batch = tuple(A.shape[:-2])
    nb = _numel(batch)
    if out.numel() == 0:
        return
    if m == 0 or n == 0:
        yield from copy_steps(torch.zeros((), dtype=out.dtype).expand(out.shape), out)
        return
    atol, rtol = a["atol"], a["rtol"]
    eps = torch.finfo(A.dtype.to_real() if A.dtype.is_floating_point or A.is_complex()
                      else torch.float32).eps
    atol64 = torch.zeros(batch or (1,), dtype=F64)
    if atol is not None:
        yield from cast_steps(atol.detach().expand(batch), atol64.view(batch))
    rtol64 = torch.empty(batch or (1,), dtype=F64)
    if rtol is not None:
        yield from cast_steps(rtol.detach().expand(batch), rtol64.view(batch))
    else:
        yield from cast_steps(torch.full((), eps * max(m, n), dtype=F64).expand(rtol64.shape),
                              rtol64)
    zero_rtol = rtol is None and atol is not None
    x = yield from f64_steps(A)
    o64 = torch.empty(batch + (n, m), dtype=x.dtype)
    status = torch.empty((nb,), dtype=I32)
    yield run(zkind("pinv", x), (b3(x), b1(atol64), b1(rtol64), b3(o64)),
        (bool(a["hermitian"]), zero_rtol, b1(status)), flops=14.0 * x.numel() * min(m, n))
    check_status(status, "linalg.pinv", _NONFINITE)
    yield from put(o64, out)


# ---------------------------------------------------------------------------------------------
# matrix_exp
# ---------------------------------------------------------------------------------------------

def lower_matrix_exp(func, a, outs):
    A, out = a["self"], outs[0]
    if out.numel() == 0:
        return
    n = A.shape[-1]
    # NOTE: in the input's precision, as PyTorch computes it: float32 results then carry the
    # CPU's own truncation and squaring errors (float64 math would differ from them by ~1e-6)
    dtype = {F64: F64, torch.complex128: C128, torch.complex64: torch.complex64}.get(
        A.dtype, torch.float32)
    np_type = "np." + str(dtype).split(".")[1]
    x = torch.empty(A.shape, dtype=dtype)
    yield from copy_steps(A.detach(), x)
    o = torch.empty(A.shape, dtype=dtype)
    parallel = x.numel() > n * n and x.numel() * n >= 1 << 16 and kc.parallel_allowed()
    key = MatrixExpKernel("linalg", "matrix_exp", VERSION, np_type, parallel)
    yield (key, key.render, (b3(x), b3(o)), 20.0 * x.numel() * n,
           2 * x.numel() * x.element_size(), "tensor")
    yield from put(o, out)


# ---------------------------------------------------------------------------------------------
# lstsq: min-norm least squares through the SVD (every driver's answer for full-rank A)
# ---------------------------------------------------------------------------------------------

_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def dynamic_lstsq(func, a, index):
    """lstsq: sizes its outputs; a generator of launch requests dispatch makes (dispatch ->
    launch), returning the outputs."""
    from ..buffers import alloc

    A, B = a["self"], a["b"]
    driver = a["driver"] or "gelsy"
    if A.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if driver not in _DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of "
                           "(gels, gelsy, gelsd, gelss)")
    if not (A.dtype.is_floating_point or A.is_complex()) or A.dtype != B.dtype:
        raise RuntimeError(f"torch.linalg.lstsq: expected floating A and b of one dtype, got "
                           f"{A.dtype} and {B.dtype}")
    vector = B.dim() == A.dim() - 1
    Bm = B.unsqueeze(-1) if vector else B
    if Bm.dim() < 2 or Bm.shape[-2] != A.shape[-2]:
        raise RuntimeError(f"torch.linalg.lstsq: input.size(-2) should match other.size(-2) "
                           f"(got {tuple(A.shape)} and {tuple(B.shape)})")
    m, n = A.shape[-2:]
    k = Bm.shape[-1]
    kk = min(m, n)
    batch = batch_of(A.shape[:-2], Bm.shape[:-2])
    nb = _numel(batch)
    dt = A.dtype
    rcond = a["rcond"]
    if rcond is None:
        rcond = torch.finfo(dt).eps * max(m, n)
    x = yield from f64_steps(A, batch + (m, n))
    rhs = yield from f64_steps(Bm, batch + (m, k))
    sol = torch.empty(batch + (n, k), dtype=x.dtype)
    rank = torch.empty(batch, dtype=torch.int64)
    sv = torch.empty(batch + (kk,), dtype=F64)
    res = torch.empty(batch + (k,), dtype=F64)
    status = torch.empty((max(nb, 1),), dtype=I32)
    if nb and m and n:
        yield run(zkind("lstsq", x), (b3(x), b3(rhs), b3(sol), b1(rank), sv.numpy().reshape(nb, kk),
                      res.numpy().reshape(nb, k)), (float(rcond), b1(status)),
            flops=12.0 * x.numel() * kk + 2.0 * x.numel() * k)
        check_status(status[:nb], "linalg.lstsq", _NONFINITE)
    elif sol.numel():
        yield from copy_steps(torch.zeros((), dtype=sol.dtype).expand(sol.shape), sol)
    # 2. outputs with the CPU's shapes: what each driver computes, empty otherwise
    sshape = batch + (n,) if vector else batch + (n, k)
    solution, sb = alloc(index, sshape, _fcontig_strides(sshape) if not vector else
                         tuple(torch.empty(sshape).stride()), dt)
    yield from put(sol.reshape(sshape), solution)
    full_rank = nb > 0 and m > n and driver != "gelsy" and (
        driver == "gels" or bool((rank.numpy() == n).all()))
    rshape = (batch + ((k,) if not vector else ())) if full_rank else (0,)
    residuals, rb = alloc(index, rshape, tuple(torch.empty(rshape).stride()), dt.to_real())
    if full_rank:
        yield from put(res.reshape(rshape), residuals)
    kshape = batch if driver != "gels" else (0,)
    rank_out, kb = alloc(index, kshape, tuple(torch.empty(kshape).stride()), torch.int64)
    if driver != "gels" and rank_out.numel():
        yield from cast_steps(rank.reshape(kshape), rank_out)
    vshape = batch + (kk,) if driver in ("gelsd", "gelss") else (0,)
    svals, vb = alloc(index, vshape, tuple(torch.empty(vshape).stride()), dt.to_real())
    if driver in ("gelsd", "gelss") and svals.numel():
        yield from put(sv, svals)
    return [(solution, sb), (residuals, rb), (rank_out, kb), (svals, vb)]


class MatrixExpKernel(NamedTuple):
    """The key of the matrix exponential kernel (kernels/linalg_mexp.py) and its render."""

    family: str      # "linalg": the renderer module
    kind: str        # "matrix_exp"
    version: int     # VERSION: bump when this family's rendered source changes
    np_type: str     # "np.float32" | "np.float64": the precision it computes in
    parallel: bool   # prange over the batch, else range

    def render(self) -> tuple[str, str]:
        return klin.render_matrix_exp(self.np_type, self.parallel)


LOWERINGS = {
    "aten::linalg_householder_product": lower_householder_product,
    "aten::ormqr": lower_ormqr,
    "aten::linalg_qr": lower_qr,
    "aten::_linalg_eigh": lower_eigh,
    "aten::_linalg_svd": lower_svd,
    "aten::linalg_pinv.atol_rtol_tensor": lower_pinv,
    "aten::linalg_matrix_exp": lower_matrix_exp,
}
# complex64/complex128 operands: complex128 scratch and the "z" kernels (kernels/linalg_complex.py)
for _fn in (lower_householder_product, lower_qr, lower_eigh, lower_svd, lower_pinv,
            lower_matrix_exp, lower_ormqr, dynamic_lstsq, dynamic_geqrf):
    _fn.handles_complex = True
LOWERINGS = {name: lowering(fn) for name, fn in LOWERINGS.items()}

DYNAMIC = {
    "aten::geqrf": dynamic_geqrf,
    "aten::linalg_lstsq": dynamic_lstsq,
}
