"""Convolution lowerings: aten::convolution and convolution_backward, 1/2/3-d, transposed too.

Every operand is viewed with three spatial dims (a 2-d convolution gets D = 1, a 1-d one
D = H = 1), so one kernel set serves all ranks. Stride, padding, dilation, groups, bias and
output_padding (transposed) are covered; float32/float64 forward and backward, integer types
forward (a loop gemm), half types in float32 (bfloat16 transposed rounded per step, as the
CPU). A transposed convolution runs the grad_input kernel forward and the
forward/grad_weight kernels backward (the same patch walk with input and output swapped).
Every op is one launch per needed gradient, plus cast-kernel copies for operands a kernel
cannot read in place. The helpers are generators of launch requests (launch()'s positional
arguments, each built when the one before has run) that the lowering launches itself:
dispatch -> lower_convolution -> launch.

>>> import torch, eager_neuron
>>> x = torch.ones(1, 1, 4, 4, device="neuron")
>>> torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device="neuron")).flatten().tolist()
[9.0, 9.0, 9.0, 9.0]
"""

from __future__ import annotations

import torch

from .. import cost
from ..blas import blas_threads
from ..context import scratch
from ..kernels import compile as kc
from ..kernels import conv as kconv
from ..launch import launch
from .cast import cast_steps

VERSION = 4              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 18   # elements of work below which a prange launch costs more than it saves
_FLOAT = frozenset({torch.float32, torch.float64})
_INT = frozenset({torch.int64, torch.int32})


def _np(t: torch.Tensor):
    """Zero-copy numpy view. Under NeuronMode an operand may be a CPU tensor that requires grad:
    detach it (same memory) rather than let .numpy() refuse."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def _contiguous(t: torch.Tensor):
    """t itself when C-contiguous, else a contiguous scratch copy made by the cast kernel
    (steps; returns the tensor)."""
    if t.is_contiguous():
        return t
    out = scratch(torch.empty(t.shape, dtype=t.dtype))
    yield from cast_steps(t, out)
    return out


def _scratch_if_strided(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else scratch(torch.empty(t.shape, dtype=t.dtype))


def _parallel(work: int) -> bool:
    return work >= PARALLEL_MIN and kc.parallel_allowed()


def _as5(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *spatial) with 1-3 spatial dims as an (N, C, D, H, W) view (unit dims in front)."""
    while t.dim() < 5:
        t = t.unsqueeze(2)
    return t


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *spatial) C-contiguous as (N, C, D*H*W)."""
    return t.reshape(t.shape[0], t.shape[1], -1)


class _Conv:
    """One convolution's geometry with three spatial dims. `x`, `w` are (N, C, D, H, W) and
    (O, Cg, KD, KH, KW) views; `args` the kernels' trailing geometry scalars for the given
    patch-matrix column sizes (the conv output's spatial dims)."""

    def __init__(self, a: dict, x: torch.Tensor, w: torch.Tensor, grad: bool):
        k = x.dim() - 2
        if k not in (1, 2, 3) or w.dim() != x.dim():
            raise NotImplementedError(f"convolution of a {tuple(x.shape)} input with a "
                                      f"{tuple(w.shape)} weight")
        ok = _FLOAT if grad else _FLOAT | _INT
        if x.dtype not in ok or w.dtype != x.dtype:
            raise NotImplementedError(f"convolution on {x.dtype}/{w.dtype}")
        pad = (3 - k)

        def three(name, fill):
            v = tuple(a[name])
            return (fill,) * pad + (v * k if len(v) == 1 else v)

        self.stride, self.padding, self.dilation = (three(n, f) for n, f in
                                                    (("stride", 1), ("padding", 0),
                                                     ("dilation", 1)))
        self.transposed, self.groups = bool(a["transposed"]), a["groups"]
        self.x, self.w = _as5(x), _as5(w)
        self.kernel = tuple(self.w.shape[2:])
        self.integer = x.dtype in _INT
        self.w2 = None   # (O, Cg*K) C: set by _conv (a copy when w is strided)

    def args(self, cols: tuple) -> tuple:
        return self.stride + self.padding + self.dilation + (self.groups,) + self.kernel + cols

    def pointwise(self, t: torch.Tensor) -> bool:
        """1x1x1, stride 1, no padding, t C-contiguous: t itself is the patch matrix."""
        return (self.kernel, self.stride, self.padding) == ((1, 1, 1), (1, 1, 1), (0, 0, 0)) \
            and t.is_contiguous()

    def flops(self, n: int, o: int, cols: tuple) -> float:
        """The implicit GEMM's FLOPs (cost.conv_work) for n samples, o output channels over
        the output positions cols (the caller counts the bytes: it knows which tensors move)."""
        cg = self.w.shape[1]
        return cost.conv_work(n, cg * self.groups, o, cols[0] * cols[1] * cols[2],
                              self.kernel[0] * self.kernel[1] * self.kernel[2], 0,
                              self.groups, 0)[0]


def _conv(a: dict, x: torch.Tensor, w: torch.Tensor, grad: bool):
    """The _Conv of an op with its weight matrix (steps: a copy when w is strided)."""
    cv = _Conv(a, x, w, grad)
    w2 = yield from _contiguous(cv.w)
    cv.w2 = w2.reshape(cv.w.shape[0], -1)
    return cv


def _forward(cv: _Conv, out5: torch.Tensor, x5: torch.Tensor, bias, nbytes: int):
    """out5 = conv(x5, cv.w) (+ bias): the forward kernel, also the transposed grad_input."""
    n, o = out5.shape[:2]
    cols = tuple(out5.shape[2:])
    res = _scratch_if_strided(out5)
    pointwise = cv.pointwise(x5)
    parallel = not pointwise and _parallel(cv.w2.shape[1] * cols[0] * cols[1] * cols[2])
    has_bias = bias is not None
    key = ("conv", "forward", VERSION, has_bias, pointwise, parallel, cv.integer)
    args = (_np(_flat(res)), _np(x5), _np(cv.w2)) + ((_np(bias),) if has_bias else ()) + \
        cv.args(cols)
    flops = cv.flops(n, o, cols)
    if not cv.integer:
        blas_threads(flops / (n * cv.groups))      # one gemm per (sample, group)
    yield (key, lambda: kconv.render_conv_forward(has_bias, pointwise, parallel, cv.integer),
           args, flops, nbytes, "tensor")
    if res is not out5:
        yield from cast_steps(res, out5)


def _grad_input(cv: _Conv, gi5: torch.Tensor, go5: torch.Tensor, bias, nbytes: int,
                bf16: bool = False):
    """gi5 = conv's input gradient for go5 (col2im of w.T @ go): also the transposed forward,
    where a bias may be added per channel of gi5 (and, for bfloat16 operands computed in
    float32, each step rounded to bfloat16 as the CPU does)."""
    n = go5.shape[0]
    cols = tuple(go5.shape[2:])
    go3 = _np(_flat((yield from _contiguous(go5))))
    res = _scratch_if_strided(gi5)
    pointwise = not bf16 and cv.pointwise(res)
    parallel = not pointwise and not bf16 and \
        _parallel(cv.w2.shape[1] * cols[0] * cols[1] * cols[2])
    has_bias = bias is not None
    key = ("conv", "grad_input", VERSION, pointwise, parallel, cv.integer, has_bias, bf16)
    target = _flat(res) if has_bias else res
    args = (_np(target), go3, _np(res), _np(cv.w2)) + ((_np(bias),) if has_bias else ()) + \
        cv.args(cols)
    flops = cv.flops(n, go5.shape[1], cols)
    if not cv.integer:
        blas_threads(flops / (n * cv.groups))
    yield (key, lambda: kconv.render_conv_grad_input(pointwise, parallel, cv.integer, has_bias,
                                                     bf16),
           args, flops, nbytes, "tensor")
    if res is not gi5:
        yield from cast_steps(res, gi5)


def _grad_weight(cv: _Conv, gw, gb, go5: torch.Tensor, x5: torch.Tensor, nbytes: int):
    """gw (O, Cg, K...) += go5 (N, O, cols) against the patches of x5; gb = go5 summed."""
    n, o = go5.shape[:2]
    cols = tuple(go5.shape[2:])
    need_w, need_b = gw is not None, gb is not None
    gw_res = _scratch_if_strided(gw) if need_w else None
    pointwise = need_w and cv.pointwise(x5)
    parallel = not pointwise and _parallel(cv.w2.shape[1] * cols[0] * cols[1] * cols[2])
    key = ("conv", "grad_weight", VERSION, need_w, need_b, pointwise, parallel)
    outs = ((_np(gw_res.reshape(gw.shape[0], -1)),) if need_w else ()) + \
        ((_np(gb),) if need_b else ())
    flops = cv.flops(n, o, cols) if need_w else float(go5.numel())
    if need_w:
        blas_threads(flops / (n * cv.groups))
    go3 = _np(_flat((yield from _contiguous(go5))))
    yield (key, lambda: kconv.render_conv_grad_weight(need_w, need_b, pointwise, parallel),
           outs + (go3, _np(x5), _np(cv.w2)) + cv.args(cols), flops, nbytes, "tensor")
    if need_w and gw_res is not gw:
        yield from cast_steps(gw_res, gw)


def _up(t):
    """A half-precision operand as a float32 scratch copy (the cast kernel); others as is
    (steps; returns the tensor)."""
    if t is None or t.dtype not in (torch.bfloat16, torch.float16):
        return t
    out = scratch(torch.empty(t.shape, dtype=torch.float32))
    yield from cast_steps(t, out)
    return out


def lower_convolution(func, a, outs):
    """Half-precision operands run in float32 (handles_half: this lowering casts them itself);
    a bfloat16 transposed convolution also rounds each step to bfloat16 as the CPU does."""
    for req in _convolution_steps(a, outs[0]):
        launch(*req)


lower_convolution.handles_half = True


def _convolution_steps(a, out):
    ts = (a["input"], a["weight"], a["bias"], out)
    if any(t is not None and t.dtype in (torch.bfloat16, torch.float16) for t in ts):
        bf16 = all(t is None or t.dtype == torch.bfloat16 for t in ts) and a["transposed"]
        out32 = scratch(torch.empty(out.shape, dtype=torch.float32))
        x32 = yield from _up(a["input"])
        w32 = yield from _up(a["weight"])
        b32 = yield from _up(a["bias"])
        yield from _lower_convolution({**a, "input": x32, "weight": w32, "bias": b32}, out32,
                                      bf16)
        yield from cast_steps(out32, out)
        return
    yield from _lower_convolution(a, out, False)


def _lower_convolution(a, out, bf16):
    x, w, bias = a["input"], a["weight"], a["bias"]
    cv = yield from _conv(a, x, w, grad=False)
    if out.numel() == 0:
        return
    if bias is not None and bias.dtype != x.dtype:
        raise NotImplementedError(f"convolution bias dtype {bias.dtype}")
    nbytes = (x.numel() + w.numel() + out.numel()) * out.element_size()
    if cv.transposed:
        # the transposed convolution of x is the input gradient of a convolution whose output
        # is x: zero-filled col2im of w.T @ x, then the bias
        if x.numel() == 0:
            yield from cast_steps(
                torch.zeros((), dtype=out.dtype) if bias is None else
                bias.reshape((-1,) + (1,) * (out.dim() - 2)).expand(out.shape[1:]), out)
            return
        yield from _grad_input(cv, _as5(out), cv.x, bias, nbytes, bf16)
    else:
        yield from _forward(cv, _as5(out), cv.x, bias, nbytes)


def lower_convolution_backward(func, a, outs):
    for req in _backward_steps(a, outs):
        launch(*req)


def _backward_steps(a, outs):
    go, x, w = a["grad_output"], a["input"], a["weight"]
    cv = yield from _conv(a, x, w, grad=True)
    if go.dtype != x.dtype:
        raise NotImplementedError(f"convolution_backward grad dtype {go.dtype}")
    mask = tuple(bool(m) for m in a["output_mask"])
    gi, gw, gb = (outs[i] if mask[i] else None for i in range(3))
    go5 = _as5(go)
    # zero-size problems: grads are zeros (or nothing to do)
    if go.numel() == 0 or x.numel() == 0:
        for t in (gi, gw, gb):
            if t is not None and t.numel():
                yield from cast_steps(torch.zeros((), dtype=t.dtype), t)
        return
    nbytes = (x.numel() + w.numel() + go.numel()) * go.element_size()
    if gb is not None and (cv.transposed or gw is None):
        # transposed: the bias gradient sums grad_output, which the weight kernel does not
        yield from _grad_weight(cv, None, gb, go5, cv.x, go.numel() * go.element_size())
        gb = None
    if cv.transposed:
        # conv of x_t: the transposed input is the conv output, grad_output the conv input
        if gi is not None and gi.numel():
            yield from _forward(cv, _as5(gi), go5, None, nbytes)
        if gw is not None:
            yield from _grad_weight(cv, gw, None, cv.x, go5, nbytes)
        return
    # 1. grad_input: its own kernel, so that layers whose input needs no grad (the first)
    #    share the weight kernel with the rest
    if gi is not None and gi.numel():
        yield from _grad_input(cv, _as5(gi), go5, None, nbytes)
    # 2. grad_weight and grad_bias in one kernel; gw is written as an (O, CKK) C matrix
    if gw is not None:
        yield from _grad_weight(cv, gw, gb, go5, cv.x, nbytes)


LOWERINGS = {
    "aten::convolution": lower_convolution,
    "aten::convolution_backward": lower_convolution_backward,
}
