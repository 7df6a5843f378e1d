"""Complex symmetric LDL^T (linalg.ldl_factor / ldl_solve, hermitian=False) on neuron: LAPACK's
zsytf2/zsytrs (kernels/linalg_complex.py), judged by the solve's residual against complex128
with an eps-derived bound, and by the pivots (the CPU's LAPACK picks them by the same
|re| + |im| rule, so they are integers we can compare exactly)."""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

EPS = {torch.complex64: 2.0 ** -24, torch.complex128: 2.0 ** -53}


def _sym(n, dt, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.complex(torch.randn(2, n, n, generator=g), torch.randn(2, n, n, generator=g))
    return (a + a.transpose(-2, -1)).to(dt)   # symmetric, not Hermitian


@pytest.mark.parametrize("dt", list(EPS))
def test_complex_ldl_solve_residual(dt):
    for n, seed in ((1, 0), (4, 1), (7, 2)):
        a = _sym(n, dt, seed)
        b = torch.complex(torch.randn(2, n, 3), torch.randn(2, n, 3)).to(dt)
        ld, piv = torch.linalg.ldl_factor(a.to("neuron"))
        x = torch.linalg.ldl_solve(ld, piv, b.to("neuron")).cpu().to(torch.complex128)
        a64, b64 = a.to(torch.complex128), b.to(torch.complex128)
        res = (a64 @ x - b64).abs().max()
        scale = a64.abs().max() * x.abs().max() + b64.abs().max()
        cond = torch.linalg.cond(a64).max()
        assert res <= 64 * n * EPS[dt] * scale * max(1.0, float(cond)) ** 0.5, (n, res)
        # pivots: integers chosen by the same rule as LAPACK's
        _, piv_cpu = torch.linalg.ldl_factor(a)
        assert torch.equal(piv.cpu(), piv_cpu), n


def test_complex_ldl_factor_reconstructs_a():
    a = _sym(5, torch.complex128, 3)[0]
    ld, piv = torch.linalg.ldl_factor(a.to("neuron"))
    ld = ld.cpu()
    # the strictly-upper part is zero and the factor solves A: A @ solve(I) = I
    assert (ld.triu(1) == 0).all()
    eye = torch.eye(5, dtype=torch.complex128)
    inv = torch.linalg.ldl_solve(ld.to("neuron"), piv, eye.to("neuron")).cpu()
    assert (a @ inv - eye).abs().max() < 1e3 * EPS[torch.complex128] * a.abs().max() * \
        inv.abs().max()
