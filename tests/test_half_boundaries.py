"""Branch boundaries of elementwise backward formulas that half inputs hit exactly (bf16/fp16
values land on 3.0): hardswish_backward is 0 from x <= -3 and grad_output from x >= 3, as the
CPU's kernel (Activation.cpp) branches. Exact references at and outside the boundaries; inside,
the float64 formula within a few ulps of the dtype (lower/elementwise_ops.py)."""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16])
def test_hardswish_backward_boundaries(dt):
    x = torch.tensor([-4.0, -3.0, -2.5, 0.0, 1.0, 2.5, 3.0, 3.5], dtype=dt)
    g = torch.tensor([1.5, -2.0, 0.75, 1.25, -0.5, 3.0, -1.125, 2.0], dtype=dt)
    ours = torch.ops.aten.hardswish_backward(g.to("neuron"), x.to("neuron")).cpu()
    x64, g64 = x.double(), g.double()
    exact = torch.where(x64 <= -3, 0.0, torch.where(x64 >= 3, g64, g64 * (x64 / 3 + 0.5)))
    edge = (x64 <= -3) | (x64 >= 3)
    assert torch.equal(ours[edge].double(), exact[edge])   # 0 or grad_output, exactly
    ulp = torch.finfo(dt).eps * exact[~edge].abs().clamp_min(torch.finfo(dt).tiny)
    assert ((ours[~edge].double() - exact[~edge]).abs() <= 2 * ulp).all()
