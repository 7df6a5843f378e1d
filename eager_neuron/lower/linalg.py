"""Linear-algebra lowerings: LU, Cholesky and triangular solves (this module), QR, eigh, SVD,
pinv, lstsq and matrix_exp (`linalg_spectral.py`), each a Numba kernel batched over leading dims.

The pattern for every op: 1. copy each matrix operand into a float64 C-contiguous scratch of
the broadcast batch shape, transposed where the op solves with A^T (the cast kernel does it);
2. one kernel launch per step, batched (prange over matrices when the work is large); 3. cast
the float64 results into the outputs, whose shape and (often column-major) strides come from
meta. PyTorch's choices that later ops read back are kept: `_linalg_solve_ex`, `_linalg_det`
and `_linalg_slogdet` factor A^T when A is contiguous (their backward formulas assume it), and
`_linalg_check_errors` raises torch.linalg.LinAlgError with the CPU's messages.

The scratch/launch/error helpers live in `linalg_base.py` (re-exported here). Each lowering is
a generator of launch requests that `lowering()` launches (dispatch -> lowering -> launch); the
helpers it calls are generators too (`lu, piv, info = yield from factor(A)`).

>>> import torch, eager_neuron
>>> A = torch.tensor([[4.0, 1.0], [2.0, 3.0]], device="neuron")
>>> [round(v, 4) for v in torch.linalg.solve(A, torch.tensor([1.0, 2.0], device="neuron")).tolist()]
[0.1, 0.6]
"""

from __future__ import annotations

import numpy as np
import torch

from .. import errors
from .cast import cast_steps
from .linalg_base import (  # noqa: F401 - re-exported for importers of lower.linalg
    C128,
    F64,
    I32,
    PARALLEL_MIN,
    VERSION,
    BatchKernel,
    _no_pivot,
    b1,
    b2,
    b3,
    batch_of,
    check_info,
    check_status,
    copy,
    copy_steps,
    f64,
    f64_steps,
    int_scratch,
    lower_check_errors,
    lowering,
    nbatch,
    put,
    put_int,
    run,
    zero,
    zero_steps,
    zkind,
)

# ---------------------------------------------------------------------------------------------
# LU
# ---------------------------------------------------------------------------------------------

def factor(A: torch.Tensor, piv_out=None, info_out=None):
    """(lu float64 scratch, pivots int32, info int32) of getrf on A (..., m, n); steps."""
    m, n = A.shape[-2:]
    batch = tuple(A.shape[:-2])
    lu = yield from f64_steps(A)
    piv = int_scratch(piv_out, batch + (min(m, n),))
    info = int_scratch(info_out, batch)
    if lu.numel():
        yield run(zkind("lu_factor", lu), (b3(lu), b2(piv), b1(info)),
            flops=2.0 * lu.numel() * min(m, n))
    else:
        yield from zero_steps(info)
    return lu, piv, info


def lower_lu_factor_ex(func, a, outs):
    A, (LU, pivots, info) = a["A"], outs
    if not a["pivot"]:
        _no_pivot("linalg.lu_factor")
    if A.numel() == 0:
        yield from zero_steps(info)
        return
    lu, piv, inf = yield from factor(A, pivots, info)
    yield from put(lu, LU)
    yield from put_int(piv, pivots)
    yield from put_int(inf, info)
    if a["check_errors"]:
        check_info(inf, "torch.linalg.lu_factor_ex", A.dim() == 2)


def lu_solve_into(lu: torch.Tensor, piv: torch.Tensor, B: torch.Tensor, out: torch.Tensor,
                  left: bool, adjoint: bool) -> None:
    """out = A^-1 B (left) or B A^-1, A = P L U given by (lu, piv); `adjoint` solves with A^H.
    lu: any (..., n, n) tensor (float64/complex128 scratch reused when its batch matches)."""
    if out.numel() == 0:
        return
    # op(A) for the kernel: X A = B <=> A^T X^T = B^T, X A^H = B <=> conj(A) X^T = B^T
    trans, conj = adjoint == left, adjoint
    if not left:
        B, out = B.mT, out.mT
    n, k = out.shape[-2:]
    batch = tuple(out.shape[:-2])
    scratch = C128 if lu.is_complex() or B.is_complex() else F64
    if not (lu.dtype == scratch and lu.is_contiguous() and tuple(lu.shape[:-2]) == batch):
        lu = yield from f64_steps(lu, batch + (n, n))
    if not (piv.is_contiguous() and piv.dtype == I32 and tuple(piv.shape[:-1]) == batch):
        p = torch.empty(batch + (n,), dtype=I32)
        yield from cast_steps(piv.expand(batch + (n,)), p)
        piv = p
    x = yield from f64_steps(B, batch + (n, k))
    if x.dtype != lu.dtype:   # a real B with a complex LU (or back): both complex
        x = yield from _as_c128(x)
        lu = yield from _as_c128(lu)
    status = torch.empty(batch, dtype=I32)
    flags = (trans, conj, False) if lu.dtype == C128 else (trans, False)
    yield run(zkind("lu_solve", lu), (b3(lu), b2(piv), b3(x), b1(status)), flags,
        flops=2.0 * x.numel() * n)
    check_status(status, "linalg.lu_solve", "pivots out of range [1, n]")
    yield from put(x, out)


def lower_lu_solve(func, a, outs):
    yield from lu_solve_into(a["LU"], a["pivots"], a["B"], outs[0], bool(a["left"]),
                             bool(a["adjoint"]))


def is_vector_rhs(A: torch.Tensor, B: torch.Tensor) -> bool:
    return B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))


def lower_solve_ex(func, a, outs):
    A, B, left = a["A"], a["B"], bool(a["left"])
    result, LU, pivots, info = outs
    # NOTE: torch 2.13 factors A itself here (unlike _linalg_det), and its backward reads LU so
    lu, piv, inf = yield from factor(A, pivots, info)
    yield from put(lu, LU)
    yield from put_int(piv, pivots)
    yield from put_int(inf, info)
    if A.numel() == 0:
        yield from zero_steps(info)
        return
    if a["check_errors"]:
        check_info(inf, "torch.linalg.solve_ex", A.dim() == 2)
    if is_vector_rhs(A, B):
        B, result = B.unsqueeze(-1), result.unsqueeze(-1)
    yield from lu_solve_into(lu, piv, B, result, left, False)


def lower_inv_ex(func, a, outs):
    A, (inv, info) = a["A"], outs
    if A.numel() == 0:
        yield from zero_steps(info)
        return
    n = A.shape[-1]
    lu, piv, inf = yield from factor(A, None, info)
    x = torch.empty(lu.shape, dtype=lu.dtype)
    status = torch.empty(A.shape[:-2], dtype=I32)
    flags = (False, False, True) if lu.dtype == C128 else (False, True)
    yield run(zkind("lu_solve", lu), (b3(lu), b2(piv), b3(x), b1(status)), flags,
        flops=2.0 * lu.numel() * n)
    yield from put(x, inv)
    yield from put_int(inf, info)
    if a["check_errors"]:
        check_info(inf, "linalg.inv_ex", A.dim() == 2)


def _det_parts(A: torch.Tensor, LU, pivots):
    # PyTorch: det(A^T) = det(A), and backward expects that LU (real matrices only)
    use_t = A.is_contiguous() and not A.is_complex()
    lu, piv, _info = yield from factor(A.mT if use_t else A, pivots)
    batch = tuple(A.shape[:-2])
    det, sign = (torch.empty(batch, dtype=lu.dtype) for _ in range(2))
    logabs = torch.empty(batch, dtype=F64)
    if det.numel():
        yield run(zkind("lu_det", lu), (b3(lu), b2(piv), b1(det), b1(sign), b1(logabs)),
            flops=lu.numel())
    yield from put(lu, LU)
    yield from put_int(piv, pivots)
    return det, sign, logabs


def lower_det(func, a, outs):
    result, LU, pivots = outs
    det, _sign, _logabs = yield from _det_parts(a["A"], LU, pivots)
    yield from put(det, result)


def lower_slogdet(func, a, outs):
    sign, logabsdet, LU, pivots = outs
    _det, s, la = yield from _det_parts(a["A"], LU, pivots)
    yield from put(s, sign)
    yield from put(la, logabsdet)


def _unpack(lu: torch.Tensor, piv: torch.Tensor, P, L, U, unpack_data: bool,
            unpack_pivots: bool) -> None:
    m, n = lu.shape[-2:]
    k = min(m, n)
    batch = tuple(lu.shape[:-2])
    if lu.dtype not in (F64, C128) or not lu.is_contiguous():
        lu = yield from f64_steps(lu)
    if not (piv.is_contiguous() and piv.dtype == I32):
        p = torch.empty(piv.shape, dtype=I32)
        yield from cast_steps(piv, p)
        piv = p
    nb = 1
    for s in batch:
        nb *= s
    if nb == 0:
        return
    unpack_data = unpack_data and L.numel() + U.numel() > 0
    unpack_pivots = unpack_pivots and P.numel() > 0
    dt = lu.dtype   # the lu_unpack kernel is type-generic: complex128 scratch for complex LU
    dummy = torch.empty((nb, 1, 1), dtype=dt)
    p64 = torch.empty(batch + (m, m), dtype=dt) if unpack_pivots else dummy
    l64 = torch.empty(batch + (m, k), dtype=dt) if unpack_data else dummy
    u64 = torch.empty(batch + (k, n), dtype=dt) if unpack_data else dummy
    status = torch.empty((nb,), dtype=I32)
    yield run("lu_unpack", (b3(lu), b2(piv), b3(p64), b3(l64), b3(u64)),
        (unpack_data, unpack_pivots, b1(status)), flops=lu.numel())
    check_status(status, "lu_unpack", "pivots out of range [1, m]")
    if unpack_pivots:
        yield from put(p64, P)
    if unpack_data:
        yield from put(l64, L)
        yield from put(u64, U)


def lower_lu_unpack(func, a, outs):
    P, L, U = outs
    yield from _unpack(a["LU_data"], a["LU_pivots"], P, L, U, bool(a["unpack_data"]),
            bool(a["unpack_pivots"]))


def lower_linalg_lu(func, a, outs):
    A, (P, L, U) = a["A"], outs
    if not a["pivot"]:
        _no_pivot("linalg.lu")
    if A.numel() == 0:
        return
    lu, piv, _info = yield from factor(A)
    yield from _unpack(lu, piv, P, L, U, True, True)


# ---------------------------------------------------------------------------------------------
# triangular solves
# ---------------------------------------------------------------------------------------------

def _trsm_into(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, upper: bool, trans: bool,
               unit: bool) -> None:
    n, k = out.shape[-2:]
    batch = tuple(out.shape[:-2])
    a64 = yield from f64_steps(A, batch + (n, n))
    x = yield from f64_steps(B, batch + (n, k))
    if a64.dtype != x.dtype:
        a64 = yield from _as_c128(a64)
        x = yield from _as_c128(x)
    flags = (upper, trans, False, unit) if x.dtype == C128 else (upper, trans, unit)
    yield run(zkind("trsm", x), (b3(a64), b3(x)), flags, flops=1.0 * x.numel() * n)
    yield from put(x, out)


def lower_solve_triangular(func, a, outs):
    A, B, out = a["self"], a["B"], outs[0]
    if out.numel() == 0:
        return
    upper, unit = bool(a["upper"]), bool(a["unitriangular"])
    if a["left"]:
        yield from _trsm_into(A, B, out, upper, False, unit)
    else:                      # X A = B  <=>  A^T X^T = B^T
        yield from _trsm_into(A, B.mT, out.mT, upper, True, unit)


def lower_triangular_solve(func, a, outs):
    errors.warn(
        "torch.triangular_solve is deprecated in favor of torch.linalg.solve_triangularand will "
        "be removed in a future PyTorch release.\ntorch.linalg.solve_triangular has its "
        "arguments reversed and does not return a copy of one of the inputs.\nX = "
        "torch.triangular_solve(B, A).solution\nshould be replaced with\nX = "
        "torch.linalg.solve_triangular(A, B).", once=True)   # ATen's TORCH_WARN_ONCE
    b, A = a["self"], a["A"]
    solution, clone = outs
    if clone.numel():
        yield from copy_steps(A.detach().expand(clone.shape), clone)
    if solution.numel():
        yield from _trsm_into(A, b, solution, bool(a["upper"]), bool(a["transpose"]),
                   bool(a["unitriangular"]))


# ---------------------------------------------------------------------------------------------
# Cholesky
# ---------------------------------------------------------------------------------------------

def _lower_factor(L: torch.Tensor, upper) -> torch.Tensor:
    """The lower factor of A = L L^H from the one given: U^H = conj(U).T (U.T when real)."""
    if not upper:
        return L
    return L.mT.conj() if L.is_complex() else L.mT


def _as_c128(t: torch.Tensor) -> torch.Tensor:
    """A complex128 scratch of a float64 or complex128 one (mixed real/complex operands)."""
    if t.dtype == C128:
        return t
    out = torch.empty(t.shape, dtype=C128)
    yield from copy_steps(t, out)
    return out


def _cholesky(A: torch.Tensor, L: torch.Tensor, info_out, upper: bool) -> torch.Tensor:
    """Factor into L (or U = L^T written as the upper factor); returns the info tensor."""
    batch = tuple(A.shape[:-2])
    info = int_scratch(info_out, batch)
    if A.numel() == 0:
        yield from zero_steps(info)
        return info
    # potrf('U') on A = potrf('L') on A^T, transposed (complex too: the lower triangle of A^T is
    # conj of the Hermitian matrix's, whose factor conj(L) transposes to U = L^H)
    lower = yield from f64_steps(A.mT if upper else A)
    n = A.shape[-1]
    yield run(zkind("cholesky", lower), (b3(lower), b1(info)), flops=lower.numel() * n / 3.0)
    yield from put(lower, L.mT if upper else L)
    return info


def lower_cholesky_ex(func, a, outs):
    A, (L, info) = a["self"], outs
    inf = yield from _cholesky(A, L, info, bool(a["upper"]))
    yield from put_int(inf, info)
    if a["check_errors"]:
        check_info(inf, "linalg.cholesky_ex", A.dim() == 2)


_CHOLESKY_DEPRECATED = (
    "torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a "
    "future PyTorch release.\nL = torch.cholesky(A)\nshould be replaced with\n"
    "L = torch.linalg.cholesky(A)\nand\nU = torch.cholesky(A, upper=True)\nshould be "
    "replaced with\nU = torch.linalg.cholesky(A).mH\nThis transform will produce equivalent "
    "results for all valid (symmetric positive definite) inputs.")


def lower_cholesky(func, a, outs):
    # ATen's kernel warns once per process (TORCH_WARN_ONCE) at the user's line
    errors.warn(_CHOLESKY_DEPRECATED, once=True)
    A = a["self"]
    inf = yield from _cholesky(A, outs[0], None, bool(a["upper"]))
    check_info(inf, "cholesky", A.dim() == 2)


def lower_cholesky_inverse(func, a, outs):
    L, out = a["self"], outs[0]
    if out.numel() == 0:
        return
    lower = yield from f64_steps(_lower_factor(L, a["upper"]))
    info = torch.empty(L.shape[:-2], dtype=I32)
    n = L.shape[-1]
    if lower.dtype == C128:
        d = b3(lower).diagonal(axis1=1, axis2=2)
        info.numpy().reshape(-1)[...] = [(np.flatnonzero(r == 0)[:1] + 1).sum() for r in d]
        check_info(info, "cholesky_inverse", L.dim() == 2)
        x = torch.empty(lower.shape, dtype=C128)
        yield run("zcholesky_solve", (b3(lower), b3(x)), (True,), flops=lower.numel() * n)
        yield from put(x, out)
        return
    yield run("cholesky_inverse", (b3(lower), b1(info)), flops=lower.numel() * n)
    check_info(info, "cholesky_inverse", L.dim() == 2)
    yield from put(lower, out)


def lower_cholesky_solve(func, a, outs):
    B, L, out = a["self"], a["input2"], outs[0]
    if out.numel() == 0:
        return
    n, k = out.shape[-2:]
    batch = tuple(out.shape[:-2])
    l64 = yield from f64_steps(_lower_factor(L, a["upper"]), batch + (n, n))
    x = yield from f64_steps(B, batch + (n, k))
    if l64.dtype != x.dtype:
        l64 = yield from _as_c128(l64)
        x = yield from _as_c128(x)
    if x.dtype == C128:
        yield run("zcholesky_solve", (b3(l64), b3(x)), (False,), flops=2.0 * x.numel() * n)
    else:
        yield run("cholesky_solve", (b3(l64), b3(x)), flops=2.0 * x.numel() * n)
    yield from put(x, out)


# ---------------------------------------------------------------------------------------------
# LDL^T (Bunch-Kaufman, LAPACK sytrf/sytrs with uplo 'L'; hetrf/hetrs for complex hermitian)
# ---------------------------------------------------------------------------------------------

def lower_ldl_factor_ex(func, a, outs):
    A, (LD, pivots, info) = a["self"], outs
    if A.numel() == 0:
        yield from zero_steps(info)
        return
    n = A.shape[-1]
    batch = tuple(A.shape[:-2])
    x = yield from f64_steps(A)
    piv = int_scratch(pivots, batch + (n,))
    inf = int_scratch(info, batch)
    kind = "zhldl_factor" if x.dtype == C128 and a.get("hermitian") else zkind("ldl_factor", x)
    yield run(kind, (b3(x), b2(piv), b1(inf)), flops=x.numel() * n / 3.0)
    yield from put(x, LD)
    yield from put_int(piv, pivots)
    yield from put_int(inf, info)
    if a["check_errors"]:
        check_info(inf, "torch.linalg.ldl_factor_ex", A.dim() == 2)


def lower_ldl_solve(func, a, outs):
    LD, pivots, B, out = a["LD"], a["pivots"], a["B"], outs[0]
    if out.numel() == 0:
        return
    n, k = out.shape[-2:]
    batch = tuple(out.shape[:-2])
    ld = yield from f64_steps(LD, batch + (n, n))
    piv = torch.empty(batch + (n,), dtype=I32)
    yield from cast_steps(pivots.detach().expand(batch + (n,)), piv)
    x = yield from f64_steps(B, batch + (n, k))
    status = torch.empty(batch, dtype=I32)
    kind = "zhldl_solve" if ld.dtype == C128 and a.get("hermitian") else zkind("ldl_solve", ld)
    yield run(kind, (b3(ld), b2(piv), b3(x), b1(status)),
        flops=2.0 * x.numel() * n)
    check_status(status, "linalg.ldl_solve", "pivots are not a valid ldl_factor output")
    yield from put(x, out)


# ---------------------------------------------------------------------------------------------
# cross product: bfloat16 only (other dtypes take PyTorch's decomposition, which is exact)
# ---------------------------------------------------------------------------------------------

def lower_cross(func, a, outs):
    """The CPU's bfloat16/float16 kernels round each product and the difference to the half
    type; the decomposition computes in float32 and rounds once (a last-bit difference)."""
    out = outs[0]
    if out.dtype == torch.bool:   # the CPU's cross has no bool instance
        raise errors.NotImplementedForDtype("cross", torch.bool)
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise NotImplementedError("linalg_cross: exact via the decomposition for this dtype")
    if out.numel() == 0:
        return
    shape = tuple(out.shape)
    dim = a["dim"] % len(shape)
    pre, post = nbatch(shape[:dim]), nbatch(shape[dim + 1:])
    xs, ys = (torch.empty(shape, dtype=torch.float32) for _ in range(2))
    yield from cast_steps(a["self"].detach().expand(shape), xs)
    yield from cast_steps(a["other"].detach().expand(shape), ys)
    o = torch.empty(shape, dtype=torch.float32)
    kind = "cross_bf16" if out.dtype == torch.bfloat16 else "cross_f16"
    yield run(kind, tuple(t.numpy().reshape(pre, 3, post) for t in (xs, ys, o)),
        flops=9.0 * out.numel())
    yield from cast_steps(o, out)


lower_cross.handles_half = True


LOWERINGS = {
    "aten::_linalg_check_errors": lower_check_errors,
    "aten::linalg_lu_factor_ex": lower_lu_factor_ex,
    "aten::linalg_lu_solve": lower_lu_solve,
    "aten::_linalg_solve_ex": lower_solve_ex,
    "aten::linalg_inv_ex": lower_inv_ex,
    "aten::_linalg_det": lower_det,
    "aten::_linalg_slogdet": lower_slogdet,
    "aten::lu_unpack": lower_lu_unpack,
    "aten::linalg_lu": lower_linalg_lu,
    "aten::linalg_solve_triangular": lower_solve_triangular,
    "aten::triangular_solve": lower_triangular_solve,
    "aten::linalg_cholesky_ex": lower_cholesky_ex,
    "aten::cholesky": lower_cholesky,
    "aten::cholesky_inverse": lower_cholesky_inverse,
    "aten::cholesky_solve": lower_cholesky_solve,
    "aten::linalg_cross": lower_cross,
    "aten::linalg_ldl_factor_ex": lower_ldl_factor_ex,
    "aten::linalg_ldl_solve": lower_ldl_solve,
}
# complex64/complex128 operands: complex128 scratch and the "z" kernels (kernels/linalg_complex.py)
for _fn in (lower_lu_factor_ex, lower_lu_solve, lower_solve_ex, lower_inv_ex, lower_det,
            lower_slogdet, lower_lu_unpack, lower_linalg_lu, lower_solve_triangular,
            lower_triangular_solve, lower_cholesky_ex, lower_cholesky, lower_cholesky_inverse,
            lower_cholesky_solve, lower_check_errors, lower_ldl_factor_ex, lower_ldl_solve):
    _fn.handles_complex = True
LOWERINGS = {name: fn if fn is lower_check_errors else lowering(fn)
             for name, fn in LOWERINGS.items()}
# part two (QR, eigh, SVD, pinv, lstsq, matrix_exp) is its own family, lower/linalg_spectral.py:
# it imports the helpers above (one direction: this module imports nothing from it)
