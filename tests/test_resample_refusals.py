"""interpolate's nearest / nearest-exact / area (and the antialiased resizes) refuse the dtypes
the CPU refuses, in its words, and answer what the CPU answers.

The CPU's nearest kernels dispatch on the floating types and uint8; its adaptive average pools
(what mode="area" calls) on the floating types only; the antialiased bilinear/bicubic on
float32, float64 and uint8. Neuron's decompositions (gathers, means) used to answer int8..int64,
bool and complex, or fail in mean()'s words. Judged against the CPU itself, every dtype both
ways (refused where it refuses, the same values where it answers).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401

_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
           torch.complex64, torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _input(dtype, rank: int, layout: str):
    shape = ((0, 3) if layout == "empty" else (2, 3)) + (5,) * rank
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(shape, generator=g) * 100
    x = x > 50 if dtype == torch.bool else x.to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if rank == 2
                         else torch.channels_last_3d)
    return x


def _same_outcome(x, **kw):
    try:
        want = F.interpolate(x, **kw)
    except NotImplementedError as cpu:
        with pytest.raises(NotImplementedError) as got:
            F.interpolate(x.to("neuron"), **kw)
        text = str(got.value)
        assert text.startswith(str(cpu)), (text, str(cpu))
        assert "on neuron" in text, text     # then the op and the user's line
        return False
    got = F.interpolate(x.to("neuron"), **kw).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if x.dtype.is_floating_point and x.dtype.itemsize < 4 and kw["mode"] == "area":
        # the half area means are judged elsewhere (test_half_adaptive_pool.py)
        assert torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    else:
        assert torch.equal(got, want)
    return True


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_resize_refuses_the_dtypes_the_cpu_refuses(mode, rank):
    accepted = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    if mode != "area":
        accepted.add(torch.uint8)
    for dtype in _DTYPES:
        for layout in ("contiguous", "channels_last", "empty"):
            if layout == "channels_last" and rank == 1:
                continue
            x = _input(dtype, rank, layout)
            for kw in (dict(size=(7,) * rank), dict(scale_factor=0.5)):
                answered = _same_outcome(x, mode=mode, **kw)
                # an empty batch: the CPU's 2-d adaptive pool answers before its dtype check
                if layout != "empty" or mode != "area":
                    assert answered == (dtype in accepted), (mode, rank, dtype, layout, kw)


def test_area_of_an_integer_gives_adaptive_pools_words():
    """mode="area" of an int tensor raised mean()'s 'could not infer output dtype' (the
    decomposition's mean) where the CPU names adaptive_avg_pool2d."""
    x = torch.arange(50, dtype=torch.int32).reshape(1, 2, 5, 5)
    with pytest.raises(NotImplementedError, match="\"adaptive_avg_pool2d\" not implemented "
                       "for 'Int'") as got:
        F.interpolate(x.to("neuron"), scale_factor=0.5, mode="area")
    assert "aten::_adaptive_avg_pool2d" in str(got.value)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_half_refused_as_the_cpu(mode):
    """The CPU's antialiased resizes have no half kernels ("compute_index_ranges_weights" not
    implemented for 'Half'); neuron answered them."""
    for dtype in (torch.float16, torch.bfloat16, torch.uint8):
        x = _input(dtype, 2, "contiguous")
        answered = _same_outcome(x, size=(3, 3), mode=mode, antialias=True)
        assert answered == (dtype == torch.uint8)

def test_complex_adaptive_pool_with_an_empty_output_answers():
    """The CPU answers a complex 2-d adaptive average pool whose output is empty (it refuses
    any other); neuron's complex route ran the decomposition: ZeroDivisionError."""
    for shape, size in (((2, 3, 5, 5), [0, 2]), ((2, 3, 5, 5), [2, 0]), ((0, 3, 1, 5), [0, 2])):
        x = torch.ones(shape, dtype=torch.complex64)
        want = torch.ops.aten._adaptive_avg_pool2d(x, size)
        got = torch.ops.aten._adaptive_avg_pool2d(x.to("neuron"), size)
        assert got.shape == want.shape and got.dtype == want.dtype


_MODES = [("nearest", 1), ("nearest", 2), ("nearest", 3), ("nearest-exact", 2), ("area", 1),
          ("area", 2), ("area", 3), ("linear", 1), ("bilinear", 2), ("bicubic", 2),
          ("trilinear", 3)]


@pytest.mark.parametrize("mode,rank", _MODES)
def test_resize_of_an_empty_dim_or_to_size_zero_as_the_cpu(mode, rank):
    """A zero channel or spatial dim, or an output size below 1: the CPU refuses ("Non-empty
    4D data tensor expected", "Input and output sizes should be greater than 0", "adaptive_avg_
    pool2d(): Expected input to have non-zero size for non-batch dimensions"); neuron answered,
    a (2, 3, 0, 4) input resized to 5x5 with values read from nothing. An empty batch is
    answered by both, with the CPU's shape and strides."""
    for zero_at in range(2 + rank):
        shape = [2, 3] + [4] * rank
        shape[zero_at] = 0
        x = torch.ones(shape)
        for kw in (dict(size=(5,) * rank), dict(scale_factor=0.1), dict(size=(0,) * rank)):
            try:
                want = F.interpolate(x, mode=mode, **kw)
            except RuntimeError as cpu:
                with pytest.raises(RuntimeError) as got:
                    F.interpolate(x.to("neuron"), mode=mode, **kw)
                assert str(got.value).startswith(str(cpu).splitlines()[0]), (shape, kw)
            else:
                got = F.interpolate(x.to("neuron"), mode=mode, **kw)
                assert (got.shape, got.stride()) == (want.shape, want.stride()), (shape, kw)
    x = torch.ones([2, 3] + [4] * rank)   # an output of size 0 (area: the CPU answers)
    if mode == "area":
        assert F.interpolate(x.to("neuron"), mode=mode, scale_factor=0.1).shape == \
            F.interpolate(x, mode=mode, scale_factor=0.1).shape
    else:
        with pytest.raises(RuntimeError, match="greater than 0"):
            F.interpolate(x.to("neuron"), mode=mode, scale_factor=0.1)
