"""embedding_bag kernels: forward (sum / mean / max, per-sample weights, padding index) and the
dense backward, as PyTorch's CPU kernels define them (EmbeddingBag.cpp).

Bag b reduces indices [offsets[b], end) of the flat index list. Two ends, because the CPU
uses two (they differ only when include_last_offset is set and the last offset is not the
number of indices): `sum_end` bounds the summed range, `bag_end` (the bag that offset2bag gives
each index: the rest of the list goes to the last bag) bounds the count a mean divides by and
the range a max takes. A padding index is skipped and not counted. Sums accumulate in float64
and round once; a max keeps the first maximum (a later NaN never replaces it, as on the CPU).

>>> src, name = render("forward")
>>> name
'embedding_bag_forward'
"""

from __future__ import annotations

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

_FORWARD = """\
def embedding_bag_forward(out, weight, idx, offsets, n_idx, psw, use_psw, mode, pad,
                          bag_size, max_idx, o2b, err):
    nbags = out.shape[0]
    noff = offsets.shape[0]
    rows = weight.shape[0]
    dim = weight.shape[1]
    for b in {rng}(nbags):
        s = offsets[b]
        sum_end = offsets[b + 1] if b + 1 < noff else n_idx
        bag_end = offsets[b + 1] if b + 1 < nbags else n_idx
        acc = np.zeros(dim, np.float64)
        arg = np.zeros(dim, np.int64)
        cnt = 0
        for i in range(s, bag_end):
            if o2b.shape[0] > 0:
                o2b[i] = b
            j = idx[i]
            if j < 0 or j >= rows:
                err[0] = 1
                err[1] = i
                err[2] = j
                continue
            if j == pad:
                continue
            if mode == 2:
                for d in range(dim):
                    v = np.float64(weight[j, d])
                    if cnt == 0 or v > acc[d]:
                        acc[d] = v
                        arg[d] = j
            elif i < sum_end:
                sc = np.float64(psw[i]) if use_psw else 1.0
                for d in range(dim):
                    acc[d] += np.float64(weight[j, d]) * sc
            cnt += 1
        if mode == 1 and cnt > 0:
            for d in range(dim):
                acc[d] = acc[d] / cnt
        for d in range(dim):
            out[b, d] = acc[d]
        if bag_size.shape[0] > b:
            bag_size[b] = cnt if mode != 0 else 0
        if mode == 2:
            for d in range(dim):
                max_idx[b, d] = arg[d]
        elif max_idx.shape[0] > b:   # (bags, 1): the CPU returns bag_size here
            max_idx[b, 0] = cnt if mode != 0 else 0
"""

# grad_weight[idx[i]] += grad[bag(i)] * scale(i): serial (two bags may share a row)
_BACKWARD = """\
def embedding_bag_backward(gw, grad, idx, offsets, n_idx, psw, use_psw, mode, pad,
                           max_idx, freq, scale_freq):
    nbags = grad.shape[0]
    noff = offsets.shape[0]
    rows = gw.shape[0]
    dim = gw.shape[1]
    acc = np.zeros((rows, dim), np.float64)
    if scale_freq:
        for i in range(n_idx):
            j = idx[i]
            if j >= 0 and j < rows:
                freq[j] += 1
    for b in range(nbags):
        s = offsets[b]
        sum_end = offsets[b + 1] if b + 1 < noff else n_idx
        bag_end = offsets[b + 1] if b + 1 < nbags else n_idx
        if mode == 2:   # a bag with no index but padding has no maximum (no gradient)
            live = 0
            for i in range(s, bag_end):
                if idx[i] != pad:
                    live += 1
            if live > 0:
                for d in range(dim):
                    j = max_idx[b, d]
                    if j >= 0 and j < rows and j != pad:
                        acc[j, d] += np.float64(grad[b, d])
            continue
        cnt = 0
        if mode == 1:
            for i in range(s, bag_end):
                if idx[i] != pad:
                    cnt += 1
        for i in range(s, bag_end if mode == 1 else sum_end):
            j = idx[i]
            if j == pad or j < 0 or j >= rows:
                continue
            sc = np.float64(psw[i]) if use_psw else 1.0
            if mode == 1:
                sc = sc / cnt
            if scale_freq:
                sc = sc / freq[j]
            for d in range(dim):
                acc[j, d] += np.float64(grad[b, d]) * sc
    for j in range(rows):
        for d in range(dim):
            gw[j, d] = acc[j, d]
"""

# d out[bag(i)] / d psw[i] = <grad[bag(i)], weight[idx[i]]>
_PSW_BACKWARD = """\
def embedding_bag_psw_backward(out, grad, weight, idx, offsets, pad):
    nbags = grad.shape[0]
    dim = grad.shape[1]
    for b in {rng}(nbags):
        s = offsets[b]
        e = offsets[b + 1] if b + 1 < nbags else out.shape[0]   # offset2bag's bag of i
        for i in range(s, e):
            j = idx[i]
            acc = 0.0
            if j != pad:
                for d in range(dim):
                    acc += np.float64(grad[b, d]) * np.float64(weight[j, d])
            out[i] = acc
"""

# embedding_renorm_: each distinct indexed row whose p-norm exceeds max_norm is scaled by
# max_norm / (norm + 1e-7) (the CPU's formula; norm in float64, the scale rounded to the dtype)
_RENORM = """\
def embedding_renorm(w, idx, seen, max_norm, p, err):
    rows = w.shape[0]
    for t in range(idx.shape[0]):
        j = idx[t]
        if j < 0 or j >= rows:
            err[0] = 1
            err[1] = j
            return
        if seen[j]:
            continue
        seen[j] = 1
        acc = 0.0
        for d in range(w.shape[1]):
            v = abs(np.float64(w[j, d]))
            if p == np.inf:
                acc = max(acc, v)
            elif p == 0.0:
                acc += 1.0 if v != 0 else 0.0
            elif p == 1.0:
                acc += v
            elif p == 2.0:
                acc += v * v
            else:
                acc += v ** p
        if p == 2.0:
            norm = math.sqrt(acc)
        elif p == np.inf or p == 0.0 or p == 1.0:
            norm = acc
        else:
            norm = acc ** (1.0 / p)
        if norm > max_norm:
            scale = w.dtype.type(max_norm / (norm + 1e-7))
            for d in range(w.shape[1]):
                w[j, d] = w[j, d] * scale
"""

_SOURCES = {"forward": ("embedding_bag_forward", _FORWARD),
            "backward": ("embedding_bag_backward", _BACKWARD),
            "psw_backward": ("embedding_bag_psw_backward", _PSW_BACKWARD),
            "renorm": ("embedding_renorm", _RENORM)}


def render(which: str, parallel: bool = False) -> tuple[str, str]:
    """(source, function name) of one embedding_bag kernel."""
    name, body = _SOURCES[which]
    extra = ", parallel=True" if parallel else ""
    return HEADER.format(extra=extra) + body.replace("{rng}", "prange" if parallel
                                                     else "range"), name
