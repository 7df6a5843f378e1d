"""uint8 bilinear and bicubic resampling, with and without antialiasing, byte for byte.

The CPU resamples uint8 images in integer arithmetic (UpSampleKernel.cpp's separable kernel under
`default`; the AVX kernel that `avx2` and `avx512` run for C <= 4 gives the same bytes): float64
weights quantized to integers at a per-axis precision, width pass then height pass, each
rounded and clamped to 0..255. The float formula rounded once differs by 1 on 10-20% of the
bytes. Judged against the CPU and against `_reference` below, an independent pure-Python
statement of that arithmetic (the only judge where the CPU's AVX kernel trips its own assert:
3 contiguous channels resized to 1x1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eager_neuron

pytestmark = pytest.mark.isa   # the CPU's uint8 path is chosen by instruction set


def _filter(interp: int, a: float):
    def f(x: float) -> float:
        x = abs(x)
        if interp == 2:
            return 1.0 - x if x < 1.0 else 0.0
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0
    return f


def _axis(isize, osize, align, sf, interp, aa):
    """[(first tap, integer weights)] per output coordinate, and the precision."""
    if align:
        scale = (isize - 1) / (osize - 1) if osize > 1 else 0.0
    else:
        scale = 1.0 / sf if sf else isize / osize
    f = _filter(interp, -0.5 if aa else -0.75)
    rows, wmax = [], 0.0
    for o in range(osize):
        if aa:
            support = interp / 2 * scale if scale >= 1 else interp / 2
            center = scale * (o + 0.5)
            inv = 1 / scale if scale >= 1 else 1.0
            lo = max(int(center - support + 0.5), 0)
            hi = min(int(center + support + 0.5), isize)
            w = [f((j - center + 0.5) * inv) for j in range(lo, hi)]
            w = [v / sum(w) for v in w]
        else:
            r = scale * o if align else scale * (o + 0.5) - 0.5
            if interp == 2 and r < 0:
                r = 0.0
            i0 = min(math.floor(np.float32(r)), isize - 1)
            lam = min(max(r - i0, 0.0), 1.0)
            half = interp // 2
            lo = max(i0 - half + 1, 0)
            w = [0.0] * (min(i0 + half + 1, isize) - lo)
            for j in range(interp):      # taps past an edge fold onto the edge pixel
                k = min(max(i0 - half + 1 + j, 0), isize - 1) - lo
                w[k] += f(j + 1 - half - lam)
        wmax = max([wmax] + w)
        rows.append((lo, w))
    prec = next((p for p in range(22) if int(0.5 + wmax * 2 ** (p + 1)) >= 2 ** 15), 22)
    q = [(lo, [int(v * 2 ** prec + (0.5 if v >= 0 else -0.5)) for v in w]) for lo, w in rows]
    return q, prec


def _pass(x: np.ndarray, osize, align, sf, interp, aa) -> np.ndarray:
    q, prec = _axis(x.shape[-1], osize, align, sf, interp, aa)
    out = np.empty(x.shape[:-1] + (osize,), np.int64)
    for o, (lo, w) in enumerate(q):
        acc = sum(x[..., lo + j].astype(np.int64) * v for j, v in enumerate(w))
        out[..., o] = np.clip((acc + 2 ** (prec - 1)) >> prec, 0, 255)
    return out


def _reference(x: torch.Tensor, size, mode, aa, align=False, sf=(None, None)) -> torch.Tensor:
    interp = 2 if mode == "bilinear" else 4
    y = x.numpy().astype(np.int64)
    if y.shape[-1] != size[1]:
        y = _pass(y, size[1], align, sf[1], interp, aa)
    if y.shape[-2] != size[0]:
        y = _pass(y.swapaxes(-1, -2), size[0], align, sf[0], interp, aa).swapaxes(-1, -2)
    return torch.from_numpy(np.ascontiguousarray(y).astype(np.uint8))


def _image(shape, seed=0, channels_last=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


SIZES = {                      # (input H, W) -> output (H, W)
    "down_odd": ((17, 23), (9, 11)),
    "up_odd": ((7, 5), (19, 13)),
    "mixed": ((17, 6), (5, 29)),
    "width_only": ((9, 12), (9, 31)),
    "height_only": ((12, 9), (3, 9)),
    "strong_down": ((40, 37), (3, 4)),
    "to_one": ((5, 6), (1, 1)),
}


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [False, True], ids=["plain", "aa"])
@pytest.mark.parametrize("align", [False, True], ids=["half_pixel", "align_corners"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "c5"])
def test_uint8_resize_bytes_equal_cpu(mode, antialias, align, layout):
    """Every size case: neuron's bytes equal the CPU's and the reference's, no CPU fallback."""
    eager_neuron.reset_stats()
    for i, (name, ((h, w), size)) in enumerate(SIZES.items()):
        c = 5 if layout == "c5" else 3 if i % 2 else 1
        x = _image((2, c, h, w), seed=i, channels_last=layout == "channels_last")
        got = F.interpolate(x.to("neuron"), size=size, mode=mode, align_corners=align,
                            antialias=antialias).cpu()
        ref = _reference(x, size, mode, antialias, align)
        assert torch.equal(got, ref), (name, (got.int() - ref.int()).abs().max())
        assert torch.equal(got, F.interpolate(x, size=size, mode=mode, align_corners=align,
                                              antialias=antialias)), name
    assert eager_neuron.stats()["fallbacks"] == {}


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [False, True], ids=["plain", "aa"])
def test_uint8_resize_scale_factor_and_strided_input(mode, antialias):
    """scale_factor (its reciprocal is the scale, not in/out) and a non-contiguous input."""
    x = _image((1, 4, 23, 30), seed=7)[:, :, 2:, ::2]
    for sf in ((0.7, 1.3), (2.5, 0.4), (1.7, 1.7)):
        got = F.interpolate(x.to("neuron"), scale_factor=sf, mode=mode, antialias=antialias).cpu()
        ref = _reference(x, tuple(got.shape[-2:]), mode, antialias, sf=sf)
        assert torch.equal(got, ref), sf
        assert torch.equal(got, F.interpolate(x, scale_factor=sf, mode=mode,
                                              antialias=antialias)), sf


def test_uint8_three_channels_to_one_pixel():
    """3 contiguous channels to 1x1: the CPU's AVX kernel (avx2, avx512) raises an internal
    assert there; neuron answers as the reference, which is what the CPU's `default` build
    answers."""
    x = _image((2, 3, 17, 23), seed=3)
    for mode in ("bilinear", "bicubic"):
        for aa in (False, True):
            got = F.interpolate(x.to("neuron"), size=(1, 1), mode=mode, antialias=aa).cpu()
            assert torch.equal(got, _reference(x, (1, 1), mode, aa)), (mode, aa)


def test_uint8_same_size_and_empty():
    x = _image((2, 3, 6, 7), seed=5)
    got = F.interpolate(x.to("neuron"), size=(6, 7), mode="bilinear", antialias=True).cpu()
    assert torch.equal(got, x)
    e = torch.empty(0, 3, 6, 7, dtype=torch.uint8)
    assert F.interpolate(e.to("neuron"), size=(3, 4), mode="bicubic").shape == (0, 3, 3, 4)


_INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("mode,rank", [("linear", 1), ("bilinear", 2), ("bicubic", 2),
                                       ("trilinear", 3)])
@pytest.mark.parametrize("dtype", _INTEGERS, ids=str)
def test_integer_resize_refused_where_the_cpu_refuses(mode, rank, dtype):
    """The CPU's linear/trilinear kernels dispatch on floating types only, bilinear/bicubic on
    floating types and uint8; neuron used to answer every other integer dtype through the
    decomposition. Now it raises the CPU's NotImplementedError, its words first (the kernel
    name depends on the CPU's path and layout), then the op, the dtype and the fix; an empty
    input too. Where the CPU answers (uint8 bilinear/bicubic), neuron answers its bytes."""
    for shape, channels_last in (((2, 3) + (5,) * rank, False), ((1, 1) + (4,) * rank, True),
                                 ((0, 3) + (5,) * rank, False)):
        x = torch.randint(0, 2 if dtype == torch.bool else 100, shape).to(dtype)
        if channels_last and rank > 1:
            x = x.contiguous(memory_format=torch.channels_last if rank == 2
                             else torch.channels_last_3d)
        kw = dict(size=(3,) * rank, mode=mode, align_corners=False)
        try:
            want = F.interpolate(x, **kw)
        except NotImplementedError as cpu:
            with pytest.raises(NotImplementedError) as got:
                F.interpolate(x.to("neuron"), **kw)
            text = str(got.value)
            assert text.startswith(str(cpu)), (text, str(cpu))
            assert f"upsample_{mode}{rank}d" in text and str(dtype) in text and "cast" in text
            assert not (dtype == torch.uint8 and rank == 2)
        else:
            assert dtype == torch.uint8 and rank == 2, "the CPU answered"
            assert torch.equal(F.interpolate(x.to("neuron"), **kw).cpu(), want)
