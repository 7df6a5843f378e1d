"""Special functions on neuron (lower/special.py, kernels/special.py, kernels/bessel.py) against
the CPU: Bessel J/Y, modified Bessel I/K (plain and scaled), Airy Ai, erfcx, log_ndtr, igamma
and igammac, over wide sweeps with the edge values (0, -0, +-inf, nan, the branch points of each
approximation), in float32 and float64, from int64 and bool inputs, igamma in bfloat16
(the CPU has no bfloat16 kernel for the others); and every call
runs a kernel (no CPU fallback).
"""

from __future__ import annotations

import math

import pytest
import scipy.special as sp
import torch

import eager_neuron  # noqa: F401  (registers the device)
from eager_neuron.stats import STATS

S = torch.special
UNARY = {
    "airy_ai": S.airy_ai, "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1,
    "modified_bessel_i0": S.modified_bessel_i0, "modified_bessel_i1": S.modified_bessel_i1,
    "modified_bessel_k0": S.modified_bessel_k0, "modified_bessel_k1": S.modified_bessel_k1,
    "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
    "erfcx": S.erfcx, "log_ndtr": S.log_ndtr,
}
# (atol, rtol): OpInfo's defaults for the dtype
TOL = {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}
EDGES = [0.0, -0.0, 1.0, -1.0, 1e-6, -1e-6, 2.0, -2.0, 2.09, -2.09, 5.0, -5.0, 8.0, -8.0,
         -6.1, -6.2, 26.0, 26.7, -26.7, -27.0, 50.0, 51.0, 5e7, 6e7, 103.89, 104.0, 1e30, -1e30,
         math.inf, -math.inf, math.nan]


def _sweep(dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(1500, generator=g, dtype=dtype) * 4,
                      (torch.rand(500, generator=g, dtype=dtype) - 0.5) * 200,
                      torch.logspace(-20, 20, 200, dtype=dtype),
                      -torch.logspace(-20, 20, 200, dtype=dtype),
                      torch.tensor(EDGES, dtype=dtype)])


def _assert_matches(actual, expected, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)


@pytest.fixture
def no_fallback():
    before = dict(STATS.fallbacks)
    launches = STATS.launches
    yield
    assert dict(STATS.fallbacks) == before, "a special function ran on the CPU"
    assert STATS.launches > launches


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32_matches_cpu(name, no_fallback):
    f = UNARY[name]
    x = _sweep(torch.float32)
    _assert_matches(f(x.to("neuron")), f(x), torch.float32)


@pytest.mark.parametrize("name", ["bessel_j0", "bessel_y1", "modified_bessel_k1", "airy_ai",
                                  "erfcx", "log_ndtr"])
def test_unary_float64_matches_cpu(name, no_fallback):
    f = UNARY[name]
    x = _sweep(torch.float64)
    _assert_matches(f(x.to("neuron")), f(x), torch.float64)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_int_and_bool_promote_to_float32(dtype, no_fallback):
    x = (torch.arange(-12, 13) if dtype != torch.bool else torch.tensor([True, False])).to(dtype)
    for f in (S.bessel_j0, S.modified_bessel_k0, S.erfcx, S.airy_ai):
        expected = f(x)
        actual = f(x.to("neuron"))
        assert actual.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1.3e-6,
                                   equal_nan=True)


def test_erfcx_tails_are_accurate():
    # far right tail (asymptotic series), near 0, and the left side where the CPU overflows
    x = torch.tensor([0.0, 1e-10, 0.5, 3.0, 25.9, 26.1, 40.0, 1e3, 1e10, -0.5, -5.0, -26.0],
                     dtype=torch.float64)
    exact = torch.from_numpy(sp.erfcx(x.numpy()))
    torch.testing.assert_close(S.erfcx(x.to("neuron")).cpu(), exact, atol=0, rtol=1e-13)


def test_log_ndtr_backward_matches_cpu(no_fallback):
    # the backward exp(-(result + x^2/2)) cancels: the forward must match the CPU's rounding
    x = torch.linspace(-9.0, 6.0, 301)
    g = torch.randn(301, generator=torch.Generator().manual_seed(1))
    for f in (S.log_ndtr, S.erfcx):
        xc = x.clone().requires_grad_(True)
        (gc,) = torch.autograd.grad(f(xc), xc, g)
        xn = x.to("neuron").requires_grad_(True)
        (gn,) = torch.autograd.grad(f(xn), xn, g.to("neuron"))
        torch.testing.assert_close(gn.cpu(), gc, atol=1e-5, rtol=1.3e-6)


def _gamma_args(dtype):
    g = torch.Generator().manual_seed(2)
    a = torch.cat([torch.rand(800, generator=g, dtype=dtype) * 10,
                   torch.logspace(-4, 4, 200, dtype=dtype),
                   torch.tensor([0.0, 0.0, 1.0, math.inf, math.inf, 2.0, math.nan, 3.0, -1.0,
                                 50.0, 250.0], dtype=dtype)])
    x = torch.cat([torch.rand(800, generator=g, dtype=dtype) * 10,
                   torch.logspace(-4, 4, 200, dtype=dtype).flip(0),
                   torch.tensor([0.0, 1.0, 0.0, 1.0, math.inf, math.inf, 1.0, math.nan, 1.0,
                                 49.0, 260.0], dtype=dtype)])
    return a, x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_igamma_matches_cpu_and_exact(name, dtype, no_fallback):
    f = getattr(torch, name)
    a, x = _gamma_args(dtype)
    actual = f(a.to("neuron"), x.to("neuron")).cpu()
    _assert_matches(actual, f(a, x), dtype)
    exact = (sp.gammainc if name == "igamma" else sp.gammaincc)(a.double().numpy(),
                                                                x.double().numpy())
    if dtype == torch.float64:
        torch.testing.assert_close(actual, torch.from_numpy(exact), atol=1e-12, rtol=1e-10,
                                   equal_nan=True)


def test_igamma_huge_a_uses_uniform_expansion():
    # a = 1e12 near x: the series would need ~1e6 terms; Temme's expansion agrees with scipy
    a = torch.full((5,), 1e12, dtype=torch.float64)
    x = a + torch.tensor([-3e6, -1e5, 0.0, 2e5, 4e6], dtype=torch.float64)
    exact = torch.from_numpy(sp.gammainc(a.numpy(), x.numpy()))
    torch.testing.assert_close(torch.igamma(a.to("neuron"), x.to("neuron")).cpu(), exact,
                               atol=1e-9, rtol=1e-8)


def test_bfloat16_igamma(no_fallback):
    a, x = _gamma_args(torch.float32)
    a, x = a.bfloat16(), x.bfloat16()
    torch.testing.assert_close(torch.igamma(a.to("neuron"), x.to("neuron")).cpu(),
                               torch.igamma(a, x), atol=1e-5, rtol=1.6e-2, equal_nan=True)


def test_out_and_inplace_forms():
    x = torch.linspace(0.1, 10.0, 50)
    out = torch.empty(50, device="neuron")
    S.bessel_y0(x.to("neuron"), out=out)
    torch.testing.assert_close(out.cpu(), S.bessel_y0(x), atol=1e-5, rtol=1.3e-6)
    a = x.to("neuron")
    a.igamma_(torch.full((50,), 2.0, device="neuron"))
    torch.testing.assert_close(a.cpu(), torch.igamma(x, torch.full((50,), 2.0)), atol=1e-5,
                               rtol=1.3e-6)
