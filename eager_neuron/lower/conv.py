"""Convolution and pooling lowerings (2-D; 1-D convolutions run as height-1 2-D ones).

aten::convolution / convolution_backward cover nn.Conv1d and nn.Conv2d (stride, padding,
dilation, groups, bias); transposed and 3-D convolutions raise NotImplementedError (counted CPU
fallback). Pooling: max_pool2d_with_indices (nn.MaxPool1d arrives here too, unsqueezed),
avg_pool2d, _adaptive_avg_pool2d, adaptive_max_pool2d, each with its backward. Every op is one
launch, plus cast-kernel copies for operands a kernel cannot read in place.

>>> import torch, eager_neuron
>>> x = torch.ones(1, 1, 4, 4, device="neuron")
>>> torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device="neuron")).flatten().tolist()
[9.0, 9.0, 9.0, 9.0]
"""

from __future__ import annotations

import torch

from ..kernels import compile as kc
from ..kernels import conv as kconv
from ..launch import launch
from .cast import cast
from .common import NP_TYPE
from .matmul import blas_threads

VERSION = 1              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 18   # elements of work below which a prange launch costs more than it saves
_FLOAT = frozenset({torch.float32, torch.float64})


def _np(t: torch.Tensor):
    """Zero-copy numpy view. Under NeuronMode an operand may be a CPU tensor that requires grad:
    detach it (same memory) rather than let .numpy() refuse."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def _pair(v, default=None) -> tuple:
    """An int[2]/int[1] schema value as (height, width); empty means `default`."""
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if not v:
        return default
    return (v[0], v[0]) if len(v) == 1 else v


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when C-contiguous, else a contiguous scratch copy made by the cast kernel."""
    if t.is_contiguous():
        return t
    out = torch.empty(t.shape, dtype=t.dtype)
    cast(t, out)
    return out


def _scratch_if_strided(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype)


def _parallel(work: int) -> bool:
    return work >= PARALLEL_MIN and kc.parallel_allowed()


# ---------------------------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------------------------

def _conv_geometry(a: dict, x: torch.Tensor, w: torch.Tensor):
    """(x4, w4, stride, padding, dilation): 1-D convolutions become height-1 2-D ones."""
    if a["transposed"]:
        raise NotImplementedError("transposed convolution has no neuron kernel")
    if x.dim() not in (3, 4) or w.dim() != x.dim():
        raise NotImplementedError(f"{x.dim() - 2}-d convolution has no neuron kernel")
    if x.dtype not in _FLOAT or w.dtype != x.dtype:
        raise NotImplementedError(f"convolution on {x.dtype}/{w.dtype}")
    stride, padding, dilation = (tuple(a[k]) for k in ("stride", "padding", "dilation"))
    if x.dim() == 3:
        return (x.unsqueeze(2), w.unsqueeze(2), (1,) + stride, (0,) + padding,
                (1,) + dilation)
    return x, w, stride, padding, dilation


def _flat_weight(w4: torch.Tensor) -> torch.Tensor:
    o = w4.shape[0]
    return _contiguous(w4).reshape(o, -1)


def lower_convolution(func, a, outs):
    x, w, bias, out = a["input"], a["weight"], a["bias"], outs[0]
    x4, w4, stride, padding, dilation = _conv_geometry(a, x, w)
    if out.numel() == 0:
        return
    if bias is not None and bias.dtype != x.dtype:
        raise NotImplementedError(f"convolution bias dtype {bias.dtype}")
    out4 = out.unsqueeze(2) if x.dim() == 3 else out
    n, o, oh, ow = out4.shape
    _, cg, kh, kw = w4.shape
    # 1. the kernel reads x by strides; weight and output must be C-contiguous for BLAS
    res = _scratch_if_strided(out4)
    w2 = _flat_weight(w4)
    pointwise = _pointwise(kh, kw, stride, padding, x4)
    parallel = not pointwise and _parallel(cg * kh * kw * oh * ow)
    has_bias = bias is not None
    key = ("conv", "forward", VERSION, has_bias, pointwise, parallel)

    def render():
        return kconv.render_conv_forward(has_bias, pointwise, parallel)

    args = (_np(res.reshape(n, o, oh * ow)), _np(x4), _np(w2)) + \
        ((_np(bias),) if has_bias else ()) + \
        stride + padding + dilation + (a["groups"], kh, kw, oh, ow)
    flops = 2.0 * n * o * oh * ow * cg * kh * kw
    nbytes = (x.numel() + w.numel() + out.numel()) * out.element_size()
    blas_threads(flops / (n * a["groups"]))      # one gemm per (sample, group)
    launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="tensor")
    if res is not out4:
        cast(res, out4)


def lower_convolution_backward(func, a, outs):
    go, x, w = a["grad_output"], a["input"], a["weight"]
    mask = tuple(bool(m) for m in a["output_mask"])
    x4, w4, stride, padding, dilation = _conv_geometry(a, x, w)
    if go.dtype != x.dtype:
        raise NotImplementedError(f"convolution_backward grad dtype {go.dtype}")
    squeeze = x.dim() == 3
    go4 = _contiguous(go.unsqueeze(2) if squeeze else go)   # often an expand() from .sum()
    n, o, oh, ow = go4.shape
    _, cg, kh, kw = w4.shape
    gi, gw, gb = (outs[i] if mask[i] else None for i in range(3))
    # zero-size problems: grads are zeros (or nothing to do)
    if go4.numel() == 0 or x.numel() == 0:
        for t in (gi, gw, gb):
            if t is not None and t.numel():
                cast(torch.zeros((), dtype=t.dtype), t)
        return
    mask = (gi is not None and gi.numel() > 0, gw is not None, gb is not None)
    if not any(mask):
        return
    geometry = stride + padding + dilation + (a["groups"], kh, kw, oh, ow)
    go3 = _np(go4.reshape(n, o, oh * ow))
    w2 = _np(_flat_weight(w4))
    gemm_flops = 2.0 * n * o * oh * ow * cg * kh * kw
    itemsize = go.element_size()
    blas_threads(gemm_flops / (n * a["groups"]))   # one gemm per (sample, group)
    # 1. grad_input: its own kernel, so that layers whose input needs no grad (the first)
    #    share the weight kernel with the rest
    if mask[0]:
        gi4 = gi.unsqueeze(2) if squeeze else gi
        pointwise = _pointwise(kh, kw, stride, padding, gi4)
        parallel = not pointwise and _parallel(cg * kh * kw * oh * ow)
        key = ("conv", "grad_input", VERSION, pointwise, parallel)
        launch(key, lambda: kconv.render_conv_grad_input(pointwise, parallel),
               (_np(gi4), go3, _np(x4), w2) + geometry, flops=gemm_flops,
               bytes_moved=(x.numel() + w.numel() + go.numel()) * itemsize, engine="tensor")
    # 2. grad_weight and grad_bias in one kernel; gw is written as an (O, CKK) C matrix
    if mask[1] or mask[2]:
        gw_res = _scratch_if_strided(gw) if mask[1] else None
        pointwise = mask[1] and _pointwise(kh, kw, stride, padding, x4)
        parallel = not pointwise and _parallel(cg * kh * kw * oh * ow)
        need_w, need_b = mask[1], mask[2]
        key = ("conv", "grad_weight", VERSION, need_w, need_b, pointwise, parallel)
        outs_ = ((_np(gw_res.reshape(o, -1)),) if need_w else ()) + \
            ((_np(gb),) if need_b else ())
        launch(key, lambda: kconv.render_conv_grad_weight(need_w, need_b, pointwise, parallel),
               outs_ + (go3, _np(x4), w2) + geometry, flops=gemm_flops if need_w else n * o,
               bytes_moved=(x.numel() + w.numel() + go.numel()) * itemsize, engine="tensor")
        if need_w and gw_res is not gw:
            cast(gw_res, gw)


def _pointwise(kh, kw, stride, padding, t: torch.Tensor) -> bool:
    """1x1, stride 1, no padding, t C-contiguous: the input itself is the patch matrix."""
    return (kh, kw, stride, padding) == (1, 1, (1, 1), (0, 0)) and t.is_contiguous()


# ---------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------

def _as4(t: torch.Tensor) -> torch.Tensor:
    """(C, H, W) inputs are one sample: (1, C, H, W) views."""
    return t.unsqueeze(0) if t.dim() == 3 else t


def _pool(kind: str, arrays: tuple, scalars: tuple, dtype, work: int, nbytes: int) -> None:
    if dtype not in _FLOAT and not (kind.startswith("max") and dtype in NP_TYPE and
                                    dtype != torch.bool):
        raise NotImplementedError(f"{kind} on {dtype}")
    T = NP_TYPE[dtype]
    lowest = "-np.inf" if dtype in _FLOAT else str(int(torch.iinfo(dtype).min))
    parallel = _parallel(work)
    key = ("pool", kind, VERSION, T, parallel)

    def render():
        return kconv.render_pool(kind, T, lowest, parallel)

    launch(key, render, tuple(_np(t) for t in arrays) + scalars, flops=work,
           bytes_moved=nbytes, engine="vector")


def _window_args(a: dict) -> tuple:
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"], kernel)
    return kernel, stride, _pair(a["padding"])


def lower_max_pool2d(func, a, outs):
    x, (out, ind) = a["self"], outs
    if out.numel() == 0:
        return
    kernel, stride, padding = _window_args(a)
    dilation = _pair(a["dilation"])
    work = out.numel() * kernel[0] * kernel[1]
    _pool("max_pool2d", (_as4(out), _as4(ind), _as4(x)), kernel + stride + padding + dilation,
          x.dtype, work, (x.numel() + 2 * out.numel()) * x.element_size())


def lower_max_pool2d_backward(func, a, outs):
    gi = outs[0]
    if gi.numel() == 0:
        return
    go, ind = a["grad_output"], a["indices"]
    _pool("max_pool2d_backward", (_as4(gi), _as4(go), _as4(ind)), (), gi.dtype,
          gi.numel() + go.numel(), (gi.numel() + 2 * go.numel()) * gi.element_size())


def lower_avg_pool2d(func, a, outs):
    x, out = a["self"], outs[0]
    if out.numel() == 0:
        return
    kernel, stride, padding = _window_args(a)
    divisor = a["divisor_override"] or 0   # 0: none (PyTorch rejects an override of 0)
    _pool("avg_pool2d", (_as4(out), _as4(x)),
          kernel + stride + padding + (bool(a["count_include_pad"]), int(divisor)),
          x.dtype, out.numel() * kernel[0] * kernel[1],
          (x.numel() + out.numel()) * x.element_size())


def lower_avg_pool2d_backward(func, a, outs):
    gi, go = outs[0], a["grad_output"]
    if gi.numel() == 0:
        return
    kernel, stride, padding = _window_args(a)
    divisor = a["divisor_override"] or 0
    _pool("avg_pool2d_backward", (_as4(gi), _as4(go)),
          kernel + stride + padding + (bool(a["count_include_pad"]), int(divisor)),
          gi.dtype, gi.numel() + go.numel() * kernel[0] * kernel[1],
          (gi.numel() + go.numel()) * gi.element_size())


def lower_adaptive_avg_pool2d(func, a, outs):
    x, out = a["self"], outs[0]
    if out.numel() == 0:
        return
    _pool("adaptive_avg_pool2d", (_as4(out), _as4(x)), (), x.dtype, x.numel() + out.numel(),
          (x.numel() + out.numel()) * x.element_size())


def lower_adaptive_avg_pool2d_backward(func, a, outs):
    gi, go = outs[0], a["grad_output"]
    if gi.numel() == 0:
        return
    _pool("adaptive_avg_pool2d_backward", (_as4(gi), _as4(go)), (), gi.dtype,
          gi.numel() + go.numel(), (gi.numel() + go.numel()) * gi.element_size())


def lower_adaptive_max_pool2d(func, a, outs):
    x, (out, ind) = a["self"], outs
    if out.numel() == 0:
        return
    _pool("adaptive_max_pool2d", (_as4(out), _as4(ind), _as4(x)), (), x.dtype,
          x.numel() + out.numel(), (x.numel() + 2 * out.numel()) * x.element_size())


LOWERINGS = {
    "aten::convolution": lower_convolution,
    "aten::convolution_backward": lower_convolution_backward,
    "aten::max_pool2d_with_indices": lower_max_pool2d,
    "aten::max_pool2d_with_indices_backward": lower_max_pool2d_backward,
    "aten::avg_pool2d": lower_avg_pool2d,
    "aten::avg_pool2d_backward": lower_avg_pool2d_backward,
    "aten::_adaptive_avg_pool2d": lower_adaptive_avg_pool2d,
    "aten::_adaptive_avg_pool2d_backward": lower_adaptive_avg_pool2d_backward,
    "aten::adaptive_max_pool2d": lower_adaptive_max_pool2d,
    "aten::adaptive_max_pool2d_backward": lower_max_pool2d_backward,
}
