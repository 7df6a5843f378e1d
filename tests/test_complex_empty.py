"""Complex prod over an empty dim is 1 (it raised "cannot reshape tensor of 0 elements"); scans
of an empty tensor are empty (lower/complex_reduce.py prod)."""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device


@pytest.mark.parametrize("dt", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("shape, kw", [((0, 3), {"dim": 0}), ((0, 3), {"dim": 0, "keepdim": True}),
                                       ((0,), {}), ((2, 0, 3), {"dim": 1}),
                                       ((2, 0, 3), {"dim": 2})])
def test_complex_prod_of_empty(dt, shape, kw):
    x = torch.zeros(shape, dtype=dt)
    ours = torch.prod(x.to("neuron"), **kw).cpu()
    want_shape = torch.prod(torch.zeros(shape), **kw).shape
    assert ours.dtype == dt and ours.shape == want_shape
    assert (ours == 1).all()
    assert torch.cumprod(x.to("neuron"), -1).shape == x.shape
