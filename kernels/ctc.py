"""CTC loss kernels: the forward (log-alpha) and backward (log-beta, gradient) recursions of
PyTorch's CPU implementation (LossCTC.cpp), in float64 log space per batch element.

Label s of the extended target (blank, t0, blank, t1, ..., blank) is the blank for even s and
target[(s - 1) / 2] for odd s; a transition may skip a blank between two different labels.

>>> src, name = render("forward")
>>> name
'ctc_forward'
"""

from __future__ import annotations

HEADER = '@njit(error_model="numpy", nogil=True)\n'

_LSE3 = """\
@njit
def _lse3(a, b, c):
    m = max(a, max(b, c))
    if m == -np.inf:
        return -np.inf
    return math.log(math.exp(a - m) + math.exp(b - m) + math.exp(c - m)) + m


"""

_FORWARD = """\
def ctc_forward(lp, tg, toff, ilen, tlen, blank, nll, la):
    nb = lp.shape[1]
    for b in range(nb):
        T = ilen[b]
        L = tlen[b]
        o = toff[b]
        for t in range(la.shape[1]):
            for s in range(la.shape[2]):
                la[b, t, s] = -np.inf
        if T == 0:
            nll[b] = 0.0 if L == 0 else np.inf
            continue
        la[b, 0, 0] = lp[0, b, blank]
        if L > 0:
            la[b, 0, 1] = lp[0, b, tg[o]]
        for t in range(1, T):
            for s in range(2 * L + 1):
                lab = blank if s % 2 == 0 else tg[o + (s - 1) // 2]
                a = np.float64(la[b, t - 1, s])
                c1 = np.float64(la[b, t - 1, s - 1]) if s > 0 else -np.inf
                c2 = -np.inf
                if s > 1 and s % 2 == 1 and tg[o + (s - 3) // 2] != lab:
                    c2 = np.float64(la[b, t - 1, s - 2])
                la[b, t, s] = _lse3(a, c1, c2) + np.float64(lp[t, b, lab])
        l1 = np.float64(la[b, T - 1, 2 * L])
        l2 = np.float64(la[b, T - 1, 2 * L - 1]) if L > 0 else -np.inf
        nll[b] = -_lse3(l1, l2, -np.inf)
"""

_BACKWARD = """\
def ctc_backward(gout, lp, tg, toff, ilen, tlen, blank, nll, la, zero_inf, lb, acc, grad):
    nb = lp.shape[1]
    nc = lp.shape[2]
    for b in range(nb):
        T = ilen[b]
        L = tlen[b]
        o = toff[b]
        g = np.float64(gout[b])
        for t in range(lp.shape[0]):
            for c in range(nc):
                acc[t, c] = -np.inf
                grad[t, b, c] = 0.0
        if T == 0:
            continue
        if zero_inf and nll[b] == np.inf:
            continue
        for t in range(T):
            for s in range(2 * L + 1):
                lb[t, s] = -np.inf
        lb[T - 1, 2 * L] = lp[T - 1, b, blank]
        acc[T - 1, blank] = np.float64(la[b, T - 1, 2 * L]) + lb[T - 1, 2 * L]
        if L > 0:
            last = tg[o + L - 1]
            lb[T - 1, 2 * L - 1] = lp[T - 1, b, last]
            acc[T - 1, last] = np.float64(la[b, T - 1, 2 * L - 1]) + lb[T - 1, 2 * L - 1]
        for t in range(T - 2, -1, -1):
            for s in range(2 * L, -1, -1):
                lab = blank if s % 2 == 0 else tg[o + (s - 1) // 2]
                a = lb[t + 1, s]
                c1 = lb[t + 1, s + 1] if s < 2 * L else -np.inf
                c2 = -np.inf
                if s < 2 * L - 1 and s % 2 == 1 and tg[o + (s + 1) // 2] != lab:
                    c2 = lb[t + 1, s + 2]
                lb[t, s] = _lse3(a, c1, c2) + np.float64(lp[t, b, lab])
                ab = np.float64(la[b, t, s]) + lb[t, s]
                cur = acc[t, lab]
                acc[t, lab] = ab if cur == -np.inf else _lse3(cur, ab, -np.inf)
        n = np.float64(nll[b])
        for t in range(T):
            for c in range(nc):
                x = np.float64(lp[t, b, c])
                grad[t, b, c] = (math.exp(x) - math.exp(acc[t, c] + n - x)) * g
"""

_SOURCES = {"forward": ("ctc_forward", _FORWARD), "backward": ("ctc_backward", _BACKWARD)}


def render(which: str) -> tuple[str, str]:
    """(source, function name) of one CTC kernel."""
    name, body = _SOURCES[which]
    return _LSE3 + HEADER + body, name
