"""Matmul family: out = beta * bias + alpha * (a @ b), 2-D or batched, one kernel per launch.

The spec is plain data:
- `batch`: "none" (2-D out), "bmm" (3-D out, one product per batch), "sum" (2-D out, products
  summed over the batch: addbmm);
- `modes`: per operand of a batched product, "n" (3-D C-contiguous array), "t" (3-D C-contiguous
  array holding the transposed matrices: the kernel reads `x[i].T`, an F-contiguous view BLAS
  takes without a copy) or "b" (one 2-D matrix shared by every batch, C or F);
- `epilogue`: "none", "scale" (alpha only: beta == 0 ignores bias, NaNs included, as PyTorch
  does) or "bias" (beta * bias + alpha * product, bias broadcast by strides).
Floats go through Numba's `np.dot(a, b, out)` (SciPy's BLAS: gemm, or gemv/dot when a side is
1); integers through a plain loop that accumulates in int64 (wrap-around matches PyTorch).

>>> src, name = render_blas("none", ("n", "n"), "bias")
>>> "np.dot(a, b, out)" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


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
    name = kernel_name("mm", "blas", batch, modes, epilogue)
    lines = [HEADER.format(extra=""), f"def {name}({_params(epilogue)}):"]
    if batch == "none":
        lines.append("    np.dot(a, b, out)")
        rank = 2
    elif batch == "bmm":
        # NOTE: out[i] of a C 3-D array is a C 2-D array: BLAS writes each product in place.
        lines.append("    for i in range(out.shape[0]):")
        lines.append(f"        np.dot({_operand('a', modes[0], 'i')}, "
                     f"{_operand('b', modes[1], 'i')}, out[i])")
        rank = 3
    else:  # "sum": products land in a scratch tile added to out
        # NOTE: "b" (broadcast) operands are not used here: the batch count comes from a.
        # Explicit loops, not `out += tmp`: Numba array expressions cost seconds to compile.
        lines += [
            "    for i0 in range(out.shape[0]):",
            "        for i1 in range(out.shape[1]):",
            "            out[i0, i1] = 0",
            "    tmp = np.empty_like(out)",
            "    for i in range(a.shape[0]):",
            f"        np.dot({_operand('a', modes[0], 'i')}, {_operand('b', modes[1], 'i')}, tmp)",
            "        for i0 in range(out.shape[0]):",
            "            for i1 in range(out.shape[1]):",
            "                out[i0, i1] += tmp[i0, i1]",
        ]
        rank = 2
    lines += _epilogue_lines(epilogue, rank, "    ")
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
