"""Complex as_strided_scatter on neuron (was the CPU fallback): against an exact reference
built element by element in Python, conj views, and ATen's refusal of a destination whose
elements share memory (lower/complex_parts.py as_strided_scatter, lower/shape.py)."""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device


def _reference(x, src, size, stride, offset):
    """out = x; out's flat storage at offset + sum(i_k * stride_k) = src[i] (a copy moves
    values exactly)."""
    flat = x.contiguous().view(-1).tolist()
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in size]).view(-1, len(size)):
        at = offset + sum(int(i) * s for i, s in zip(idx, stride))
        flat[at] = complex(src[tuple(int(i) for i in idx)])
    return flat


@pytest.mark.parametrize("dt", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("size, stride, offset", [
    ((2, 2), (1, 2), 1), ((2, 2), (3, 1), 0), ((3,), (4,), 0), ((2, 3), (3, 1), 6)])
def test_complex_as_strided_scatter_exact(dt, size, stride, offset):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, dtype=dt, generator=g)
    src = torch.randn(size, dtype=dt, generator=g)
    before = eager_neuron.stats()["fallbacks"]
    for conj_src in (False, True):
        s = src.conj() if conj_src else src
        ours = torch.as_strided_scatter(x.to("neuron"), s.to("neuron"), size, stride, offset)
        assert ours.dtype == dt
        assert ours.cpu().view(-1).tolist() == _reference(x, s.resolve_conj(), size, stride,
                                                          offset)
    assert eager_neuron.stats()["fallbacks"] == before


@pytest.mark.parametrize("dt", [torch.complex64, torch.float32])
def test_as_strided_scatter_refuses_overlapping_destination(dt):
    x, src = torch.zeros(4, 3, dtype=dt), torch.ones(2, 2, dtype=dt)
    words = "more than one element of the written-to tensor"
    with pytest.raises(RuntimeError, match=words):   # the CPU refuses it
        torch.as_strided_scatter(x, src, (2, 2), (0, 1), 0)
    with pytest.raises(RuntimeError, match=words):
        torch.as_strided_scatter(x.to("neuron"), src.to("neuron"), (2, 2), (0, 1), 0)


@pytest.mark.parametrize("dt", [torch.complex64, torch.complex128])
def test_complex_masked_scatter_backward_exact(dt):
    # the source's gradient: grad[mask] in row-major order, zero-padded to the source's size
    g = torch.Generator().manual_seed(2)
    grad = torch.randn(3, 4, dtype=dt, generator=g)
    mask = torch.rand(3, 4, generator=g) > 0.4
    before = eager_neuron.stats()["fallbacks"]
    for gr in (grad, grad.conj(), grad[:, ::2], grad[0].expand(3, 4)):
        m = mask[:, :gr.shape[1]]
        want = [complex(gr[i, j]) for i in range(gr.shape[0]) for j in range(gr.shape[1])
                if m[i, j]]
        want += [0j] * (14 - len(want))
        ours = torch.ops.aten.masked_scatter_backward(gr.to("neuron"), m.to("neuron"), [14])
        assert ours.dtype == dt and ours.cpu().tolist() == want
    assert eager_neuron.stats()["fallbacks"] == before
