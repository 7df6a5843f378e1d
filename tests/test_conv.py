"""Convolution and pooling on `neuron` against the CPU, forward and backward: conv1d/2d/3d and
transposed convolutions with stride, padding, dilation, groups, bias, output_padding, 1x1 and
channels_last inputs, integer forward; max/avg/adaptive/fractional pooling, 1/2/3-d, with their
options; upsample and replication-pad backward; grid_sample 2-d/3-d; a small CNN; counters
(no CPU fallback or decomposition of these ops, no recompile for a new batch size).

Sizes are small and cases share kernels (keyed on flags and layouts, never on sizes).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.lower import conv as lconv
from eager_neuron.lower import pool as lpool
from eager_neuron.lower import resample as lresample

DEV = "neuron"
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5, "equal_nan": True},
       torch.float64: {"equal_nan": True}}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _ours_clean():
    st = eager_neuron.stats()
    ours = set(lconv.LOWERINGS) | set(lpool.LOWERINGS) | set(lresample.LOWERINGS)
    assert not ours & set(st["fallbacks"]), st["fallbacks"]
    assert not ours & set(st["decompositions"]), st["decompositions"]


def run(fn, *xs, dtype=torch.float32, grad=(True,)):
    """fn on neuron copies and on xs: outputs, and .grad of every float input, match the CPU."""
    eager_neuron.reset_stats()
    grads = tuple(grad) + (grad[-1],) * (len(xs) - len(grad))
    xs = [x.to(dtype) for x in xs]
    xc = [x.clone().requires_grad_(g) for x, g in zip(xs, grads)]
    xd = [x.to(DEV).requires_grad_(g) for x, g in zip(xs, grads)]
    want, got = fn(*xc), fn(*xd)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w, **TOL[dtype])
    if any(grads):
        go = torch.randn_like(want[0])
        want[0].backward(go)
        got[0].backward(go.to(DEV))
        for c, d in zip(xc, xd):
            if c.grad is None:                  # an input fn does not use
                assert d.grad is None
            else:
                torch.testing.assert_close(d.grad.cpu(), c.grad, **TOL[dtype])
    _ours_clean()


# -- convolution ---------------------------------------------------------------------------------

CONV2D = {
    "pad": lambda x, w, b: F.conv2d(x, w, b, padding=1),
    "stride_dilation_groups": lambda x, w, b: F.conv2d(x, w[:, :2], b, stride=(2, 1),
                                                       padding=(1, 2), dilation=(2, 1), groups=2),
    "no_bias": lambda x, w, b: F.conv2d(x, w, None, stride=2),
    "pointwise": lambda x, w, b: F.conv2d(x, w[:, :, :1, :1], b),
    "depthwise": lambda x, w, b: F.conv2d(x, w[:4, :1], b[:4], padding=1, groups=4),
    "channels_last": lambda x, w, b: F.conv2d(x.contiguous(memory_format=torch.channels_last),
                                              w, b, padding=1),
}


@pytest.mark.parametrize("case", sorted(CONV2D))
def test_conv2d(case):
    run(CONV2D[case], torch.randn(2, 4, 7, 9), torch.randn(6, 4, 3, 3), torch.randn(6))


LAYOUTS = [(dtype, nd, icl, wcl, tr, groups)
           for dtype in (torch.float32, torch.float64) for nd in (1, 2, 3)
           for icl, wcl in ((0, 0), (1, 0), (0, 1)) for tr, groups in ((False, 1), (True, 1),
                                                                        (False, 2))
           if nd > 1 or not (icl or wcl)]


@pytest.mark.parametrize("dtype,nd,icl,wcl,tr,groups", LAYOUTS)
def test_conv_output_and_gradient_layouts_are_the_cpus(dtype, nd, icl, wcl, tr, groups):
    # the CPU's convolution gives its backend's memory format (channels_last when the input or
    # the weight is, where the backend has it; float64 3-d has not): the output and both
    # gradients have the CPU's strides, and values within float64's reference bounds
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(nd)
    x = torch.randn(2, 4, *(5,) * nd, dtype=dtype)
    w = torch.randn(4, 4 // groups, *(3,) * nd, dtype=dtype)
    x = x.contiguous(memory_format=fmt) if icl else x
    w = w.contiguous(memory_format=fmt) if wcl else w
    got = {}
    for dev in ("cpu", DEV):
        xx, ww = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        y = torch.ops.aten.convolution(xx, ww, None, [1] * nd, [1] * nd, [1] * nd, tr,
                                       [0] * nd, groups)
        gx, gw = torch.autograd.grad(y, (xx, ww), torch.ones_like(y))
        got[dev] = (y, gx, gw)
    for c, d in zip(got["cpu"], got[DEV]):
        assert d.stride() == c.stride()
        torch.testing.assert_close(d.detach().cpu(), c.detach(), **TOL[dtype])


def test_channel_shuffle_keeps_channels_last():
    x = torch.randn(2, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    want, got = F.channel_shuffle(x, 2), F.channel_shuffle(x.to(DEV), 2)
    assert got.stride() == want.stride() and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv1d(dtype):
    """Height-1 2-D convolution; in float32 it reuses the conv2d kernels."""
    run(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2, dilation=2),
        torch.randn(3, 4, 17), torch.randn(5, 4, 3), torch.randn(5), dtype=dtype)


def test_conv_input_without_grad():
    """The first layer: output_mask (False, True, True) runs the weight kernel only."""
    run(CONV2D["pad"], torch.randn(2, 4, 7, 9), torch.randn(6, 4, 3, 3), torch.randn(6),
        grad=(False, True, True))


def test_conv_forward_is_one_launch():
    x, w, b = (t.to(DEV) for t in (torch.randn(2, 4, 7, 9), torch.randn(6, 4, 3, 3),
                                   torch.randn(6)))
    F.conv2d(x, w, b, padding=1)
    eager_neuron.reset_stats()
    F.conv2d(x, w, b, padding=1)
    assert eager_neuron.stats()["launches"] == 1


CONV_ND = {
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 2),
                                        dilation=(2, 1, 1)), (2, 4, 5, 6, 7), (6, 4, 3, 2, 3)),
    "conv3d_groups_pointwise": (lambda x, w, b: F.conv3d(x, w, b, groups=2), (2, 4, 3, 4, 5),
                                (6, 2, 1, 1, 1)),
    "transpose1d": (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1,
                                                       output_padding=1, dilation=2),
                    (2, 4, 9), (4, 6, 3)),
    "transpose2d_groups": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 3),
                                                              padding=(1, 0), groups=2),
                           (2, 4, 5, 6), (4, 3, 3, 2)),
    "transpose2d_pointwise": (lambda x, w, b: F.conv_transpose2d(x, w, b), (2, 4, 5, 6),
                              (4, 6, 1, 1)),
    "transpose3d": (lambda x, w, b: F.conv_transpose3d(x, w, None, stride=2, padding=1,
                                                       output_padding=(1, 0, 1)),
                    (1, 4, 3, 4, 5), (4, 6, 3, 3, 2)),
}


@pytest.mark.parametrize("case", sorted(CONV_ND))
def test_conv_nd_and_transposed(case):
    fn, xs, ws = CONV_ND[case]
    bias = torch.randn(ws[1] * (2 if "groups" in case and "transpose" in case else 1)
                       if "transpose" in case else ws[0])
    run(fn, torch.randn(xs), torch.randn(ws), bias)


def test_conv_transposed_strided_grad_and_input_without_grad():
    """An expand()ed grad_output and output_mask (False, True, True)."""
    run(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2).sum(dim=(2, 3)),
        torch.randn(2, 4, 5, 6), torch.randn(4, 3, 3, 3), torch.randn(3),
        grad=(False, True, True))


@pytest.mark.isa
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_transposed_bfloat16_vs_float64(rank):
    """bfloat16 transposed convolution against the exact result of the same bfloat16 inputs.

    Torch's CPU kernel is no reference here: it rounds at every step on AVX2 (gemm, each col2im
    add, bias) and differently on oneDNN's AMX path. The bound is the textbook forward error of
    a sum rounded to bfloat16 (unit roundoff 2**-8) at each of its S steps: |got - exact| <=
    S * 2**-8 * (the same convolution of |x|, |w|, |b|); S = 1 (gemm) + 2**rank (overlapping
    taps, kernel 3 stride 2) + 1 (bias). And most outputs must be within one rounding."""
    fn = getattr(F, f"conv_transpose{rank}d")
    x = torch.randn((2, 4) + (5,) * rank).bfloat16()
    w = torch.randn((4, 3) + (3,) * rank).bfloat16()
    b = torch.randn(3).bfloat16()
    eager_neuron.reset_stats()
    got = fn(x.to(DEV), w.to(DEV), b.to(DEV), stride=2, padding=1).cpu()
    assert got.dtype == torch.bfloat16
    exact = fn(x.double(), w.double(), b.double(), stride=2, padding=1)
    mag = fn(x.double().abs(), w.double().abs(), b.double().abs(), stride=2, padding=1)
    err = (got.double() - exact).abs()
    steps = 2 + 2 ** rank
    assert bool((err <= steps * 2.0 ** -8 * mag).all()), float((err / mag).max())
    assert float((err <= 2.0 ** -8 * mag).double().mean()) > 0.5
    _ours_clean()


@pytest.mark.parametrize("op", ["conv1d", "conv2d", "conv3d", "conv_transpose2d"])
def test_conv_integer_forward(op):
    """int64 convolutions run a loop gemm: exact, like the CPU."""
    rank = 2 if op == "conv_transpose2d" else int(op[4])
    x = torch.randint(-5, 5, (2, 4) + (5,) * rank)
    w = torch.randint(-3, 3, (4, 2 if op == "conv_transpose2d" else 4) + (3,) * rank)
    b = torch.randint(-3, 3, (2 if op == "conv_transpose2d" else 4,))
    fn = getattr(F, op)
    eager_neuron.reset_stats()
    got = fn(x.to(DEV), w.to(DEV), b.to(DEV), stride=2, padding=1)
    torch.testing.assert_close(got.cpu(), fn(x, w, b, stride=2, padding=1))
    _ours_clean()


# -- pooling ---------------------------------------------------------------------------------------

POOLS = {
    "max": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "max_dilation_ceil": lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 1), dilation=(2, 1),
                                                ceil_mode=True, return_indices=True),
    "max1d": lambda x: F.max_pool1d(x.flatten(2), 3, 2),
    "avg": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_exclude_pad_ceil": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                   count_include_pad=False),
    "avg_divisor": lambda x: F.avg_pool2d(x, (2, 3), 2, divisor_override=5),
    "avg1d": lambda x: F.avg_pool1d(x.flatten(2), 4, 3, 1),
    "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
    "adaptive_avg_unbatched": lambda x: F.adaptive_avg_pool2d(x[0], (4, 2)),
    "adaptive_max": lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
    "channels_last": lambda x: F.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2),
    "max3d": lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), dilation=(1, 1, 2),
                                    ceil_mode=True, return_indices=True),
    "avg3d": lambda x: F.avg_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), ceil_mode=True,
                                    count_include_pad=False),
    "avg3d_divisor": lambda x: F.avg_pool3d(x, 2, divisor_override=3),
    "adaptive_avg3d": lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)),
    "adaptive_max3d": lambda x: F.adaptive_max_pool3d(x, (2, 4, 3), return_indices=True),
    "adaptive_max3d_unbatched": lambda x: F.adaptive_max_pool3d(x[0], (3, 2, 5)),
    "fractional2d": lambda x: F.fractional_max_pool2d(
        x, 3, output_size=(5, 4), return_indices=True,
        _random_samples=torch.rand(2, 3, 2, dtype=x.dtype).to(x.device)),
    "fractional3d": lambda x: F.fractional_max_pool3d(
        x.unflatten(2, (2, 5)), (1, 2, 2), output_size=(1, 3, 4), return_indices=True,
        _random_samples=torch.rand(2, 3, 3, dtype=x.dtype).to(x.device)),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pool(case):
    x = torch.randn(2, 3, 10, 9)
    if "3d" in case and "fractional" not in case:
        x = x.unflatten(2, (2, 5))
    torch.manual_seed(1)             # the same random samples on both sides
    rs = torch.get_rng_state()

    def fn(t):
        torch.set_rng_state(rs)
        return POOLS[case](t)
    run(fn, x)


@pytest.mark.isa
def test_adaptive_avg_pool_bfloat16_bitwise():
    """The CPU's 3-d kernel adds and divides in bfloat16 (the 2-d one in float32): both match
    bit for bit; float32 math rounded once differs in most elements of the 3-d case."""
    x = torch.randn(2, 3, 5, 7, 6).bfloat16()
    for fn in (lambda t: F.adaptive_avg_pool3d(t, (3, 4, 2)),
               lambda t: F.adaptive_avg_pool2d(t[:, :, 0], (4, 2))):
        eager_neuron.reset_stats()
        assert torch.equal(fn(x.to(DEV)).cpu(), fn(x))
        _ours_clean()


def test_avg_pool_integers_truncate():
    """Integer average pooling divides like C (toward zero), not like Python's //."""
    x = torch.randint(-9, 9, (2, 3, 6, 7, 5))
    for fn in (lambda t: F.avg_pool1d(t[:, :, 0, 0], 3, 2, 1),
               lambda t: F.avg_pool2d(t[:, :, 0], 2, 1, 1, count_include_pad=False),
               lambda t: F.avg_pool3d(t, 2, 2, ceil_mode=True)):
        eager_neuron.reset_stats()
        torch.testing.assert_close(fn(x.to(DEV)).cpu(), fn(x))
        _ours_clean()


def test_pool_float64():
    run(POOLS["max"], torch.randn(2, 3, 10, 9), dtype=torch.float64)
    run(POOLS["avg"], torch.randn(2, 3, 10, 9), dtype=torch.float64)


def test_max_pool_nan_and_integers():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    run(POOLS["max"], x, grad=(False,))
    eager_neuron.reset_stats()
    xi = torch.randint(-50, -1, (2, 3, 6, 6))     # all negative: the start value must be lowest
    got = F.max_pool2d(xi.to(DEV), 2, return_indices=True)
    for g, w in zip(got, F.max_pool2d(xi, 2, return_indices=True)):
        torch.testing.assert_close(g.cpu(), w)
    _ours_clean()


# -- models and counters ---------------------------------------------------------------------------

def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
        torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d((2, 2)), torch.nn.Flatten(),
        torch.nn.Linear(32, 5))


def test_cnn_training_step_matches_cpu():
    cpu = _cnn()
    dev = copy.deepcopy(cpu).to(DEV)
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
    eager_neuron.reset_stats()
    for _ in range(2):
        for model, opt, xx, yy in ((cpu, opt_c, x, y), (dev, opt_d, x.to(DEV), y.to(DEV))):
            opt.zero_grad()
            F.cross_entropy(model(xx), yy).backward()
            opt.step()
    for pc, pd in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(pd.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-5)
    _ours_clean()


def test_new_batch_size_does_not_recompile():
    model = _cnn().to(DEV)

    def step(batch):
        model(torch.randn(batch, 3, 12, 12, device=DEV, requires_grad=True)).sum().backward()

    step(2)
    step(2)          # the second backward accumulates into .grad: that kernel is warm too
    eager_neuron.reset_stats()
    step(5)
    st = eager_neuron.stats()
    assert st["compiles"] == 0, st
    _ours_clean()


# -- resampling backward: upsample and replication padding ---------------------------------------

def _d3(x):
    return x.unsqueeze(2).expand(2, 3, 3, 10, 9)


RESAMPLE = {
    "nearest1d": lambda x: F.interpolate(x[:, :, 0], size=7, mode="nearest"),
    "nearest2d_scale": lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest"),
    "nearest3d": lambda x: F.interpolate(_d3(x), size=(5, 3, 10), mode="nearest"),
    "nearest_exact2d": lambda x: F.interpolate(x, size=(9, 3), mode="nearest-exact"),
    "nearest_exact1d_scale": lambda x: F.interpolate(x[:, :, 0], scale_factor=2.3,
                                                     mode="nearest-exact"),
    "linear1d_align": lambda x: F.interpolate(x[:, :, 0], size=3, mode="linear",
                                              align_corners=True),
    "bilinear": lambda x: F.interpolate(x, size=(7, 3), mode="bilinear"),
    "bilinear_scale": lambda x: F.interpolate(x, scale_factor=(1.5, 0.7), mode="bilinear",
                                              recompute_scale_factor=False),
    "trilinear_align": lambda x: F.interpolate(_d3(x), size=(5, 3, 10), mode="trilinear",
                                               align_corners=True),
    "bicubic": lambda x: F.interpolate(x, size=(19, 4), mode="bicubic"),
    "bicubic_align": lambda x: F.interpolate(x, size=(9, 11), mode="bicubic",
                                             align_corners=True),
    "bilinear_antialias_down": lambda x: F.interpolate(x, size=(3, 4), mode="bilinear",
                                                       antialias=True),
    "bilinear_antialias_mixed_align": lambda x: F.interpolate(
        x, scale_factor=(0.4, 1.7), mode="bilinear", antialias=True, align_corners=True),
    "replicate1d": lambda x: F.pad(x[:, :, 0], (2, 3), mode="replicate"),
    "replicate2d_negative": lambda x: F.pad(x, (-1, 3, 2, -2), mode="replicate"),
    "replicate3d": lambda x: F.pad(_d3(x), (1, 2, 0, 3, 2, 1), mode="replicate"),
    "replicate2d_unbatched": lambda x: F.pad(x[0], (1, 2, 3, 0), mode="replicate"),
}


@pytest.mark.parametrize("case", sorted(RESAMPLE))
def test_resample_backward(case):
    run(RESAMPLE[case], torch.randn(2, 3, 10, 9))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
def test_grid_sample(rank, mode, padding, align):
    """Coordinates reach past [-1, 1] so that every padding rule is exercised."""
    x = torch.randn((2, 3, 4, 5, 6)[:rank + 2])
    grid = torch.rand((2,) + (3, 4, 5)[:rank] + (rank,)) * 2.6 - 1.3
    run(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
        x, grid)
