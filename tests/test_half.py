"""bfloat16 / float16: where PyTorch's CPU kernels round, the device rounds the same way.

References are exact (float64 arithmetic on the half values, rounded once) or float64 with
dtype-derived bounds; never bit-for-bit against an ISA-dependent CPU kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eager_neuron

DEV = "neuron"
HALF = [torch.bfloat16, torch.float16]


def _h(v: float, dtype) -> float:
    """v rounded to the half dtype (what the CPU makes of a Python number operand)."""
    return float(torch.tensor(v, dtype=torch.float64).to(dtype))


def _x(dtype, n=1000):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, generator=g).to(dtype)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
@pytest.mark.parametrize("dtype", HALF)
def test_number_operand_rounded_first(dtype, adaptive):
    # issue 11 item 9: bf16 `x - 0.3` differed from the CPU in 349/1000 elements
    x = _x(dtype)
    xd = x.double()
    h = _h(0.3, dtype)
    want = {
        "sub": (xd - h).to(dtype), "add": (xd + h).to(dtype), "rsub": (h - xd).to(dtype),
        "add0d": (xd + h).to(dtype),
        "add_alpha": (xd + _h(0.7, dtype) * xd).to(dtype),
        "mul": (xd * 0.3).to(dtype),   # mul reads the number unrounded, as the CPU does
    }
    with eager_neuron.adaptive() if adaptive else _null():
        n = x.to(DEV)
        got = {"sub": n - 0.3, "add": n + 0.3, "rsub": 0.3 - n,
               "add0d": n + torch.tensor(0.3), "add_alpha": n.add(n, alpha=0.7),
               "mul": n * 0.3}
        got = {k: v.cpu() for k, v in got.items()}
    for k in want:
        if k == "add_alpha":   # alpha * x is one more rounding in float32: 1 ulp at most
            torch.testing.assert_close(got[k], want[k], atol=0, rtol=torch.finfo(dtype).eps)
        elif k == "mul":       # one float32 rounding before the half one
            torch.testing.assert_close(got[k], want[k], atol=0, rtol=torch.finfo(dtype).eps)
        else:
            assert torch.equal(got[k], want[k]), (k, (got[k] != want[k]).sum().item())


@pytest.mark.parametrize("dtype", HALF)
def test_comparison_and_remainder_use_the_rounded_number(dtype):
    h = _h(0.3, dtype)
    x = torch.tensor([h, -h, 1.0, 0.25], dtype=dtype)
    n = x.to(DEV)
    # 0.3 rounds to h: x > 0.3 is False at x == h on the CPU
    assert (n > 0.3).cpu().tolist() == [False, False, True, False]
    assert (n == 0.3).cpu().tolist() == [True, False, False, False]
    want = torch.remainder(x.double(), h).to(dtype)
    assert torch.equal(torch.remainder(n, 0.3).cpu(), want)


@pytest.mark.parametrize("dtype", HALF)
def test_exact_integer_operand_keeps_its_kernel(dtype):
    x = _x(dtype, 64)
    assert torch.equal((x.to(DEV) + 3).cpu(), (x.double() + 3).to(dtype))


def test_expanded_half_operands_upcast_without_overlapping_writes():
    # float16 raised "more than one element of the written-to tensor refers to a single memory
    # location" on expanded (stride-0) operands: cartesian_prod, normalize, cov backward
    a = torch.randn(3).half()
    b = torch.randn(4).half()
    got = torch.cartesian_prod(a.to(DEV), b.to(DEV)).cpu()
    assert torch.equal(got, torch.cartesian_prod(a, b))
    x = torch.randn(4, 5, dtype=torch.float64)
    for dtype in HALF:
        xh = x.to(dtype)
        xn = xh.to(DEV).requires_grad_()
        y = F.normalize(xn, dim=1)
        (g,) = torch.autograd.grad(y.sum() + torch.cov(xn).sum(), xn)
        xr = xh.double().requires_grad_()
        yr = F.normalize(xr, dim=1)
        (gr,) = torch.autograd.grad(yr.sum() + torch.cov(xr).sum(), xr)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(y.detach().cpu().double(), yr.detach(), atol=4 * eps,
                                   rtol=4 * eps)
        torch.testing.assert_close(g.cpu().double(), gr, atol=64 * eps, rtol=16 * eps)
    # a half view with stride 0 as an elementwise operand
    e = torch.randn(1, 6).half()
    got = (e.to(DEV).expand(4, 6) * torch.ones(4, 6).half().to(DEV)).cpu()
    assert torch.equal(got, e.expand(4, 6))


def test_float16_casts_are_kernels_bit_exact():
    # every float16 pattern up to float32 (NaNs compared as NaN)
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    got, want = h.to(DEV).float().cpu(), h.double().float()
    same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
    assert bool(same.all())
    # float32 down to float16: every rounding boundary (the exact midpoint, one float32 ulp
    # either side), overflow, subnormals and signed zero, against float64 -> float16 references
    pos = torch.arange(0, 31744, dtype=torch.int32).to(torch.int16).view(torch.float16).double()
    mid = ((pos[:-1] + pos[1:]) / 2).float()
    f = torch.cat([mid, torch.nextafter(mid, torch.tensor(0.0)),
                   torch.nextafter(mid, torch.tensor(1e9)),
                   torch.tensor([65504.0, 65519.99, 65520.0, 1e6, 2.0 ** -25, 2.0 ** -26,
                                 1e-45, 0.0, float("inf"), float("nan")])])
    f = torch.cat([f, -f])
    got = f.to(DEV).half().cpu()
    # the reference: round to nearest even from the exact (float64) value of each float32
    want = f.double().half()
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert bool(same.all()), f[~same][:4]
    # through float32: int64, bfloat16, float64 sources and destinations
    i = torch.arange(-70000, 70000, 997)
    assert torch.equal(i.to(DEV).half().cpu(), i.double().half())
    assert torch.equal(h[:2000].nan_to_num().to(DEV).to(torch.int64).cpu(),
                       h[:2000].nan_to_num().double().to(torch.int64))


@pytest.mark.parametrize("dtype", HALF)
def test_addr_rounds_every_step_as_the_cpu(dtype):
    # the CPU's half addr rounds after each multiply and add: bf(bf(b*s) + bf(bf(a*v1)*v2));
    # the reference composes exactly those roundings in float64 (each step exact before it)
    g = torch.Generator().manual_seed(11)
    s = torch.randn(6, 7, generator=g).to(dtype)
    v1, v2 = torch.randn(6, generator=g).to(dtype), torch.randn(7, generator=g).to(dtype)

    def r(t):
        return t.to(dtype).double()

    b, a = _h(0.2, dtype), _h(0.6, dtype)
    want = r(r(b * s.double()) + r(r(a * v1.double())[:, None] * v2.double()[None])).to(dtype)
    got = torch.addr(s.to(DEV), v1.to(DEV), v2.to(DEV), beta=0.2, alpha=0.6).cpu()
    assert torch.equal(got, want)
    x = s.to(DEV)
    x.addr_(v1.to(DEV), v2.to(DEV), beta=0.2, alpha=0.6)   # in place: no CPU fallback
    assert torch.equal(x.cpu(), want)


@pytest.mark.parametrize("dtype", HALF)
def test_bilinear_rounds_the_inner_product_as_the_cpu(dtype):
    # the CPU's _trilinear rounds x1 W (a half bmm) before the product with x2, and in the
    # backward adds the unrolled slices one by one in the half type. Integer operands make
    # every float32 sum exact, so only those rounding points decide the bits: the float64
    # model (forward) and the CPU (forward and backward) are exact references on every ISA.
    g = torch.Generator().manual_seed(5)
    x1 = torch.randint(-40, 41, (4, 12), generator=g).to(dtype)
    w = torch.randint(-40, 41, (3, 12, 5), generator=g).to(dtype)
    x2 = torch.randint(-2, 3, (4, 5), generator=g).to(dtype)
    b = torch.randint(-9, 10, (3,), generator=g).to(dtype)

    def r(t):
        return t.to(dtype).double()

    inner = r(torch.einsum("ni,oij->noj", x1.double(), w.double()))
    want = r(r(torch.einsum("noj,nj->no", inner, x2.double())) + b.double()).to(dtype)
    assert torch.isfinite(want).all() and not torch.equal(
        want, (torch.einsum("ni,oij,nj->no", x1.double(), w.double(), x2.double())
               + b.double()).to(dtype))   # the inner rounding matters for these operands
    ins = [t.requires_grad_() for t in (x1, x2, w, b)]
    dev = [t.detach().to(DEV).requires_grad_() for t in ins]
    out = F.bilinear(*dev)
    assert torch.equal(out.cpu(), want)
    go = torch.randint(-3, 4, want.shape, generator=g).to(dtype)
    cpu = F.bilinear(*ins)
    assert torch.equal(cpu, want)
    for got, ref in zip(torch.autograd.grad(out, dev, go.to(DEV)),
                        torch.autograd.grad(cpu, ins, go)):
        assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nan_to_num_replaces_infinities_by_the_half_types_largest(dtype):
    # (computed in float32, the default bound was float32's largest, which rounds back to inf)
    big = torch.finfo(dtype).max
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1.5], dtype=dtype)
    want = [big, -big, 0.0, 1.5]
    assert x.nan_to_num().tolist() == want
    for adaptive in (False, True):
        with eager_neuron.adaptive(adaptive):
            got = x.to(DEV).nan_to_num()
            inplace = x.to(DEV)
            inplace.nan_to_num_(posinf=7.0)
        assert got.cpu().tolist() == want, adaptive
        assert inplace.cpu().tolist() == [7.0, -big, 0.0, 1.5], adaptive
