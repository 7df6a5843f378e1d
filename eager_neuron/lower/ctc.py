"""CTC loss: _ctc_loss and _ctc_loss_backward (both overloads: lengths as int lists or
tensors) as kernels (kernels/ctc.py). PyTorch has no meta kernels for them, so they are DYNAMIC
lowerings that allocate their own outputs: the per-sample negative log likelihood and the
log-alpha table (batch, T, 2 * max target length + 1) that backward reads. Each is a
generator of launch requests dispatch makes (dispatch -> launch).

>>> import torch, eager_neuron
>>> lp = torch.randn(6, 2, 4).log_softmax(2)
>>> tg = torch.tensor([[1, 2], [3, 3]])
>>> got = torch.nn.functional.ctc_loss(lp.to("neuron"), tg.to("neuron"), [6, 5], [2, 2])
>>> bool(torch.isclose(got.cpu(), torch.nn.functional.ctc_loss(lp, tg, [6, 5], [2, 2])))
True
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels import ctc as kctc
from .cast import cast_steps

VERSION = 1
_FLOAT = frozenset({torch.float32, torch.float64})


def _alloc(index, shape, dtype):
    from ..buffers import alloc
    from .mask import core_index

    stride = torch.empty(shape, device="meta").stride()
    return alloc(core_index(index), tuple(shape), stride, dtype)


def _lengths(v, nb: int, what: str) -> np.ndarray:
    arr = np.asarray(v.numpy() if isinstance(v, torch.Tensor) else list(v), np.int64).reshape(-1)
    if arr.shape[0] != nb:
        raise RuntimeError(f"ctc_loss: {what} must have one entry per batch element ({nb}), "
                           f"got {arr.shape[0]}")
    return arr


def _prepare(a):
    """The checked operands as numpy arrays (a strided log_probs copied first): steps."""
    lp, targets = a["log_probs"], a["targets"]
    if lp.dtype not in _FLOAT or lp.dim() != 3:
        raise NotImplementedError(f"_ctc_loss on a {lp.dim()}-d {lp.dtype} tensor")
    nT, nb, nc = lp.shape
    ilen = _lengths(a["input_lengths"], nb, "input_lengths")
    tlen = _lengths(a["target_lengths"], nb, "target_lengths")
    blank = int(a["blank"])
    if not 0 <= blank < nc:
        raise RuntimeError("blank must be in label range")
    if (ilen < 0).any() or (ilen > nT).any():
        raise RuntimeError(f"Expected input_lengths to have value at most {nT}, but got value "
                           f"{int(ilen.max())}")
    if (tlen < 0).any():
        raise RuntimeError("target_lengths must be non-negative")
    tg = np.ascontiguousarray(targets.numpy()).astype(np.int64)
    if targets.dim() == 2:
        toff = np.arange(nb, dtype=np.int64) * targets.shape[1]
        if (tlen > targets.shape[1]).any():
            raise RuntimeError("Expected tensor to have size at least "
                               f"{int(tlen.max())} at dimension 1, but got size "
                               f"{targets.shape[1]} for argument #2 'targets'")
        tg = tg.reshape(-1)
    else:
        toff = np.zeros(nb, np.int64)
        if nb > 1:
            toff[1:] = np.cumsum(tlen)[:-1]
        if tlen.sum() > tg.shape[0]:
            raise RuntimeError("ctc_loss: target_lengths sum past the end of targets")
    for b in range(nb):
        seg = tg[toff[b]:toff[b] + tlen[b]]
        if seg.size and (seg.min() < 0 or seg.max() >= nc):
            raise RuntimeError(f"ctc_loss: target label out of range [0, {nc}) in batch "
                               f"element {b}")
    lpc = lp if lp.is_contiguous() else None
    if lpc is None:
        lpc = torch.empty(lp.shape, dtype=lp.dtype)
        yield from cast_steps(lp, lpc)
    return lpc.numpy(), tg, toff, ilen, tlen, blank


def dynamic_ctc_loss(func, a, index=-1):
    lpn, tg, toff, ilen, tlen, blank = yield from _prepare(a)
    nT, nb, nc = lpn.shape
    dtype = a["log_probs"].dtype
    smax = int(tlen.max()) if nb else 0
    nll, nblock = _alloc(index, (nb,), dtype)
    la, lblock = _alloc(index, (nb, nT, 2 * smax + 1), dtype)
    if nb:
        yield (("ctc", "forward", VERSION), lambda: kctc.render("forward"),
               (lpn, tg, toff, ilen, tlen, blank, nll.numpy(), la.numpy()),
               float(nT * nb * (2 * smax + 1) * 8), float(la.numpy().nbytes))
    return [(nll, nblock), (la, lblock)]


def dynamic_ctc_loss_backward(func, a, index=-1):
    lpn, tg, toff, ilen, tlen, blank = yield from _prepare(a)
    nT, nb, nc = lpn.shape
    dtype = a["log_probs"].dtype
    grad, gblock = _alloc(index, (nT, nb, nc), dtype)
    gout = np.ascontiguousarray(a["grad"].numpy()).reshape(-1)
    if gout.shape[0] == 1 and nb > 1:
        gout = np.repeat(gout, nb)
    nll = np.ascontiguousarray(a["neg_log_likelihood"].numpy())
    la = np.ascontiguousarray(a["log_alpha"].numpy())
    smax = int(tlen.max()) if nb else 0
    lb = np.empty((nT, 2 * smax + 1), np.float64)
    acc = np.empty((nT, nc), np.float64)
    if grad.numel():
        yield (("ctc", "backward", VERSION), lambda: kctc.render("backward"),
               (gout, lpn, tg, toff, ilen, tlen, blank, nll, la, bool(a["zero_infinity"]),
                lb, acc, grad.numpy()),
               float(nT * nb * (2 * smax + 1 + nc) * 10), float(grad.numpy().nbytes * 3))
    return [(grad, gblock)]


LOWERINGS: dict = {}
DYNAMIC = {
    "aten::_ctc_loss": dynamic_ctc_loss,
    "aten::_ctc_loss_backward": dynamic_ctc_loss_backward,
}
