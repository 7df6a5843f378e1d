"""histc and segment_reduce on float16 (and bfloat16) on neuron (float16 was the CPU fallback):
the CPU computes both in the half type, rounding every step (c10::Half arithmetic: histc's bin
position (v - lo) * bins / (hi - lo), its per-thread counts; segment_reduce's running value and
the mean's division). References: numpy float16 arithmetic at the same steps (each numpy float16
operation is the correctly rounded result, as c10's), and the float64 result within the bound
those roundings allow (kernels/sort.py render_histc, kernels/reduce.py render_segment)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device


def _histc_f16(x: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """histc in float16 steps (one thread's histogram: fewer than 200 elements)."""
    h = np.float16
    left, right, nb = h(lo), h(hi), h(bins)
    hist = np.zeros(bins, np.float16)
    for v in x.astype(np.float16):
        if not (left <= v <= right):
            continue
        pos = int(h(h(h(v - left) * nb) / h(right - left)))
        hist[min(pos, bins - 1)] += h(1)
    return hist.astype(np.float32)


@pytest.mark.parametrize("bins, lo, hi", [(10, -2.0, 2.0), (7, -1.3, 0.7), (301, -3.0, 3.0)])
def test_histc_float16_steps(bins, lo, hi):
    g = torch.Generator().manual_seed(bins)
    x = (torch.randn(150, generator=g) * 1.5).half()
    x[:6] = torch.tensor([lo, hi, -0.0, float("nan"), float("inf"), 0.5]).half()
    before = eager_neuron.stats()["fallbacks"]
    ours = torch.histc(x.to("neuron"), bins, lo, hi).cpu()
    assert eager_neuron.stats()["fallbacks"] == before
    assert ours.dtype == torch.float16
    ref = _histc_f16(x.numpy(), bins, lo, hi)
    assert ours.float().numpy().tolist() == ref.tolist()
    # every element within the (half-rounded) range counted once: the steps only move elements
    # next to a bin edge
    left, right = float(np.float16(lo)), float(np.float16(hi))
    inside = ((x.float() >= left) & (x.float() <= right)).sum().item()
    assert ours.float().sum().item() == inside


def test_histc_bfloat16_rounds_the_bin_count():
    # bins = 301 is not a bfloat16 (it rounds to 300): the CPU scales by bf16(301)
    x = torch.linspace(-1, 1, 120).bfloat16()
    ours = torch.histc(x.to("neuron"), 301, -1.0, 1.0).cpu().float()
    b = lambda v: float(torch.tensor(v).bfloat16())   # noqa: E731
    nb, left, right = b(301.0), b(-1.0), b(1.0)
    ref = torch.zeros(301)
    for v in x.float().tolist():
        pos = int(b(b(b(v - left) * nb) / b(right - left)))
        ref[min(pos, 300)] += 1
    assert torch.equal(ours, ref)


def _segment_f16(data: np.ndarray, lengths, red: str, initial):
    h = np.float16
    out, start = [], 0
    for n in lengths:
        seg = data[start:start + n].astype(np.float16)
        start += n
        start_v = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf, "prod": 1.0}[red]
        v = h(initial) if initial is not None else h(start_v)
        for x in seg:
            if red in ("sum", "mean"):
                v = h(v + x)
            elif red == "prod":
                v = h(v * x)
            elif red == "max":
                v = x if np.isnan(x) else max(v, x)
            else:
                v = x if np.isnan(x) else min(v, x)
        if red == "mean":
            v = h(np.nan) if n == 0 and initial is None else (h(v / h(n)) if n else v)
        out.append(v)
    return np.array(out, np.float16)


@pytest.mark.parametrize("red", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 0.3])
def test_segment_reduce_float16_steps(red, initial):
    g = torch.Generator().manual_seed(7)
    data = (torch.randn(40, generator=g) * (0.9 if red == "prod" else 3)).half()
    lengths = [10, 0, 25, 5]
    before = eager_neuron.stats()["fallbacks"]
    for kw in ({"lengths": torch.tensor(lengths)},
               {"offsets": torch.tensor([0, 10, 10, 35, 40])}):
        kw = {k: v.to("neuron") for k, v in kw.items()}
        ours = torch.segment_reduce(data.to("neuron"), red, initial=initial, **kw).cpu()
        assert ours.dtype == torch.float16
        ref = _segment_f16(data.numpy(), lengths, red, initial)
        np.testing.assert_array_equal(ours.numpy(), ref)
    assert eager_neuron.stats()["fallbacks"] == before
    if red in ("sum", "mean"):   # and within n roundings of the float64 sum
        d64, start = data.double(), 0
        u = torch.finfo(torch.float16).eps / 2
        for n, o in zip(lengths, ours.double()):
            seg = d64[start:start + n]
            start += n
            if n == 0:
                continue
            exact = (seg.sum() + (initial or 0.0)) / (n if red == "mean" else 1)
            bound = (n + 2) * u * (seg.abs().sum() + abs(initial or 0.0))
            assert abs(o - exact) <= bound
