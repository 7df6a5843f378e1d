"""Complex ops where neuron must do what the CPU does: run them (in-place nan_to_num_, whose
torch meta function refuses complex) or raise the CPU's exception type and words (unique,
unique_consecutive, unique(dim=), nansum/nanmean). Values against exact references built in
Python; errors against the CPU's message. (lower/complex.py CPU_REFUSES, lower/sort.py,
lower/extras.py, eager_neuron/meta.py _META_VIA_OUT)"""

from __future__ import annotations

import math

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dt", [torch.complex64, torch.complex128])
def test_complex_nan_to_num_inplace_replaces_each_part(dt):
    vals = [complex(1, 2), complex(NAN, 1), complex(INF, -INF), complex(-INF, NAN)]
    z = torch.tensor(vals, dtype=dt).to("neuron")
    big = torch.finfo(dt.to_real()).max

    def fix(v, posinf, neginf):   # the exact result, part by part
        return 0.0 if math.isnan(v) else posinf if v == INF else neginf if v == -INF else v

    for kw, (pi, ni) in (({}, (big, -big)), ({"nan": 7.0, "posinf": 3.0, "neginf": -4.0},
                                             (3.0, -4.0))):
        w = z.clone()
        r = w.nan_to_num_(**kw)
        assert r is w
        nan = kw.get("nan", 0.0)
        want = [complex(nan if math.isnan(v.real) else fix(v.real, pi, ni),
                        nan if math.isnan(v.imag) else fix(v.imag, pi, ni)) for v in vals]
        assert w.cpu().tolist() == [complex(torch.tensor(c, dtype=dt)) for c in want]


@pytest.mark.parametrize("call, words", [
    (lambda t: torch.unique(t), '"unique" not implemented for \'ComplexFloat\''),
    (lambda t: torch.unique(t, sorted=False, return_inverse=True, return_counts=True),
     '"unique" not implemented for \'ComplexFloat\''),
    (lambda t: torch.unique_consecutive(t), '"unique" not implemented for \'ComplexFloat\''),
    (lambda t: torch.unique_consecutive(t.view(2, 2), dim=0),
     '"unique_dim" not implemented for \'ComplexFloat\''),
    (lambda t: torch.unique(t.view(2, 2), dim=1), '"unique_dim" not implemented for '
                                                  '\'ComplexFloat\''),
])
def test_complex_unique_raises_the_cpus_error(call, words):
    z = torch.tensor([1 + 2j, 1 + 2j, 3j, 1 + 2j])
    with pytest.raises(NotImplementedError, match=words):   # the CPU's own words
        call(z)
    before = eager_neuron.stats()["fallbacks"]
    with pytest.raises(NotImplementedError, match=words):
        call(z.to("neuron"))
    assert eager_neuron.stats()["fallbacks"] == before   # raised on neuron, not by the CPU


def test_complex_nansum_nanmean_raise_the_cpus_error():
    z = torch.tensor([1 + 2j, complex(NAN, 0)])
    words = "nansum on CPU does not support complex inputs"
    for f in (torch.nansum, torch.nanmean):
        with pytest.raises(RuntimeError, match=words):
            f(z)
        with pytest.raises(RuntimeError, match=words):
            f(z.to("neuron"))


def test_real_nansum_nanmean_still_run():
    x = torch.tensor([[1.5, NAN, 2.0], [NAN, NAN, -4.0]], dtype=torch.float64)
    xn = x.to("neuron")
    assert torch.nansum(xn).item() == -0.5
    assert torch.nansum(xn, 1).cpu().tolist() == [3.5, -4.0]
    assert torch.nanmean(xn, 1).cpu().tolist() == [1.75, -4.0]
