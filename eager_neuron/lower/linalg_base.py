"""Linear-algebra lowerings' shared machinery: scratch copies in (float64, or complex128 for
complex operands), batched kernel launches (kernels/linalg.py), results out, and PyTorch's
`_linalg_check_errors` messages.

Call depth: a lowering's body is a generator of launch requests (launch()'s positional
arguments); `lowering(steps)` makes the function dispatch calls, which launches each request
itself as it comes, so every launch sits two calls below dispatch however many helpers built
it. The helpers below are generators too (`buf = yield from f64_steps(t)`); each request is
built when the one before it has run, so host checks between launches (check_info) keep their
place. `linalg.py` (LU, Cholesky, triangular, LDL), `linalg_spectral.py`
(QR, eigh, SVD, pinv, lstsq, matrix_exp) and `linalg_complex.py` (their complex forms) build on it.

>>> import torch
>>> buf = f64(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
>>> buf.dtype, b3(buf).shape
(torch.float64, (1, 2, 2))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..kernels import compile as kc
from ..kernels import linalg as klin
from ..launch import launch
from .cast import cast, cast_steps

VERSION = 1              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 24   # flops below which a prange over the batch costs more than it saves
F64 = torch.float64
I32 = torch.int32
C128 = torch.complex128


# ---------------------------------------------------------------------------------------------
# scratch in, kernel, results out
# ---------------------------------------------------------------------------------------------

def lowering(steps):
    """The lowering dispatch calls for a generator of launch requests `steps(func, a, outs)`:
    it launches each request itself (dispatch -> lowering -> launch). out= overloads
    (linalg_inv_ex.inverse, ...) may need their outputs resized, which a lowering cannot do:
    they decline (NotImplementedError) and take the counted fallback."""
    def lower(func, a, outs):
        if any(r.alias_info is not None and r.alias_info.is_write
               for r in func._schema.returns):
            raise NotImplementedError(f"{func._schema.name}: out= variant")
        for req in steps(func, a, outs):
            launch(*req)

    lower.__name__ = steps.__name__
    lower.__doc__ = steps.__doc__
    lower.handles_half = getattr(steps, "handles_half", False)
    lower.handles_complex = getattr(steps, "handles_complex", False)
    return lower


def drive(gen):
    """Run a generator of launch requests to its end; its return value (a helper's result, for
    callers outside this family's lowerings)."""
    try:
        while True:
            launch(*next(gen))
    except StopIteration as stop:
        return stop.value


def f64_steps(t: torch.Tensor, shape=None):
    """A float64 C-contiguous scratch copy of t, broadcast to `shape` (t's own by default);
    complex128 for a complex t (conj/neg views resolved: the scratch holds the values).
    A generator of the copy's launches; returns the scratch."""
    shape = tuple(t.shape) if shape is None else tuple(shape)
    buf = torch.empty(shape, dtype=C128 if t.is_complex() else F64)
    if buf.numel():
        yield from copy_steps(t.detach().expand(shape), buf)
    return buf


def f64(t: torch.Tensor, shape=None) -> torch.Tensor:
    """f64_steps, launched."""
    return drive(f64_steps(t, shape))


def copy_steps(src: torch.Tensor, dst: torch.Tensor):
    """dst[...] = src (same shape); complex operands through the complex family, which reads
    PyTorch's conjugate and negative bits. A generator of its launches."""
    if src.is_complex() or dst.is_complex():
        from .complex_ew import elementwise_steps  # NOTE: here: complex imports ops

        yield from elementwise_steps("aten::_to_copy", {"self": src}, dst)
    else:
        yield from cast_steps(src, dst)


def copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    for req in copy_steps(src, dst):
        launch(*req)


def zkind(kind: str, t: torch.Tensor) -> str:
    """The batch kernel for t's scratch: `kind`, or its complex form "z" + kind."""
    return "z" + kind if t.dtype == C128 else kind


def nbatch(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def b3(t: torch.Tensor) -> np.ndarray:
    """(B, rows, cols) numpy view of a C-contiguous scratch."""
    return t.numpy().reshape((nbatch(t.shape[:-2]),) + tuple(t.shape[-2:]))


def b2(t: torch.Tensor) -> np.ndarray:
    """(B, n) numpy view of a C-contiguous scratch."""
    return t.numpy().reshape((nbatch(t.shape[:-1]), t.shape[-1]))


def b1(t: torch.Tensor) -> np.ndarray:
    return t.numpy().reshape(-1)


def put(buf: torch.Tensor, out: torch.Tensor):
    """out[...] = buf (same shape), converting dtype and layout (steps)."""
    if out.numel():
        yield from copy_steps(buf.reshape(out.shape), out)


def int_scratch(out: torch.Tensor | None, shape: tuple, dtype=I32) -> torch.Tensor:
    """out itself when it is a C-contiguous `dtype` tensor of `shape`, else a fresh scratch."""
    if out is not None and out.dtype == dtype and out.is_contiguous() and \
            tuple(out.shape) == tuple(shape):
        return out
    return torch.empty(shape, dtype=dtype)


def put_int(buf: torch.Tensor, out: torch.Tensor):
    if buf is not out and out.numel():
        yield from cast_steps(buf.reshape(out.shape), out)


def zero_steps(t: torch.Tensor):
    if t.numel():
        yield from cast_steps(torch.zeros((), dtype=t.dtype).expand(t.shape), t)


def zero(t: torch.Tensor) -> None:
    if t.numel():
        cast(torch.zeros((), dtype=t.dtype).expand(t.shape), t)


class BatchKernel(NamedTuple):
    """The key of a batch kernel of kernels/linalg.py: every field its source depends on, and the
    render that reads nothing else (a tuple: launch appends the argument types to it).

    >>> BatchKernel("linalg", "lu_factor", VERSION, False).render()[1].startswith("linalg_lu")
    True
    """

    family: str      # "linalg": the renderer module
    kind: str        # which batch kernel: a key of kernels/linalg._KERNELS
    version: int     # VERSION: bump when this family's rendered source changes
    parallel: bool   # prange over the batch, else range

    def render(self) -> tuple[str, str]:
        return klin.render(self.kind, self.parallel)


def run(kind: str, arrays: tuple, scalars: tuple = (), flops: float = 0.0) -> tuple:
    """The launch of kernel `kind` of kernels/linalg.py over numpy `arrays` (+ runtime flags):
    launch()'s positional arguments (a step: `yield run(...)`)."""
    batch = arrays[0].shape[0]
    parallel = batch > 1 and flops >= PARALLEL_MIN and kc.parallel_allowed()
    key = BatchKernel("linalg", kind, VERSION, parallel)
    nbytes = sum(a.nbytes for a in arrays)
    return (key, key.render, tuple(arrays) + tuple(scalars), flops, nbytes, "vector")


def batch_of(*shapes) -> tuple:
    return tuple(torch.broadcast_shapes(*(tuple(s) for s in shapes)))


# ---------------------------------------------------------------------------------------------
# errors: PyTorch's _linalg_check_errors, on the info the kernels wrote
# ---------------------------------------------------------------------------------------------

def check_info(info: torch.Tensor, api: str, is_matrix: bool) -> None:
    """Raise what the CPU raises for a non-zero LAPACK info (first failing batch element)."""
    flat = info.detach().numpy().reshape(-1)
    bad = np.flatnonzero(flat)
    if bad.size == 0:
        return
    i = int(bad[0])
    code = int(flat[i])
    where = "" if is_matrix else f": (Batch element {i})"
    if code < 0:
        raise RuntimeError(f"{api}{where}: Argument {-code} has illegal value.")
    if "inv" in api:
        msg = (f": The diagonal element {code} is zero, the inversion could not be completed "
               "because the input matrix is singular.")
    elif "solve" in api:
        msg = ": The solver failed because the input matrix is singular."
    elif "cholesky" in api:
        msg = (": The factorization could not be completed because the input is not "
               f"positive-definite (the leading minor of order {code} is not "
               "positive-definite).")
    elif "svd" in api:
        msg = (": The algorithm failed to converge because the input matrix is ill-conditioned "
               f"or has too many repeated singular values (error code: {code}).")
    elif "eig" in api or "syevd" in api:
        msg = (": The algorithm failed to converge because the input matrix is ill-conditioned "
               f"or has too many repeated eigenvalues (error code: {code}).")
    elif "lstsq" in api:
        msg = (": The least squares solution could not be computed because the input matrix "
               f"does not have full rank (error code: {code}).")
    elif "lu_factor" in api:
        raise RuntimeError(
            f"{api}{where}: U[{code},{code}] is zero and using it on lu_solve would result in a "
            "division by zero. If you still want to perform the factorization, consider "
            "calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")
    else:
        msg = f": Unknown error code: {code}."
    raise torch.linalg.LinAlgError(api + where + msg)


def lower_check_errors(func, a, outs):
    info = a["info"]
    if info.numel():
        check_info(info, a["api_name"], bool(a["is_matrix"]))


def check_status(status: torch.Tensor, op: str, what: str) -> None:
    """A kernel's per-matrix status flag (1 = bad input it skipped) as a clear error."""
    flat = status.numpy().reshape(-1)
    bad = np.flatnonzero(flat)
    if bad.size:
        raise torch.linalg.LinAlgError(
            f"{op}: (Batch element {int(bad[0])}): {what}")


def _no_pivot(op: str):
    raise RuntimeError(f"{op}: LU without pivoting is not implemented on the CPU or on neuron; "
                       "fix: call it with pivot=True")
