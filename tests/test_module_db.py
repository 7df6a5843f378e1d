"""PyTorch's own module database (module_db) as an oracle: each nn module's samples run forward
and backward on neuron and on the CPU from the same weights and inputs; outputs, input
gradients and parameter gradients must agree (rtol = atol = 1e-4, float32).

Bounded by default (the first sample of every module); EAGER_NEURON_MODULE_DB=N runs the first
N samples of each (PyTorch's list has ~400). Strict xfails: an entry that starts passing fails
the suite, so the list only shrinks.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import eager_neuron

common_modules = pytest.importorskip("torch.testing._internal.common_modules")

SAMPLES = int(os.environ.get("EAGER_NEURON_MODULE_DB", "1"))
# module name (every sample) or "name-k" (sample k) -> reason
XFAIL: dict = {}
# modules whose ops still run as CPU fallbacks (counted, allowed here; see the issue tracker)
FALLBACK_OK = {"CTCLoss", "Transformer", "TransformerEncoder", "TransformerEncoderLayer",
               "TransformerDecoderLayer", "MultiheadAttention"}


def _cases():
    for info in common_modules.module_db:
        name = info.module_cls.__name__
        for k in range(SAMPLES):
            reason = XFAIL.get(name) or XFAIL.get(f"{name}-{k}")
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            yield pytest.param(info, k, id=f"{name}-{k}", marks=marks)


def _cpu(x, memo=None):
    """CPU copies of the sample's tensors; one tensor passed twice stays one tensor (KLDivLoss's
    scalar samples are `m(x, x)`: two copies would get two separate gradients)."""
    memo = {} if memo is None else memo

    def one(t):
        if isinstance(t, torch.Tensor):
            if id(t) not in memo:
                memo[id(t)] = t.detach().cpu().requires_grad_(t.requires_grad)
            return memo[id(t)]
        if isinstance(t, torch.nn.Module):          # TransformerEncoder(layer, ...)
            return copy.deepcopy(t).cpu()
        return t
    return tree_map(one, x)


def _unique(ts):
    seen: set = set()
    return [t for t in ts if not (id(t) in seen or seen.add(id(t)))]


def _tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _samples(info, device: str) -> list:
    """The module's float32 training samples that have a forward input, made on `device`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        inputs = info.module_inputs_func(info, device=device, dtype=torch.float32,
                                         requires_grad=True, training=True)
    return [mi for mi in inputs if mi.forward_input is not None]


@pytest.mark.parametrize(("info", "k"), list(_cases()))
def test_module_matches_cpu(info, k):
    inputs = _samples(info, "neuron")
    if k >= len(inputs):
        pytest.skip(f"{info.module_cls.__name__} has {len(inputs)} samples")
    mi = inputs[k]
    c_args, c_kw = _cpu(mi.constructor_input.args), _cpu(mi.constructor_input.kwargs)
    if "device" in c_kw:
        c_kw["device"] = "cpu"
    torch.manual_seed(0)
    ref = info.module_cls(*c_args, **c_kw)
    dev = copy.deepcopy(ref).to("neuron")
    if isinstance(getattr(ref, "_random_samples", None), torch.Tensor):
        dev._random_samples = ref._random_samples.to("neuron")    # a plain attribute
    f_args, f_kw = mi.forward_input.args, mi.forward_input.kwargs
    memo: dict = {}
    r_args, r_kw = _cpu(f_args, memo), _cpu(f_kw, memo)
    torch.manual_seed(1)
    try:
        want = ref(*r_args, **r_kw)
    except Exception as exc:             # an invalid sample for float32: neuron must refuse too
        with pytest.raises(type(exc)):
            dev(*f_args, **f_kw)
        return
    eager_neuron.reset_stats()
    torch.manual_seed(1)
    out = dev(*f_args, **f_kw)
    outs, wants = _tensors(out), _tensors(want)
    assert len(outs) == len(wants)
    for o, w in zip(outs, wants):
        assert o.device.type == "neuron" and o.shape == w.shape and o.dtype == w.dtype
        torch.testing.assert_close(o.detach().cpu(), w.detach(), rtol=1e-4, atol=1e-4,
                                   equal_nan=True)
    # backward: the same cotangent through both; gradients of every input and parameter
    diff = [i for i, (o, w) in enumerate(zip(outs, wants))
            if o.requires_grad and w.requires_grad and o.is_floating_point()]
    if diff:
        torch.manual_seed(2)
        cots = [torch.randn(wants[i].shape, dtype=wants[i].dtype) for i in diff]
        d_in = _unique([t for t in _tensors((f_args, f_kw)) if t.requires_grad]) + list(
            dev.parameters())
        r_in = _unique([t for t in _tensors((r_args, r_kw)) if t.requires_grad]) + list(
            ref.parameters())
        got_g = torch.autograd.grad([outs[i] for i in diff], d_in,
                                    [c.to("neuron") for c in cots], allow_unused=True)
        want_g = torch.autograd.grad([wants[i] for i in diff], r_in, cots, allow_unused=True)
        for g, w in zip(got_g, want_g):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4, equal_nan=True)
    if info.module_cls.__name__ not in FALLBACK_OK:
        assert eager_neuron.stats()["fallbacks"] == {}


def _channels_last_cases():
    for info in common_modules.module_db:
        yield pytest.param(info, id=info.module_cls.__name__)


@pytest.mark.parametrize("info", list(_channels_last_cases()))
def test_channels_last_matches_cpu(info):
    """The first sample with its 4-d/5-d tensors in channels_last(_3d) layout: outputs and input
    and parameter gradients as the CPU's, values and strides (a backward's layout is its
    kernel's: BatchNorm keeps channels_last, MSELoss's and ELU's gradients do not)."""
    inputs = _samples(info, "cpu")
    dims = {t.dim() for t in _tensors(inputs[0].forward_input.args)} if inputs else set()
    if not dims & {4, 5}:
        pytest.skip("no 4-d or 5-d input")
    mi = inputs[0]

    def layout(t):
        if not isinstance(t, torch.Tensor):
            return t
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
        out = t.detach().contiguous(memory_format=fmt) if fmt else t.detach().clone()
        return out.requires_grad_(t.requires_grad)

    def run(device):
        torch.manual_seed(0)
        m = info.module_cls(*_cpu(mi.constructor_input.args),
                            **_cpu(mi.constructor_input.kwargs)).to(device)
        if isinstance(getattr(m, "_random_samples", None), torch.Tensor):
            m._random_samples = m._random_samples.to(device)
        memo: dict = {}
        args = tree_map(layout, _cpu(mi.forward_input.args, memo))
        args = tree_map(lambda t: t.to(device).detach().requires_grad_(t.requires_grad)
                        if isinstance(t, torch.Tensor) else t, args)
        torch.manual_seed(1)
        if issubclass(info.module_cls, torch.nn.modules.lazy.LazyModuleMixin):
            m(*args)
        outs = [o for o in _tensors(m(*args)) if o.requires_grad and o.is_floating_point()]
        ins = _unique([t for t in _tensors(args) if t.requires_grad]) + list(m.parameters())
        torch.manual_seed(2)
        cots = [torch.randn(o.shape).to(device) for o in outs]
        grads = torch.autograd.grad(outs, ins, cots, allow_unused=True) if outs else []
        return outs, [g for g in grads if g is not None]

    try:
        w_out, w_grad = run("cpu")
    except Exception as exc:        # an invalid sample (float64 random samples): refused alike
        with pytest.raises(type(exc)):
            run("neuron")
        return
    g_out, g_grad = run("neuron")
    for g, w in zip(g_out + g_grad, w_out + w_grad):
        assert g.shape == w.shape and (g.stride() == w.stride() or g.numel() <= 1)
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=1e-4, atol=1e-4,
                                   equal_nan=True)
