"""Complex logcumsumexp on neuron against complex128 references with dtype-derived bounds
(lower/complex_reduce.py, kernels/complex.py render_scan). The backward (PyTorch's formula
over complex ops) is covered by the OpInfo sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

EPS = {torch.complex64: 2.0 ** -24, torch.complex128: 2.0 ** -53}


@pytest.mark.parametrize("dt", list(EPS))
def test_complex_logcumsumexp_matches_complex128(dt):
    g = torch.Generator().manual_seed(0)
    x = torch.complex(torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)).to(dt)
    for dim in (0, 1, -1):
        ours = torch.logcumsumexp(x.to("neuron"), dim).cpu()
        assert ours.dtype == dt
        ref = np.log(np.cumsum(np.exp(x.numpy().astype(np.complex128)), axis=dim))
        # the imaginary part is an angle: compare exp of both (no 2*pi ambiguity)
        err = np.abs(np.exp(ours.numpy().astype(np.complex128)) - np.exp(ref))
        bound = 64 * EPS[dt] * np.abs(np.exp(ref)) * x.shape[dim]
        assert (err <= bound + 64 * EPS[dt]).all(), (dim, err.max())


def test_complex_logcumsumexp_large_real_parts_do_not_overflow():
    # exp(800) overflows complex128: the factored form stays finite
    x = torch.tensor([800 + 1j, 799 - 2j, -5 + 0.5j], dtype=torch.complex64)
    ours = torch.logcumsumexp(x.to("neuron"), 0).cpu().numpy().astype(np.complex128)
    z = x.numpy().astype(np.complex128) - 800
    ref = np.log(np.cumsum(np.exp(z))) + 800
    assert np.isfinite(ours).all()
    err = np.abs(np.exp(ours - 800) - np.exp(ref - 800))
    assert (err <= 64 * EPS[torch.complex64] * 800 * np.abs(np.exp(ref - 800))).all()
