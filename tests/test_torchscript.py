"""TorchScript modules on neuron: `torch.jit.trace(model, x).to("neuron")` moves the weights
(they live in C++ slots, which Module._apply's swap_tensors did not reach: every weight stayed
on the CPU, silently), the traced graph's backend-selecting `aten::_convolution` runs as
neuron's convolution (it was a CPU fallback), forward and backward equal the CPU's, and the
module moves back and forth."""

from __future__ import annotations

import pytest
import torch

import eager_neuron

N = "neuron"
# float32 sums of at most 36 products: a dtype-derived bound for neuron's and the CPU's orders
TOL = dict(rtol=4 * 36 * torch.finfo(torch.float32).eps, atol=1e-5)


def _model(kind):
    torch.manual_seed(0)
    if kind == "conv":
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1),
                                   torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    if kind == "conv_transpose":
        return torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))


@pytest.mark.parametrize("kind", ["conv", "conv_transpose", "mlp"])
def test_a_traced_module_moves_to_neuron_and_runs_there(kind):
    m = _model(kind).eval()
    x = torch.randint(-3, 4, (2, 3, 8, 8) if kind != "mlp" else (2, 8)).float()
    traced = torch.jit.trace(m, x)
    ref = traced(x)
    xc = x.clone().requires_grad_()
    traced(xc).sum().backward()
    tn = traced.to(N)
    assert all(p.device.type == N for p in tn.parameters())
    assert all(b.device.type == N for b in tn.buffers())
    eager_neuron.reset_stats()
    xn = x.to(N).requires_grad_()
    got = tn(xn)
    got.sum().backward()
    assert eager_neuron.stats()["fallbacks"] == {}
    assert got.device.type == N and got.stride() == ref.stride()
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), **TOL)
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, **TOL)
    back = tn.cpu()
    assert all(p.device.type == "cpu" for p in back.parameters())
    torch.testing.assert_close(back(x), ref.detach(), **TOL)


@pytest.mark.parametrize("where", ["neuron", "neuron:0", torch.device("neuron")], ids=str)
def test_jit_load_with_map_location_neuron(where):
    import io

    m = _model("mlp").eval()
    x = torch.randint(-3, 4, (2, 8)).float()
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(m, x), buf)
    buf.seek(0)
    loaded = torch.jit.load(buf, map_location=where)
    assert all(p.device.type == N and p.shape == q.shape
               for p, q in zip(loaded.parameters(), m.parameters()))
    torch.testing.assert_close(loaded(x.to(N)).cpu(), m(x).detach(), **TOL)


def test_a_saved_parameter_loads_as_a_parameter():
    # torch.save of a whole neuron module, torch.export.save: the weights came back as plain
    # tensors (isinstance(w, nn.Parameter) False; torch.export.load's verifier refused them)
    import io

    m = _model("mlp").to(N)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    m2 = torch.load(buf, weights_only=False)
    for p, q in zip(m2.parameters(), m.parameters()):
        assert isinstance(p, torch.nn.Parameter) and p.device.type == N and p.requires_grad
        assert torch.equal(p.cpu(), q.cpu())
    x = torch.randn(2, 8).to(N)
    ep = torch.export.export(m, (x,))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.export.load(buf).module()(x).cpu(), m(x).detach().cpu())
