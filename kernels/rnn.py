"""Sequence-level LSTM kernels: one launch runs a whole layer (both directions) over the sequence,
forward or backward (BPTT), for eager_neuron/lower/rnn_seq.py.

Layouts (all numpy views of device buffers, time-major unless said otherwise):
- x (T, B, I) the layer's input, or (B, T, I) when `xbf` (layer 0 of a batch_first call; any
  strides whose rows BLAS can address), y (T, B, D*H) its output (direction d writes columns
  d*H:(d+1)*H), dy like x with `dybf`, h0/c0/hn/cn (D, B, H);
- gates (D, T, B, 4H): the activated gates i, f, g, o of each step (saved for the backward),
  cs (D, T, B, H): the cell state of each step;
- weights per direction: w_ih (4H, I), w_hh (4H, H), biases (4H,) (C-contiguous).
Products are MKL's gemm (kernels/blas.py xgemm, the BLAS torch's CPU mm calls) or, without it,
Numba's np.dot. The math per step is ATen's LSTM cell (cuda/RNN.cu, the cell the decomposition
runs): i, f, o sigmoid, g tanh, c = f * c_prev + i * g, h = o * tanh(c).

>>> src, name = render_lstm_forward("np.float32", False)
>>> name.startswith("lstm_seq_fwd_") and "def " + name in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .matmul import gemm_prelude

HEADER = '@njit(error_model="numpy", nogil=True)\n'


# products up to this many multiply-adds run as plain loops: MKL's call (and its thread-count
# switch) cost ~1 us each, more than a (3, 16) x (16, 40) product, and a step makes several
SMALL = 1 << 15
# a layer's input (and the output's grad) arrive as the user laid them out: x[:, s] when
# batch_first (xbf), so every layer's kernel has one signature (a transposed view would be
# another Numba type, compiled again)
XS = "            xs = x[:, s] if xbf else x[s]\n"

_MM = f"""{HEADER}def _mm(a, b, c, beta):
    m = a.shape[0]
    k = a.shape[1]
    n = b.shape[1]
    if m * n * k > {SMALL}:
        return _xgemm(a, b, c, beta)
    for i in range(m):
        for j in range(n):
            s = c[i, j] if beta != 0.0 else c.dtype.type(0)
            for q in range(k):
                s += a[i, q] * b[q, j]
            c[i, j] = s
    return True


"""


def _prelude(mkl: bool) -> str:
    return gemm_prelude() + _MM if mkl else ""


def _gemm(a: str, b: str, c: str, beta: str, indent: str, mkl: bool) -> str:
    """Source lines: c = a @ b (beta "0.0") or c += a @ b (beta "1.0"), 2-D float arrays."""
    if mkl:
        return (f"{indent}if not _mm({a}, {b}, {c}, {beta}):\n"
                f"{indent}    raise ValueError('gemm: an operand BLAS cannot address')\n")
    op = "+=" if beta == "1.0" else "="
    return (f"{indent}_gm = np.dot(np.ascontiguousarray({a}), np.ascontiguousarray({b}))\n"
            f"{indent}for _i0 in range(_gm.shape[0]):\n"
            f"{indent}    for _i1 in range(_gm.shape[1]):\n"
            f"{indent}        {c}[_i0, _i1] {op} _gm[_i0, _i1]\n")


def render_lstm_forward(T: str, mkl: bool) -> tuple[str, str]:
    """k(x, wih0, whh0, bih0, bhh0, wih1, whh1, bih1, bhh1, h0, c0, y, hn, cn, gates, cs, ndir,
    has_bias, xbf): one layer, `ndir` directions (the second set of weights is direction 1's)."""
    name = kernel_name("lstm_seq_fwd", T, mkl)
    prelude = _prelude(mkl)
    i12, i16 = " " * 12, " " * 16
    gx = XS + _gemm("xs", "wihT", "g", "0.0", i12, mkl)
    gh0 = _gemm("h0[d]", "whhT", "g", "1.0", i16, mkl)
    ghy = _gemm("y[sp, :, d * H:(d + 1) * H]", "whhT", "g", "1.0", i16, mkl)
    src = f'''{prelude}{HEADER}def {name}(x, wih0, whh0, bih0, bhh0, wih1, whh1, bih1, bhh1, h0, c0,
        y, hn, cn, gates, cs, ndir, has_bias, xbf):
    one = {T}(1)
    S = x.shape[1] if xbf else x.shape[0]
    B = x.shape[0] if xbf else x.shape[1]
    H = h0.shape[2]
    for d in range(ndir):
        if d == 0:
            wihT = wih0.T
            whhT = whh0.T
            bih = bih0
            bhh = bhh0
        else:
            wihT = wih1.T
            whhT = whh1.T
            bih = bih1
            bhh = bhh1
        for k in range(S):
            s = k if d == 0 else S - 1 - k
            sp = s - 1 if d == 0 else s + 1
            g = gates[d, s]
{gx}            if k == 0:
{gh0}            else:
{ghy}            for b in range(B):
                for j in range(H):
                    ai = g[b, j]
                    af = g[b, H + j]
                    ag = g[b, 2 * H + j]
                    ao = g[b, 3 * H + j]
                    if has_bias:
                        ai += bih[j] + bhh[j]
                        af += bih[H + j] + bhh[H + j]
                        ag += bih[2 * H + j] + bhh[2 * H + j]
                        ao += bih[3 * H + j] + bhh[3 * H + j]
                    gi = one / (one + math.exp(-ai))
                    gf = one / (one + math.exp(-af))
                    gc = math.tanh(ag)
                    go = one / (one + math.exp(-ao))
                    g[b, j] = gi
                    g[b, H + j] = gf
                    g[b, 2 * H + j] = gc
                    g[b, 3 * H + j] = go
                    cp = c0[d, b, j] if k == 0 else cs[d, sp, b, j]
                    c = gf * cp + gi * gc
                    cs[d, s, b, j] = c
                    h = go * math.tanh(c)
                    y[s, b, d * H + j] = h
                    if k == S - 1:
                        hn[d, b, j] = h
                        cn[d, b, j] = c
'''
    return src, name


def render_lstm_backward(T: str, mkl: bool) -> tuple[str, str]:
    """k(x, wih0, whh0, wih1, whh1, h0, c0, y, gates, cs, dy, dhn, dcn, dx, dwih0, dwhh0, dbi0,
    dbh0, dwih1, dwhh1, dbi1, dbh1, dh0, dc0, ndir, has_dy, has_dhn, has_dcn, has_bias, xbf, dybf):
    BPTT of one layer.
    dx (T*B, I) C-contiguous is written (both directions summed); the weight and bias grads of
    each direction, dh0 and dc0 (D, B, H) are written."""
    name = kernel_name("lstm_seq_bwd", T, mkl)
    prelude = _prelude(mkl)
    i12, i16 = " " * 12, " " * 16
    g_dh = _gemm("dAs", "whh", "dhr", "0.0", i12, mkl)
    g_h0 = _gemm("dAs.T", "h0[d]", "dwhh", "1.0", i16, mkl)
    g_hy = _gemm("dAs.T", "y[sp, :, d * H:(d + 1) * H]", "dwhh", "1.0", i16, mkl)
    g_wi = XS + _gemm("dAs.T", "xs", "dwih", "1.0", i12, mkl)
    g_dx0 = _gemm("dA", "wih", "dx", "0.0", i12, mkl)
    g_dx1 = _gemm("dA", "wih", "dx", "1.0", i12, mkl)
    src = f'''{prelude}{HEADER}def {name}(x, wih0, whh0, wih1, whh1, h0, c0, y, gates, cs, dy, dhn,
        dcn, dx, dwih0, dwhh0, dbi0, dbh0, dwih1, dwhh1, dbi1, dbh1, dh0, dc0, ndir, has_dy,
        has_dhn, has_dcn, has_bias, xbf, dybf):
    one = {T}(1)
    zero = {T}(0)
    S = x.shape[1] if xbf else x.shape[0]
    B = x.shape[0] if xbf else x.shape[1]
    H = h0.shape[2]
    G = 4 * H
    dA = np.empty((S * B, G), dtype={T})
    dhr = np.empty((B, H), dtype={T})
    dc = np.empty((B, H), dtype={T})
    for d in range(ndir):
        if d == 0:
            wih = wih0
            whh = whh0
            dwih = dwih0
            dwhh = dwhh0
            dbi = dbi0
            dbh = dbh0
        else:
            wih = wih1
            whh = whh1
            dwih = dwih1
            dwhh = dwhh1
            dbi = dbi1
            dbh = dbh1
        for b in range(B):
            for j in range(H):
                dhr[b, j] = dhn[d, b, j] if has_dhn else zero
                dc[b, j] = dcn[d, b, j] if has_dcn else zero
        for r in range(dwhh.shape[0]):
            for q in range(dwhh.shape[1]):
                dwhh[r, q] = zero
            for q in range(dwih.shape[1]):
                dwih[r, q] = zero
        for k in range(S):
            s = S - 1 - k if d == 0 else k
            sp = s - 1 if d == 0 else s + 1
            first = k == S - 1
            for b in range(B):
                row = s * B + b
                for j in range(H):
                    dh = dhr[b, j]
                    if has_dy:
                        dh += dy[b, s, d * H + j] if dybf else dy[s, b, d * H + j]
                    gi = gates[d, s, b, j]
                    gf = gates[d, s, b, H + j]
                    gc = gates[d, s, b, 2 * H + j]
                    go = gates[d, s, b, 3 * H + j]
                    tc = math.tanh(cs[d, s, b, j])
                    dcc = dc[b, j] + dh * go * (one - tc * tc)
                    cp = c0[d, b, j] if first else cs[d, sp, b, j]
                    dA[row, j] = dcc * gc * ((one - gi) * gi)
                    dA[row, H + j] = dcc * cp * ((one - gf) * gf)
                    dA[row, 2 * H + j] = dcc * gi * (one - gc * gc)
                    dA[row, 3 * H + j] = dh * tc * ((one - go) * go)
                    dc[b, j] = dcc * gf
            dAs = dA[s * B:(s + 1) * B]
{g_dh}            if first:
{g_h0}            else:
{g_hy}{g_wi}
        for b in range(B):
            for j in range(H):
                dh0[d, b, j] = dhr[b, j]
                dc0[d, b, j] = dc[b, j]
        if d == 0:
{g_dx0}        else:
{g_dx1}        if has_bias:
            for q in range(G):
                dbi[q] = zero
            for row in range(S * B):
                for q in range(G):
                    dbi[q] += dA[row, q]
            for q in range(G):
                dbh[q] = dbi[q]
'''
    return src, name


def render_gru_forward(T: str, mkl: bool) -> tuple[str, str]:
    """k(x, wih0, whh0, bih0, bhh0, wih1, whh1, bih1, bhh1, h0, y, hn, ws, ndir, has_bias, xbf): one
    GRU layer (ATen's cell: r, z sigmoid, n = tanh(i_n + b_in + r * (h_n + b_hn)),
    h = n + z * (h_prev - n)); ws (D, T, B, 4H) keeps r, z, n and h_n + b_hn of each step."""
    name = kernel_name("gru_seq_fwd", T, mkl)
    prelude = _prelude(mkl)
    i12, i16 = " " * 12, " " * 16
    gx = XS + _gemm("xs", "wihT", "gi", "0.0", i12, mkl)
    gh0 = _gemm("h0[d]", "whhT", "gh", "0.0", i16, mkl)
    ghy = _gemm("y[sp, :, d * H:(d + 1) * H]", "whhT", "gh", "0.0", i16, mkl)
    src = f'''{prelude}{HEADER}def {name}(x, wih0, whh0, bih0, bhh0, wih1, whh1, bih1, bhh1, h0, y,
        hn, ws, ndir, has_bias, xbf):
    one = {T}(1)
    S = x.shape[1] if xbf else x.shape[0]
    B = x.shape[0] if xbf else x.shape[1]
    H = h0.shape[2]
    gi = np.empty((B, 3 * H), dtype={T})
    gh = np.empty((B, 3 * H), dtype={T})
    for d in range(ndir):
        if d == 0:
            wihT = wih0.T
            whhT = whh0.T
            bih = bih0
            bhh = bhh0
        else:
            wihT = wih1.T
            whhT = whh1.T
            bih = bih1
            bhh = bhh1
        for k in range(S):
            s = k if d == 0 else S - 1 - k
            sp = s - 1 if d == 0 else s + 1
{gx}            if k == 0:
{gh0}            else:
{ghy}            for b in range(B):
                for j in range(H):
                    ir = gi[b, j]
                    iz = gi[b, H + j]
                    i_n = gi[b, 2 * H + j]
                    hr = gh[b, j]
                    hz = gh[b, H + j]
                    h_n = gh[b, 2 * H + j]
                    if has_bias:
                        ir += bih[j]
                        iz += bih[H + j]
                        i_n += bih[2 * H + j]
                        hr += bhh[j]
                        hz += bhh[H + j]
                        h_n += bhh[2 * H + j]
                    r = one / (one + math.exp(-(hr + ir)))
                    z = one / (one + math.exp(-(hz + iz)))
                    n = math.tanh(i_n + h_n * r)
                    hp = h0[d, b, j] if k == 0 else y[sp, b, d * H + j]
                    h = (hp - n) * z + n
                    ws[d, s, b, j] = r
                    ws[d, s, b, H + j] = z
                    ws[d, s, b, 2 * H + j] = n
                    ws[d, s, b, 3 * H + j] = h_n
                    y[s, b, d * H + j] = h
                    if k == S - 1:
                        hn[d, b, j] = h
'''
    return src, name


def render_gru_backward(T: str, mkl: bool) -> tuple[str, str]:
    """k(x, wih0, whh0, wih1, whh1, h0, y, ws, dy, dhn, dx, dwih0, dwhh0, dbi0, dbh0, dwih1,
    dwhh1, dbi1, dbh1, dh0, ndir, has_dy, has_dhn, has_bias, xbf, dybf): BPTT of one GRU layer; dx
    (T*B, I) C-contiguous."""
    name = kernel_name("gru_seq_bwd", T, mkl)
    prelude = _prelude(mkl)
    i12, i16 = " " * 12, " " * 16
    g_dh = _gemm("dHs", "whh", "dhr", "1.0", i12, mkl)
    g_h0 = _gemm("dHs.T", "h0[d]", "dwhh", "1.0", i16, mkl)
    g_hy = _gemm("dHs.T", "y[sp, :, d * H:(d + 1) * H]", "dwhh", "1.0", i16, mkl)
    g_wi = XS + _gemm("dIs.T", "xs", "dwih", "1.0", i12, mkl)
    g_dx0 = _gemm("dI", "wih", "dx", "0.0", i12, mkl)
    g_dx1 = _gemm("dI", "wih", "dx", "1.0", i12, mkl)
    src = f'''{prelude}{HEADER}def {name}(x, wih0, whh0, wih1, whh1, h0, y, ws, dy, dhn, dx, dwih0,
        dwhh0, dbi0, dbh0, dwih1, dwhh1, dbi1, dbh1, dh0, ndir, has_dy, has_dhn, has_bias, xbf,
        dybf):
    one = {T}(1)
    zero = {T}(0)
    S = x.shape[1] if xbf else x.shape[0]
    B = x.shape[0] if xbf else x.shape[1]
    H = h0.shape[2]
    G = 3 * H
    dI = np.empty((S * B, G), dtype={T})
    dH = np.empty((S * B, G), dtype={T})
    dhr = np.empty((B, H), dtype={T})
    for d in range(ndir):
        if d == 0:
            wih = wih0
            whh = whh0
            dwih = dwih0
            dwhh = dwhh0
            dbi = dbi0
            dbh = dbh0
        else:
            wih = wih1
            whh = whh1
            dwih = dwih1
            dwhh = dwhh1
            dbi = dbi1
            dbh = dbh1
        for b in range(B):
            for j in range(H):
                dhr[b, j] = dhn[d, b, j] if has_dhn else zero
        for r_ in range(G):
            for q in range(dwhh.shape[1]):
                dwhh[r_, q] = zero
            for q in range(dwih.shape[1]):
                dwih[r_, q] = zero
        for k in range(S):
            s = S - 1 - k if d == 0 else k
            sp = s - 1 if d == 0 else s + 1
            first = k == S - 1
            for b in range(B):
                row = s * B + b
                for j in range(H):
                    dh = dhr[b, j]
                    if has_dy:
                        dh += dy[b, s, d * H + j] if dybf else dy[s, b, d * H + j]
                    r = ws[d, s, b, j]
                    z = ws[d, s, b, H + j]
                    n = ws[d, s, b, 2 * H + j]
                    h_n = ws[d, s, b, 3 * H + j]
                    hp = h0[d, b, j] if first else y[sp, b, d * H + j]
                    dan = dh * (one - z) * (one - n * n)
                    dar = dan * h_n * ((one - r) * r)
                    daz = dh * (hp - n) * ((one - z) * z)
                    dI[row, j] = dar
                    dI[row, H + j] = daz
                    dI[row, 2 * H + j] = dan
                    dH[row, j] = dar
                    dH[row, H + j] = daz
                    dH[row, 2 * H + j] = dan * r
                    dhr[b, j] = dh * z
            dHs = dH[s * B:(s + 1) * B]
            dIs = dI[s * B:(s + 1) * B]
{g_dh}            if first:
{g_h0}            else:
{g_hy}{g_wi}
        for b in range(B):
            for j in range(H):
                dh0[d, b, j] = dhr[b, j]
        if d == 0:
{g_dx0}        else:
{g_dx1}        if has_bias:
            for q in range(G):
                dbi[q] = zero
                dbh[q] = zero
            for row in range(S * B):
                for q in range(G):
                    dbi[q] += dI[row, q]
                    dbh[q] += dH[row, q]
'''
    return src, name
