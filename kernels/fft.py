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

from .elementwise import kernel_name

DFT_MAX = 32        # direct DFT below this for non-powers of two: exact and cheap
LINES_PER_CHUNK = 8  # lines sharing one scratch allocation inside the prange body

PRELUDE = '''
@njit(nogil=True)
def _twiddles(m):
    """tw[k] = exp(-2 pi i k / m), k < m / 2, from sin/cos of exact angles."""
    tw = np.empty(max(m // 2, 1), np.complex128)
    for k in range(m // 2):
        ang = 2.0 * math.pi * k / m
        tw[k] = complex(math.cos(ang), -math.sin(ang))
    return tw


@njit(nogil=True)
def _fft_pow2(a, tw, m):
    """In-place forward FFT of a[:m], m a power of two, tw = _twiddles(m)."""
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
        step = m // size
        if half < 8:
            # short butterflies: the twiddle outside, the blocks inside
            for k in range(half):
                w = tw[k * step]
                for start in range(0, m, size):
                    p = start + k
                    t = w * a[p + half]
                    a[p + half] = a[p] - t
                    a[p] = a[p] + t
        else:
            for start in range(0, m, size):
                for k in range(half):
                    p = start + k
                    t = tw[k * step] * a[p + half]
                    a[p + half] = a[p] - t
                    a[p] = a[p] + t
        size <<= 1


@njit(nogil=True)
def _plan(n):
    """(kind, m, tw, chirp, bf): kind 0 radix-2, 1 direct DFT, 2 Bluestein of size m."""
    empty = np.zeros(1, np.complex128)
    if n & (n - 1) == 0:
        return 0, n, _twiddles(n), empty, empty
    if n <= DFT_MAX:
        tbl = np.empty(n, np.complex128)
        for k in range(n):
            ang = 2.0 * math.pi * k / n
            tbl[k] = complex(math.cos(ang), -math.sin(ang))
        return 1, n, tbl, empty, empty
    m = 1
    while m < 2 * n - 1:
        m <<= 1
    tw = _twiddles(m)
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


_HELPERS: list = []


def helpers():
    """(_plan, _fft_line): Numba dispatchers shared by every FFT kernel of the process, so each
    kernel's own compile is its line loop only (a kernel's source fetches them by import)."""
    if not _HELPERS:
        from . import compile as kc

        _HELPERS.append(kc.compile_kernel(f"DFT_MAX = {DFT_MAX}\n" + PRELUDE
                                          + "HELPERS = (_plan, _fft_line)\n", "HELPERS"))
    return _HELPERS[0]


def render_fft(mode: str, rank_b: int, parallel: bool) -> tuple[str, str]:
    """Source of `k(y, x, n, scale, inverse)` over rank_b batch dims + the line axis."""
    name = kernel_name("fft", mode, rank_b, parallel, DFT_MAX, LINES_PER_CHUNK)
    rng = "prange" if parallel else "range"
    bidx = "".join(f"i{d}, " for d in range(rank_b))
    lines = ["from eager_neuron.kernels.fft import helpers",
             "_plan, _fft_line = helpers()", "",
             '@njit(error_model="numpy", nogil=True' + (", parallel=True" if parallel else "")
             + ")",
             f"def {name}(y, x, n, scale, inverse):",
             "    kind, m, tw, chirp, bf = _plan(n)",
             "    n_in = x.shape[-1]",
             "    n_out = y.shape[-1]",
             "    lines = 1"]
    for d in range(rank_b):
        lines.append(f"    lines *= y.shape[{d}]")
    lines += [
        f"    chunks = (lines + {LINES_PER_CHUNK - 1}) // {LINES_PER_CHUNK}",
        f"    for c in {rng}(chunks):",
        "        a = np.empty(n, np.complex128)",
        "        w = np.empty(m, np.complex128)",
        f"        for line in range(c * {LINES_PER_CHUNK}, min(lines, (c + 1) * "
        f"{LINES_PER_CHUNK})):",
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
        lines += [pad + "for k in range(n):",
                  pad + f"    a[k] = complex(np.float64(x[{bidx}k]), 0.0) if k < n_in else 0j"]
    else:
        # Hermitian completion of bins 0..n//2; the imaginary parts of bin 0 (and of bin n/2
        # for even n) do not contribute, as in pocketfft's c2r
        lines += [pad + "nh = min(n // 2 + 1, n_in)",
                  pad + "for k in range(n):",
                  pad + "    if k < nh:",
                  pad + f"        v = np.complex128(x[{bidx}k])",
                  pad + "    elif n - k < nh:",
                  pad + f"        v = np.conj(np.complex128(x[{bidx}n - k]))",
                  pad + "    else:",
                  pad + "        v = 0j",
                  pad + "    if k == 0 or 2 * k == n:",
                  pad + "        v = complex(v.real, 0.0)",
                  pad + "    a[k] = np.conj(v)"]
    # 2. transform, 3. store (scaled; conj back for the inverse; real part for c2r)
    lines.append(pad + "_fft_line(a, n, kind, m, tw, chirp, bf, w)")
    if mode == "c2r":
        lines += [pad + "for k in range(n_out):",
                  pad + f"    y[{bidx}k] = a[k].real * scale"]
    else:
        lines += [pad + "for k in range(n_out):",
                  pad + "    v = a[k] * scale",
                  pad + f"    y[{bidx}k] = np.conj(v) if inverse else v"]
    return "\n".join(lines) + "\n", name
