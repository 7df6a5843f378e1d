"""Elementwise family: one loop, any number of inputs, one output, broadcasting by strides.

The spec is plain data: an expression over loaded operands `x0..xn` and scalars `c0..ck`, each
operand's kind ('flat': same shape and contiguous, 'one': a single element, 'nd': broadcast
view), the rank of the loop, the load casts and the store cast.

>>> src, name = render("x0 + c0", ("flat",), 1, ("np.float32",), ("np.float32",), "np.float32")
>>> "for i in range(n)" in src
True
"""

from __future__ import annotations

import hashlib

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


def kernel_name(prefix: str, *parts) -> str:
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def render(expr: str, kinds: tuple, rank: int, loads: tuple, scalar_casts: tuple,
           store: str, parallel: bool = False, fastmath: bool = False) -> tuple[str, str]:
    """Source of `k(out, a0..an, s0..sk)`; `rank == 1` with no 'nd' input is the flat loop."""
    n_in, n_sc = len(kinds), len(scalar_casts)
    name = kernel_name("ew", expr, kinds, rank, loads, scalar_casts, store, parallel, fastmath)
    extra = (", parallel=True" if parallel else "") + (", fastmath=True" if fastmath else "")
    params = ["out"] + [f"a{i}" for i in range(n_in)] + [f"s{j}" for j in range(n_sc)]
    lines = [HEADER.format(extra=extra), f"def {name}({', '.join(params)}):"]
    # 1. scalars and single-element operands are loaded once, outside the loop
    for j, cast in enumerate(scalar_casts):
        lines.append(f"    c{j} = {cast}(s{j})")
    for i, kind in enumerate(kinds):
        if kind == "one":
            lines.append(f"    x{i} = {loads[i]}(a{i}[0])")
    rng = "prange" if parallel else "range"
    idx = ", ".join(f"i{d}" for d in range(rank))
    # 2. the loop nest over the output
    indent = "    "
    for d in range(rank):
        loop = rng if d == 0 else "range"
        lines.append(f"{indent}for i{d} in {loop}(out.shape[{d}]):")
        indent += "    "
    for i, kind in enumerate(kinds):
        if kind != "one":
            lines.append(f"{indent}x{i} = {loads[i]}(a{i}[{idx}])")
    lines.append(f"{indent}out[{idx}] = {store.format(expr)}")
    return "\n".join(lines) + "\n", name
