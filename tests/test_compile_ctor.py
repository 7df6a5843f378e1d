"""Tensors a compiled program makes without a kernel: `torch.tensor(data, device="neuron")`
inside a compiled region (HF's DynamicCache starts from `torch.tensor([])` on the device), traced
as a CPU constant moved to the device by the program; and views, made from the host data.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - the neuron device and backend
from eager_neuron.compile import stats as cstats

pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


def _ctor_fn(x, scale):
    t = torch.tensor([1.0, -2.0, 3.5], device="neuron")
    s = torch.tensor(scale, device=x.device)                       # a 0-d tensor from a float
    i = torch.tensor([[1, 2, 3]], device="neuron", dtype=torch.int64)
    empty = torch.tensor([], device="neuron")                      # DynamicCache's start
    return x * t + s * i + empty.numel(), torch.cat([empty, t])


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "neuron"])
def test_tensor_ctor_in_a_traced_region_equals_eager(backend):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("neuron")
    want = _ctor_fn(x, 0.5)
    f = torch.compile(_ctor_fn, backend=backend, fullgraph=True)
    got = f(x, 0.5)
    for g, w in zip(got, want):
        assert g.device.type == "neuron" and g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w.cpu())          # exact: small integers and halves
    # another Python value is another constant (dynamo guards on it), never a stale one
    got = f(x, -4.0)
    assert torch.equal(got[0].cpu(), _ctor_fn(x, -4.0)[0].cpu())


def test_tensor_ctor_runs_as_a_device_copy_in_the_program():
    before = cstats()
    copies = before["graph_eager_ops"].get("aten::_to_copy", 0)
    f = torch.compile(lambda x: x + torch.tensor([2.0, 4.0], device="neuron"), backend="neuron")
    out = f(torch.ones(2, device="neuron"))
    assert out.cpu().tolist() == [3.0, 5.0]
    after = cstats()
    assert after["graph_fallbacks"] == before["graph_fallbacks"]    # compiled, not replayed
    assert after["graph_eager_ops"].get("aten::_to_copy", 0) > copies


def test_tensor_ctor_under_export():
    class M(torch.nn.Module):
        def forward(self, x):
            return x * torch.tensor([3.0, 5.0], device="neuron")

    x = torch.ones(4, 2, device="neuron")
    ep = torch.export.export(M(), (x,), strict=True)
    assert torch.equal(ep.module()(x).cpu(), torch.tensor([[3.0, 5.0]] * 4))


# -- views in a program: made from the host data, without dispatch ----------------------------

def _views(x, w):
    a = x.t().unsqueeze(0).expand(2, -1, -1)          # t, unsqueeze, expand
    b = x.view(3, 4)[1:, ::2].permute(1, 0)           # view, slice (step 2), permute
    c = x.transpose(0, 1).select(1, 2)                 # a strided pick
    return (a * 2).sum(0) @ w, b + 1, c.detach(), x.view(-1)   # (the last aliases the input)


def test_views_in_a_program_equal_eager():
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3).to("neuron")
    # halves (linspace(-1, 1, 8) has steps of 2/7: its products round, and the order of the
    # matmul's sums then decides the last bit)
    w = ((torch.arange(8, dtype=torch.float32) - 4) / 2).reshape(4, 2).to("neuron")
    f = torch.compile(_views, backend="neuron")
    f(x, w)      # (AOTAutograd's first call runs under its custom-op checking mode: dispatch)
    before = cstats()["graph_views"]
    got = f(x, w)
    want = _views(x, w)
    assert cstats()["graph_views"] > before
    for g, e in zip(got, want):
        assert g.shape == e.shape and g.stride() == e.stride()
        assert torch.equal(g.cpu(), e.cpu())      # exact: small integers times halves
    # the aliasing output is a view of the input (AOTAutograd regenerates it from x)
    assert got[3].data_ptr() == x.data_ptr()


def test_views_under_a_dispatch_mode_go_through_dispatch():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("neuron")
    f = torch.compile(lambda x: x.t() + 1, backend="neuron")
    f(x)                                  # compiled outside the mode
    with Log():
        out = f(x)
    assert torch.ops.aten.t.default in seen      # the mode saw the view
    assert torch.equal(out.cpu(), x.cpu().t() + 1)
