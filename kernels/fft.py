"""FFT kernels: one pass transforms every line of a strided view along its last axis.

A kernel `k(y, x, n, scale, inverse)` reads lines `x[b..., :]`, transforms each in complex128
(accuracy: float32 results stay within one rounding of pocketfft's), multiplies by `scale` and
writes `y[b..., :]`. The batch dims `b...` are a coalesced view (rank `rank_b`), unravelled from
one line counter so the line loop can be a prange. Any length works:
- powers of two: iterative radix-2 (bit reversal, then butterflies with a twiddle table);
- short other lengths (<= DFT_MAX): the direct O(n^2) sum with an exact twiddle table;
- the rest: Bluestein's chirp-z, a circular convolution done with power-of-two FFTs.
The inverse is conj(fft(conj(x))), so only the forward transform is written. Tables are built at
the start of each launch (O(n), cheap next to the n log n per line), never on the host.

Modes (what a line is on each side):
- "c2c": complex -> complex, n points;
- "r2c": real -> complex, writes the first y.shape[-1] bins (n // 2 + 1 when onesided);
- "c2r": complex (bins 0..n//2) -> real, the Hermitian completion of the line, inverse.

>>> src, name = render_fft("c2c", 1, False)
>>> "def " + name in src
True
"""

from __future__ import annotations

import hashlib

from .elementwise import kernel_name

DFT_MAX = 32        # direct DFT below this for non-powers of two: exact and cheap
LINES_PER_CHUNK = 8  # lines sharing one scratch allocation inside the prange body

PRELUDE = '''
@njit(nogil=True)
def _twiddles(m):
    """tw[k] = exp(-2 pi i k / m), k < m / 2, from sin/cos of exact angles; for m % 8 == 0
    only the first octant is computed, the rest follows exactly by symmetry."""
    tw = np.empty(max(m // 2, 1), np.complex128)
    if m % 8 != 0:
        for k in range(m // 2):
            ang = 2.0 * math.pi * k / m
            tw[k] = complex(math.cos(ang), -math.sin(ang))
        return tw
    q = m // 4
    for k in range(m // 8 + 1):
        ang = 2.0 * math.pi * k / m
        c = math.cos(ang)
        s = math.sin(ang)
        tw[k] = complex(c, -s)
        tw[q - k] = complex(s, -c)         # angle pi/2 - a
        if k > 0:
            tw[q + k] = complex(-s, -c)    # angle pi/2 + a
        if q + (q - k) < m // 2:
            tw[2 * q - k] = complex(-c, -s)   # angle pi - a
    return tw


@njit(nogil=True)
def _stages(tw, m):
    """The twiddles of each radix-2 stage laid out contiguously: st[h + k] = tw[k * m / 2h]."""
    st = np.empty(max(m, 2), np.complex128)
    h = 1
    while h < m:
        step = m // (2 * h)
        for k in range(h):
            st[h + k] = tw[k * step]
        h <<= 1
    return st


@njit(nogil=True)
def _fft_pow2(a, st, m):
    """In-place forward FFT of a[:m], m a power of two, st = _stages(_twiddles(m), m)."""
    j = 0
    for i in range(1, m):
        bit = m >> 1
        while j & bit:
            j ^= bit
            bit >>= 1
        j |= bit
        if i < j:
            t = a[i]
            a[i] = a[j]
            a[j] = t
    size = 2
    while size <= m:
        half = size >> 1
        if half < 8:
            # short butterflies: the twiddle outside, the blocks inside
            for k in range(half):
                w = st[half + k]
                for start in range(0, m, size):
                    p = start + k
                    t = w * a[p + half]
                    a[p + half] = a[p] - t
                    a[p] = a[p] + t
        else:
            for start in range(0, m, size):
                for k in range(half):
                    p = start + k
                    t = st[half + k] * a[p + half]
                    a[p + half] = a[p] - t
                    a[p] = a[p] + t
        size <<= 1


@njit(nogil=True)
def _plan(n):
    """(kind, m, tw, chirp, bf): kind 0 radix-2, 1 direct DFT, 2 Bluestein of size m."""
    empty = np.zeros(1, np.complex128)
    if n & (n - 1) == 0:
        return 0, n, _stages(_twiddles(n), n), empty, empty
    if n <= DFT_MAX:
        tbl = np.empty(n, np.complex128)
        for k in range(n):
            ang = 2.0 * math.pi * k / n
            tbl[k] = complex(math.cos(ang), -math.sin(ang))
        return 1, n, tbl, empty, empty
    m = 1
    while m < 2 * n - 1:
        m <<= 1
    tw = _stages(_twiddles(m), m)
    chirp = np.empty(n, np.complex128)
    for k in range(n):
        # k^2 mod 2n keeps the angle exact for large k
        ang = math.pi * ((k * k) % (2 * n)) / n
        chirp[k] = complex(math.cos(ang), -math.sin(ang))
    bf = np.zeros(m, np.complex128)
    bf[0] = np.conj(chirp[0])
    for k in range(1, n):
        bf[k] = np.conj(chirp[k])
        bf[m - k] = np.conj(chirp[k])
    _fft_pow2(bf, tw, m)
    return 2, m, tw, chirp, bf


@njit(nogil=True)
def _unpack(a, h, twn, k):
    """Bin k (0 <= k <= h) of the real FFT of 2h points from Z = FFT_h(x[2j] + i x[2j+1]):
    X[k] = E[k] + exp(-2 pi i k / 2h) O[k], E/O the transforms of the even/odd samples."""
    zk = a[k % h]
    zc = np.conj(a[(h - k) % h])
    even = (zk + zc) * 0.5
    odd = (zk - zc) * complex(0.0, -0.5)
    w = twn[k] if k < h else complex(-1.0, 0.0)
    return even + w * odd


@njit(nogil=True)
def _fft_line(a, n, kind, m, tw, chirp, bf, w):
    """In-place forward FFT of a[:n] (w: scratch of length >= m)."""
    if kind == 0:
        _fft_pow2(a, tw, n)
    elif kind == 1:
        for k in range(n):
            s = 0j
            for j in range(n):
                s += a[j] * tw[(j * k) % n]
            w[k] = s
        for k in range(n):
            a[k] = w[k]
    else:
        for k in range(n):
            w[k] = a[k] * chirp[k]
        for k in range(n, m):
            w[k] = 0j
        _fft_pow2(w, tw, m)
        for k in range(m):
            w[k] = np.conj(w[k] * bf[k])
        _fft_pow2(w, tw, m)
        inv = 1.0 / m
        for k in range(n):
            a[k] = chirp[k] * np.conj(w[k]) * inv
'''


# the helpers' machine code is linked into each kernel, so their text is part of its identity
# (the disk cache keys a kernel on its source: this comment line carries the prelude's hash)
PRELUDE_ID = hashlib.sha1(PRELUDE.encode()).hexdigest()[:12]
_HELPERS: list = []


def helpers():
    """(_plan, _fft_line, _twiddles, _unpack): Numba dispatchers shared by every FFT kernel of
    the process, so each kernel's own compile is its line loop only (a kernel's source fetches
    them by import)."""
    if not _HELPERS:
        from . import compile as kc

        source = (f"DFT_MAX = {DFT_MAX}\n" + PRELUDE
                  + "HELPERS = (_plan, _fft_line, _twiddles, _unpack)\n")
        _HELPERS.append(kc.compile_kernel(source, "HELPERS"))
    return _HELPERS[0]


def render_fft(mode: str, rank_b: int, parallel: bool) -> tuple[str, str]:
    """Source of `k(y, x, n, scale, inverse)` over rank_b batch dims + the line axis."""
    name = kernel_name("fft", mode, rank_b, parallel, DFT_MAX, LINES_PER_CHUNK, PRELUDE_ID)
    rng = "prange" if parallel else "range"
    bidx = "".join(f"i{d}, " for d in range(rank_b))
    lines = [f"# fft prelude {PRELUDE_ID}", "from eager_neuron.kernels.fft import helpers",
             "_plan, _fft_line, _twiddles, _unpack = helpers()", "",
             '@njit(error_model="numpy", nogil=True' + (", parallel=True" if parallel else "")
             + ")",
             f"def {name}(y, x, n, scale, inverse):",
             # r2c of even n: one complex FFT of n/2 points over (x[2k], x[2k+1]) pairs
             "    packed = " + ("n % 2 == 0 and n >= 4" if mode != "c2c" else "False"),
             "    nn = n // 2 if packed else n",
             "    kind, m, tw, chirp, bf = _plan(nn)",
             "    twn = _twiddles(n) if packed else tw",
             "    n_in = x.shape[-1]",
             "    n_out = y.shape[-1]",
             "    lines = 1"]
    for d in range(rank_b):
        lines.append(f"    lines *= y.shape[{d}]")
    lines += [
        f"    chunks = (lines + {LINES_PER_CHUNK - 1}) // {LINES_PER_CHUNK}",
        f"    for c in {rng}(chunks):",
        "        a = np.empty(nn, np.complex128)",
        "        w = np.empty(m, np.complex128)",
        (f"        for line in range(c * {LINES_PER_CHUNK}, min(lines, (c + 1) * "
         f"{LINES_PER_CHUNK})):"),
        "            r = line",
    ]
    for d in reversed(range(rank_b)):
        lines.append(f"            i{d} = r % y.shape[{d}]")
        lines.append(f"            r //= y.shape[{d}]")
    pad = "            "
    # 1. load one line (conj for the inverse: ifft(x) = conj(fft(conj(x))))
    if mode == "c2c":
        lines += [pad + "for k in range(n):",
                  pad + f"    v = np.complex128(x[{bidx}k]) if k < n_in else 0j",
                  pad + "    a[k] = np.conj(v) if inverse else v"]
    elif mode == "r2c":
        lines += [pad + "if packed:",
                  pad + "    for k in range(nn):",
                  pad + f"        re = np.float64(x[{bidx}2 * k]) if 2 * k < n_in else 0.0",
                  pad + f"        im = np.float64(x[{bidx}2 * k + 1]) if 2 * k + 1 < n_in "
                  "else 0.0",
                  pad + "        a[k] = complex(re, im)",
                  pad + "else:",
                  pad + "    for k in range(n):",
                  pad + f"        a[k] = complex(np.float64(x[{bidx}k]), 0.0) if k < n_in "
                  "else 0j"]
    else:
        # Hermitian completion of bins 0..n//2; the imaginary parts of bin 0 (and of bin n/2
        # for even n) do not contribute, as in pocketfft's c2r
        # packed (even n): z = IFFT_h(E + i O), E[k] = X[k] + conj(X[h-k]), O[k] = (X[k] -
        # conj(X[h-k])) exp(2 pi i k / n), gives x[2j] = Re z[j] and x[2j+1] = Im z[j]
        lines += [pad + "nh = min(n // 2 + 1, n_in)",
                  pad + "if packed:",
                  pad + "    for k in range(nn):",
                  pad + f"        xk = np.complex128(x[{bidx}k]) if k < nh else 0j",
                  pad + f"        xc = np.complex128(x[{bidx}nn - k]) if nn - k < nh else 0j",
                  pad + "        if k == 0:",
                  pad + "            xk = complex(xk.real, 0.0)",
                  pad + "            xc = complex(xc.real, 0.0)",
                  pad + "        xc = np.conj(xc)",
                  pad + "        o = (xk - xc) * np.conj(twn[k])",
                  pad + "        a[k] = np.conj(xk + xc + complex(-o.imag, o.real))",
                  pad + "else:",
                  pad + "    for k in range(n):",
                  pad + "        if k < nh:",
                  pad + f"            v = np.complex128(x[{bidx}k])",
                  pad + "        elif n - k < nh:",
                  pad + f"            v = np.conj(np.complex128(x[{bidx}n - k]))",
                  pad + "        else:",
                  pad + "            v = 0j",
                  pad + "        if k == 0 or 2 * k == n:",
                  pad + "            v = complex(v.real, 0.0)",
                  pad + "        a[k] = np.conj(v)"]
    # 2. transform, 3. store (scaled; conj back for the inverse; real part for c2r)
    lines.append(pad + "_fft_line(a, nn, kind, m, tw, chirp, bf, w)")
    if mode == "r2c":
        lines += [pad + "for k in range(n_out):",
                  pad + "    if packed:",
                  pad + "        v = _unpack(a, nn, twn, k) if k <= nn else "
                  "np.conj(_unpack(a, nn, twn, n - k))",
                  pad + "    else:",
                  pad + "        v = a[k]",
                  pad + f"    y[{bidx}k] = v * scale"]
    elif mode == "c2r":
        lines += [pad + "if packed:",
                  pad + "    for j in range(nn):",
                  pad + f"        y[{bidx}2 * j] = a[j].real * scale",
                  pad + f"        y[{bidx}2 * j + 1] = -a[j].imag * scale",
                  pad + "else:",
                  pad + "    for k in range(n_out):",
                  pad + f"        y[{bidx}k] = a[k].real * scale"]
    else:
        lines += [pad + "for k in range(n_out):",
                  pad + "    v = a[k] * scale",
                  pad + f"    y[{bidx}k] = np.conj(v) if inverse else v"]
    return "\n".join(lines) + "\n", name
