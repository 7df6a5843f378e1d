"""FlexAttention kernels: one forward, one backward, walking a block mask tile by tile.

The score_mod / mask_mod / joint-graph lines come rendered (eager_neuron/compile/flex.py): they
read `x` (the scaled score), `b`, `h`, `i`, `j` (and `ds` for the joint graph) and set `sc`,
`ok`, `gs`. Every (query block, kv block) pair the block mask lists is a tile: its products
(Q K^T, P V and, backward, dO V^T, P^T dO, dS K, dS^T Q) are gemm calls (kernels/matmul.py's
`_gemm_line`: MKL's gemm when torch exports it, Numba's np.dot otherwise) on tile copies, the
mods and the online softmax are scalar loops over the tile. Partial blocks (`kv_indices`)
evaluate the mask; full blocks (`full_kv_indices`) do not.

Forward `k(out, lse, mx, q, k, v, kvn, kvi, fkvn, fkvi, scale, QB, KVB, *bufs)`: threads split
(batch, head, query block); lse and mx are in log2 units (the HOP's), -inf for a fully masked
row (its output 0). Backward `k(dq, dk, dv, q, k, v, out, go, lse, glse, kvn, kvi, fkvn, fkvi,
scale, QB, KVB, *bufs)`: threads split (kv batch, kv head), so dk and dv (accumulated in tiles
of the thread's own) have one writer each.

>>> src, name = render_forward(["sc = T(x)"], ["ok = i >= j"], 0, 0, True, False, False)
>>> name, "np.dot(qt, kt.T, s)" in src
('flex_fwd', True)
"""

from __future__ import annotations

from .matmul import _gemm_line


def _indent(lines, n: int) -> list:
    return [" " * n + ln for ln in lines]


def _params(nsb: int, nmb: int) -> str:
    return "".join(f", sb{i}" for i in range(nsb)) + "".join(f", mb{i}" for i in range(nmb))


def _head(name: str, params: str, f32: bool, parallel: bool, mkl: bool) -> list:
    from .matmul import gemm_prelude

    return [
        (gemm_prelude() if mkl else ""),
        f"T = np.{'float32' if f32 else 'float64'}",
        "",
        f'@njit(error_model="numpy", nogil=True{", parallel=True" if parallel else ""})',
        f"def {name}({params}):",
        "    B, H, L, E = q.shape",
        "    Bk, Hk, S, Ev = v.shape",
        "    G = H // Hk",
        "    MB, MH = kvn.shape[0], kvn.shape[1]",
        "    tsc = T(scale)",
        "    NQB = (L + QB - 1) // QB",
    ]


def _blocks(ind: int) -> list:
    """The kv blocks of query block qb: partial ones, then full ones; sets j0, nj, partial."""
    return _indent([
        "npart = kvn[mb, mh, qb]",
        "nall = npart + (fkvn[mb, mh, qb] if fkvn.shape[2] > 0 else 0)",
        "for tb in range(nall):",
        "    partial = tb < npart",
        "    kb = kvi[mb, mh, qb, tb] if partial else fkvi[mb, mh, qb, tb - npart]",
        "    j0 = kb * KVB",
        "    nj = min(KVB, S - j0)",
        "    if nj <= 0:",
        "        continue",
        "    kt = np.empty((nj, E), T)",
        "    vt = np.empty((nj, Ev), T)",
        "    for jj in range(nj):",
        "        for e in range(E):",
        "            kt[jj, e] = k[bk, hk, j0 + jj, e]",
        "        for e in range(Ev):",
        "            vt[jj, e] = v[bk, hk, j0 + jj, e]",
    ], ind)


def render_forward(score, mask, nsb: int, nmb: int, f32: bool, parallel: bool, mkl: bool):
    name = "flex_fwd"
    exp = "_v_exp_neg" if f32 else "np.exp"
    g = 12   # the block loop's body indent
    src = _head(name, "out, lse, mx, q, k, v, kvn, kvi, fkvn, fkvi, scale, QB, KVB"
                + _params(nsb, nmb), f32, parallel, mkl) + [
        "    inv_ln2 = T(1.0 / np.log(2.0))",
        f"    for w in {'prange' if parallel else 'range'}(B * H * NQB):",
        "        bh = w // NQB",
        "        qb = w - bh * NQB",
        "        b = bh // H",
        "        h = bh - b * H",
        "        bk = b if Bk > 1 else 0",
        "        hk = h // G",
        "        mb = b if MB > 1 else 0",
        "        mh = h if MH > 1 else 0",
        "        r0 = qb * QB",
        "        ni = min(QB, L - r0)",
        "        qt = np.empty((ni, E), T)",
        "        acc = np.zeros((ni, Ev), T)",
        "        m = np.empty(ni, T)",
        "        l = np.zeros(ni, T)",
        "        for ii in range(ni):",
        "            m[ii] = -np.inf",
        "            for e in range(E):",
        "                qt[ii, e] = q[b, h, r0 + ii, e]",
        *_blocks(8),
        "            s = np.empty((ni, nj), T)",
        *_gemm_line("qt", "kt.T", "s", "0.0", " " * g, mkl),
        "            for ii in range(ni):",
        "                i = r0 + ii",
        "                rmax = T(-np.inf)",
        "                for jj in range(nj):",
        "                    j = j0 + jj",
        "                    x = s[ii, jj] * tsc",
        *_indent(score, 20),
        "                    if partial:",
        *_indent(mask, 24),
        "                        if not ok:",
        "                            sc = T(-np.inf)",
        "                    s[ii, jj] = sc",
        "                    if sc > rmax:",
        "                        rmax = sc",
        "                mold = m[ii]",
        "                mnew = rmax if rmax > mold else mold",
        "                if mnew == -np.inf:",
        "                    for jj in range(nj):",
        "                        s[ii, jj] = 0",
        "                    continue",
        f"                alpha = {exp}(mold - mnew)",
        "                for jj in range(nj):",
        f"                    s[ii, jj] = {exp}(s[ii, jj] - mnew)",
        "                psum = T(0)",
        "                for jj in range(nj):",
        "                    psum += s[ii, jj]",
        "                l[ii] = l[ii] * alpha + psum",
        "                m[ii] = mnew",
        "                for e in range(Ev):",
        "                    acc[ii, e] *= alpha",
        *_gemm_line("s", "vt", "acc", "1.0", " " * g, mkl),
        "        for ii in range(ni):",
        "            i = r0 + ii",
        "            if l[ii] > 0:",
        "                inv = T(1) / l[ii]",
        "                for e in range(Ev):",
        "                    out[b, h, i, e] = acc[ii, e] * inv",
        "                lse[b, h, i] = (m[ii] + np.log(l[ii])) * inv_ln2",
        "                mx[b, h, i] = m[ii] * inv_ln2",
        "            else:",
        "                for e in range(Ev):",
        "                    out[b, h, i, e] = 0",
        "                lse[b, h, i] = -np.inf",
        "                mx[b, h, i] = -np.inf",
    ]
    return "\n".join(src) + "\n", name


def render_backward(score, mask, joint, nsb: int, nmb: int, f32: bool, parallel: bool,
                    mkl: bool):
    name = "flex_bwd"
    exp = "_v_exp_neg" if f32 else "np.exp"
    g = 20   # the block loop's body indent
    src = _head(name, "dq, dk, dv, q, k, v, out, go, lse, glse, kvn, kvi, fkvn, fkvi, scale, "
                "QB, KVB" + _params(nsb, nmb), f32, parallel, mkl) + [
        "    ln2 = T(np.log(2.0))",
        f"    for w in {'prange' if parallel else 'range'}(Bk * Hk):",
        "        bk = w // Hk",
        "        hk = w - bk * Hk",
        "        dka = np.zeros((S, E), T)",
        "        dva = np.zeros((S, Ev), T)",
        "        for b in range(B):",
        "            if Bk > 1 and b != bk:",
        "                continue",
        "            mb = b if MB > 1 else 0",
        "            for hg in range(G):",
        "                h = hk * G + hg",
        "                mh = h if MH > 1 else 0",
        "                for qb in range(NQB):",
        "                    r0 = qb * QB",
        "                    ni = min(QB, L - r0)",
        "                    qt = np.empty((ni, E), T)",
        "                    got = np.empty((ni, Ev), T)",
        "                    dqa = np.zeros((ni, E), T)",
        "                    li = np.empty(ni, T)",
        "                    di = np.empty(ni, T)",
        "                    gl = np.empty(ni, T)",
        "                    for ii in range(ni):",
        "                        i = r0 + ii",
        "                        for e in range(E):",
        "                            qt[ii, e] = q[b, h, i, e]",
        "                        acc = T(0)",
        "                        for e in range(Ev):",
        "                            got[ii, e] = go[b, h, i, e]",
        "                            acc += T(out[b, h, i, e]) * got[ii, e]",
        "                        di[ii] = acc",
        "                        li[ii] = T(lse[b, h, i]) * ln2",
        "                        gl[ii] = T(glse[b, h, i]) / ln2",
        *_blocks(20),
        "                        s = np.empty((ni, nj), T)",
        "                        dp = np.empty((ni, nj), T)",
        *_gemm_line("qt", "kt.T", "s", "0.0", " " * (g + 4), mkl),
        *_gemm_line("got", "vt.T", "dp", "0.0", " " * (g + 4), mkl),
        "                        for ii in range(ni):",
        "                            i = r0 + ii",
        "                            lrow = li[ii]",
        "                            for jj in range(nj):",
        "                                j = j0 + jj",
        "                                x = s[ii, jj] * tsc",
        "                                ok = lrow != -np.inf",
        "                                if ok and partial:",
        *_indent(mask, 36),
        "                                if not ok:",
        "                                    s[ii, jj] = 0",
        "                                    dp[ii, jj] = 0",
        "                                    continue",
        *_indent(score, 32),
        f"                                p = {exp}(sc - lrow) if sc <= lrow else "
        "np.exp(sc - lrow)",
        "                                ds = p * (dp[ii, jj] - di[ii] + gl[ii])",
        *_indent(joint, 32),
        "                                s[ii, jj] = p",
        "                                dp[ii, jj] = gs * tsc",
        *_gemm_line("s.T", "got", "dva[j0:j0 + nj]", "1.0", " " * (g + 4), mkl),
        *_gemm_line("dp", "kt", "dqa", "1.0", " " * (g + 4), mkl),
        *_gemm_line("dp.T", "qt", "dka[j0:j0 + nj]", "1.0", " " * (g + 4), mkl),
        "                    for ii in range(ni):",
        "                        for e in range(E):",
        "                            dq[b, h, r0 + ii, e] = dqa[ii, e]",
        "        for j in range(S):",
        "            for e in range(E):",
        "                dk[bk, hk, j, e] = dka[j, e]",
        "            for e in range(Ev):",
        "                dv[bk, hk, j, e] = dva[j, e]",
    ]
    return "\n".join(src) + "\n", name
