"""nn.LSTM on neuron as sequence kernels: one launch per layer forward, one per layer backward.

Why a door of its own: `aten::lstm.input` is CompositeImplicitAutograd; on a non-CPU device it
decomposes (above autograd, before dispatch sees it) per time step and layer into an addmm, a
matmul and `_thnn_fused_lstm_cell`, and its backward per step into the cell's backward and
matmuls: ~40 ops per step, ~300 launches for a 2-layer, 7-step training step, each paying the
per-op host cost. This module registers the op's AutogradPrivateUse1 kernel: a supported call
runs `_LSTMSeq` (a torch.autograd.Function) whose forward launches kernels/rnn.py's forward
kernel once per layer (both directions in one launch; it keeps the activated gates and the cell
states) and whose backward launches the BPTT kernel once per layer (grads of the input, h0, c0,
every weight and bias). Everything else takes the decomposition exactly as before, counted in
`stats()["rnn_seq_fallbacks"]` by reason: proj_size > 0, dropout between layers while training
(its RNG order is the decomposition's), other dtypes, a dispatch mode / tracer / functorch
transform / forward-mode AD, anything not a plain neuron tensor (fake tensors), shapes that do
not match (the decomposition raises the CPU's errors), empty sequences. A backward with
create_graph=True recomputes the forward with the decomposition and differentiates that (so
double backward works as before).

>>> import torch, eager_neuron
>>> m = torch.nn.LSTM(3, 4).to("neuron")
>>> eager_neuron.reset_stats()
>>> y, (h, c) = m(torch.ones(5, 2, 3, device="neuron"))
>>> y.shape, eager_neuron.stats()["rnn_seq_calls"]
(torch.Size([5, 2, 4]), 1)
"""

from __future__ import annotations

import collections

import numpy as np
import torch
from torch.autograd import forward_ad as _fwad

from ..adaptive import MODULE as _adaptive
from ..buffers import alloc
from ..context import OpContext, swap
from ..kernels import rnn as krnn
from ..kernels.matmul import mkl_symbols
from ..launch import launch
from ..stats import add_counters
from ..tensor import NeuronTensor, wrap
from .common import NP_TYPE

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)


class RnnSeqStats:
    """rnn_seq_calls: nn.LSTM calls run as sequence kernels; rnn_seq_fallbacks: reason -> calls
    that took the per-step decomposition."""

    __slots__ = ("calls", "fallbacks")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.fallbacks = collections.Counter()

    def snapshot(self) -> dict:
        return {"rnn_seq_calls": self.calls, "rnn_seq_fallbacks": dict(self.fallbacks)}


RSTATS = RnnSeqStats()
add_counters(RSTATS)


class _Spec:
    """What a call's kernels need besides the tensors (one per call, kept by the backward)."""

    __slots__ = ("layers", "ndir", "bias", "batch_first", "H", "T", "index", "dtype")

    def __init__(self, layers, ndir, bias, batch_first, H, dtype, index) -> None:
        self.layers, self.ndir, self.bias, self.batch_first = layers, ndir, bias, batch_first
        self.H, self.dtype, self.T, self.index = H, dtype, NP_TYPE[dtype], index


# ---------------------------------------------------------------------------------------------
# the door: which calls take the sequence kernels
# ---------------------------------------------------------------------------------------------

def _rows_ok(t: torch.Tensor) -> bool:
    """Each t[s] (B, F) of a (T, B, F) host view is a matrix BLAS can read in place."""
    _, b, f = t.shape
    sb, sf = t.stride(1), t.stride(2)
    return (f <= 1 or sf == 1) and (b <= 1 or sb >= max(f, 1))


def _why_not(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
             batch_first) -> str | None:
    """None when the sequence kernels run this call, else why it decomposes (as before)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._get_tracing_state() is not None:
        return "dispatch mode or tracer"
    if torch._C._are_functorch_transforms_active() or _fwad._current_level >= 0:
        return "functorch transform or forward-mode AD"
    if len(hx) != 2:
        return "hidden states"
    h0, c0 = hx
    if type(x) is not NeuronTensor or type(h0) is not NeuronTensor or \
            type(c0) is not NeuronTensor:
        return "not a neuron tensor"
    if x.dtype not in _FLOATS or h0.dtype != x.dtype or c0.dtype != x.dtype:
        return "dtype"
    if x.dim() != 3 or h0.dim() != 3 or h0.shape != c0.shape:
        return "shapes or proj_size"
    if dropout > 0.0 and train and num_layers > 1:
        return "dropout while training"
    ndir = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if num_layers < 1 or len(params) != num_layers * ndir * per:
        return "parameter count"
    T, B = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    H, feat = h0.shape[2], x.shape[2]
    if T == 0 or B == 0 or H == 0 or feat == 0:
        return "empty"
    if h0.shape != (num_layers * ndir, B, H):
        return "shapes or proj_size"
    index = x._index
    if h0._index != index or c0._index != index:
        return "devices"
    for layer in range(num_layers):
        for d in range(ndir):
            w = params[(layer * ndir + d) * per:(layer * ndir + d + 1) * per]
            for p in w:
                if type(p) is not NeuronTensor or p.dtype != x.dtype or p._index != index \
                        or not p._data.is_contiguous():
                    return "parameters"
            if w[0].shape != (4 * H, feat) or w[1].shape != (4 * H, H):
                return "shapes or proj_size"
            if per == 4 and (w[2].shape != (4 * H,) or w[3].shape != (4 * H,)):
                return "shapes or proj_size"
        feat = ndir * H
    return None


# ---------------------------------------------------------------------------------------------
# host side of the kernels
# ---------------------------------------------------------------------------------------------

_MKL: list = []


def _mkl() -> bool:
    if not _MKL:
        _MKL.append(bool(mkl_symbols()))
    return _MKL[0]


def _new(sp: _Spec, shape: tuple) -> NeuronTensor:
    """A fresh C-contiguous device tensor (written by a kernel before anyone reads it)."""
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    data, block = alloc(sp.index, shape, tuple(reversed(stride)), sp.dtype)
    return wrap(data, block, sp.index)


def _tm(t: torch.Tensor, sp: _Spec) -> torch.Tensor:
    """The time-major (T, B, F) host view of a neuron tensor given as the user sees it."""
    return t._data.transpose(0, 1) if sp.batch_first else t._data


def _user(t: NeuronTensor, sp: _Spec) -> NeuronTensor:
    """A time-major result as the user sees it: (B, T, F) for batch_first, a transposed view of
    the same memory (as ATen returns it)."""
    if not sp.batch_first:
        return t
    return wrap(t._data.transpose(0, 1), t._block, sp.index)


def _flush(what: str) -> None:
    if _adaptive.PENDING:   # the kernels read buffers a pending fused group may still write
        _adaptive.flush_all(f"non-fusible op {what}")


def _weights(sp: _Spec, params, layer: int, dummy) -> tuple:
    """(wih0, whh0, bih0, bhh0, wih1, whh1, bih1, bhh1) numpy views of one layer."""
    per = 4 if sp.bias else 2
    out = []
    for d in (0, 1 if sp.ndir == 2 else 0):
        w = [p._data.numpy() for p in params[(layer * sp.ndir + d) * per:
                                             (layer * sp.ndir + d + 1) * per]]
        out += w if sp.bias else w + [dummy, dummy]
    return tuple(out)


def _forward(sp: _Spec, x, h0, c0, params) -> tuple:
    """Run every layer; returns (y as the user sees it, hn, cn, per layer (gates, cs, y))."""
    _flush("aten::lstm")
    L, D, H = sp.layers, sp.ndir, sp.H
    inp = _tm(x, sp).numpy()
    S, B = inp.shape[0], inp.shape[1]
    hn, cn = _new(sp, (L * D, B, H)), _new(sp, (L * D, B, H))
    h0a, c0a, hna, cna = (t._data.numpy() for t in (h0, c0, hn, cn))
    dummy = np.zeros(1, inp.dtype)
    key = ("rnn", "lstm_seq_fwd", sp.T, _mkl())
    render = lambda: krnn.render_lstm_forward(sp.T, _mkl())   # noqa: E731
    layers = []
    prev = swap(OpContext(sp.index))
    try:
        for layer in range(L):
            y, g, cs = _new(sp, (S, B, D * H)), _new(sp, (D, S, B, 4 * H)), \
                _new(sp, (D, S, B, H))
            lo, hi = layer * D, (layer + 1) * D
            args = (inp,) + _weights(sp, params, layer, dummy) + (
                h0a[lo:hi], c0a[lo:hi], y._data.numpy(), hna[lo:hi], cna[lo:hi],
                g._data.numpy(), cs._data.numpy(), D, sp.bias)
            flops = 2.0 * D * S * B * 4 * H * (inp.shape[2] + H) + 30.0 * D * S * B * H
            nbytes = float(sum(a.nbytes for a in args if type(a) is np.ndarray))
            launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="tensor")
            layers.append((g, cs, y))
            inp = args[11]
    finally:
        swap(prev)
    return _user(layers[-1][2], sp), hn, cn, layers


def _backward(sp: _Spec, x, h0, c0, y, params, layers, dy, dhn, dcn) -> tuple:
    """BPTT, one launch per layer from the top; returns (dx, dh0, dc0, *param grads)."""
    _flush("aten::lstm backward")
    L, D, H = sp.layers, sp.ndir, sp.H
    xh = _tm(x, sp).numpy()
    S, B = xh.shape[0], xh.shape[1]
    dummy1, dummy3 = np.zeros(1, xh.dtype), np.zeros((1, 1, 1), xh.dtype)
    above = _tm(dy, sp).numpy() if dy is not None else dummy3
    dhna = dhn._data.numpy() if dhn is not None else dummy3
    dcna = dcn._data.numpy() if dcn is not None else dummy3
    h0a, c0a = h0._data.numpy(), c0._data.numpy()
    dh0, dc0 = _new(sp, (L * D, B, H)), _new(sp, (L * D, B, H))
    dh0a, dc0a = dh0._data.numpy(), dc0._data.numpy()
    pgrads = [_new(sp, tuple(p.shape)) for p in params]
    per = 4 if sp.bias else 2
    key = ("rnn", "lstm_seq_bwd", sp.T, _mkl())
    render = lambda: krnn.render_lstm_backward(sp.T, _mkl())   # noqa: E731
    has_dy = dy is not None
    dx = None
    prev = swap(OpContext(sp.index))
    try:
        for layer in reversed(range(L)):
            inp = xh if layer == 0 else layers[layer - 1][2]._data.numpy()
            yl = _tm(y, sp).numpy() if layer == L - 1 else layers[layer][2]._data.numpy()
            g, cs = layers[layer][0]._data.numpy(), layers[layer][1]._data.numpy()
            dx = _new(sp, (S, B, inp.shape[2]))
            w = _weights(sp, params, layer, dummy1)
            dws = []
            for d in (0, 1 if D == 2 else 0):
                pg = [t._data.numpy() for t in pgrads[(layer * D + d) * per:
                                                      (layer * D + d + 1) * per]]
                dws += pg if sp.bias else pg + [dummy1, dummy1]
            lo, hi = layer * D, (layer + 1) * D
            args = (inp, w[0], w[1], w[4], w[5], h0a[lo:hi], c0a[lo:hi], yl, g, cs, above,
                    dhna[lo:hi] if dhn is not None else dhna,
                    dcna[lo:hi] if dcn is not None else dcna,
                    dx._data.numpy().reshape(S * B, inp.shape[2])) + tuple(dws) + (
                    dh0a[lo:hi], dc0a[lo:hi], D, has_dy, dhn is not None, dcn is not None,
                    sp.bias)
            flops = 4.0 * D * S * B * 4 * H * (inp.shape[2] + H) + 40.0 * D * S * B * H
            nbytes = float(sum(a.nbytes for a in args if type(a) is np.ndarray))
            launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="tensor")
            above, has_dy = dx._data.numpy(), True
    finally:
        swap(prev)
    return (_user(dx, sp), dh0, dc0, *pgrads)


# ---------------------------------------------------------------------------------------------
# autograd and the registration
# ---------------------------------------------------------------------------------------------

def _recompute_grads(sp: _Spec, needs, x, h0, c0, params, grads) -> tuple:
    """The backward through the decomposition (create_graph=True: differentiable, as before)."""
    ins = (x, h0, c0, *params)
    wanted = [t for t, n in zip(ins, needs) if n]
    if not wanted:
        return (None,) * len(ins)
    with torch.enable_grad():
        outs = aten.lstm.input.decompose(x, [h0, c0], list(params), sp.bias, sp.layers, 0.0,
                                         False, sp.ndir == 2, sp.batch_first)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                  create_graph=torch.is_grad_enabled(), allow_unused=True)
    it = iter(got)
    return tuple(next(it) if n else None for n in needs)


class _LSTMSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sp, x, h0, c0, *params):
        y, hn, cn, layers = _forward(sp, x, h0, c0, params)
        ctx.sp = sp
        ctx.layers = [(g, cs, yl) for g, cs, yl in layers[:-1]] + [layers[-1][:2] + (None,)]
        ctx.save_for_backward(x, h0, c0, y, *params)
        ctx.set_materialize_grads(False)
        return y, hn, cn

    @staticmethod
    def backward(ctx, dy, dhn, dcn):
        x, h0, c0, y, *params = ctx.saved_tensors
        sp, needs = ctx.sp, ctx.needs_input_grad[1:]
        grads = (dy, dhn, dcn)
        if all(g is None for g in grads):
            return (None,) * (len(needs) + 1)
        if torch.is_grad_enabled() or any(g is not None and (type(g) is not NeuronTensor or
                                                             g.dtype != x.dtype) for g in grads):
            RSTATS.fallbacks["create_graph or foreign grads"] += 1
            return (None,) + _recompute_grads(sp, needs, x, h0, c0, params, grads)
        out = _backward(sp, x, h0, c0, y, params, ctx.layers, dy, dhn, dcn)
        return (None,) + tuple(g if n else None for g, n in zip(out, needs))


def lstm_input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
               batch_first):
    """AutogradPrivateUse1 kernel of aten::lstm.input."""
    why = _why_not(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                   batch_first)
    if why is not None:
        RSTATS.fallbacks[why] += 1
        return aten.lstm.input.decompose(input, hx, params, has_biases, num_layers, dropout,
                                         train, bidirectional, batch_first)
    RSTATS.calls += 1
    sp = _Spec(num_layers, 2 if bidirectional else 1, bool(has_biases), bool(batch_first),
               hx[0].shape[2], input.dtype, input._index)
    x = input if _rows_ok(_tm(input, sp)) else input.contiguous()
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, h0, c0, *params)):
        return _LSTMSeq.apply(sp, x, h0, c0, *params)
    return _forward(sp, x, h0, c0, params)[:3]


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("lstm.input", lstm_input, "AutogradPrivateUse1")
