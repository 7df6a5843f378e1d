"""Losses on `neuron` against the CPU: nll/cross entropy (1d, 2d, batchless, class weights,
ignore_index, every reduction), mse and binary cross entropy, forward and backward, errors
for bad targets, multi-margin and multilabel-margin backward, and counters (no fallback, no
recompile for a new batch size)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.lower import loss as lloss

DEV = "neuron"
REDUCTIONS = ["mean", "sum", "none"]


def _same(got, want, **kw):
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **kw)


def check(fn, *xs, grad=(0,)):
    """fn on neuron and CPU copies; inputs listed in `grad` get gradients compared."""
    cs = [x.clone().requires_grad_(i in grad) for i, x in enumerate(xs)]
    ns = [x.to(DEV).requires_grad_(i in grad) for i, x in enumerate(xs)]
    eager_neuron.reset_stats()
    yc, yn = fn(*cs), fn(*ns)
    _same(yn, yc.detach())
    g = torch.randn_like(yc)
    yc.backward(g)
    yn.backward(g.to(DEV))
    for i in grad:
        _same(ns[i].grad, cs[i].grad)
    st = eager_neuron.stats()
    assert st["fallbacks"] == {}, st["fallbacks"]
    ours = {k for k in st["decompositions"] if k in lloss.LOWERINGS}
    assert not ours, f"declined to decompositions: {ours}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy(reduction):
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), torch.randn(6, 5),
          torch.randint(0, 5, (6,)))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_weight_ignore(reduction):
    w = torch.rand(5) + 0.5
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=2, reduction=reduction),
          torch.randn(6, 5), t, w)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_nll_2d(reduction):
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction, ignore_index=1),
          torch.randn(2, 3, 4, 5), torch.randint(0, 3, (2, 4, 5)))


def test_nll_odd():
    check(lambda x, t: F.nll_loss(x, t), torch.randn(5), torch.tensor(3))        # batchless
    check(lambda x, t: F.cross_entropy(x, t), torch.randn(2, 3, 4), torch.randint(0, 3, (2, 4)))
    check(lambda x, t: F.nll_loss(x.t(), t), torch.randn(5, 6), torch.randint(0, 5, (6,)))
    # every target ignored: mean is 0 / 0 = NaN, as on the CPU
    t = torch.full((4,), -100)
    check(lambda x, t: F.cross_entropy(x, t), torch.randn(4, 3), t)


def test_nll_bad_target_raises():
    x = torch.randn(2, 3, device=DEV)
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        F.nll_loss(x, torch.tensor([0, 3]).to(DEV))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse(reduction):
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), torch.randn(4, 6),
          torch.randn(4, 6), grad=(0, 1))


def test_mse_odd():
    check(lambda x, y: F.mse_loss(x.t(), y), torch.randn(6, 4), torch.randn(4, 6), grad=(0, 1))
    check(lambda x, y: F.mse_loss(x, y), torch.tensor(2.0), torch.tensor(0.5))
    check(lambda x, y: F.mse_loss(x, y, reduction="sum"), torch.randn(0, 3), torch.randn(0, 3))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bce(reduction):
    x = torch.rand(4, 6) * 0.98 + 0.01
    x[0, 0], x[0, 1] = 0.0, 1.0                    # log(0) clamps to -100, like torch
    y = torch.rand(4, 6)
    w = torch.rand(6)
    check(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x, y)
    check(lambda x, y, w: F.binary_cross_entropy(x, y, weight=w, reduction=reduction), x, y, w)


def test_bce_out_of_range_raises():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([1.5]).to(DEV), torch.tensor([1.0]).to(DEV))


def test_no_recompile_for_new_batch():
    def step(n):
        x = torch.randn(n, 5, device=DEV, requires_grad=True)
        t = torch.randint(0, 5, (n,)).to(DEV)
        (F.cross_entropy(x, t) + F.mse_loss(x, x.detach() * 2)).backward()

    step(3)
    eager_neuron.reset_stats()
    step(7)
    step(40)
    st = eager_neuron.stats()
    assert st["compiles"] == 0
    assert st["fallbacks"] == {}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin(reduction, p):
    w = torch.rand(5) + 0.5
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    check(lambda x, t, w: F.multi_margin_loss(x, t, p=p, margin=0.7, weight=w,
                                              reduction=reduction),
          torch.randn(6, 5), t, w)
    if reduction != "none":   # NOTE: PyTorch's Meta kernel gives a 1-d input's loss shape (1,)
        check(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), torch.randn(5),
              torch.tensor(3))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin(reduction):
    t = torch.tensor([[1, 3, -1, 0, 2], [0, -1, 2, 2, 1], [3, 2, 1, 0, 4], [4, 4, 4, 4, 4]])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction),
          torch.randn(4, 5), t)
    if reduction != "none":   # NOTE: as for multi_margin_loss, the Meta shape is (1,), not ()
        check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction),
              torch.randn(5), t[0])
