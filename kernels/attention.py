"""Attention family: scaled dot-product attention, forward and backward, one kernel each.

Views are rank 4: q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev), any strides; H is a
multiple of Hk (grouped-query attention: query head h reads key/value head h // (H // Hk)).
The mask is a (B, H, L, S) view broadcast by strides (stride 0 where the user's mask has size
1), either added to the scores ("add") or selecting them ("bool": False is -inf), or absent
("none", a 1-element dummy). `causal` keeps key j <= query i (upper-left, as PyTorch's math
path). Rows whose every score is -inf give a zero output and logsumexp -inf, as `_safe_softmax`.
Scores, softmax and products accumulate in float64; one rounding at each store.

Forward `k(out, lse, seed, offset, q, k, v, mask, scale)`: per query row, scores -> max ->
exp -> weighted sum of values; `lse` (B, H, L) keeps m + log(sum) so the backward recomputes
probabilities.
Backward `k(gq, gk, gv, gm, go, q, k, v, mask, out, lse, scale)`: with p = exp(s - lse),
dv += p go, dp = go . v, ds = p (dp - sum(go * out)), dq = scale ds k, dk += scale ds q,
dmask += ds (accumulated into the broadcast view: a broadcast mask gets the summed gradient).

>>> src, name = render_forward("add", False, False)
>>> "math.exp" in src and name.startswith("attn_fwd")
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


def _score_lines(mask: str, causal: bool, ind: str) -> list[str]:
    """Lines that set `x`, the score of (b, h, i, j), and the row's key extent `jend`."""
    return [
        f"{ind}acc = 0.0",
        f"{ind}for e in range(E):",
        f"{ind}    acc += np.float64(q[b, h, i, e]) * np.float64(k[b, hk, j, e])",
        f"{ind}x = acc * scale",
    ] + {
        "none": [],
        "add": [f"{ind}x += np.float64(mask[b, h, i, j])"],
        "bool": [f"{ind}if not mask[b, h, i, j]:", f"{ind}    x = -np.inf"],
    }[mask]


def _head(name: str, params: str, parallel: bool, causal: bool) -> list[str]:
    extra = ", parallel=True" if parallel else ""
    return [
        HEADER.format(extra=extra) + f"def {name}({params}):",
        "    B, H, L, E = q.shape",
        "    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]",
        "    G = H // Hk",
    ]


def _jend(causal: bool) -> str:
    return "min(S, i + 1)" if causal else "S"


def render_forward(mask: str, causal: bool, parallel: bool) -> tuple[str, str]:
    """`k(out, lse, seed, offset, q, k, v, mask, scale)`: out (B, H, L, Ev), lse (B, H, L)
    float32; seed and offset (1-element int64, no dropout so no RNG state) are zeroed."""
    name = kernel_name("attn_fwd", mask, causal, parallel)
    rng = "prange" if parallel else "range"
    lines = _head(name, "out, lse, seed, offset, q, k, v, mask, scale", parallel, causal) + [
        "    seed[0] = 0",
        "    offset[0] = 0",
        f"    for bh in {rng}(B * H):",
        "        b = bh // H",
        "        h = bh - b * H",
        "        hk = h // G",
        "        p = np.empty(S, np.float64)",
        "        for i in range(L):",
        f"            jend = {_jend(causal)}",
        "            m = -np.inf",
        "            for j in range(jend):",
    ] + _score_lines(mask, causal, " " * 16) + [
        "                p[j] = x",
        "                if x > m or x != x:",
        "                    m = x",
        "            if m == -np.inf:",
        "                for e in range(Ev):",
        "                    out[b, h, i, e] = 0",
        "                lse[b, h, i] = -np.inf",
        "                continue",
        "            s = 0.0",
        "            for j in range(jend):",
        "                p[j] = math.exp(p[j] - m)",
        "                s += p[j]",
        "            inv = 1.0 / s",
        "            for e in range(Ev):",
        "                acc = 0.0",
        "                for j in range(jend):",
        "                    acc += p[j] * np.float64(v[b, hk, j, e])",
        "                out[b, h, i, e] = acc * inv",
        "            lse[b, h, i] = m + math.log(s)",
    ]
    return "\n".join(lines) + "\n", name


def render_backward(mask: str, causal: bool, mask_grad: bool,
                    parallel: bool) -> tuple[str, str]:
    """`k(gq, gk, gv, gm, go, q, k, v, mask, out, lse, scale)`; gm is the (B, H, L, S)
    broadcast view of the mask's gradient (a dummy unless `mask_grad`).

    `parallel` splits the batch across threads; the caller asks for it only when no two
    batches write the same gradient element (the mask's gradient is not broadcast over B)."""
    name = kernel_name("attn_bwd", mask, causal, mask_grad, parallel)
    rng = "prange" if parallel else "range"
    lines = _head(name, "gq, gk, gv, gm, go, q, k, v, mask, out, lse, scale", parallel,
                  causal)
    if mask_grad:
        # 1. the mask gradient accumulates through a broadcast view: zero it first (serially;
        #    a broadcast element is written several times, always with 0)
        lines += [
            "    for b in range(B):",
            "        for h in range(H):",
            "            for i in range(L):",
            "                for j in range(S):",
            "                    gm[b, h, i, j] = 0",
        ]
    # 2. per batch: key/value gradients accumulate over query rows (and grouped heads) in f64
    lines += [
        f"    for b in {rng}(B):",
        "        dk = np.zeros((Hk, S, E), np.float64)",
        "        dv = np.zeros((Hk, S, Ev), np.float64)",
        "        dq = np.empty(E, np.float64)",
        "        for h in range(H):",
        "            hk = h // G",
        "            for i in range(L):",
        "                for e in range(E):",
        "                    dq[e] = 0.0",
        "                lrow = np.float64(lse[b, h, i])",
        "                jend = 0 if lrow == -np.inf else " + _jend(causal),
        "                d = 0.0",
        "                for e in range(Ev):",
        "                    d += np.float64(go[b, h, i, e]) * np.float64(out[b, h, i, e])",
        "                for j in range(jend):",
    ] + _score_lines(mask, causal, " " * 20) + [
        "                    pr = math.exp(x - lrow)",
        "                    dp = 0.0",
        "                    for e in range(Ev):",
        "                        g = np.float64(go[b, h, i, e])",
        "                        dp += g * np.float64(v[b, hk, j, e])",
        "                        dv[hk, j, e] += pr * g",
        "                    ds = pr * (dp - d)",
    ] + ([
        "                    gm[b, h, i, j] += ds",
    ] if mask_grad else []) + [
        "                    ds *= scale",
        "                    for e in range(E):",
        "                        dq[e] += ds * np.float64(k[b, hk, j, e])",
        "                        dk[hk, j, e] += ds * np.float64(q[b, h, i, e])",
        "                for e in range(E):",
        "                    gq[b, h, i, e] = dq[e]",
        "        for hk in range(Hk):",
        "            for j in range(S):",
        "                for e in range(E):",
        "                    gk[b, hk, j, e] = dk[hk, j, e]",
        "                for e in range(Ev):",
        "                    gv[b, hk, j, e] = dv[hk, j, e]",
    ]
    return "\n".join(lines) + "\n", name
