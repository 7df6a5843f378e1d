"""OpInfo defects found by the float32/int64/bool sweep (tools/dtype_sweep.py, every sample), each
judged against an exact or float64 reference, with no CPU fallback allowed.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron


def _fallbacks() -> dict:
    return dict(eager_neuron.stats()["fallbacks"])


@pytest.mark.parametrize("s1,s2,mode", [
    ((0, 4, 5), (1, 3, 5), "use_mm_for_euclid_dist"),   # empty batch, x2 broadcast over it
    ((4, 5), (0, 3, 5), "use_mm_for_euclid_dist"),      # x1 broadcast over an empty batch
    ((0, 5), (4, 5), "use_mm_for_euclid_dist"),         # p=2 matmul mode, no rows
    ((4, 5), (0, 5), "donot_use_mm_for_euclid_dist"),
])
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_cdist_empty_output_gradients_are_zero(s1, s2, mode, p):
    """An empty distance matrix: the gradients of the non-empty operand are exactly zero (they
    were never written: garbage up to 1e36), and the forward runs on the device (p=2 in matmul
    mode fell back to the CPU)."""
    torch.manual_seed(0)
    x1 = torch.randn(s1, dtype=torch.float32)
    x2 = torch.randn(s2, dtype=torch.float32)
    n1 = x1.to("neuron").requires_grad_()
    n2 = x2.to("neuron").requires_grad_()
    before = _fallbacks()
    d = torch.cdist(n1, n2, p=p, compute_mode=mode)
    want_shape = torch.broadcast_shapes(s1[:-2], s2[:-2]) + (s1[-2], s2[-2])
    assert tuple(d.shape) == tuple(want_shape) and d.numel() == 0
    g1, g2 = torch.autograd.grad(d, (n1, n2), torch.randn(want_shape).to("neuron"))
    assert _fallbacks() == before
    assert torch.equal(g1.cpu(), torch.zeros(s1)) and torch.equal(g2.cpu(), torch.zeros(s2))


def test_pdist_one_row_gradient_is_zero():
    x = torch.tensor([[1.0, -2.0, 3.0]]).to("neuron").requires_grad_()
    d = torch.pdist(x)
    assert d.shape == (0,)
    (g,) = torch.autograd.grad(d, x, torch.empty(0).to("neuron"))
    assert torch.equal(g.cpu(), torch.zeros(1, 3))


@pytest.mark.parametrize("divisor", [-2, -3, 3, None])
def test_avg_pool_int64_truncates_toward_zero(divisor):
    """Integer average pooling divides the window sum as C does (toward zero), also under a
    negative divisor_override (it floored there: off by one on every inexact window)."""
    torch.manual_seed(0)
    x = torch.randint(-50, 50, (2, 3, 5, 6), dtype=torch.int64)
    got = torch.nn.functional.avg_pool2d(x.to("neuron"), (2, 3), stride=(2, 1),
                                         divisor_override=divisor).cpu()
    sums = x.unfold(2, 2, 2).unfold(3, 3, 1).sum((-1, -2)).tolist()
    d = divisor or 6

    def tdiv(s):
        q = abs(s) // abs(d)
        return q if (s >= 0) == (d > 0) else -q

    want = torch.tensor([[[[tdiv(s) for s in row] for row in ch] for ch in b] for b in sums])
    assert torch.equal(got, want)
    x3 = x[:, :, :4].unsqueeze(2).expand(2, 3, 2, 4, 6).contiguous()
    got3 = torch.nn.functional.avg_pool3d(x3.to("neuron"), (2, 2, 3), stride=(2, 2, 1),
                                          divisor_override=divisor).cpu()
    sums3 = x3.unfold(2, 2, 2).unfold(3, 2, 2).unfold(4, 3, 1).sum((-1, -2, -3))
    d = divisor or 12
    want3 = torch.tensor([tdiv(s) for s in sums3.flatten().tolist()]).view(sums3.shape)
    assert torch.equal(got3, want3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_householder_product_without_reflectors_is_identity(dtype):
    """tau of length 0: Q is the first n columns of the identity, exactly, and the gradient of
    the input is None, as on the CPU (it raised "cannot reshape array of size 0")."""
    A = torch.randn(2, 5, 3, dtype=dtype).to("neuron").requires_grad_()
    tau = torch.empty(2, 0, dtype=dtype).to("neuron")
    Q = torch.linalg.householder_product(A, tau)
    assert torch.equal(Q.detach().cpu(), torch.eye(5, 3, dtype=dtype).expand(2, 5, 3))
    (g,) = torch.autograd.grad(Q, A, torch.randn(2, 5, 3, dtype=dtype).to("neuron"),
                               allow_unused=True)
    assert g is None


def test_scatter_with_empty_index_of_more_dims():
    """An empty index with more dims than self (gather's backward of such an index) scatters
    nothing: self is returned exactly (it raised "Dimension out of range")."""
    s = torch.randn(5)
    idx = torch.empty(2, 0, dtype=torch.long).to("neuron")
    src = torch.empty(2, 0).to("neuron")
    assert torch.equal(s.to("neuron").scatter_add(0, idx, src).cpu(), s)
    assert torch.equal(s.to("neuron").scatter(0, idx, 2.0).cpu(), s)
    x = s.to("neuron").requires_grad_()
    out = torch.gather(x, 0, idx)
    assert out.shape == (2, 0)
    (g,) = torch.autograd.grad(out, x, torch.empty(2, 0).to("neuron"))
    assert torch.equal(g.cpu(), torch.zeros(5))


def _runs(rows: list) -> tuple:
    """Reference unique_consecutive over a list of rows: (values, inverse, counts)."""
    values, inverse, counts = [], [], []
    for r in rows:
        if not values or r != values[-1] or any(v != v for v in r):   # NaN never equals
            values.append(r)
            counts.append(0)
        inverse.append(len(values) - 1)
        counts[-1] += 1
    return values, inverse, counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_consecutive_along_a_dim(dtype, dim):
    """unique_consecutive with a dim runs on the device (it was the CPU fallback): runs of equal
    slices collapse in order; inverse and counts are returned as ATen's dim path does."""
    torch.manual_seed(0)
    x = torch.randint(0, 2, (6, 3)).to(dtype)
    x[1] = x[0]
    x[4] = x[3]
    before = _fallbacks()
    v, inv, cnt = torch.ops.aten.unique_consecutive(x.to("neuron"), False, False, dim)
    assert _fallbacks() == before
    moved = x.movedim(dim, 0)
    vals, rinv, rcnt = _runs([r.tolist() for r in moved])
    assert torch.equal(v.cpu(), torch.tensor(vals, dtype=dtype).reshape(
        (len(vals),) + tuple(moved.shape[1:])).movedim(0, dim))
    assert inv.cpu().tolist() == rinv and cnt.cpu().tolist() == rcnt


def test_unique_consecutive_1d_dims():
    """dim=0 of a 1-d tensor takes the flat path (no inverse/counts unless asked), dim=-1 the
    dim path (both returned); NaNs stay distinct."""
    x = torch.tensor([1.0, 1.0, float("nan"), float("nan"), 2.0, 1.0])
    vals, rinv, rcnt = _runs([[v] for v in x.tolist()])
    want = torch.tensor([v[0] for v in vals])
    v, inv, cnt = torch.ops.aten.unique_consecutive(x.to("neuron"), False, False, 0)
    assert torch.allclose(v.cpu(), want, equal_nan=True, rtol=0, atol=0)
    assert inv.numel() == 0 and cnt.numel() == 0
    v, inv, cnt = torch.ops.aten.unique_consecutive(x.to("neuron"), False, False, -1)
    assert torch.allclose(v.cpu(), want, equal_nan=True, rtol=0, atol=0)
    assert inv.cpu().tolist() == rinv and cnt.cpu().tolist() == rcnt


@pytest.mark.parametrize("bins", [1, 4])
def test_histogram_of_no_data_has_unit_edges(bins):
    """histogram of an empty tensor without a range: edges linspace(0, 1) as ATen's outer edges
    start (they were widened around 0 to [-0.5, 0.5]); counts zero, density NaN (0/0)."""
    x = torch.empty(5, 0, 5).to("neuron")
    h, e = torch.histogram(x, bins)
    want = [i / bins for i in range(bins + 1)]
    assert e.cpu().double().sub(torch.tensor(want, dtype=torch.float64)).abs().max() <= \
        torch.finfo(torch.float32).eps
    assert torch.equal(h.cpu(), torch.zeros(bins))
    h, _ = torch.histogram(x, bins, density=True)
    assert bool(h.cpu().isnan().all())


@pytest.mark.parametrize("size", [0, 2, 7])
def test_nonzero_static_complex(size):
    """nonzero_static of a complex tensor (z != 0: either part) on the device, padded with
    fill_value or cut, as the real one (it raised "no neuron kernel for complex tensors")."""
    z = torch.tensor([[0j, 1j, 0j], [2 + 0j, 0j, -1 - 1j]], dtype=torch.complex64)
    pos = [[i, j] for i in range(2) for j in range(3) if z[i, j] != 0]
    want = (pos + [[-5, -5]] * size)[:size]
    got = torch.nonzero_static(z.to("neuron"), size=size, fill_value=-5).cpu()
    assert got.dtype == torch.int64 and got.tolist() == want
