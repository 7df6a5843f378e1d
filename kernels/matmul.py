"""Matmul family: out = beta * bias + alpha * (a @ b), 2-D or batched, one kernel per launch.

The spec is plain data:
- `batch`: "none" (2-D out), "bmm" (3-D out, one product per batch), "sum" (2-D out, products
  summed over the batch: addbmm);
- `modes`: per operand of a batched product, "n" (3-D C-contiguous array), "t" (3-D C-contiguous
  array holding the transposed matrices: the kernel reads `x[i].T`, an F-contiguous view BLAS
  takes without a copy) or "b" (one 2-D matrix shared by every batch, C or F);
- `epilogue`: "none", "scale" (alpha only: beta == 0 ignores bias, NaNs included, as PyTorch
  does) or "bias" (beta * bias + alpha * product, bias broadcast by strides).
Floats go through the MKL gemm torch's own CPU mm calls (kernels/blas.py `xgemm`; Numba's
np.dot, SciPy's OpenBLAS, when torch does not export it), written straight into `out`; integers
through a plain loop that accumulates in int64 (wrap-around matches PyTorch).

>>> src, name = render_blas("none", ("n", "n"), "bias")
>>> "_xgemm(a, b, out, 0.0)" in src or "np.dot(a, b, out)" in src
True
"""

from __future__ import annotations

import ctypes
import hashlib
import os

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'
_MKL_GEMM = {"eager_neuron_sgemm": "sgemm_64_", "eager_neuron_dgemm": "dgemm_64_",
             "eager_neuron_mkl_threads": "MKL_Set_Num_Threads_Local"}
_MKL: list = []


def mkl_symbols() -> dict:
    """{our name: address} of MKL's ILP64 gemm and thread control in libtorch_cpu.so (what
    torch's own CPU mm calls); {} when this torch does not export them."""
    if not _MKL:
        try:
            import torch

            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib",
                                           "libtorch_cpu.so"))
            _MKL.append({ours: ctypes.cast(getattr(lib, theirs), ctypes.c_void_p).value
                         for ours, theirs in _MKL_GEMM.items()})
        except (OSError, AttributeError):
            _MKL.append({})
    return _MKL[0]


def _gemm_line(a: str, b: str, c: str, beta: str, indent: str, mkl: bool) -> list[str]:
    """Source lines computing c = a @ b + beta * c (beta "0.0" or "1.0") for 2-D float arrays.

    MKL (kernels/blas.py xgemm) reads C- or F-contiguous a/b in place and writes row-major c; it
    refuses other layouts (the lowering copies those first), which raises here, never a wrong
    result. Without MKL: Numba's np.dot (SciPy's OpenBLAS).
    """
    if mkl:
        return [f"{indent}if not _xgemm({a}, {b}, {c}, {beta}):",
                f"{indent}    raise ValueError('gemm: an operand BLAS cannot address')"]
    if beta == "0.0":
        return [f"{indent}np.dot({a}, {b}, {c})"]
    # NOTE: explicit loops, not `c += t`: Numba array expressions cost seconds to compile
    return [f"{indent}t = np.dot({a}, {b})",
            f"{indent}for i0 in range({c}.shape[0]):",
            f"{indent}    for i1 in range({c}.shape[1]):",
            f"{indent}        {c}[i0, i1] += t[i0, i1]"]


def gemm_prelude() -> str:
    """What the float kernel's source needs before it: kernels/blas.py (with its digest: its
    intrinsic is compiled into every kernel, so an edit must change the disk key), or nothing."""
    if not mkl_symbols():
        return ""
    return f"from eager_neuron.kernels.blas import xgemm as _xgemm  # blas.py {_BLAS_ID}\n"


with open(os.path.join(os.path.dirname(__file__), "blas.py"), "rb") as _f:
    _BLAS_ID = hashlib.sha1(_f.read()).hexdigest()[:10]


def _operand(name: str, mode: str, idx: str) -> str:
    """The 2-D matrix of operand `name` for batch `idx`, as the kernel source spells it."""
    if mode == "b":
        return name
    if mode == "t":
        return f"{name}[{idx}].T"
    return f"{name}[{idx}]"


def _epilogue_lines(epilogue: str, rank: int, indent: str) -> list[str]:
    """In-place epilogue over `out` (rank 2 or 3); bias has out's rank, broadcast by strides."""
    if epilogue == "none":
        return []
    idx = ", ".join(f"i{d}" for d in range(rank))
    lines = []
    ind = indent
    for d in range(rank):
        lines.append(f"{ind}for i{d} in range(out.shape[{d}]):")
        ind += "    "
    if epilogue == "scale":
        lines.append(f"{ind}out[{idx}] = alpha * out[{idx}]")
    else:
        lines.append(f"{ind}out[{idx}] = beta * bias[{idx}] + alpha * out[{idx}]")
    return lines


def _params(epilogue: str) -> str:
    return {"none": "out, a, b", "scale": "out, a, b, alpha",
            "bias": "out, a, b, bias, beta, alpha"}[epilogue]


def render_blas(batch: str, modes: tuple, epilogue: str) -> tuple[str, str]:
    """Float kernel `k(out, a, b[, bias, beta][, alpha])`: BLAS product, then the epilogue.

    `out` is C-contiguous (BLAS writes it directly); `alpha`/`beta` arrive already cast to the
    array dtype, so a float32 kernel never widens to float64.
    """
    prelude = gemm_prelude()
    mkl = bool(prelude)
    name = kernel_name("mm", "blas", batch, modes, epilogue, prelude)
    lines = [prelude + HEADER.format(extra=""), f"def {name}({_params(epilogue)}):"]
    if batch == "none":
        lines += _gemm_line("a", "b", "out", "0.0", "    ", mkl)
        rank = 2
    elif batch == "bmm":
        # NOTE: out[i] of a C 3-D array is a C 2-D array: BLAS writes each product in place.
        lines.append("    for i in range(out.shape[0]):")
        lines += _gemm_line(_operand("a", modes[0], "i"), _operand("b", modes[1], "i"),
                            "out[i]", "0.0", "        ", mkl)
        rank = 3
    else:  # "sum": every product accumulated into out (beta 1), as ATen's addbmm
        # NOTE: "b" (broadcast) operands are not used here: the batch count comes from a.
        lines += [
            "    for i0 in range(out.shape[0]):",
            "        for i1 in range(out.shape[1]):",
            "            out[i0, i1] = 0",
            "    for i in range(a.shape[0]):",
        ]
        lines += _gemm_line(_operand("a", modes[0], "i"), _operand("b", modes[1], "i"),
                            "out", "1.0", "        ", mkl)
        rank = 2
    lines += _epilogue_lines(epilogue, rank, "    ")
    return "\n".join(lines) + "\n", name


def _half_temp(name: str, src: str, layout: str, rank: int, ld: str, indent: str) -> list[str]:
    """Lines making float32 temporary `name` from half-bits array `src` (any strides): C, or in
    `layout` "F" (2-D) / "t" (3-D: each matrix transposed in memory), the layout BLAS then
    reads, as the upcast route's scratch kept the operand's."""
    dims = ", ".join(f"{src}.shape[{d}]" for d in range(rank))
    if layout == "F":
        lines = [f"{indent}{name} = np.empty(({src}.shape[1], {src}.shape[0]), np.float32).T"]
    elif layout == "t":
        lines = [f"{indent}{name} = np.empty(({src}.shape[0], {src}.shape[2], {src}.shape[1]), "
                 f"np.float32).transpose((0, 2, 1))"]
    else:
        lines = [f"{indent}{name} = np.empty(({dims},), np.float32)"]
    idx = ", ".join(f"i{d}" for d in range(rank))
    ind = indent
    # loops in the temporary's memory order (the operand's too, when it has that layout)
    order = {"F": (1, 0), "t": (0, 2, 1)}.get(layout, tuple(range(rank)))
    for d in order:
        lines.append(f"{ind}for i{d} in range({src}.shape[{d}]):")
        ind += "    "
    lines.append(f"{ind}{name}[{idx}] = {ld}({src}[{idx}])")
    return lines


def render_blas_half(batch: str, half: str, layouts: tuple, epilogue: str) -> tuple[str, str]:
    """bfloat16 / float16 kernel `k(out, a, b[, bias, beta][, alpha])` on the half types' int16
    bits (any strides): the operands are loaded exactly into float32 temporaries (`layouts`:
    each one's memory order, see _half_temp), the float32 BLAS product and epilogue run on them
    (float32 alpha/beta, the bias loaded exactly), and the result is stored rounded to the half
    type once: what the upcast route (casts up, the float32 kernel, a cast down) computed, in
    one launch. `half` "bf16" | "f16"; `batch` "none" | "bmm" (addbmm keeps the upcast route:
    lower/matmul.py)."""
    from .halfround import HALF_IO

    if batch not in ("none", "bmm"):
        raise ValueError(f"render_blas_half: batch {batch!r}")

    prelude = gemm_prelude()
    mkl = bool(prelude)
    name = kernel_name("mmh", batch, half, layouts, epilogue, prelude)
    ld, st = f"_ld_{half}", f"_st_{half}"
    rank = 2 if batch == "none" else 3
    lines = [prelude + HALF_IO + "\n" + HEADER.format(extra=""),
             f"def {name}({_params(epilogue)}):"]
    lines += _half_temp("ta", "a", layouts[0], rank, ld, "    ")
    lines += _half_temp("tb", "b", layouts[1], rank, ld, "    ")
    dims = ", ".join(f"out.shape[{d}]" for d in range(rank))
    lines.append(f"    acc = np.empty(({dims},), np.float32)")   # (gemm's beta 0 writes it all)
    if batch == "none":
        lines += _gemm_line("ta", "tb", "acc", "0.0", "    ", mkl)
    else:
        lines.append("    for i in range(acc.shape[0]):")
        lines += _gemm_line("ta[i]", "tb[i]", "acc[i]", "0.0", "        ", mkl)
    idx = ", ".join(f"i{d}" for d in range(rank))
    ind = "    "
    for d in range(rank):
        lines.append(f"{ind}for i{d} in range(out.shape[{d}]):")
        ind += "    "
    value = {"none": f"acc[{idx}]", "scale": f"alpha * acc[{idx}]",
             "bias": f"beta * {ld}(bias[{idx}]) + alpha * acc[{idx}]"}[epilogue]
    lines.append(f"{ind}out[{idx}] = {st}({value})")
    return "\n".join(lines) + "\n", name


def render_loop(batch: str, epilogue: str, acc: str, store: str,
                parallel: bool) -> tuple[str, str]:
    """Integer kernel over 3-D views of any strides: out (Bo, M, N), a (B, M, K), b (B, K, N).

    For batch "sum" Bo == 1 and every (i, j) sums over all B; otherwise batch p of out uses
    batch p of a and b. Row-at-a-time i-k-j order keeps b's rows streaming through the cache.
    """
    name = kernel_name("mm", "loop", batch, epilogue, acc, store, parallel)
    extra = ", parallel=True" if parallel else ""
    rng = "prange" if parallel else "range"
    batches = "range(nb)" if batch == "sum" else "range(bo, bo + 1)"
    lines = [
        HEADER.format(extra=extra),
        f"def {name}({_params(epilogue)}):",
        "    m = out.shape[1]",
        "    n = out.shape[2]",
        "    kk = a.shape[2]",
        "    nb = a.shape[0]",
        f"    for p in {rng}(out.shape[0] * m):",
        "        bo = p // m",
        "        i = p % m",
        f"        row = np.zeros(n, {acc})",
        f"        for bi in {batches}:",
        "            for k in range(kk):",
        f"                av = {acc}(a[bi, i, k])",
        "                for j in range(n):",
        f"                    row[j] += av * {acc}(b[bi, k, j])",
        "        for j in range(n):",
    ]
    value = {"none": "row[j]", "scale": "alpha * row[j]",
             "bias": f"beta * {acc}(bias[bo, i, j]) + alpha * row[j]"}[epilogue]
    lines.append(f"            out[bo, i, j] = {store}({value})")
    return "\n".join(lines) + "\n", name


# _grouped_mm's three offs layouts (lower/matmul.py dynamic_grouped_mm): the operands each
# group's product reads and the part of `out` it writes
_GROUPED = {
    "2x3": ("x[start:end]", "w[g]", "out[start:end]"),        # rows of x grouped, w per group
    "2x2": ("x[:, start:end]", "w[start:end]", "out[g]"),     # the weight gradient
    "3x2": ("x[g]", "w[:, start:end]", "out[:, start:end]"),  # columns of out grouped
}


def render_grouped(case: str) -> tuple[str, str]:
    """`k(out, x, w, offs)`: out zeroed, then one BLAS product per group of `offs` (cumulative
    ends, read here: one launch, whatever the routing) on views of the operands in place
    (kernels/blas.py xgemm; MKL only). Groups past the data, empty or out of order write
    nothing, as the per-group launches did."""
    prelude = gemm_prelude()
    if not prelude:
        raise RuntimeError("grouped gemm needs MKL's gemm (kernels/blas.py)")
    a, b, c = _GROUPED[case]
    name = kernel_name("grouped_mm", case, prelude)
    rank = 3 if case == "2x2" else 2
    idx = ", ".join(f"i{d}" for d in range(rank))
    lines = [prelude + HEADER.format(extra=""), f"def {name}(out, x, w, offs):"]
    ind = "    "
    for d in range(rank):
        lines.append(f"{ind}for i{d} in range(out.shape[{d}]):")
        ind += "    "
    lines += [f"{ind}out[{idx}] = 0",
              "    start = 0",
              "    for g in range(offs.shape[0]):",
              "        end = np.int64(offs[g])",
              "        if end > start:"]
    lines += _gemm_line(a, b, c, "0.0", "            ", True)
    lines.append("        start = max(start, end)")
    return "\n".join(lines) + "\n", name
