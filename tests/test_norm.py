"""Softmax, layer norm and batch norm on `neuron` against the CPU: forward, gradients of inputs
and parameters, running statistics, odd layouts, and counters (no fallback, no recompile)."""

from __future__ import annotations

import math

import pytest
import torch

import eager_neuron
from eager_neuron import fastpath
from eager_neuron.lower import norm as lnorm

DEV = "neuron"


def _same(got, want, **kw):
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **kw)


def _no_fallback():
    st = eager_neuron.stats()
    assert st["fallbacks"] == {}, st["fallbacks"]
    ours = {k for k in st["decompositions"] if k in lnorm.LOWERINGS}
    assert not ours, f"declined to decompositions: {ours}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def check_module(make, x, train=True, steps=1, **kw):
    """The module on neuron and on the CPU: outputs, input/parameter grads, buffers."""
    torch.manual_seed(1)
    mc = make()
    torch.manual_seed(1)
    mn = make().to(DEV)
    mc.train(train)
    mn.train(train)
    eager_neuron.reset_stats()
    for _ in range(steps):
        xc = x.clone().requires_grad_()
        xn = x.to(DEV).requires_grad_()
        yc, yn = mc(xc), mn(xn)
        _same(yn, yc.detach())
        g = torch.randn_like(yc)
        yc.backward(g)
        yn.backward(g.to(DEV))
        _same(xn.grad, xc.grad)
    for (name, p), (_, q) in zip(mc.named_parameters(), mn.named_parameters()):
        _same(q.grad, p.grad, msg=name, **kw)
    for (name, b), (_, c) in zip(mc.named_buffers(), mn.named_buffers()):
        _same(c, b, msg=name)
    _no_fallback()


def check_fn(fn, *xs, grad=True, **kw):
    cs = [x.clone().requires_grad_(grad) for x in xs]
    ns = [x.to(DEV).requires_grad_(grad) for x in xs]
    eager_neuron.reset_stats()
    yc, yn = fn(*cs), fn(*ns)
    _same(yn, yc.detach(), **kw)
    if grad:
        g = torch.randn_like(yc)
        yc.backward(g)
        yn.backward(g.to(DEV))
        for c, n in zip(cs, ns):
            _same(n.grad, c.grad, **kw)
    _no_fallback()


# -- softmax -------------------------------------------------------------------------------------

@pytest.mark.parametrize("log,dim", [(False, -1), (True, -1), (False, 1)])
def test_softmax(log, dim):
    fn = torch.log_softmax if log else torch.softmax
    check_fn(lambda t: fn(t * 4, dim), torch.randn(4, 6, 5))


def test_softmax_odd():
    check_fn(lambda t: torch.softmax(t, 0), torch.tensor(3.0))                 # 0-d: 1.0
    check_fn(lambda t: torch.softmax(t.transpose(0, 2), -1), torch.randn(4, 6, 5))
    check_fn(lambda t: torch.log_softmax(t, -1), torch.randn(3, 0), grad=False)
    x = torch.randn(3, 5)
    x[0, :] = -math.inf                                                       # NaN like torch
    x[1, 2] = math.inf
    x[2, 1] = -math.inf
    check_fn(lambda t: torch.softmax(t, -1), x, grad=False)
    check_fn(lambda t: torch.log_softmax(t, -1), x, grad=False)
    check_fn(lambda t: torch.softmax(t, -1), torch.randn(3, 5, dtype=torch.float64))
    check_fn(lambda t: torch.softmax(t, -1, dtype=torch.float64), torch.randn(3, 5))


# -- layer norm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,normalized", [((4, 6, 5), (5,)), ((4, 6, 5), (6, 5)),
                                               ((7, 5), (5,))])
def test_layer_norm(shape, normalized):
    check_module(lambda: torch.nn.LayerNorm(normalized), torch.randn(*shape) * 3 + 2)


def test_layer_norm_no_affine_and_functional():
    check_module(lambda: torch.nn.LayerNorm(5, elementwise_affine=False), torch.randn(4, 6, 5))
    w, b = torch.randn(5), torch.randn(5)
    check_fn(lambda t, w, b: torch.nn.functional.layer_norm(t, (5,), w, b, 1e-3),
             torch.randn(4, 5), w, b)
    check_fn(lambda t, w: torch.nn.functional.layer_norm(t, (5,), w), torch.randn(3, 5), w)
    # a transposed input: the rows are strided
    check_fn(lambda t: torch.nn.functional.layer_norm(t.t(), (3,)), torch.randn(3, 4))


# -- batch norm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_2d(train):
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    check_module(lambda: torch.nn.BatchNorm2d(3), x, train=train, steps=2)


def test_batch_norm_1d_and_options():
    check_module(lambda: torch.nn.BatchNorm1d(6), torch.randn(8, 6), steps=2)
    check_module(lambda: torch.nn.BatchNorm1d(6), torch.randn(8, 6, 3))
    check_module(lambda: torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False),
                 torch.randn(4, 3, 5, 5))
    check_module(lambda: torch.nn.BatchNorm2d(3, momentum=None), torch.randn(4, 3, 2, 2),
                 steps=3)


def test_batch_norm_channels_last():
    x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
    check_module(lambda: torch.nn.BatchNorm2d(3), x)


def test_batch_norm_aten_variants():
    aten = torch.ops.aten
    x = torch.randn(4, 3, 5)
    w, b, rm, rv = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    dev = [t.to(DEV) for t in (x, w, b, rm, rv)]
    eager_neuron.reset_stats()
    cases = [
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5),
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1,
                                                                       1e-5),
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1,
                                                                          1e-5)[:1],
        lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True,
                                                                         0.1, 1e-5),
    ]
    cpu = [x, w, b, rm.clone(), rv.clone()]
    for case in cases:
        got, want = case(*dev), case(*cpu)
        for g, e in zip(got, want):
            _same(g, e)
    _same(dev[3], cpu[3])                                        # running stats updated in place
    _same(dev[4], cpu[4])
    _no_fallback()


def test_no_recompile_for_new_batch():
    ln, bn = torch.nn.LayerNorm(8).to(DEV), torch.nn.BatchNorm1d(8).to(DEV)

    def step(batch):
        x = torch.randn(batch, 8, device=DEV, requires_grad=True)
        (torch.log_softmax(ln(x), -1).sum() + bn(x).sum()).backward()

    step(3)
    step(3)                     # the second step accumulates into .grad: warm that path too
    eager_neuron.reset_stats()
    step(5)
    step(33)
    assert eager_neuron.stats()["compiles"] == 0
    _no_fallback()


def test_large_parallel():
    # above PARALLEL_MIN rows run under prange; layer norm backward merges per-chunk partials
    x = torch.randn(lnorm.PARALLEL_MIN // 64 + 3, 64)
    # NOTE: weight/bias grads sum 4099 rows; torch accumulates in float32, we in float64
    check_module(lambda: torch.nn.LayerNorm(64), x, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_outputs_as_the_cpu_returns_them(dtype, train):
    # CPU: eval saves no statistics (shape [0]); bfloat16 statistics stay bfloat16 and the
    # output is normalized with those rounded values; running stats updated in place
    aten = torch.ops.aten
    torch.manual_seed(0)
    x = (torch.randn(5, 5, 5) * 3).to(dtype)
    w, b = torch.randn(5).to(dtype), torch.randn(5).to(dtype)
    rm, rv = torch.randn(5).to(dtype), (torch.rand(5) + 0.5).to(dtype)
    rm_n, rv_n = rm.to(DEV), rv.to(DEV)
    want = aten.native_batch_norm(x, w, b, rm, rv, train, 0.1, 1e-5)
    got = aten.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), rm_n, rv_n, train, 0.1, 1e-5)
    for g, e in zip(got, want):
        assert g.shape == e.shape and g.dtype == e.dtype
        _same(g, e, atol=0, rtol=0) if dtype == torch.bfloat16 and g.numel() == 125 else \
            _same(g, e)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}
    _same(rm_n, rm, **tol)
    _same(rv_n, rv, **tol)
    if train:
        assert not torch.equal(rm_n.cpu(), torch.zeros(5).to(dtype) + rm_n.cpu()[0])
    _no_fallback()


@pytest.mark.parametrize("shape", [(1, 25, 5), (2, 6, 16)])
def test_instance_norm_bfloat16_bitwise_as_cpu(shape):
    # the CPU's bfloat16 batch norm rounds var_sum and var to bfloat16 on the way to invstd
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).bfloat16()
    want = torch.nn.functional.instance_norm(x)
    _same(torch.nn.functional.instance_norm(x.to(DEV)), want, atol=0, rtol=0)
    _no_fallback()


def test_layer_norm_bfloat16_statistics_dtype():
    x = torch.randn(3, 4, 8).bfloat16()
    w = torch.randn(8).bfloat16()
    want = torch.ops.aten.native_layer_norm(x, [8], w, None, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(DEV), [8], w.to(DEV), None, 1e-5)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16] * 3
    for g, e in zip(got, want):
        _same(g, e, atol=1e-2, rtol=1e-2)
    _no_fallback()


# -- group norm ----------------------------------------------------------------------------------

def _group_norm64(x, groups, w, b, eps, g):
    """float64 reference: output and the grads of x, w, b for upstream gradient g."""
    xs = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = torch.nn.functional.group_norm(xs[0], groups, xs[1], xs[2], eps)
    y.backward(g.double())
    return y.detach(), [t.grad if t is not None else None for t in xs]


def _within(got, want, what):
    """One float32 rounding of a float64 computation from float32-stored statistics: a few
    float32 ulps of the result's magnitude (never the CPU's own rounding)."""
    eps = torch.finfo(got.dtype).eps
    scale = want.abs().max().item() + 1.0
    err = (got.cpu().double() - want).abs().max().item()
    assert err <= 16 * eps * scale, (what, err, scale)


@pytest.mark.parametrize("shape,groups,layout", [
    ((2, 8, 5, 6), 4, "contiguous"), ((2, 8, 5, 6), 2, "channels_last"),
    ((3, 6, 7), 3, "contiguous"), ((4, 6), 6, "contiguous"), ((2, 4, 3, 4, 5), 1, "contiguous")])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_one_kernel_each_way(shape, groups, layout, affine):
    # native_group_norm and its backward are one launch each (they decomposed into ~15 ops),
    # within float32 rounding of float64; the repeat call is a fast-path hit
    x = torch.randn(shape) * 3 + 1
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w, b = (torch.randn(c), torch.randn(c)) if affine else (None, None)
    g = torch.randn(shape)
    want, grads = _group_norm64(x, groups, w, b, 1e-5, g)
    for _ in range(2):
        xn = x.to(DEV).requires_grad_()
        wn, bn = [t.to(DEV).requires_grad_() if t is not None else None for t in (w, b)]
        eager_neuron.reset_stats()
        call = (xn, wn, bn, shape[0], c, math.prod(shape[2:]), groups, 1e-5)
        y = torch.ops.aten.native_group_norm(*call)[0]
        assert eager_neuron.stats()["launches"] == 1
        assert y.stride() == torch.nn.functional.group_norm(x, groups, w, b).stride()
        values, runners = fastpath.TABLES[torch.ops.aten.native_group_norm.default]
        assert fastpath.signature(call, {}, values) in runners   # learned: a repeat is a hit
        _within(y, want, "out")
        eager_neuron.reset_stats()
        y.backward(g.to(DEV))
        for name, t, ref in zip("xwb", (xn, wn, bn), grads):
            if t is not None:
                _within(t.grad, ref, name)
        _no_fallback()
        assert "aten::native_group_norm_backward" not in eager_neuron.stats()["decompositions"]


def test_group_norm_statistics_and_odd_calls():
    x = torch.randn(2, 6, 4, 4)
    # the statistics: (N, groups), the CPU's dtype rule (float32 for half data with float32
    # parameters); a bfloat16 input rounds once from the float32 computation
    for dt, pdt in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                    (torch.bfloat16, torch.float32), (torch.float16, None)):
        w = torch.randn(6, dtype=pdt) if pdt is not None else None
        want = torch.ops.aten.native_group_norm(x.to(dt), w, w, 2, 6, 16, 3, 1e-5)
        got = torch.ops.aten.native_group_norm(x.to(dt).to(DEV), *(
            [w.to(DEV)] * 2 if w is not None else [None, None]), 2, 6, 16, 3, 1e-5)
        assert [t.dtype for t in got] == [t.dtype for t in want]
        assert [t.shape for t in got] == [t.shape for t in want] == [x.shape, (2, 3), (2, 3)]
        ref = torch.nn.functional.group_norm(x.to(dt).double(), 3, *(
            [w.double()] * 2 if w is not None else [None, None]))
        tol = 2 * torch.finfo(dt).eps * (ref.abs().max().item() + 1)
        assert (got[0].cpu().double() - ref).abs().max().item() <= tol
    # spatial dims that do not merge into one strided dim: the decomposition, same values
    xs = torch.randn(2, 4, 5, 8)[..., ::2]
    want, _ = _group_norm64(xs, 2, None, None, 1e-5, torch.ones(xs.shape))
    _within(torch.nn.functional.group_norm(xs.to(DEV), 2), want, "strided")
    # the CPU's refusal: channels not divisible by the groups
    with pytest.raises(RuntimeError, match="group"):
        torch.nn.functional.group_norm(torch.randn(2, 5, 3, device=DEV), 2)


@pytest.mark.parametrize("shape,perm,normalized", [
    ((2, 32, 8), (0, 2, 1), (32,)),          # Whisper: a conv's (B, C, T) output as (B, T, C)
    ((3, 4, 5, 6), (2, 0, 1, 3), (6,)), ((3, 4, 5, 6), (1, 0, 3, 2), (5,)),
    ((2, 3, 4, 5, 6), (3, 2, 1, 0, 4), (6,))])
def test_layer_norm_leading_dims_that_do_not_coalesce(shape, perm, normalized):
    # one launch each way (they decomposed into ~20 ops), within float32 rounding of float64
    x = torch.randn(shape).permute(perm) * 3 + 1
    w, b = torch.randn(normalized), torch.randn(normalized)
    g = torch.randn(x.shape)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    want = torch.nn.functional.layer_norm(xd, normalized, wd, bd)
    want.backward(g.double())
    xn, wn, bn = (t.to(DEV).requires_grad_() for t in (x, w, b))
    eager_neuron.reset_stats()
    call = (xn, list(normalized), wn, bn, 1e-5)
    y = torch.ops.aten.native_layer_norm(*call)[0]
    assert eager_neuron.stats()["launches"] == 1
    values, runners = fastpath.TABLES[torch.ops.aten.native_layer_norm.default]
    assert fastpath.signature(call, {}, values) in runners
    _within(y, want.detach(), "out")
    y.backward(g.to(DEV))
    for name, t, ref in zip("xwb", (xn, wn, bn), (xd, wd, bd)):
        _within(t.grad, ref.grad, name)
    _no_fallback()
    assert not eager_neuron.stats()["decompositions"]
