"""Complex tensors and the FFT family on `neuron` against the CPU: values, dtypes, strides, views
and conj bits, autograd through rfft/irfft/stft, clear errors, and counters (no CPU fallback, no
recompile for a new batch size).
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron

DEV = "neuron"
C64, C128 = torch.complex64, torch.complex128


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _same(got, want, atol=1e-5, rtol=1e-5):
    assert got.device.type == DEV
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)


def _no_fallback():
    assert not eager_neuron.stats()["fallbacks"], eager_neuron.stats()["fallbacks"]


# ---------------------------------------------------------------------------------------------
# storage, views, conj bits
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [C64, C128])
def test_round_trip_keeps_values_dtype_and_strides(dtype):
    x = torch.randn(3, 5, dtype=dtype)
    d = x.to(DEV)
    assert d.dtype == dtype and torch.equal(d.cpu(), x)
    x, d = x.t(), d.t()                             # non-contiguous on purpose
    assert "j" in repr(d) and "neuron" in repr(d)
    c = d.clone()
    assert c.stride() == x.stride() and torch.equal(c.cpu(), x)


def test_real_imag_and_view_as_real_are_views():
    x = torch.randn(4, 3, dtype=C64)
    d = x.to(DEV)
    eager_neuron.reset_stats()
    r = torch.view_as_real(d)
    assert r.dtype == torch.float32 and r.shape == (4, 3, 2)
    d.real.mul_(2)           # writes through the view into d
    d.imag.add_(1)
    want = torch.complex(x.real * 2, x.imag + 1)
    _same(d, want)
    _same(torch.view_as_complex(r), want)
    _no_fallback()


def test_conj_bit_and_resolve():
    x = torch.randn(6, dtype=C64)
    d = x.to(DEV)
    c = d.conj()
    assert c.is_conj()                     # a view with the bit, no copy
    _same(c, x.conj())
    _same(c.resolve_conj(), x.conj().resolve_conj())
    assert not c.resolve_conj().is_conj()
    _same(torch.conj_physical(d), torch.conj_physical(x))
    _same(c * d, x.conj() * x)             # the math-bits fallback resolves before the kernel
    _same(c.sum(), x.conj().sum())


def test_in_place_through_a_conj_view():
    x = torch.randn(5, dtype=C64)
    d = x.to(DEV)
    c, cx = d.conj(), x.conj()
    c.mul_(2j)
    cx.mul_(2j)
    c.add_(1)
    cx.add_(1)
    _same(d, x)
    c.copy_(torch.full((5,), 1j, device=DEV))
    cx.copy_(torch.full((5,), 1j))
    _same(d, x)


@pytest.mark.parametrize("src,dst", [(torch.float32, C64), (torch.int64, C64),
                                     (torch.bool, C128), (C64, C128), (C128, C64),
                                     (torch.bfloat16, C64)])
def test_casts_to_complex(src, dst):
    x = (torch.randn(7) * 3).to(src) if src not in (C64, C128) else torch.randn(7, dtype=src)
    _same(x.to(DEV).to(dst), x.to(dst))


def test_complex_to_real_keeps_the_real_part():
    from eager_neuron import errors

    x = torch.randn(5, dtype=C64)
    errors._ONCE.clear()   # warned once per process, as the CPU's TORCH_WARN_ONCE
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        got = x.to(DEV).to(torch.float32)
    _same(got, x.real.contiguous())


# ---------------------------------------------------------------------------------------------
# elementwise and sums
# ---------------------------------------------------------------------------------------------

_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "eq": lambda a, b: a == b, "where": lambda a, b: torch.where(a.real > 0, a, b),
}
_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "angle": torch.angle, "sgn": torch.sgn,
    "exp": torch.exp, "reciprocal": torch.reciprocal, "scalar": lambda a: a * (2 - 1j) + 0.5,
}


@pytest.mark.parametrize("name", sorted(_BINARY))
@pytest.mark.parametrize("dtype", [C64, C128])
def test_binary(name, dtype):
    a = torch.randn(4, 5, dtype=dtype)
    b = torch.randn(5, dtype=dtype)          # broadcast
    r = torch.randn(4, 1)                    # a real operand promotes
    fn = _BINARY[name]
    eager_neuron.reset_stats()
    _same(fn(a.to(DEV), b.to(DEV)), fn(a, b))
    if name == "div":
        b[1] = 0
        b[2] = complex(0.0, 0.5)
        _same(fn(a.to(DEV), b.to(DEV)), fn(a, b))   # zero divisor: inf/nan as on the CPU
    if name not in ("eq", "where"):
        _same(fn(a.to(DEV), r.to(DEV)), fn(a, r))
    _no_fallback()


@pytest.mark.parametrize("name", sorted(_UNARY))
def test_unary(name):
    a = torch.randn(3, 4, dtype=C64)
    a[0, 0] = 0                              # sgn(0) = 0, 1 / 0 = inf + nan j
    fn = _UNARY[name]
    eager_neuron.reset_stats()
    _same(fn(a.to(DEV)), fn(a))
    _no_fallback()


def test_complex_and_polar_from_real():
    re, im = torch.randn(6), torch.randn(6)
    _same(torch.complex(re.to(DEV), im.to(DEV)), torch.complex(re, im))
    _same(torch.polar(re.abs().to(DEV), im.to(DEV)), torch.polar(re.abs(), im))


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 2), False)])
def test_sum_and_mean(dim, keepdim):
    x = torch.randn(3, 4, 5, dtype=C64)
    d = x.to(DEV)
    if dim is None:
        _same(d.sum(), x.sum())
        _same(d.mean(), x.mean())
    else:
        _same(d.sum(dim, keepdim=keepdim), x.sum(dim, keepdim=keepdim))
        _same(d.mean(dim, keepdim=keepdim), x.mean(dim, keepdim=keepdim))


def test_special_values_and_norms():
    z = torch.randn(3, 4, dtype=C64)
    z[0, 0] = complex(float("inf"), 0.0)
    z[1, 1] = complex(0.0, float("nan"))
    d = z.to(DEV)
    assert torch.equal(d.isinf().cpu(), z.isinf())
    assert torch.equal(d.isfinite().cpu(), z.isfinite())
    assert torch.equal(d.isnan().cpu(), z.isnan())
    w = torch.randn(3, 4, dtype=C64)
    for ord in (2, 1, float("inf")):
        _same(torch.linalg.vector_norm(w.to(DEV), ord, dim=1), torch.linalg.vector_norm(w, ord,
                                                                                       dim=1))


def test_data_movement_runs_on_real_and_imaginary_parts():
    x = torch.randn(3, 4, dtype=C64)
    d = x.to(DEV)
    eager_neuron.reset_stats()
    _same(torch.cat([d, d * 2], 1), torch.cat([x, x * 2], 1))
    _same(torch.nn.functional.pad(d, (1, 2)), torch.nn.functional.pad(x, (1, 2)))
    _same(d.flip(0), x.flip(0))
    _same(d[torch.tensor([2, 0]).to(DEV)], x[torch.tensor([2, 0])])
    _no_fallback()


def test_matrix_products():
    a, b = torch.randn(3, 4, dtype=C64), torch.randn(4, 5, dtype=C64)
    c, v = torch.randn(3, 5, dtype=C64), torch.randn(4, dtype=C64)
    x, y = torch.randn(2, 3, 4, dtype=C128), torch.randn(2, 4, 2, dtype=C128)

    def n(t):
        return t.to(DEV)

    eager_neuron.reset_stats()
    _same(n(a) @ n(b), a @ b)
    _same(n(a).conj() @ n(b), a.conj() @ b)          # mm sees the conj bit: loaded conjugated
    _same(n(b).mH @ n(a).mH, b.mH @ a.mH)
    _same(n(a) @ n(v), a @ v)
    _same(torch.vdot(n(v), n(v)), torch.vdot(v, v))
    _same(torch.addmm(n(c), n(a), n(b), beta=0.5, alpha=2), torch.addmm(c, a, b, beta=0.5,
                                                                        alpha=2))
    _same(n(x) @ n(y), x @ y, atol=1e-12, rtol=1e-12)
    _no_fallback()


# ---------------------------------------------------------------------------------------------
# FFT
# ---------------------------------------------------------------------------------------------

# powers of two (radix-2), short odd (direct DFT), primes and composites (Bluestein)
LENGTHS = [1, 2, 8, 12, 17, 64, 97, 100, 1000]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_lengths_and_norms(n, norm):
    x = torch.randn(3, n)
    z = torch.randn(3, n, dtype=C64)
    d, dz = x.to(DEV), z.to(DEV)
    eager_neuron.reset_stats()
    _same(torch.fft.rfft(d, norm=norm), torch.fft.rfft(x, norm=norm), atol=1e-4)
    _same(torch.fft.fft(d, norm=norm), torch.fft.fft(x, norm=norm), atol=1e-4)
    _same(torch.fft.ifft(dz, norm=norm), torch.fft.ifft(z, norm=norm), atol=1e-4)
    if n > 1:
        _same(torch.fft.irfft(dz, norm=norm), torch.fft.irfft(z, norm=norm), atol=1e-4)
    _no_fallback()


def test_fft_float64_is_accurate():
    x = torch.randn(2, 1000, dtype=torch.float64)
    _same(torch.fft.fft(x.to(DEV)), torch.fft.fft(x), atol=1e-10, rtol=1e-10)
    _same(torch.fft.rfft(x.to(DEV), n=997), torch.fft.rfft(x, n=997), atol=1e-10, rtol=1e-10)


def test_fft_along_any_dim_and_strides():
    x = torch.randn(6, 5, 8)
    x, d = x.transpose(0, 2), x.to(DEV).transpose(0, 2)   # non-contiguous on both sides
    for dim in (0, 1, 2, -1):
        _same(torch.fft.fft(d, dim=dim), torch.fft.fft(x, dim=dim), atol=1e-4)
        got, want = torch.fft.rfft(d, dim=dim), torch.fft.rfft(x, dim=dim)
        _same(got, want, atol=1e-4)
        assert got.stride() == want.stride()


def test_fft_nd_and_hermitian():
    x = torch.randn(4, 6, 10)
    d = x.to(DEV)
    _same(torch.fft.fftn(d), torch.fft.fftn(x), atol=1e-4)
    _same(torch.fft.rfft2(d), torch.fft.rfft2(x), atol=1e-4)
    z = torch.fft.rfftn(x)
    _same(torch.fft.irfftn(z.to(DEV), s=x.shape), torch.fft.irfftn(z, s=x.shape), atol=1e-4)
    _same(torch.fft.hfft(z.to(DEV)), torch.fft.hfft(z), atol=1e-3)
    _same(torch.fft.ihfft(d), torch.fft.ihfft(x), atol=1e-4)
    _same(torch.fft.ifftn(z.to(DEV), dim=(0, 2)), torch.fft.ifftn(z, dim=(0, 2)), atol=1e-4)


def test_fft_new_batch_size_does_not_recompile():
    torch.fft.rfft(torch.randn(3, 40, device=DEV))
    eager_neuron.reset_stats()
    out = torch.fft.rfft(torch.randn(7, 40, device=DEV))
    st = eager_neuron.stats()
    assert st["compiles"] == 0 and st["launches"] >= 1
    assert out.shape == (7, 21)


def test_rfft_irfft_autograd():
    x = torch.randn(4, 30, requires_grad=True)
    d = x.detach().to(DEV).requires_grad_(True)
    w = torch.randn(4, 16)

    def loss(t, w):
        spec = torch.fft.rfft(t)
        back = torch.fft.irfft(spec * spec.abs(), n=30)
        return (back * back).sum() + (spec.abs() * w).sum()

    loss(x, w).backward()
    eager_neuron.reset_stats()
    loss(d, w.to(DEV)).backward()
    _no_fallback()
    _same(d.grad, x.grad, atol=1e-3, rtol=1e-4)


def test_stft_istft():
    x = torch.randn(2, 400)
    win = torch.hann_window(64)
    kw = {"n_fft": 64, "hop_length": 16, "return_complex": True}
    spec = torch.stft(x, window=win, **kw)
    dspec = torch.stft(x.to(DEV), window=win.to(DEV), **kw)
    _same(dspec, spec, atol=1e-4)
    back = torch.istft(dspec, n_fft=64, hop_length=16, window=win.to(DEV), length=400)
    _same(back, torch.istft(spec, n_fft=64, hop_length=16, window=win, length=400), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# clear errors
# ---------------------------------------------------------------------------------------------

def test_unimplemented_complex_op_names_op_dtype_and_fix():
    d = torch.randn(3, dtype=C64).to(DEV)
    with pytest.raises(NotImplementedError) as info:
        torch.histc(d)   # no complex kernel: the CPU's refusal, in its words (dispatch's gate)
    text = str(info.value)
    assert "aten::histc" in text and "complex64" in text and "fix:" in text
    assert "not implemented for 'ComplexFloat'" in text
    assert "test_complex_fft.py" in text


def test_nan_to_num_replaces_each_part_as_the_cpu():
    z = torch.tensor([complex(float("nan"), 1), complex(float("inf"), float("-inf")),
                      complex(-float("inf"), float("nan")), 1 + 2j], dtype=C64)
    for kw in ({}, {"nan": 0.5, "posinf": 7.0, "neginf": -3.0}):
        assert torch.equal(torch.nan_to_num(z.to(DEV), **kw).cpu(), torch.nan_to_num(z, **kw))


def test_complex32_is_storage_only():
    x = torch.randn(6)
    got = x.to(DEV).chalf()                       # casts to and from complex32 work
    assert got.dtype == torch.complex32
    assert torch.equal(torch.view_as_real(got.cpu()), torch.view_as_real(x.chalf()))
    _same(got.to(C64), x.chalf().to(C64))
    with pytest.raises(eager_neuron.UnsupportedOpError, match="complex32.*\n.*\n.*complex64"):
        got + 1                                   # any other op names the fix


def test_rotary_embedding_through_complex_views_and_autograd():
    """LLaMA-style RoPE: polar, view_as_complex of a reshape, complex mul, view_as_real."""
    def rope(xq, freqs):
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        return torch.view_as_real(xq_ * freqs_cis).flatten(2)

    xq = torch.randn(2, 5, 8, requires_grad=True)
    freqs = torch.outer(torch.arange(5.0), 1.0 / (10000 ** (torch.arange(0, 8, 2) / 8)))
    w = torch.randn(2, 5, 8)
    want = rope(xq, freqs)
    (want * w).sum().backward()
    xd = xq.detach().to(DEV).requires_grad_(True)
    eager_neuron.reset_stats()
    got = rope(xd, freqs.to(DEV))
    (got * w.to(DEV)).sum().backward()
    _no_fallback()
    _same(got.detach(), want.detach())
    _same(xd.grad, xq.grad)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_backward_of_the_complex_ops_autograd_needs(dtype):
    """mul, abs, angle, real/imag, conj, view_as_real/view_as_complex, div, exp: gradients equal
    the complex128 CPU ones within a bound from the dtype's epsilon."""
    fns = [lambda x, y: x * y, lambda x, y: x.abs(), lambda x, y: x.angle(),
           lambda x, y: x.real * 2 + x.imag, lambda x, y: x.conj() * y,
           lambda x, y: torch.view_as_real(x * y).sum(-1),
           lambda x, y: torch.view_as_complex(torch.view_as_real(x) * 3) / y,
           lambda x, y: (x * 0.2).exp() + x.sum()]
    torch.manual_seed(3)
    x0, y0 = torch.randn(3, 4, dtype=dtype), torch.randn(3, 4, dtype=dtype) + 2

    def grads(f, dev, cast):
        x = cast(x0).to(dev).requires_grad_()
        y = cast(y0).to(dev).requires_grad_()
        out = f(x, y)
        torch.manual_seed(4)
        g = torch.randn(out.shape, dtype=torch.complex128 if out.is_complex() else torch.float64)
        gx, gy = torch.autograd.grad(out, (x, y), g.to(out.dtype).to(dev), allow_unused=True)
        return [t.cpu() if t is not None else None for t in (gx, gy)]

    eps = torch.finfo(dtype.to_real()).eps
    for f in fns:
        got = grads(f, DEV, lambda t: t)
        exact = grads(f, "cpu", lambda t: t.to(torch.complex128))
        for g, e in zip(got, exact):
            assert (g is None) == (e is None)
            if e is not None:
                assert g.dtype == dtype
                err = float((g.to(torch.complex128) - e).abs().max())
                assert err <= 16 * eps * max(1.0, float(e.abs().max())), err
