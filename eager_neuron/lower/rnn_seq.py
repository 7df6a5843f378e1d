"""nn.LSTM and nn.GRU on neuron as sequence kernels: one launch per layer forward, one per layer
backward.

Why a door of its own: `aten::lstm.input` / `aten::gru.input` are CompositeImplicitAutograd; on a
non-CPU device they decompose (above autograd, before dispatch sees them) per time step and layer
into an addmm, a matmul and `_thnn_fused_lstm_cell` (`_thnn_fused_gru_cell`), and the backward
per step into the cell's backward and matmuls: ~40 ops per step, ~300 launches for a 2-layer,
7-step LSTM training step, each paying the per-op host cost. This module registers the ops'
AutogradPrivateUse1 kernels: a supported call runs `_RNNSeq` (a torch.autograd.Function) whose
forward launches kernels/rnn.py's forward kernel once per layer (both directions in one launch;
it keeps the activated gates, and the LSTM's cell states) and whose backward launches the BPTT
kernel once per layer (grads of the input, h0, c0, every weight and bias). Everything else takes
the decomposition exactly as before, counted in `stats()["rnn_seq_fallbacks"]` by reason:
proj_size > 0, dropout between layers while training (ATen's C++ composite: the CPU's masks),
other dtypes, autocast, a dispatch mode / tracer / functorch transform / forward-mode AD,
anything not a plain neuron tensor (fake tensors), shapes that do not match (the decomposition
raises), empty sequences. Under torch.inference_mode the autograd key is skipped: the
decomposition, as before. A backward with create_graph=True recomputes the forward with the
decomposition and differentiates that (double backward works as before).

>>> import torch, eager_neuron
>>> m = torch.nn.LSTM(3, 4).to("neuron")
>>> eager_neuron.reset_stats()
>>> y, (h, c) = m(torch.ones(5, 2, 3, device="neuron"))
>>> y.shape, eager_neuron.stats()["rnn_seq_calls"]
(torch.Size([5, 2, 4]), 1)
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import torch
from torch.autograd import forward_ad as _fwad

from ..adaptive import MODULE as _adaptive
from ..buffers import alloc
from ..context import OpContext, swap
from ..fastpath import full_np
from ..kernels import rnn as krnn
from ..kernels.matmul import mkl_symbols
from ..launch import launch
from ..stats import add_counters
from ..tensor import NeuronTensor, wrap
from .common import NP_TYPE

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)


class RnnSeqStats:
    """rnn_seq_calls: nn.LSTM/GRU calls run as sequence kernels; rnn_seq_fallbacks: reason -> calls
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

    __slots__ = ("gru", "layers", "ndir", "bias", "batch_first", "H", "T", "index", "dtype")

    def __init__(self, gru, layers, ndir, bias, batch_first, H, dtype, index) -> None:
        self.gru, self.layers, self.ndir, self.bias = gru, layers, ndir, bias
        self.batch_first, self.H, self.dtype, self.T = batch_first, H, dtype, NP_TYPE[dtype]
        self.index = index

    def key(self, what: str) -> tuple:
        return ("rnn", ("gru" if self.gru else "lstm") + what, self.T, _mkl())

    def render(self, what: str):
        fn = {("lstm", "_seq_fwd"): krnn.render_lstm_forward,
              ("lstm", "_seq_bwd"): krnn.render_lstm_backward,
              ("gru", "_seq_fwd"): krnn.render_gru_forward,
              ("gru", "_seq_bwd"): krnn.render_gru_backward}["gru" if self.gru else "lstm", what]
        return lambda: fn(self.T, _mkl())


# ---------------------------------------------------------------------------------------------
# the door: which calls take the sequence kernels
# ---------------------------------------------------------------------------------------------

def _rows_ok(t: torch.Tensor) -> bool:
    """Each t[s] (B, F) of a (T, B, F) host view is a matrix BLAS can read in place."""
    _, b, f = t.shape
    sb, sf = t.stride(1), t.stride(2)
    return (f <= 1 or sf == 1) and (b <= 1 or sb >= max(f, 1))


def _why_not(x, h0, c0, params, has_biases, num_layers, dropout, train, bidirectional,
             batch_first, gates: int) -> str | None:
    """None when the sequence kernels run this call, else why it decomposes (as before);
    c0 is None for a GRU (gates 3)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._get_tracing_state() is not None:
        return "dispatch mode or tracer"
    if torch._C._are_functorch_transforms_active() or _fwad._current_level >= 0:
        return "functorch transform or forward-mode AD"
    if type(x) is not NeuronTensor or type(h0) is not NeuronTensor or \
            (gates == 4 and type(c0) is not NeuronTensor):
        return "not a neuron tensor"
    if torch.is_autocast_enabled("neuron"):   # the decomposition's products are autocast ops
        return "autocast"
    if x.dtype not in _FLOATS or h0.dtype != x.dtype or (c0 is not None and
                                                          c0.dtype != x.dtype):
        return "dtype"
    if x.dim() != 3 or h0.dim() != 3 or (c0 is not None and h0.shape != c0.shape):
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
    if h0._index != index or (c0 is not None and c0._index != index):
        return "devices"
    GH = gates * H
    for layer in range(num_layers):
        for d in range(ndir):
            w = params[(layer * ndir + d) * per:(layer * ndir + d + 1) * per]
            for p in w:
                if type(p) is not NeuronTensor or p.dtype != x.dtype or p._index != index \
                        or not p._data.is_contiguous():
                    return "parameters"
            if w[0].shape != (GH, feat) or w[1].shape != (GH, H):
                return "shapes or proj_size"
            if per == 4 and (w[2].shape != (GH,) or w[3].shape != (GH,)):
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


def _carve(sp: _Spec, shapes: list) -> tuple:
    """One device allocation holding C-contiguous tensors of `shapes`: (block, host views)."""
    sizes = []
    for shape in shapes:
        n = 1
        for s in shape:
            n *= s
        sizes.append(n)
    data, block = alloc(sp.index, (sum(sizes),), (1,), sp.dtype)
    out, o = [], 0
    for shape, n in zip(shapes, sizes):
        out.append(data[o:o + n].view(shape))
        o += n
    return block, out


def _np(t: NeuronTensor) -> np.ndarray:
    return full_np(t)   # the host view's numpy array, cached on the tensor


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
        w = [_np(p) for p in params[(layer * sp.ndir + d) * per:(layer * sp.ndir + d + 1) * per]]
        out += w if sp.bias else w + [dummy, dummy]
    return tuple(out)


def _forward(sp: _Spec, x, h0, c0, params) -> tuple:
    """Run every layer; returns (y as the user sees it, hn, cn (None: GRU), per layer
    (gates, cell states or None, y))."""
    _flush("aten::gru" if sp.gru else "aten::lstm")
    L, D, H, G = sp.layers, sp.ndir, sp.H, 3 if sp.gru else 4
    inp, xbf = _np(x), sp.batch_first   # layer 0 reads x as laid out (kernels/rnn.py XS)
    S, B = (inp.shape[1], inp.shape[0]) if xbf else (inp.shape[0], inp.shape[1])
    block, hcs = _carve(sp, [(L * D, B, H)] * (1 if sp.gru else 2))
    hn = wrap(hcs[0], block, sp.index)
    cn = None if sp.gru else wrap(hcs[1], block, sp.index)
    h0a, hna = _np(h0), hcs[0].numpy()
    c0a, cna = (None, None) if sp.gru else (_np(c0), hcs[1].numpy())
    dummy = np.zeros(1, inp.dtype)
    key, render = sp.key("_seq_fwd"), sp.render("_seq_fwd")
    layers = []
    prev = swap(OpContext(sp.index))
    try:
        for layer in range(L):
            # the saved workspace (and a lower layer's output) in one allocation; the top
            # layer's output is the user's, allocated on its own
            top = layer == L - 1
            block, ws = _carve(sp, [(D, S, B, 4 * H)] + ([] if sp.gru else [(D, S, B, H)]) +
                               ([] if top else [(S, B, D * H)]))
            y = _new(sp, (S, B, D * H)) if top else ws[-1]
            g, cs = ws[0], None if sp.gru else ws[1]
            lo, hi = layer * D, (layer + 1) * D
            ya, ga = _np(y) if top else y.numpy(), g.numpy()
            if sp.gru:
                tail = (h0a[lo:hi], ya, hna[lo:hi], ga, D, sp.bias, xbf)
            else:
                tail = (h0a[lo:hi], c0a[lo:hi], ya, hna[lo:hi], cna[lo:hi], ga, cs.numpy(),
                        D, sp.bias, xbf)
            args = (inp,) + _weights(sp, params, layer, dummy) + tail
            flops = 2.0 * D * S * B * G * H * (inp.shape[2] + H) + 30.0 * D * S * B * H
            nbytes = float(sum(a.nbytes for a in args if type(a) is np.ndarray))
            launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="tensor")
            layers.append((block, g, cs, y))
            inp, xbf = ya, False
    finally:
        swap(prev)
    return _user(layers[-1][3], sp), hn, cn, layers


def _backward(sp: _Spec, x, h0, c0, y, params, layers, dy, dhn, dcn) -> tuple:
    """BPTT, one launch per layer from the top; returns (dx, dh0, dc0 (None: GRU), *param
    grads)."""
    _flush("aten::gru backward" if sp.gru else "aten::lstm backward")
    L, D, H, G = sp.layers, sp.ndir, sp.H, 3 if sp.gru else 4
    xh = _np(x)   # x and dy as laid out (kernels/rnn.py XS)
    S, B = (xh.shape[1], xh.shape[0]) if sp.batch_first else (xh.shape[0], xh.shape[1])
    dummy1, dummy3 = np.zeros(1, xh.dtype), np.zeros((1, 1, 1), xh.dtype)
    above = _np(dy) if dy is not None else dummy3
    dybf = sp.batch_first and dy is not None
    dhna = _np(dhn) if dhn is not None else dummy3
    dcna = _np(dcn) if dcn is not None else dummy3
    h0a = _np(h0)
    c0a = None if sp.gru else _np(c0)
    block, hcs = _carve(sp, [(L * D, B, H)] * (1 if sp.gru else 2))
    dh0 = wrap(hcs[0], block, sp.index)
    dc0 = None if sp.gru else wrap(hcs[1], block, sp.index)
    dh0a = hcs[0].numpy()
    dc0a = None if sp.gru else hcs[1].numpy()
    # the parameters' grads: views of one allocation (each its own tensor, as a view is)
    block, pg = _carve(sp, [tuple(p.shape) for p in params])
    pgrads = [wrap(t, block, sp.index) for t in pg]
    pga = [t.numpy() for t in pg]
    per = 4 if sp.bias else 2
    key, render = sp.key("_seq_bwd"), sp.render("_seq_bwd")
    has_dy = dy is not None
    dx = None
    prev = swap(OpContext(sp.index))
    try:
        for layer in reversed(range(L)):
            inp = xh if layer == 0 else layers[layer - 1][3].numpy()
            yl = _tm(y, sp).numpy() if layer == L - 1 else layers[layer][3].numpy()
            g = layers[layer][1].numpy()
            dx = _new(sp, (S, B, inp.shape[2])) if layer == 0 else \
                _carve(sp, [(S, B, inp.shape[2])])[1][0]
            dxa = _np(dx) if layer == 0 else dx.numpy()
            w = _weights(sp, params, layer, dummy1)
            dws = []
            for d in (0, 1 if D == 2 else 0):
                pg = pga[(layer * D + d) * per:(layer * D + d + 1) * per]
                dws += pg if sp.bias else pg + [dummy1, dummy1]
            lo, hi = layer * D, (layer + 1) * D
            dhl = dhna[lo:hi] if dhn is not None else dhna
            dx2 = dxa.reshape(S * B, inp.shape[2])
            if sp.gru:
                args = (inp, w[0], w[1], w[4], w[5], h0a[lo:hi], yl, g, above, dhl, dx2,
                        *dws, dh0a[lo:hi], D, has_dy, dhn is not None, sp.bias,
                        sp.batch_first and layer == 0, dybf)
            else:
                dcl = dcna[lo:hi] if dcn is not None else dcna
                args = (inp, w[0], w[1], w[4], w[5], h0a[lo:hi], c0a[lo:hi], yl, g,
                        layers[layer][2].numpy(), above, dhl, dcl, dx2, *dws, dh0a[lo:hi],
                        dc0a[lo:hi], D, has_dy, dhn is not None, dcn is not None, sp.bias,
                        sp.batch_first and layer == 0, dybf)
            flops = 4.0 * D * S * B * G * H * (inp.shape[2] + H) + 40.0 * D * S * B * H
            nbytes = float(sum(a.nbytes for a in args if type(a) is np.ndarray))
            launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="tensor")
            above, has_dy, dybf = dxa, True, False
    finally:
        swap(prev)
    return (_user(dx, sp), dh0, dc0, *pgrads)


# ---------------------------------------------------------------------------------------------
# autograd and the registration
# ---------------------------------------------------------------------------------------------

def _decompose(sp: _Spec, x, h0, c0, params, dropout=0.0, train=False):
    if sp.gru:
        return aten.gru.input.decompose(x, h0, list(params), sp.bias, sp.layers, dropout, train,
                                        sp.ndir == 2, sp.batch_first)
    return aten.lstm.input.decompose(x, [h0, c0], list(params), sp.bias, sp.layers, dropout,
                                     train, sp.ndir == 2, sp.batch_first)


def _recompute_grads(sp: _Spec, needs, x, h0, c0, params, grads) -> tuple:
    """The backward through the decomposition (create_graph=True: differentiable, as before)."""
    ins = (x, h0, c0, *params)
    wanted = [t for t, n in zip(ins, needs) if n]
    if not wanted:
        return (None,) * len(ins)
    with torch.enable_grad():
        outs = _decompose(sp, x, h0, c0, params)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                  create_graph=torch.is_grad_enabled(), allow_unused=True)
    it = iter(got)
    return tuple(next(it) if n else None for n in needs)


class _RNNSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sp, x, h0, c0, *params):
        y, hn, cn, layers = _forward(sp, x, h0, c0, params)
        ctx.sp = sp
        ctx.layers = layers[:-1] + [layers[-1][:3] + (None,)]   # the top y: saved below
        ctx.save_for_backward(x, h0, c0, y, *params)
        ctx.set_materialize_grads(False)
        return (y, hn) if sp.gru else (y, hn, cn)

    @staticmethod
    def backward(ctx, *grads):
        x, h0, c0, y, *params = ctx.saved_tensors
        sp, needs = ctx.sp, ctx.needs_input_grad[1:]
        dy, dhn, dcn = grads if len(grads) == 3 else grads + (None,)
        if all(g is None for g in grads):
            return (None,) * (len(needs) + 1)
        if torch.is_grad_enabled() or any(g is not None and (type(g) is not NeuronTensor or
                                                             g.dtype != x.dtype) for g in grads):
            RSTATS.fallbacks["create_graph or foreign grads"] += 1
            return (None,) + _recompute_grads(sp, needs, x, h0, c0, params, grads)
        out = _backward(sp, x, h0, c0, y, params, ctx.layers, dy, dhn, dcn)
        return (None,) + tuple(g if n else None for g, n in zip(out, needs))


def _run(gru, input, h0, c0, params, has_biases, num_layers, dropout, train, bidirectional,
         batch_first):
    why = _why_not(input, h0, c0, params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first, 3 if gru else 4)
    if why is not None:
        RSTATS.fallbacks[why] += 1
        return None
    RSTATS.calls += 1
    sp = _Spec(gru, num_layers, 2 if bidirectional else 1, bool(has_biases), bool(batch_first),
               h0.shape[2], input.dtype, input._index)
    x = input if _rows_ok(_tm(input, sp)) else input.contiguous()
    h0 = h0.contiguous()
    c0 = None if gru else c0.contiguous()
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, h0, c0, *params)):
        return _RNNSeq.apply(sp, x, h0, c0, *params)
    y, hn, cn, _ = _forward(sp, x, h0, c0, params)
    return (y, hn) if gru else (y, hn, cn)


def lstm_input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
               batch_first):
    """AutogradPrivateUse1 kernel of aten::lstm.input."""
    out = None
    if len(hx) == 2:
        out = _run(False, input, hx[0], hx[1], params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first)
    else:
        RSTATS.fallbacks["hidden states"] += 1
    if out is None:
        return _fallback(aten.lstm.input, dropout, train, num_layers)(
            input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first)
    return out


def gru_input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
              batch_first):
    """AutogradPrivateUse1 kernel of aten::gru.input."""
    out = _run(True, input, hx, None, params, has_biases, num_layers, dropout, train,
               bidirectional, batch_first)
    if out is None:
        return _fallback(aten.gru.input, dropout, train, num_layers)(
            input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first)
    return out


def _fallback(op, dropout, train, num_layers):
    """The op's composite: with dropout between layers while training, ATen's C++ one (the code
    the CPU's nn.LSTM/GRU runs: its masks are drawn layer by layer with at::dropout, which on
    neuron draws as the CPU does, so a seed gives the CPU's masks); otherwise torch's Python
    decomposition, as before (torch/_decomp's, which draws its masks in another order)."""
    if dropout > 0.0 and train and num_layers > 1:
        return functools.partial(op._op_dk, torch._C.DispatchKey.CompositeImplicitAutograd)
    return op.decompose


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("lstm.input", lstm_input, "AutogradPrivateUse1")
_LIB.impl("gru.input", gru_input, "AutogradPrivateUse1")
