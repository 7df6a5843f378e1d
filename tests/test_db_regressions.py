"""Failures found by running PyTorch's module_db and optim_db unbounded on neuron (every sample,
float32/float64, train/eval, plain and adaptive; every optimizer config with foreach, fused,
capturable, differentiable, param groups, state_dict round trips, LR schedulers), reduced to
one fast test each. Every test failed before its fix.
"""

from __future__ import annotations

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
