"""Fused family: one kernel holding several loops, each loop a chain of elementwise nodes.

The spec is plain data. Each loop runs over the elements of one size; its nodes are computed in
order per element, values flow between nodes of the same loop in registers (`v{k}`), and a node's
store is omitted when nothing outside the group can observe it. A node may end in a sum/mean
epilogue that accumulates over the loop and writes one element after it.

spec = (loops, n_bufs, scalar_casts) with
  loop  = (size_buf, nodes)
  node  = (expr, loads, store, operands, scalars, out_buf or None, reduce, node_id)
  operand = ("buf", j) | ("one", j) | ("val", k)      # k: id of an earlier node, same loop
"""

from __future__ import annotations

import re

from .elementwise import kernel_name

_X = re.compile(r"\bx(\d+)\b")
_C = re.compile(r"\bc(\d+)\b")


def render(spec: tuple, parallel: bool) -> tuple[str, str]:
    loops, n_bufs, scalar_casts = spec
    name = kernel_name("fused", spec, parallel)
    params = [f"b{j}" for j in range(n_bufs)] + [f"s{j}" for j in range(len(scalar_casts))]
    extra = ", parallel=True" if parallel else ""
    lines = [f'@njit(error_model="numpy", nogil=True{extra})', f"def {name}({', '.join(params)}):"]
    rng = "prange" if parallel else "range"
    for li, (size_buf, nodes) in enumerate(loops):
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
        for j, cast in enumerate(scalar_casts):
            if li == 0:
                lines.append(f"    c{j} = {cast}(s{j})")
        lines.extend(pre)
        lines.append(f"    for i in {rng}(b{size_buf}.shape[0]):")
        lines.extend(body or ["        pass"])
        lines.extend(post)
    return "\n".join(lines) + "\n", name
