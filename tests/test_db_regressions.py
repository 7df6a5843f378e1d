"""Failures found by running PyTorch's module_db and optim_db unbounded on neuron (every sample,
float32/float64, train/eval, plain and adaptive; every optimizer config with foreach, fused,
capturable, differentiable, param groups, state_dict round trips, LR schedulers), reduced to
one fast test each. Every test failed before its fix.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import eager_neuron


def _params(device, dtype=torch.float32):
    torch.manual_seed(0)
    w = torch.randn(4, 3, dtype=dtype).to(device).requires_grad_()
    b = torch.randn(4, dtype=dtype).to(device).requires_grad_()
    return [w, b]


def _train(cls, device, steps=4, **kw):
    params = _params(device)
    torch.manual_seed(1)
    x = torch.randn(5, 3).to(device)
    opt = cls(params, **kw)
    for _ in range(steps):
        opt.zero_grad()
        ((x @ params[0].t() + params[1]) ** 2).sum().backward()
        opt.step()
    return [p.detach().cpu() for p in params]


# -- foreach ops whose first argument is not a list --------------------------------------------

def test_foreach_pow_scalar_and_tensor():
    """`_foreach_pow.ScalarAndTensor(Scalar self, Tensor[] exponent)` (capturable Adam's
    `beta ** step`) leads with a number: the list length was read off that number (TypeError)."""
    steps = [torch.tensor(2.0), torch.tensor(3.0), torch.tensor([1.0, 4.0])]
    want = torch._foreach_pow(0.9, steps)
    got = torch._foreach_pow(0.9, [s.to("neuron") for s in steps])
    for g, w in zip(got, want):
        assert g.device.type == "neuron"
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_maximum_scalar_in_place():
    """`_foreach_maximum_.Scalar` (ASGD's capturable foreach step) looked up an aten
    `maximum_` packet that does not exist (AttributeError) before mapping it to clamp_min_."""
    def run(device):
        xs = [torch.tensor([0.5, 2.0, -1.0]).to(device), torch.tensor(3.0).to(device)]
        ys = [x.clone() for x in xs]
        torch._foreach_maximum_(xs, 1.0)
        torch._foreach_minimum_(ys, [1.0, 2.0])
        return [t.cpu() for t in xs + ys]
    for g, w in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("mode", ["plain", "adaptive"])
@pytest.mark.parametrize(("cls", "kw"), [
    (torch.optim.Adam, {}), (torch.optim.Adam, {"amsgrad": True}), (torch.optim.AdamW, {}),
    (torch.optim.ASGD, {}), (torch.optim.NAdam, {}), (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}),
], ids=lambda v: getattr(v, "__name__", None) or "-".join(v) or "default")
def test_capturable_foreach_matches_cpu(cls, kw, mode):
    """capturable=True with foreach=True: the state's `step` stays on the device and the
    bias corrections are foreach ops on it. The CPU refuses capturable, so its for-loop form is
    the reference (float32 `step` there too: the same roundings)."""
    want = _train(cls, "cpu", **kw)
    ctx = eager_neuron.adaptive() if mode == "adaptive" else eager_neuron.adaptive(False)
    with ctx:
        got = _train(cls, "neuron", capturable=True, foreach=True, **kw)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# -- layouts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("fmt", [torch.channels_last, torch.channels_last_3d])
def test_batch_norm_backward_keeps_channels_last(fmt, train):
    """native_batch_norm_backward's grad_input takes the input's suggested memory format on the
    CPU (empty_like(input, suggest_memory_format)); torch's meta function gave a contiguous one,
    so BatchNorm2d/3d's input gradient of a channels_last input had other strides."""
    shape = (2, 3, 4, 5) if fmt == torch.channels_last else (2, 3, 4, 5, 2)

    def run(device):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm2d(3) if len(shape) == 4 else torch.nn.BatchNorm3d(3)
        bn = bn.to(device).train(train)
        x = torch.randn(shape).to(memory_format=fmt).to(device).requires_grad_()
        g = torch.randn(shape).to(device)
        (gi,) = torch.autograd.grad(bn(x), x, g)
        return gi
    got, want = run("neuron"), run("cpu")
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


# -- lazy modules made on the device -----------------------------------------------------------

@pytest.mark.parametrize(("cls", "args", "shape"), [
    (torch.nn.LazyLinear, (4,), (2, 3)), (torch.nn.LazyConv2d, (4, 2), (1, 3, 5, 5)),
    (torch.nn.LazyBatchNorm1d, (), (4, 3)),
], ids=lambda v: getattr(v, "__name__", None) or str(v))
def test_lazy_module_factory_kwargs(cls, args, shape):
    """`nn.LazyLinear(4, device="neuron")` (module_db's factory-kwargs test): torch's
    UninitializedParameter/Buffer `_make_subclass` a `torch.empty(0, device=...)`, which a neuron
    tensor refuses (RuntimeError). They are made on the CPU remembering the device, and
    materialize there at the first forward, also after a deepcopy."""
    import copy

    torch.manual_seed(0)
    m = cls(*args, device="neuron", dtype=torch.float64)
    torch.manual_seed(0)
    ref = cls(*args, dtype=torch.float64)
    x = torch.randn(shape, dtype=torch.float64)
    twin = m if cls is torch.nn.LazyBatchNorm1d else copy.deepcopy(m)  # CPU refuses that copy
    torch.manual_seed(1)
    want = ref(x)
    for mod in (m, twin):
        torch.manual_seed(1)
        got = mod(x.to("neuron"))
        assert got.device.type == "neuron"
        for t in list(mod.parameters()) + list(mod.buffers()):
            assert t.device.type == "neuron" and t.dtype in (torch.float64, torch.int64)
        torch.testing.assert_close(got.cpu(), want)


def test_uninitialized_factory_arguments():
    p = torch.nn.UninitializedParameter(False, "neuron", torch.float64)
    b = torch.nn.UninitializedBuffer(device="neuron", persistent=False)
    assert not p.requires_grad and p.dtype == torch.float64 and not b.persistent
    p.materialize((2, 3))
    assert type(p) is not torch.nn.UninitializedParameter and p.device.type == "neuron"
    assert p.shape == (2, 3) and p.dtype == torch.float64


_A = torch.ops.aten
_CL = torch.channels_last
_ITERATED = {   # CPU TensorIterator over (first, second) tensor; torch's meta/decomposition not
    "copysign": torch.copysign, "xlogy": torch.xlogy, "floor_divide": torch.floor_divide,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "xlog1py": torch.special.xlog1py,
    "hardtanh_backward": lambda g, x: _A.hardtanh_backward(g, x, -0.5, 0.5),
    "softplus_backward": lambda g, x: _A.softplus_backward(g, x, 1, 20),
    "hardswish_backward": _A.hardswish_backward, "hardsigmoid_backward": _A.hardsigmoid_backward,
    "elu_backward": lambda g, x: _A.elu_backward(g, 1.0, 1, 1, False, x),
}


def _mixed(first_cl, device):
    torch.manual_seed(0)
    a, b = torch.rand(2, 4, 3, 5) + 0.5, torch.rand(2, 4, 3, 5) + 0.5
    if first_cl:
        return a.contiguous(memory_format=_CL).to(device), b.to(device)
    return a.to(device), b.contiguous(memory_format=_CL).to(device)


@pytest.mark.parametrize("first_cl", [False, True])
@pytest.mark.parametrize("name", sorted(_ITERATED))
def test_mixed_layout_results_as_cpu(name, first_cl):
    """A contiguous operand next to a channels_last one: the CPU's result follows its kernel's
    iteration order; torch's meta functions and decompositions of these ops are where()s led by
    another operand, so neuron's had the other layout (module_db: ELU's, Hardswish's input
    gradients of channels_last inputs)."""
    got = _ITERATED[name](*_mixed(first_cl, "neuron"))
    want = _ITERATED[name](*_mixed(first_cl, "cpu"))
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


_CONTIGUOUS = {   # the CPU makes these contiguous whatever the input's layout
    "mse_loss_backward": lambda g, x: _A.mse_loss_backward(g, x, x * 0.5, 0),
    "smooth_l1_loss_backward": lambda g, x: _A.smooth_l1_loss_backward(g, x, x * 0.5, 0, 1.0),
    "huber_loss_backward": lambda g, x: _A.huber_loss_backward(g, x, x * 0.5, 0, 1.0),
    "glu_backward": lambda g, x: _A.glu_backward(g[:, :2], x, 1),
}


@pytest.mark.parametrize("name", sorted(_CONTIGUOUS))
def test_gradients_of_channels_last_inputs_contiguous(name):
    """mse/smooth_l1/huber losses' backward (zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT))
    and glu_backward (an output resized from empty) are contiguous on the CPU for a
    channels_last input; neuron's kept the input's layout (module_db: MSELoss)."""
    got = _CONTIGUOUS[name](*_mixed(False, "neuron"))
    want = _CONTIGUOUS[name](*_mixed(False, "cpu"))
    assert want.is_contiguous() and got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


def test_fractional_max_pool3d_gradient_contiguous():
    """fractional_max_pool3d_backward's gradInput is contiguous on the CPU for a
    channels_last_3d input; the meta function kept the input's layout."""
    def run(device):
        torch.manual_seed(0)
        x = torch.randn(2, 3, 7, 7, 7).to(memory_format=torch.channels_last_3d)
        x = x.to(device).requires_grad_()
        pool = torch.nn.FractionalMaxPool3d(2, output_size=3,
                                            _random_samples=torch.rand(2, 3, 3).to(device))
        out = pool(x)
        return torch.autograd.grad(out, x, torch.ones_like(out))[0]
    got, want = run("neuron"), run("cpu")
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


# -- the rest of the foreach family ------------------------------------------------------------

def _lists(device):
    xs = [torch.tensor([0.3, 1.7, 2.2]), torch.tensor([[0.6, 1.1], [0.9, 1.4]])]
    ys = [torch.tensor([1.5, 0.5, 2.0]), torch.tensor([[2.0, 0.5], [1.0, 3.0]])]
    return [x.to(device) for x in xs], [y.to(device) for y in ys]


@pytest.mark.parametrize("ov", ["Scalar", "ScalarList", "List"])
def test_foreach_pow_in_place_runs_on_device(ov):
    """`_foreach_pow_` (ASGD's capturable foreach step: `_foreach_pow_(new_etas, alpha)`) ran
    as a CPU fallback: the in-place pow_ packet names its overloads Scalar/Tensor, not
    Tensor_Scalar/Tensor_Tensor as pow's."""
    def run(device):
        xs, es = _lists(device)
        exp = {"Scalar": 0.75, "ScalarList": [0.75, 1.5], "List": es}[ov]
        getattr(torch.ops.aten._foreach_pow_, ov)(xs, exp)
        return [x.cpu() for x in xs]
    eager_neuron.reset_stats()
    got = run("neuron")
    assert eager_neuron.stats()["fallbacks"] == {}
    for g, w in zip(got, run("cpu")):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", ["_foreach_sqrt.out", "_foreach_add.List_out",
                                  "_foreach_mul.Scalar_out", "_foreach_pow.ScalarList_out",
                                  "_foreach_lerp.Scalar_out", "_foreach_norm.Scalar_out"])
def test_foreach_out_overloads(name):
    """The `out=` overloads of the foreach ops (what functionalized graphs call) raised on
    neuron: the per-element op was called with the whole out list. They run the functional
    overload and copy into each out tensor (resized as the CPU resizes), one version bump each."""
    packet, ov = name.split(".")
    op = getattr(getattr(torch.ops.aten, packet), ov)
    extra = {"_foreach_sqrt": (), "_foreach_add": ("second",), "_foreach_mul": (2.0,),
             "_foreach_pow": ([0.5, 2.0],), "_foreach_lerp": ("second", 0.25),
             "_foreach_norm": (2,)}[packet]

    def run(device):
        xs, ys = _lists(device)
        args = [xs] + [ys if a == "second" else a for a in extra]
        outs = [torch.zeros(3).to(device), torch.zeros(2, 2).to(device)]
        before = [o._version for o in outs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # norm's 0-d results resize the outs
            op(*args, out=outs)
        return [o.cpu() for o in outs], [o._version - v for o, v in zip(outs, before)]
    (got, gv), (want, wv) = run("neuron"), run("cpu")
    assert gv == wv
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_foreach_in_place_versions_under_neuron_mode():
    """Under NeuronMode (CPU tensors through the device's kernels) a foreach in-place op left
    the version counters alone (the CPU bumps each written tensor once), so autograd could not
    see an optimizer step change a saved tensor."""
    xs, ys = _lists("cpu")
    before = [x._version for x in xs]
    with eager_neuron.NeuronMode():
        torch._foreach_mul_(xs, 2.0)
    assert [x._version - v for x, v in zip(xs, before)] == [1, 1]
    w = torch.ones(3, requires_grad=True)
    p = torch.tensor([1.0, 2.0, 3.0])
    loss = (w * p).sum()              # saves p
    with eager_neuron.NeuronMode():
        torch._foreach_add_([p], [torch.ones(3)])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4, 5, 6), (2, 3, 4, 5, 2)])
def test_padding_gradient_keeps_channels_last(mode, shape):
    """reflection/replication padding's backward makes grad_input as
    zeros_like(input, input.suggest_memory_format()); neuron's was contiguous for a
    channels_last(_3d) input (module_db: ReflectionPad3d/ReplicationPad3d in channels_last)."""
    pad = (1, 1, 1, 1) if shape == (2, 3, 4, 5) else (1, 1, 1, 1, 1, 1)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d

    def run(device):
        torch.manual_seed(0)
        x = torch.randn(shape).contiguous(memory_format=fmt).to(device).requires_grad_()
        out = torch.nn.functional.pad(x, pad, mode=mode)
        g = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape).to(device)
        return torch.autograd.grad(out, x, g)[0]
    got, want = run("neuron"), run("cpu")
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


def test_fractional_max_pool_sample_dtype_refused_as_cpu(strict_fallback):
    """float64 `_random_samples` with a float32 input: the CPU raises RuntimeError ("Expect
    _random_samples to have the same dtype as input"); neuron's kernel declined with
    NotImplementedError, so only a CPU fallback gave the CPU's error and
    EAGER_NEURON_FALLBACK=error raised another type."""
    for device in ("cpu", "neuron"):
        x = torch.randn(1, 3, 5, 5, 5).to(device)
        rs = torch.rand(1, 3, 3, dtype=torch.float64).to(device)
        with pytest.raises(RuntimeError, match="same dtype as input"):
            torch.nn.functional.fractional_max_pool3d(x, 2, output_size=3, _random_samples=rs)


def test_log_softmax_backward_is_contiguous_as_the_cpus():
    """The CPU's `_log_softmax_backward_data` is contiguous whatever its gradient's layout;
    neuron's followed a channels_last gradient (softmax's backward already matched)."""
    got = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        g = torch.randn(2, 3, 4, 5).to(device).contiguous(memory_format=torch.channels_last)
        out = torch.log_softmax(torch.randn(2, 3, 4, 5).to(device), 1)
        out = out.contiguous(memory_format=torch.channels_last)
        got[device] = torch.ops.aten._log_softmax_backward_data(g, out, 1, torch.float32)
    assert got["neuron"].stride() == got["cpu"].stride()
    torch.testing.assert_close(got["neuron"].cpu(), got["cpu"], rtol=1e-6, atol=1e-6)
