"""Fused family: one kernel holding several loops, each loop a chain of elementwise nodes, and
calls of other kernels (a matmul) between them.

The spec is plain data. Each loop runs over the elements of one size; its nodes are computed in
order per element, values flow between nodes of the same loop in registers (`v{k}`), and a node's
store is omitted when nothing outside the group can observe it. A node may end in a sum/mean
epilogue that accumulates over the loop and writes one element after it. A call segment runs
another family's kernel (its source is put before this kernel's: `callees` names it) on the
fused kernel's trailing arguments `a{base}..a{base + n - 1}`, between the loops before it and
the loops after it.

spec = (loops, n_bufs, scalar_casts) with
  loop  = (size_buf, nodes) | ("call", callee_key, base, n)
  node  = (expr, loads, store, operands, scalars, out_buf or None, reduce, node_id)
  operand = ("buf", j) | ("one", j) | ("val", k)      # k: id of an earlier node, same loop

>>> spec = ((("call", ("mm",), 0, 3), (0, (("x0 + 1", ("np.float32",), "np.float32({})",
...          (("buf", 0),), (), 0, None, 0),))), 1, ())
>>> src, name = render(spec, False, {("mm",): "k_mm"})
>>> "    k_mm(a0, a1, a2)" in src
True
"""

from __future__ import annotations

import re

from .elementwise import kernel_name

_X = re.compile(r"\bx(\d+)\b")
_C = re.compile(r"\bc(\d+)\b")


def render(spec: tuple, parallel: bool, callees: dict | None = None) -> tuple[str, str]:
    """The fused kernel's source and name; `callees`: callee key -> its kernel's name."""
    loops, n_bufs, scalar_casts = spec
    name = kernel_name("fused", spec, parallel)
    n_call = sum(lp[3] for lp in loops if lp[0] == "call")
    params = ([f"b{j}" for j in range(n_bufs)] + [f"s{j}" for j in range(len(scalar_casts))]
              + [f"a{j}" for j in range(n_call)])
    extra = ", parallel=True" if parallel else ""
    lines = [f'@njit(error_model="numpy", nogil=True{extra})', f"def {name}({', '.join(params)}):"]
    casts = [f"    c{j} = {cast}(s{j})" for j, cast in enumerate(scalar_casts)]
    if loops and loops[0][0] == "call":
        lines += casts
        casts = []
    rng = "prange" if parallel else "range"
    for li, loop in enumerate(loops):
        if loop[0] == "call":
            _, ckey, base, n = loop
            lines.append(f"    # call {li}")
            lines.append(f"    {callees[ckey]}({', '.join(f'a{base + t}' for t in range(n))})")
            continue
        size_buf, nodes = loop
        pre, body, post = [], [], []
        for expr, loads, store, operands, scalars, out_buf, reduce, k in nodes:
            names = []
            for oi, (kind, ref) in enumerate(operands):
                cast = loads[oi]
                if kind == "one":
                    pre.append(f"    o{k}_{oi} = {cast}(b{ref}[0])")
                    names.append(f"o{k}_{oi}")
                elif kind == "val":
                    names.append(f"{cast}(v{ref})")
                else:
                    names.append(f"{cast}(b{ref}[i])")
            # the closures run inside this iteration (re.sub calls them at once)
            e = _X.sub(lambda m: f"({names[int(m.group(1))]})", expr)  # noqa: B023
            e = _C.sub(lambda m: f"c{scalars[int(m.group(1))]}", e)  # noqa: B023
            if reduce:
                pre.append(f"    acc{k} = 0.0")
                body.append(f"        acc{k} += {e}")
                value = f"acc{k} / b{size_buf}.shape[0]" if reduce == "mean" else f"acc{k}"
                post.append(f"    b{out_buf}[0] = {store.format(value)}")
                continue
            body.append(f"        v{k} = {store.format(e)}")
            if out_buf is not None:
                body.append(f"        b{out_buf}[i] = v{k}")
        lines.append(f"    # loop {li}")
        if li == 0:   # (here, not above: the source of a group without calls is unchanged)
            lines.extend(casts)
        lines.extend(pre)
        lines.append(f"    for i in {rng}(b{size_buf}.shape[0]):")
        lines.extend(body or ["        pass"])
        lines.extend(post)
    return "\n".join(lines) + "\n", name
