"""Elementwise ops with several outputs, one kernel each: the fused LSTM / GRU cells PyTorch
calls for nn.LSTM / nn.GRU on an accelerator (aten::_thnn_fused_{lstm,gru}_cell and their
backward; no CPU kernel exists, the math of ATen's cuda/RNN.cu) and frexp. Kernels are rendered
by kernels/elementwise.py; lower/elementwise.py merges LOWERINGS into its table.

>>> import torch, eager_neuron
>>> m, e = torch.frexp(torch.tensor([8.0], device="neuron"))
>>> (m.item(), e.item())
(0.5, 4)
"""

from __future__ import annotations

import numpy as np
import torch

from ..adaptive import MODULE as _adaptive
from ..kernels import elementwise as kew
from ..launch import launch
from .common import NP_TYPE

_FLOATS = frozenset({torch.float32, torch.float64})


def _np(t: torch.Tensor):
    return t.numpy(force=True)



def _cell_arrays(*ts):
    """2-D (or 1-D bias) numpy views; a missing optional tensor is an empty placeholder."""
    out = []
    for t in ts:
        out.append(_np(t) if t is not None else np.zeros(0, np.float32))
    return out


def _cell_launch(op: str, key: tuple, render, arrays: list, numel: int) -> None:
    launch(*_cell_request(op, key, render, arrays, numel))


def _cell_request(op: str, key: tuple, render, arrays: list, numel: int) -> tuple:
    """The cell kernel's launch (launch()'s positional arguments) for the lowering to make."""
    if _adaptive.STATE.group is not None:   # reads buffers a pending fused group may write
        _adaptive.flush(f"non-fusible op {op}")
    nbytes = sum(x.nbytes for x in arrays)
    return (("elementwise", op) + key, render, tuple(arrays), 30.0 * numel, float(nbytes),
            "scalar")


def _check_cell(*ts) -> str:
    if any(t is not None and t.dim() != 2 for t in ts):
        raise NotImplementedError("fused rnn cell: 2-D (batched) operands only")
    dtypes = {t.dtype for t in ts if t is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOATS:
        raise NotImplementedError(f"fused rnn cell: one float dtype, got {dtypes}")
    return NP_TYPE[next(iter(dtypes))]


def lower_lstm_cell(func, a, outs) -> None:
    ig, hg, cx, b1, b2 = (a["input_gates"], a["hidden_gates"], a["cx"], a["input_bias"],
                          a["hidden_bias"])
    T = _check_cell(ig, hg, cx)
    has_bias = b1 is not None and b2 is not None
    hy, cy, ws = outs
    if hy.numel() == 0:
        return
    _cell_launch("aten::_thnn_fused_lstm_cell", (has_bias, T),
                 lambda: kew.render_lstm_cell(has_bias, T),
                 _cell_arrays(hy, cy, ws, ig, hg, cx, b1 if has_bias else None,
                              b2 if has_bias else None), cx.numel())


def lower_lstm_cell_backward(func, a, outs) -> None:
    ghy, gcy, cx, cy, ws = a["grad_hy"], a["grad_cy"], a["cx"], a["cy"], a["workspace"]
    T = _check_cell(ghy, gcy, cx, cy, ws)
    gg, gcx, gb = outs
    if not isinstance(gg, torch.Tensor):    # neither grad defined: nothing to compute
        return
    has_bias = isinstance(gb, torch.Tensor)
    if gg.numel() == 0:
        if has_bias:
            gb.zero_()
        return
    flags = (ghy is not None, gcy is not None, has_bias)
    _cell_launch("aten::_thnn_fused_lstm_cell_backward_impl", flags + (T,),
                 lambda: kew.render_lstm_cell_backward(*flags, T),
                 _cell_arrays(gg, gcx, gb if has_bias else None, ghy, gcy, cx, cy, ws),
                 cx.numel())


def lower_gru_cell(func, a, outs) -> None:
    ig, hg, hx, b1, b2 = (a["input_gates"], a["hidden_gates"], a["hx"], a["input_bias"],
                          a["hidden_bias"])
    T = _check_cell(ig, hg, hx)
    has_bias = b1 is not None and b2 is not None
    hy, ws = outs
    if hy.numel() == 0:
        return
    _cell_launch("aten::_thnn_fused_gru_cell", (has_bias, T),
                 lambda: kew.render_gru_cell(has_bias, T),
                 _cell_arrays(hy, ws, ig, hg, hx, b1 if has_bias else None,
                              b2 if has_bias else None), hx.numel())


def lower_gru_cell_backward(func, a, outs) -> None:
    ghy, ws = a["grad_hy"], a["workspace"]
    T = _check_cell(ghy, ws)
    gig, ghg, ghx, gib, ghb = outs
    has_bias = isinstance(gib, torch.Tensor) and isinstance(ghb, torch.Tensor)
    if ghy.numel() == 0:
        for g in (gib, ghb):
            if isinstance(g, torch.Tensor):
                g.zero_()
        return
    _cell_launch("aten::_thnn_fused_gru_cell_backward", (has_bias, T),
                 lambda: kew.render_gru_cell_backward(has_bias, T),
                 _cell_arrays(gig, ghg, ghx, gib if has_bias else None,
                              ghb if has_bias else None, ghy, ws), ghy.numel())


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    # shapes as ATen's cuda/RNN.cu: hy like hx, workspace [B, 5H]
    return (torch.empty_like(hx, memory_format=torch.contiguous_format),
            input_gates.new_empty((hx.shape[0], 5 * hx.shape[1])))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    b, h = grad_hy.shape
    gates = grad_hy.new_empty((b, 3 * h))
    bias = grad_hy.new_empty((3 * h,)) if has_bias else None
    return (gates, grad_hy.new_empty((b, 3 * h)), torch.empty_like(grad_hy), bias,
            None if bias is None else grad_hy.new_empty((3 * h,)))


def _register_missing_metas() -> None:
    """PyTorch has no Meta kernel for the fused GRU cell (dispatch needs output shapes)."""
    global _META_LIB
    for name, fn in (("_thnn_fused_gru_cell", _gru_cell_meta),
                     ("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta)):
        op = getattr(torch.ops.aten, name).default
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
            continue
        if _META_LIB is None:
            _META_LIB = torch.library.Library("aten", "IMPL")
        _META_LIB.impl(name, fn, "Meta")


_META_LIB = None
_register_missing_metas()


# -- LSTM cell without biases (module_db helper, issue 16) -----------------------------------------
def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """PyTorch's Meta kernel reads `.device` of every bias, so nn.LSTM(bias=False) failed with
    "'NoneType' object has no attribute 'device'": the same shapes and checks, biases optional."""
    torch._check(input_gates.shape == hidden_gates.shape,
                 lambda: f"{input_gates.shape} != {hidden_gates.shape}")
    torch._check((input_bias is None) == (hidden_bias is None),
                 lambda: "_thnn_fused_lstm_cell: give both biases or neither")
    if input_bias is not None:
        torch._check(input_bias.ndim == 1 and input_bias.numel() == input_gates.size(1)
                     and input_bias.shape == hidden_bias.shape,
                     lambda: f"bias shapes {input_bias.shape}, {hidden_bias.shape}")
    torch._check(cx.ndim == 2 and cx.numel() == input_gates.size(0) * input_gates.size(1) // 4,
                 lambda: f"cx {cx.shape} does not match gates {input_gates.shape}")
    return (torch.empty_like(cx, memory_format=torch.contiguous_format),
            torch.empty_like(cx, memory_format=torch.contiguous_format),
            torch.empty_like(input_gates, memory_format=torch.contiguous_format))


_LSTM_META_LIB = torch.library.Library("aten", "IMPL")
_LSTM_META_LIB.impl("_thnn_fused_lstm_cell", _lstm_cell_meta, "Meta")


def lower_frexp(func, a, outs) -> None:
    x = a["self"]
    m, e = outs
    if x.dtype not in _FLOATS or not (x.is_contiguous() and m.is_contiguous() and
                                      e.is_contiguous()):
        raise NotImplementedError("frexp: contiguous float32/float64 tensors only")
    if x.numel() == 0:
        return
    T = NP_TYPE[x.dtype]
    arrays = [_np(m).reshape(-1), _np(e).reshape(-1), _np(x).reshape(-1)]
    launch(*_cell_request("aten::frexp", (T,), lambda: kew.render_frexp(T), arrays,
                          x.numel()))


LOWERINGS = {
    "aten::frexp": lower_frexp,
    "aten::_thnn_fused_lstm_cell": lower_lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": lower_lstm_cell_backward,
    "aten::_thnn_fused_gru_cell": lower_gru_cell,
    "aten::_thnn_fused_gru_cell_backward": lower_gru_cell_backward,
}
