"""pdist and cdist on `neuron` against the CPU, forward and backward, for every class of p
(0, 1, 2, inf, 0 < p < 2, general), with batch dims broadcast in cdist; no CPU fallback."""

from __future__ import annotations

import pytest
import torch

import eager_neuron

DEV = "neuron"
PS = [0.0, 1.0, 2.0, 0.5, 1.5, 3.0, float("inf")]
DIRECT = "donot_use_mm_for_euclid_dist"   # p = 2 otherwise decomposes into a matmul


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def check(fn, *xs):
    xc = [x.clone().requires_grad_() for x in xs]
    xd = [x.to(DEV).requires_grad_() for x in xs]
    eager_neuron.reset_stats()
    yc, yd = fn(*xc), fn(*xd)
    torch.testing.assert_close(yd.detach().cpu(), yc.detach())
    g = torch.randn(yc.shape)
    yc.backward(g)
    yd.backward(g.to(DEV))
    for c, d in zip(xc, xd):
        torch.testing.assert_close(d.grad.cpu(), c.grad)
    assert eager_neuron.stats()["fallbacks"] == {}, eager_neuron.stats()["fallbacks"]


@pytest.mark.parametrize("p", PS)
def test_pdist(p):
    x = torch.randn(6, 4)
    x[2] = x[4]                         # a zero distance: its gradient is 0, not NaN
    x[1, 0] = x[3, 0]                   # a zero coordinate difference (matters for p < 1)
    check(lambda x: torch.pdist(x, p), x)


@pytest.mark.parametrize("p", PS)
def test_cdist(p):
    x1, x2 = torch.randn(5, 4), torch.randn(3, 4)
    x2[1] = x1[2]
    check(lambda a, b: torch.cdist(a, b, p, compute_mode=DIRECT), x1, x2)


@pytest.mark.parametrize("p", [1.0, 2.0, 1.5])
def test_cdist_broadcast_batch(p):
    """x2's batch broadcasts against x1's: its gradient sums over the broadcast dim."""
    check(lambda a, b: torch.cdist(a, b, p, compute_mode=DIRECT),
          torch.randn(2, 3, 5, 4), torch.randn(3, 7, 4))
