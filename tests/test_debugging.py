"""Debugging as on the CPU: print and .item() mid-forward, Python control flow on tensor values,
.tolist() and bool(). Each test runs in plain eager and under adaptive eager, where every one
of these reads must flush the pending work first (and the printed values must be current).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn

import eager_neuron


@pytest.fixture(params=["plain", "adaptive"])
def mode(request):
    """Runs the test body in plain eager, then again under adaptive eager."""
    if request.param == "plain":
        yield contextlib.nullcontext
    else:
        adaptive = getattr(eager_neuron, "adaptive", None)
        if adaptive is None:
            pytest.skip("adaptive eager not built yet")
        yield adaptive


class Inspected(nn.Module):
    """A forward with a 'breakpoint' in the middle: repr() and .item() of an intermediate."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list = []

    def forward(self, x):
        h = torch.relu(self.lin(x)) * 2 + 1
        print("h =", repr(h))               # what a user types at a breakpoint
        self.seen.append((repr(h), h.sum().item(), h[0, 0].item()))
        return (h - 1).mean()


def test_repr_and_item_mid_forward(capsys, mode):
    torch.manual_seed(0)
    m = Inspected()
    x = torch.randn(2, 4)
    ref = m(x)
    ref_text, ref_sum, ref_first = m.seen[0]
    m.to("neuron")
    with mode():
        out = m(x.to("neuron"))
        text, total, first = m.seen[1]
        printed = capsys.readouterr().out
        assert "device='neuron:0'" in text
        assert "device='neuron:0'" in printed
        assert "grad_fn=" in text
        assert isinstance(total, float) and isinstance(first, float)
        assert total == pytest.approx(ref_sum, rel=1e-5)
        assert first == pytest.approx(ref_first, rel=1e-5)
        # the printed numbers are the CPU's numbers, and only the device is added
        assert text.replace("device='neuron:0', ", "") == ref_text
    assert out.item() == pytest.approx(ref.item(), rel=1e-5)


def test_repr_formats_like_cpu(mode):
    x = torch.tensor([[1.5, -2.0], [0.25, 3.0]])
    with mode():
        xn = x.to("neuron") * 1
        assert repr(xn) == "tensor([[ 1.5000, -2.0000],\n        [ 0.2500,  3.0000]], " \
                           "device='neuron:0')"
        i = torch.arange(3, device="neuron") + 1
        assert repr(i) == "tensor([1, 2, 3], device='neuron:0')"
        b = xn > 0
        assert repr(b) == "tensor([[ True, False],\n        [ True,  True]], device='neuron:0')"


def test_repr_device_before_dtype_like_cuda():
    # torch prints "tensor([...], device='cuda:0', dtype=torch.bfloat16)"
    x = torch.tensor([1.5, -2.0], device="neuron").to(torch.bfloat16)
    assert repr(x) == "tensor([ 1.5000, -2.0000], device='neuron:0', dtype=torch.bfloat16)"


def test_data_dependent_if_and_while(mode):
    def algo(x):
        steps = 0
        while x.abs().max() > 1:            # bool(tensor) each iteration
            x = x / 2
            steps += 1
        if x.sum() > 0:
            x = x + 1
        else:
            x = x - 1
        return x, steps

    x = torch.tensor([7.0, -3.0, 2.5])
    ref, ref_steps = algo(x)
    with mode():
        out, steps = algo(x.to("neuron"))
        assert steps == ref_steps == 3
        torch.testing.assert_close(out.cpu(), ref)


def test_tolist_bool_int_float(mode):
    with mode():
        x = torch.tensor([[1.0, 2.0], [3.0, 4.5]], device="neuron") * 2
        assert x.tolist() == [[2.0, 4.0], [6.0, 9.0]]
        assert (x[0] + 1).tolist() == [3.0, 5.0]
        assert torch.arange(4, device="neuron").add(1).tolist() == [1, 2, 3, 4]
        assert bool(x.sum() > 20) is True
        assert bool((x < 0).any()) is False
        assert int(x[1, 1]) == 9 and float(x[0, 0]) == 2.0
        assert x[1, 0].item() == 6.0
        with pytest.raises(RuntimeError, match="ambiguous"):
            bool(x > 1)
        assert (x > 3).sum().item() == 3


def test_numpy_needs_cpu_first():
    x = torch.ones(2, device="neuron")
    with pytest.raises(TypeError, match="cpu"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0]


def test_values_current_after_inplace(mode):
    with mode():
        x = torch.zeros(3, device="neuron")
        for i in range(3):
            x.add_(1)
            assert x[0].item() == i + 1     # every read sees every write before it
        y = x * 2
        x.fill_(0)
        assert y.tolist() == [6.0, 6.0, 6.0] and x.tolist() == [0.0, 0.0, 0.0]


def test_bfloat16_chain_values_current(mode):
    # bf16 -> f32 -> op -> bf16: the float32 temporary is read back through an int32 view
    x = torch.randn(16).bfloat16()
    with mode():
        y = x.to("neuron")
        out = (y.float() * 2 + 1).bfloat16()
        assert torch.equal(out.cpu(), (x.float() * 2 + 1).bfloat16())
        assert torch.equal(torch.deg2rad(y).cpu(), torch.deg2rad(x))
