"""Half-precision upsampling (linear, bilinear, trilinear, bicubic) forward: one float32
interpolation rounded once to the half type, per-axis weights stored in the half type where
the CPU stores them so (lower/resample.py `_upsample_half`). Judged against float64 with
dtype-derived bounds, and the weight rounding against a Python model of the 1-d case.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import eager_neuron

F = torch.nn.functional
EPS = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
CASES = (("linear", (2, 3, 7)), ("bilinear", (2, 3, 5, 7)), ("bicubic", (2, 3, 5, 7)),
         ("trilinear", (1, 2, 4, 5, 6)))


# float16 in every mode; bfloat16 (another rounding function, same code) in one: each (mode,
# dtype) is a kernel compile, and the suite's cold-cache budget is small
@pytest.mark.parametrize("dt,mode,shape", [(torch.float16, m, s) for m, s in CASES] +
                         [(torch.bfloat16, "bicubic", (2, 3, 5, 7))])
def test_half_upsample_within_float64_bound(dt, mode, shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).to(dt)
    rank = len(shape) - 2
    # each tap weight carries <= 1 rounding (|w| sums to <= 1.25 per axis for cubic), plus
    # the final rounding of the result
    for align, kw in itertools.product((False, True), ({"scale_factor": 1.7},
                                                       {"size": (11,) * rank},
                                                       {"scale_factor": 0.6})):
        if mode == "bicubic" and align is False and "size" in kw:
            x = x.contiguous(memory_format=torch.channels_last)
        ours = F.interpolate(x.to("neuron"), mode=mode, align_corners=align, **kw).cpu()
        assert ours.dtype == dt
        ref = F.interpolate(x.double(), mode=mode, align_corners=align, **kw)
        bound = 2 * rank * 1.25 ** rank * EPS[dt] * x.double().abs().max() + \
            EPS[dt] * ref.abs()
        err = (ours.double() - ref).abs()
        assert (err <= bound).all(), (mode, align, kw, err.max().item())


def _r(v: float, dt) -> float:
    return float(torch.tensor(v, dtype=torch.float32).to(dt))


@pytest.mark.parametrize("dt", list(EPS))
def test_half_linear1d_weights_in_half_type(dt):
    """out[o] = x[i0] * w0 + x[i1] * w1 in float32, w1 = half(frac), w0 = half(1 - w1)."""
    x = (torch.randn(1, 1, 9, generator=torch.Generator().manual_seed(2)) * 3).to(dt)
    osize = 23
    ours = F.interpolate(x.to("neuron"), size=osize, mode="linear").cpu()
    scale = torch.tensor(9 / osize, dtype=torch.float32)
    v = x.float().flatten()
    want = []
    for o in range(osize):
        src = float(scale * (torch.tensor(o, dtype=torch.float32) + 0.5) - 0.5)
        src = max(src, 0.0)
        i0 = min(math.floor(src), 8)
        i1 = i0 + 1 if i0 < 8 else i0
        w1 = _r(min(max(src - i0, 0.0), 1.0), dt)
        w0 = _r(1.0 - w1, dt)
        acc = torch.tensor(float(v[i0]) * w0, dtype=torch.float32) + \
            torch.tensor(float(v[i1]) * w1, dtype=torch.float32)
        want.append(float(acc))
    assert torch.equal(ours.flatten(), torch.tensor(want).to(dt))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_nearest_forward_one_copy_kernel(dt):
    # upsample_nearest{1,2,3}d / nearest-exact forward: one launch copying each element from
    # the CPU's source index (bits as they are: -0.0 stays -0.0), the CPU's output layout
    g = torch.Generator().manual_seed(0)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dt.itemsize]
    for shape, sizes in (((2, 3, 5), ((9,), (2,))), ((2, 3, 4, 5), ((8, 10), (3, 7))),
                         ((1, 2, 3, 4, 5), ((6, 8, 10), (2, 3, 7)))):
        x = (torch.randn(shape, generator=g) * 50).to(dt)
        x[(0,) * x.dim()] = -0.0 if dt.is_floating_point else 0
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        for mode in ("nearest", "nearest-exact"):
            for kw in [{"size": s} for s in sizes] + [{"scale_factor": 1.7},
                                                      {"scale_factor": 2.0}]:
                want = F.interpolate(x, mode=mode, **kw)
                eager_neuron.reset_stats()
                got = F.interpolate(x.to("neuron"), mode=mode, **kw)
                assert eager_neuron.stats()["launches"] == 1, (shape, mode, kw)
                assert not eager_neuron.stats()["decompositions"]
                assert got.stride() == want.stride()
                assert torch.equal(got.cpu().view(bits), want.view(bits)), (shape, mode, kw)
