"""FP8 on neuron: float8 storage, casts with each format's saturation/NaN rule, _scaled_mm with
per-tensor and row-wise scales, amax, and a tiny dynamically scaled FP8 linear layer trained on
neuron against the same code on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the neuron device

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def _codes(dt):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)


def _same(a, b):
    """Equal values, NaN where the other is NaN, -0.0 kept."""
    a, b = a.double(), b.double()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(
        torch.where(a.isnan(), 0, a), torch.where(b.isnan(), 0, b)) and torch.equal(
        torch.where(a.isnan(), 0, a).signbit(), torch.where(b.isnan(), 0, b).signbit())


@pytest.mark.parametrize("dt", FP8)
def test_storage_round_trip_and_decode_exact(dt):
    codes = _codes(dt)
    dev = codes.to("neuron")
    assert dev.dtype == dt and torch.equal(dev.cpu().view(torch.uint8), codes.view(torch.uint8))
    # every fp8 value is a float32: decoding is exact (the CPU's decode is a bit formula too)
    for od in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        assert _same(dev.to(od).cpu(), codes.to(od)), od
    assert torch.finfo(dt).max == dev.float().cpu().nan_to_num(0, 0, 0).abs().max().item()


def _nearest(x: torch.Tensor, dt) -> torch.Tensor:
    """float64 reference: the nearest fp8 value, ties to the even code (finite, in range)."""
    codes = _codes(dt)
    vals = codes.double()
    ok = ~vals.isnan() & ~vals.isinf()
    vals, cnums = vals[ok], codes.view(torch.uint8).long()[ok]
    d = (x.double()[:, None] - vals[None, :]).abs()
    best = d.min(1, keepdim=True).values
    tie = d == best
    # among equally near values prefer the even code (an exact hit is unique up to +-0)
    score = torch.where(tie, (cnums[None, :] % 2) * 2 + (vals[None, :].signbit() !=
                                                         x[:, None].signbit()), 99)
    return vals[score.argmin(1)]


@pytest.mark.parametrize("dt", FP8)
def test_casts_round_to_nearest_even_and_saturate_as_cpu(dt):
    fmax = torch.finfo(dt).max
    tiny = torch.finfo(dt).smallest_normal
    g = torch.Generator().manual_seed(1)
    # in range: random magnitudes, every midpoint between neighbours and one float32 ulp around it
    vals = _codes(dt).double()
    fin = vals[~vals.isnan() & ~vals.isinf()].unique()
    mids = ((fin[1:] + fin[:-1]) / 2).float()
    x = torch.cat([mids, mids.nextafter(torch.tensor(math.inf)),
                   mids.nextafter(torch.tensor(-math.inf)),
                   torch.randn(2000, generator=g) * tiny * 4,
                   torch.randn(2000, generator=g) * fmax / 3]).float()
    x = x[x.abs() <= fmax]
    got = x.to("neuron").to(dt).cpu()
    assert torch.equal(got.double(), _nearest(x, dt)), dt
    # specials: the CPU's rule per format (e4m3fn saturates, e5m2 goes to inf, fnuz to NaN)
    sp = torch.tensor([1e6, -1e6, math.inf, -math.inf, math.nan, -0.0, fmax * 1.07, 1e-30])
    for src in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        s = sp.to(src)
        assert torch.equal(s.to("neuron").to(dt).cpu().view(torch.uint8),
                           s.to(dt).view(torch.uint8)), (dt, src)
    # every bfloat16 and float16 bit pattern: the same codes as the CPU's (c10 scalar formula)
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    for src in (torch.bfloat16, torch.float16):
        s = bits.view(src)
        assert torch.equal(s.to("neuron").to(dt).cpu().view(torch.uint8),
                           s.to(dt).view(torch.uint8)), (dt, src)


def test_fp8_to_fp8_and_broadcast_copy():
    x = torch.randn(4, 1) * 100
    a = x.to(torch.float8_e4m3fn)
    d = torch.empty(4, 3, dtype=torch.float8_e5m2, device="neuron")
    d.copy_(a.to("neuron"))
    assert torch.equal(d.cpu().view(torch.uint8),
                       a.to(torch.float8_e5m2).expand(4, 3).contiguous().view(torch.uint8))


def _ref_scaled_mm(a, b, sa, sb, bias, od):
    out = (a.double() * sa.double()) @ (b.double() * sb.double())
    if bias is not None:
        out = out + bias.double()
    return out


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("od", [torch.float32, torch.bfloat16])
def test_scaled_mm(rowwise, od):
    g = torch.Generator().manual_seed(2)
    m, k, n = 16, 48, 32
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e5m2).t()   # column-major mat2
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    else:
        sa, sb = torch.tensor(0.25), torch.tensor(3.0)
    bias = torch.randn(n, generator=g).to(od)
    for bi in (None, bias):
        got = torch._scaled_mm(a.to("neuron"), b.to("neuron"), sa.to("neuron"), sb.to("neuron"),
                               bias=None if bi is None else bi.to("neuron"), out_dtype=od)
        assert got.device.type == "neuron" and got.dtype == od
        ref = _ref_scaled_mm(a, b, sa, sb, bi, od)
        # one rounding to out_dtype of a float64-exact sum (+ float32 accumulation slack)
        eps = torch.finfo(od).eps
        bound = eps * ref.abs() + 1e-6 * (a.double().abs() * sa.abs()).sum(1, keepdim=True)[
            0].max() * (b.double().abs() * sb.abs()).max()
        assert ((got.cpu().double() - ref).abs() <= bound).all()


def test_scaled_mm_bad_scale_raises_the_cpus_error():
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="Invalid scaling configuration") as cpu:
        torch._scaled_mm(a, a.t(), torch.ones(3), torch.tensor(1.0), out_dtype=torch.float32)
    an = a.to("neuron")
    with pytest.raises(ValueError, match="Invalid scaling configuration") as dev:
        torch._scaled_mm(an, an.t(), torch.ones(3, device="neuron"),
                         torch.tensor(1.0, device="neuron"), out_dtype=torch.float32)
    assert "_scaled_mm" in str(dev.value) and type(dev.value) is type(cpu.value)


def test_amax_of_fp8_scaled_values():
    x = torch.randn(64) * 30
    xd = x.to("neuron")
    scale = 448.0 / xd.abs().amax()
    q = (xd * scale).to(torch.float8_e4m3fn)
    assert q.float().abs().amax().item() == 448.0          # the scaled max lands on fp8 max
    assert torch.equal(q.cpu().view(torch.uint8),
                       (x * (448.0 / x.abs().amax())).to(torch.float8_e4m3fn).view(torch.uint8))


class _FP8Linear(torch.autograd.Function):
    """y = x @ w.T with x, w cast to e4m3 under per-tensor dynamic scales (amax -> scale) and
    multiplied by _scaled_mm; backward in float32 from the saved unquantised x and w."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        e4 = torch.float8_e4m3fn
        sx = 448.0 / x.abs().amax().clamp(min=1e-12)
        sw = 448.0 / w.abs().amax().clamp(min=1e-12)
        xq, wq = (x * sx).to(e4), (w * sw).to(e4)
        if x.device.type == "cpu":
            # the CPU reference: the definition in float64, rounded once. torch's CPU
            # _scaled_mm goes through oneDNN, which has no fp8 matmul below AVX-512 (a test
            # of one CPU otherwise); neuron's kernel computes the same definition
            return _ref_scaled_mm(xq, wq.t(), sx.reciprocal(), sw.reciprocal(), None,
                                  torch.float32).float()
        return torch._scaled_mm(xq, wq.t(), sx.reciprocal(), sw.reciprocal(),
                                out_dtype=torch.float32)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        return gy @ w, gy.t() @ x


def _train(device):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(16, 32, generator=g) * 0.2).to(device).requires_grad_()
    x = torch.randn(16, 32, generator=g).to(device)
    target = torch.randn(16, 16, generator=g).to(device)
    losses = []
    for _ in range(3):
        loss = ((_FP8Linear.apply(x, w) - target) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.5 * w.grad
            w.grad = None
        losses.append(loss.item())
    return losses, w.detach().cpu()


def test_fp8_linear_trains_like_cpu():
    cpu_losses, cpu_w = _train("cpu")
    dev_losses, dev_w = _train("neuron")
    assert dev_losses[-1] < dev_losses[0]
    # same quantisation on both sides (casts are bit-exact); what differs is the matmul
    # accumulation order, which can move one fp8 rounding: bound by one e4m3 step (2**-3)
    assert torch.allclose(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=2 ** -3)
    assert torch.allclose(dev_w, cpu_w, rtol=2 ** -3, atol=2 ** -3 * cpu_w.abs().max().item())


def test_adaptive_eager_flushes_before_fp8_kernels():
    # the cast's operand is the output of a recorded (not yet launched) group: it must be
    # computed before the fp8 encoder reads it, and the fp8 result usable by later recorded ops
    x = torch.randn(100) * 300
    with eager_neuron.adaptive():
        for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
            xd = x.to("neuron")
            q = (xd * 2 + 1).to(dt)
            r = (q.float() * 3 + 1).cpu()
            assert torch.equal(r, (x * 2 + 1).to(dt).float() * 3 + 1)
            d = torch.empty(100, dtype=dt, device="neuron")
            d.copy_(xd * 5)
            assert torch.equal(d.cpu().view(torch.uint8), (x * 5).to(dt).view(torch.uint8))
        dev_losses, _ = _train("neuron")
    cpu_losses, _ = _train("cpu")
    assert torch.allclose(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=2 ** -3)
