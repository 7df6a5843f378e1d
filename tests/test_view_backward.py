"""The gradients of views that scatter into zeros: slice_backward and select_backward on neuron
equal the CPU's (values, dtype, shape and strides) for every slice form: negative and
out-of-range bounds, empty slices, steps, non-contiguous gradients, every dtype family. A unit
step is one zero-pad kernel (decomps._zero_padded), counted."""

from __future__ import annotations

import pytest
import torch

import eager_neuron

aten = torch.ops.aten
BIG = 9223372036854775807   # the end a `x[a:]` slice records


def _grad(shape, dtype, contiguous=True):
    g = torch.arange(1, 1 + int(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape)
    g = g.to(dtype) if dtype != torch.bool else (g.long() % 3 == 0)
    if not contiguous and g.dim() >= 2:
        g = g.transpose(0, -1).contiguous().transpose(0, -1)   # same shape, column-major
    return g


def _same(got, ref):
    assert got.device.type == "neuron"
    got = got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape and got.stride() == ref.stride()
    assert torch.equal(got, ref)


SLICES = [  # (input sizes, dim, start, end, step)
    ([2, 3, 8], -1, 4, BIG, 1), ([2, 3, 8], 2, 0, 4, 1), ([2, 3, 8], 1, 1, 2, 1),
    ([2, 3, 8], 0, -1, BIG, 1), ([2, 3, 8], -1, -100, 3, 1), ([2, 3, 8], 2, 5, 5, 1),
    ([2, 3, 8], 2, 6, 2, 1), ([5], 0, 1, 4, 1), ([2, 3, 8], 2, 1, 8, 2), ([4, 6], 1, 0, BIG, 3),
    ([0, 4], 1, 1, 3, 1),
]


def _slice_len(n, start, end, step):
    return len(range(n)[slice(start, None if end == BIG else end, step)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16,
                                   torch.complex64])
@pytest.mark.parametrize("case", SLICES, ids=lambda c: str(c))
@pytest.mark.parametrize("contiguous", [True, False])
def test_slice_backward_equals_cpu(dtype, case, contiguous):
    sizes, dim, start, end, step = case
    gshape = list(sizes)
    gshape[dim] = _slice_len(sizes[dim], start, end, step)
    g = _grad(gshape, dtype, contiguous)
    ref = aten.slice_backward(g, sizes, dim, start, end, step)
    _same(aten.slice_backward(g.to("neuron"), sizes, dim, start, end, step), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("case", [([2, 3, 8], 1, 2), ([2, 3, 8], -1, -1), ([4], 0, 0),
                                  ([2, 5], 0, -2), ([3, 0], 0, 1)])
def test_select_backward_equals_cpu(dtype, case):
    sizes, dim, index = case
    gshape = list(sizes)
    del gshape[dim]
    g = _grad(gshape, dtype)
    ref = aten.select_backward(g, sizes, dim, index)
    _same(aten.select_backward(g.to("neuron"), sizes, dim, index), ref)


def test_unit_step_slice_backward_is_one_kernel():
    g = torch.randn(2, 4, 8, 4, device="neuron")
    eager_neuron.reset_stats()
    out = aten.slice_backward(g, [2, 4, 8, 8], 3, 4, BIG, 1)
    assert eager_neuron.stats()["launches"] == 1
    _same(out, aten.slice_backward(g.cpu(), [2, 4, 8, 8], 3, 4, BIG, 1))


def _laid_out(shape, layout, device):
    """A float32 gradient of `shape` in one of the layouts a backward hands slice_backward,
    made on `device` by the same ops on both sides (the CPU's and neuron's strides equal)."""
    g = _grad(shape, torch.float32).to(device)
    if layout == "heads":        # Llama's q.transpose(1, 2) after a projection
        return g.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "channels_last":
        return g.contiguous(memory_format=torch.channels_last)
    if layout == "expanded":     # a broadcast gradient (stride 0 in dim 0)
        return g[:1].expand(shape)
    if layout == "sliced":       # a slice of a wider gradient (rotate_half's halves)
        wide = _grad(shape[:-1] + [2 * shape[-1]], torch.float32).to(device)
        return wide[..., shape[-1]:]
    raise AssertionError(layout)


@pytest.mark.parametrize("layout", ["heads", "channels_last", "expanded", "sliced"])
@pytest.mark.parametrize("case", [([2, 4, 8, 16], 3, 8, BIG), ([2, 4, 8, 16], 3, 0, 8),
                                  ([2, 4, 8, 16], 1, 1, 3), ([3, 4, 5, 6], 0, -2, BIG)],
                         ids=str)
def test_unit_step_slice_backward_of_strided_gradients(layout, case):
    # a non-contiguous gradient pads into the CPU's contiguous result in one kernel, except a
    # channels-last one (constant_pad_nd would keep channels-last): zeros and a copy, as the CPU
    sizes, dim, start, end = case
    gshape = list(sizes)
    gshape[dim] = _slice_len(sizes[dim], start, end, 1)
    g = _laid_out(gshape, layout, "cpu")
    ref = aten.slice_backward(g, sizes, dim, start, end, 1)
    gn = _laid_out(gshape, layout, "neuron")
    assert gn.stride() == g.stride()
    eager_neuron.reset_stats()
    _same(aten.slice_backward(gn, sizes, dim, start, end, 1), ref)
    if layout != "channels_last":
        assert eager_neuron.stats()["launches"] == 1


def test_wrong_gradient_shape_raises_as_cpu():
    g = torch.randn(2, 3)
    with pytest.raises(RuntimeError):
        aten.slice_backward(g, [2, 8], 1, 0, 4, 1)
    with pytest.raises(RuntimeError):
        aten.slice_backward(g.to("neuron"), [2, 8], 1, 0, 4, 1)


def test_rotate_half_gradient_equals_cpu():
    # Llama's rotate_half: cat((-x2, x1)) of the two halves; its backward is two slice_backward
    def f(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    x = torch.randn(2, 4, 8, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 4, 8, 16, dtype=torch.float64)
    (f(x) * w).sum().backward()
    xn = x.detach().to("neuron").requires_grad_()
    (f(xn) * w.to("neuron")).sum().backward()
    _same(xn.grad, x.grad)


def test_compiled_rotate_half_gradient_equals_cpu():
    # the compiled graph's slice_backward nodes take the same zero pad (compile/forms.py)
    def f(x, w):
        h = x.shape[-1] // 2
        return (torch.cat((-x[..., h:], x[..., :h]), dim=-1) * w).sum()

    x = torch.randn(2, 4, 8, 16, requires_grad=True)
    w = torch.randn(2, 4, 8, 16)
    f(x, w).backward()
    torch._dynamo.reset()
    eager_neuron.compile.reset_stats()
    g = torch.compile(f, backend="neuron")
    for _ in range(2):        # the interpreted call, then the planned one
        xn = x.detach().to("neuron").requires_grad_()
        g(xn, w.to("neuron")).backward()
        _same(xn.grad, x.grad)
    s = eager_neuron.compile.stats()
    assert s["graph_eager_ops"].get("aten::slice_backward", 0) >= 2, s["graph_eager_ops"]
    assert s["graph_fallbacks"] == {}
