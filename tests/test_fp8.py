"""FP8 on neuron: float8 storage, casts with each format's saturation/NaN rule, _scaled_mm with
per-tensor and row-wise scales, amax, and a tiny dynamically scaled FP8 linear layer trained on
neuron against the same code on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the neuron device
from eager_neuron import errors

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


# ---------------------------------------------------------------------------------------------
# ops beyond casts: exactly what the CPU runs on fp8, with its results; its error otherwise
# ---------------------------------------------------------------------------------------------

def _fp8_programs(x, y, i, m):
    """name -> fn(x, y, i, m): x, y fp8 (4, 8), i int64 indices, m a bool mask."""
    return {
        # data movement: bit patterns (the CPU supports all of these on fp8)
        "clone_t": lambda: x.t().contiguous(), "cat": lambda: torch.cat([x, y], 1),
        "stack": lambda: torch.stack([x, y]), "index": lambda: x[i], "mask": lambda: x[m],
        "index_select": lambda: x.index_select(1, i), "flip0": lambda: x.flip(0),
        "roll": lambda: x.roll(1, 1), "pad": lambda: torch.nn.functional.pad(x, (1, 2), value=0.5),
        "repeat": lambda: x.repeat(2, 1), "where": lambda: torch.where(m, x, y),
        "where_scalar": lambda: torch.where(m, x, 2.0), "fill": lambda: x.clone().fill_(-3.0),
        "zeros_like": lambda: torch.zeros_like(x), "ones_like": lambda: torch.ones_like(x),
        "full_like": lambda: torch.full_like(x, 0.3), "slice_scatter":
        lambda: torch.slice_scatter(x, y[:2], 0, 0, 2), "select_scatter":
        lambda: torch.select_scatter(x, y[0], 0, 1), "setitem":
        lambda: x.clone().__setitem__((0, 1), 1.5), "embedding":
        lambda: torch.nn.functional.embedding(i, x.t().contiguous()), "masked_select":
        lambda: x.masked_select(m), "index_put": lambda: x.clone().index_put_((i,), y[:2, 0]),
        "diag": lambda: x[:, :4].diag(), "unfold": lambda: x.unfold(1, 2, 2).contiguous(),
        # arithmetic the CPU allows: float32 from exact decodes, one rounding
        "abs": lambda: x.abs(), "mul": lambda: x * y, "mul_": lambda: x.clone().mul_(y),
        "eq": lambda: x == y, "ne_scalar": lambda: x != 0.5, "isnan": lambda: x.isnan(),
        "any": lambda: x.any(), "all_dim": lambda: x.all(1), "equal": lambda: torch.equal(x, y),
        "index_put_acc": lambda: x.clone().index_put_((i,), y[:2, 0], accumulate=True),
        # refused by the CPU (its NotImplementedError / RuntimeError)
        "neg": lambda: -x, "lt": lambda: x < y, "add": lambda: x + y, "sum": lambda: x.sum(),
        "amax": lambda: x.amax(), "tril": lambda: x.tril(), "sort": lambda: x.sort(),
        "gather": lambda: x.gather(1, i[None].expand(4, 2)), "relu": lambda: x.relu(),
        "mul_scalar": lambda: x * 2, "masked_fill": lambda: x.masked_fill(m, 1.0),
        "nonzero": lambda: x.nonzero(), "unique": lambda: x.unique(),
        "fliplr": lambda: x.fliplr(), "isinf": lambda: x.isinf(), "cumsum": lambda: x.cumsum(0),
        "mul_f32": lambda: x * torch.ones(8, device=x.device),
    }


def _bits(t):
    return t.view(torch.uint8) if t.dtype in FP8 else t


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_ops_mirror_the_cpu(dt):
    torch.manual_seed(0)
    x, y = (torch.randn(4, 8) * 3).to(dt), (torch.randn(4, 8) * 3).to(dt)
    i, m = torch.tensor([2, 0]), torch.rand(4, 8) > 0.5
    cpu = _fp8_programs(x, y, i, m)
    dev = _fp8_programs(*(t.to("neuron") for t in (x, y, i, m)))
    ran = refused = 0
    for name, fn in cpu.items():
        try:
            want, err = fn(), None
        except Exception as exc:   # noqa: BLE001 - the CPU's refusal is the expected result
            want, err = None, exc
        if err is not None:
            with pytest.raises(type(err)) as got:
                dev[name]()
            assert str(err).splitlines()[0] in str(got.value), (name, str(got.value)[:200])
            refused += 1
            continue
        got = dev[name]()
        if isinstance(want, torch.Tensor):
            assert got.device.type == "neuron" and got.dtype == want.dtype, name
            assert torch.equal(_bits(got.cpu()), _bits(want)), name
        else:
            assert got == want, name
        ran += 1
    assert ran >= 30 and refused >= 15, (ran, refused)
    # mm on fp8 (the CPU's: float32 accumulation, one rounding): within one fp8 step of exact
    w = (torch.randn(8, 8)).to(dt)
    exact = (x.double() @ w.double())
    got = (x.to("neuron") @ w.to("neuron")).cpu()
    assert got.dtype == dt
    step = exact.abs().clamp_min(torch.finfo(dt).tiny) * 2.0 ** -(3 if dt == torch.float8_e4m3fn
                                                                   else 2)
    assert bool(((got.double() - exact).abs() <= step).all())


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_to_and_from_every_dtype(dt):
    """Casts as the CPU does them (through float32; out-of-range to small ints as its int32
    truncation), bit for bit, both directions."""
    vals = torch.tensor([0.0, -0.0, 1.5, -2.75, 300.0, -448.0, 1e-3, float("nan"),
                         float("inf"), -float("inf"), 57344.0, 0.3])
    f8 = vals.to(dt)
    for od in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
               torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2):
        want = f8.to(od)
        got = f8.to("neuron").to(od).cpu()
        assert torch.equal(_bits(got), _bits(want)) or (
            od.is_floating_point or od.is_complex) and _same(
            torch.view_as_real(got) if od.is_complex else got,
            torch.view_as_real(want) if od.is_complex else want), od
        src = vals.to(od) if od != torch.bool else vals.bool()
        if od.is_complex:
            src = src + 0j   # (the imaginary part is dropped, with the CPU's warning: once
            # per process, as the CPU's TORCH_WARN_ONCE, so forget that it was given)
            errors._ONCE.clear()
            with pytest.warns(UserWarning, match="imaginary"):
                got = src.to("neuron").to(dt).cpu()
        else:
            got = src.to("neuron").to(dt).cpu()
        assert torch.equal(got.view(torch.uint8), src.to(dt).view(torch.uint8)), od


@pytest.mark.parametrize("od", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_scaled_mm_variants(od):
    """Row-wise scales, bias, scale_result, K not a multiple of 16, mat2 row-major (the CPU's
    rules, not cuBLAS's): the float64 definition rounded to `od`, within one step of `od`."""
    torch.manual_seed(1)
    a = (torch.randn(5, 24) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(24, 7) * 4).to(torch.float8_e5m2)            # row-major, N = 7
    sa, sb = torch.rand(5, 1) + 0.5, torch.rand(1, 7) + 0.5
    bias = torch.randn(7).to(od if od != torch.float8_e4m3fn else torch.float32)
    sr = torch.tensor(4.0)
    got = torch._scaled_mm(a.to("neuron"), b.to("neuron"), sa.to("neuron"), sb.to("neuron"),
                           bias=bias.to("neuron"), scale_result=sr.to("neuron"),
                           out_dtype=od).cpu()
    want_cpu = torch._scaled_mm(a, b, sa, sb, bias=bias, scale_result=sr, out_dtype=od)
    assert got.dtype == od and got.shape == want_cpu.shape == (5, 7)
    exact = (a.double() * sa.double()) @ (b.double() * sb.double()) + bias.double()
    if od in FP8:
        exact = exact / 4.0   # scale_result applies to fp8 results only, as on the CPU
    bits = {torch.float32: 23, torch.bfloat16: 7, torch.float8_e4m3fn: 3}[od]
    step = exact.abs().clamp_min(torch.finfo(od).tiny) * 2.0 ** -bits + 1e-6 * exact.abs().max()
    assert bool(((got.double() - exact).abs() <= step).all())
