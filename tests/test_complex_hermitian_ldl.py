"""Complex Hermitian LDL^H (linalg.ldl_factor / ldl_solve, hermitian=True) on neuron (was the CPU
fallback): LAPACK's zhetf2/zhetrs (kernels/linalg_complex.py), judged by the solve's residual
against complex128 with an eps-derived bound, by the pivots (integers LAPACK picks by the same
rule) and by the factor's structure (real diagonal of D, zero strict upper triangle)."""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

EPS = {torch.complex64: 2.0 ** -24, torch.complex128: 2.0 ** -53}


def _herm(n, dt, seed, small_diag=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.complex(torch.randn(2, n, n, generator=g), torch.randn(2, n, n, generator=g))
    a = a + a.mH   # Hermitian, indefinite
    if small_diag:   # |a_kk| << |a_ik|: Bunch-Kaufman takes 2x2 pivots
        a.diagonal(dim1=-2, dim2=-1).mul_(0.01)
    return a.to(dt)


def _check_solve(a, ld, piv, b, dt):
    n = a.shape[-1]
    x = torch.linalg.ldl_solve(ld, piv, b.to("neuron"), hermitian=True).cpu()
    x = x.to(torch.complex128)
    a64, b64 = a.to(torch.complex128), b.to(torch.complex128)
    # LAPACK reads the lower triangle and the real part of the diagonal
    a64 = a64.tril(-1) + a64.tril(-1).mH + torch.diag_embed(a64.diagonal(0, -2, -1).real)
    res = (a64 @ x - b64).abs().max()
    scale = a64.abs().max() * x.abs().max() + b64.abs().max()
    cond = float(torch.linalg.cond(a64).max())
    assert res <= 64 * n * EPS[dt] * scale * max(1.0, cond) ** 0.5, (n, float(res))


@pytest.mark.parametrize("dt", list(EPS))
def test_hermitian_ldl_solve_residual_and_pivots(dt):
    saw_2x2 = False
    before = eager_neuron.stats()["fallbacks"]
    for n, seed, small in ((1, 0, False), (4, 1, False), (6, 2, True), (7, 3, True)):
        a = _herm(n, dt, seed, small)
        b = torch.complex(torch.randn(2, n, 3), torch.randn(2, n, 3)).to(dt)
        ld, piv = torch.linalg.ldl_factor(a.to("neuron"), hermitian=True)
        _check_solve(a, ld, piv, b, dt)
        _, piv_cpu = torch.linalg.ldl_factor(a, hermitian=True)
        assert torch.equal(piv.cpu(), piv_cpu), n
        saw_2x2 |= bool((piv_cpu < 0).any())
        ld = ld.cpu()
        assert (ld.triu(1) == 0).all()
    assert saw_2x2   # the 2x2-pivot paths ran
    assert eager_neuron.stats()["fallbacks"] == before   # on neuron, not the CPU


def test_hermitian_ldl_ignores_the_diagonals_imaginary_part():
    a = _herm(5, torch.complex128, 4)
    a.diagonal(dim1=-2, dim2=-1).imag.fill_(3.0)   # not Hermitian: LAPACK ignores it
    ld, piv = torch.linalg.ldl_factor(a.to("neuron"), hermitian=True)
    b = torch.randn(2, 5, 2, dtype=torch.complex128)
    _check_solve(a, ld, piv, b, torch.complex128)
    ld = ld.cpu()
    one_by_one = piv > 0   # 1x1 blocks of D: real on the diagonal
    assert (ld.diagonal(0, -2, -1).imag[one_by_one] == 0).all()
