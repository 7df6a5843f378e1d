"""Index/gather and shape families (lower/index.py, lower/mask.py, lower/shape.py) vs the CPU.

Forward and backward against PyTorch's CPU, int64/float32/bool, non-contiguous inputs, negative
indices; out-of-range indices raise an error naming the op; no CPU fallbacks for these ops; a new
batch size does not recompile. nonzero, masked_select and x[mask] have data-dependent output
shapes: they are served by the DYNAMIC hook (tested directly, and through dispatch once wired).
"""

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.lower.index import DYNAMIC, LOWERINGS

pytestmark = pytest.mark.filterwarnings(
    "ignore:(The reduce argument|index_reduce\\(\\) is in beta):UserWarning")
aten = torch.ops.aten
D = "neuron"
OURS = set(LOWERINGS) | set(DYNAMIC)


def _ours_fell_back() -> set:
    return {name for name in eager_neuron.stats()["fallbacks"]
            if name in OURS or name.split(".")[0] in OURS}


@pytest.fixture(autouse=True)
def no_fallbacks_for_our_ops(request):
    eager_neuron.reset_stats()
    yield
    if request.node.get_closest_marker("xfail") is None:
        assert not _ours_fell_back(), eager_neuron.stats()["fallbacks"]


def dev(x):
    return x.to(D) if isinstance(x, torch.Tensor) else x


def same(fn, *args, exact=True):
    """fn on the CPU and on neuron give the same result (tuples compared element by element)."""
    cpu = fn(*args)
    got = fn(*[dev(a) for a in args])
    cpu = cpu if isinstance(cpu, tuple) else (cpu,)
    got = got if isinstance(got, tuple) else (got,)
    for c, g in zip(cpu, got):
        assert g.device.type == D
        if exact:   # bit-exact, NaN equal to NaN
            torch.testing.assert_close(g.cpu(), c, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(g.cpu(), c)


def grads_match(fn, *args):
    """Forward and the gradients of every float argument match the CPU."""
    cx = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    nx = [dev(a).detach().requires_grad_(a.is_floating_point()) for a in args]
    out_c, out_n = fn(*cx), fn(*nx)
    torch.testing.assert_close(out_n.cpu(), out_c)
    w = torch.randn(out_c.shape)
    (out_c * w).sum().backward()
    (out_n * dev(w)).sum().backward()
    for c, n in zip(cx, nx):
        if c.grad is not None:
            torch.testing.assert_close(n.grad.cpu(), c.grad)


X = torch.randn(6, 7)
XT = torch.randn(7, 6).t()                     # non-contiguous
IDX = torch.tensor([0, 3, 3, -1, 5])             # negative index: valid for advanced indexing
G = torch.randint(0, 7, (6, 4))


# -- reads ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_embedding_index_select_gather(dtype):
    w = (torch.randn(10, 5) * 10).to(dtype)
    ids = torch.randint(0, 10, (3, 4))
    same(lambda w, i: F.embedding(i, w), w, ids)
    same(lambda x, i: x.index_select(1, i), w, torch.tensor([4, 0, 4]))
    same(lambda x, i: x.gather(1, i), w, torch.randint(0, 5, (10, 3)))
    if dtype == torch.float32:   # non-contiguous operands (one more kernel layout each)
        same(lambda w, i: F.embedding(i, w), w.t().contiguous().t(), ids.t())
        same(lambda x, i: x.index_select(0, i), w[:, ::2], torch.tensor(7))
        same(lambda x, i: x.gather(0, i), w.t(), torch.randint(0, 5, (2, 10)))


def test_gather_take_along_dim_and_3d():
    x = torch.randn(3, 4, 5).transpose(0, 2)
    same(lambda x, i: x.gather(1, i), x, torch.randint(0, 4, (5, 2, 3)))
    same(lambda x, i: torch.take_along_dim(x, i, 2), x, torch.randint(0, 3, (5, 4, 1)))


def test_advanced_index():
    x = torch.randn(4, 5, 6)
    i, j = torch.tensor([[0, -1], [2, 3]]), torch.tensor([1, -2])
    cases = [
        [i], [None, j], [i, j], [None, None, j],       # adjacent: result keeps their place
        [i, None, j],                                   # split: broadcast dims go first
        [torch.tensor(2), None, j],
    ]
    for idx in cases:
        for src in (x, x.transpose(0, 2).contiguous().transpose(0, 2)):
            same(lambda s, *ix: aten.index.Tensor(s, list(ix)), src, *idx)
    same(lambda x, i: x[i], X, IDX)
    same(lambda x, i: x[:, i.int()], XT, IDX)
    same(lambda x, i: x[1:, i], X > 0, IDX)


def test_boolean_mask_index_nonzero_masked_select():
    x = torch.randn(4, 5, 3)
    m = x[..., 0] > 0
    same(lambda x, m: x[m], x, m)
    same(lambda x, m: x[:, m[0]], x, m)
    same(lambda x, m: x[m[:, 0], :, -1], x, m)
    same(lambda x: x[x > 0], x.transpose(0, 1))
    for t in (x, x > 0, x > 9, torch.tensor(1.5), x.to(torch.bfloat16)):
        cpu, got = torch.nonzero(t), torch.nonzero(dev(t))
        assert got.stride() == cpu.stride()   # column-major, as the CPU
        assert torch.equal(got.cpu(), cpu)
    same(lambda x: torch.where(x > 0.5), x)
    same(lambda x: torch.masked_select(x, x > 0.5), x)
    same(lambda x, m: torch.masked_select(x, m), x.int(), x[0, :, :1] > 0)
    same(lambda x, m: torch.masked_select(x, m), x.to(torch.bfloat16), x > 0)
    for size in (0, 3, 200):
        same(lambda x, n=size: torch.nonzero_static(x, size=n, fill_value=-7), x > 0)


# -- writes ---------------------------------------------------------------------------------------

def test_index_put():
    x, v = torch.randn(5, 6), torch.randn(5, 3)
    v6 = torch.randn(3, 6).t()
    dup = torch.tensor([0, 2, 2])
    for acc in (False, True):
        same(lambda x, i, v, acc=acc: aten.index_put(x, [None, i], v, acc), x, dup, v)
        same(lambda x, i, v, acc=acc: aten.index_put(x, [i, i], v[0], acc), x, dup, v)
        same(lambda x, i, acc=acc: aten.index_put(x, [i], x[0, 0], acc), x, torch.tensor([-1]))
        same(lambda x, i, v, acc=acc: aten.index_put(x.t(), [None, i], v, acc), x, dup, v6)
    xi = (x * 10).long()

    def setitem(x, i, v):
        x = x.clone()
        x[:, i] = v
        x[x > 1] = v[0, 0]
        x[x < -1] = torch.arange(int((x < -1).sum()), dtype=x.dtype, device=x.device)
        return x
    same(setitem, x, dup, v)
    same(setitem, xi, dup, (v * 10).long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_scatter_variants(dtype):
    x = (torch.randn(4, 6) * 5).to(dtype)
    src = (torch.randn(4, 6) * 5).to(dtype)
    i = torch.randint(0, 6, (4, 3))
    same(lambda x, i, s: x.scatter(1, i, s), x, i, src)
    same(lambda x, i: x.scatter(1, i, 1), x, i)
    if dtype == torch.float32:
        same(lambda x, i, s: x.t().scatter(0, i.t(), s.t()), x, i, src)
    if dtype != torch.bool:
        same(lambda x, i, s: x.scatter_add(1, i, s), x, i, src, exact=False)
        same(lambda x, i, s: x.scatter(1, i, s, reduce="multiply"), x, i, src, exact=False)
        same(lambda x, i: x.scatter(1, i, 2, reduce="add"), x, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(dtype):
    x = (torch.randn(3, 8) * 5).to(dtype)
    src = (torch.randn(3, 10) * 5).to(dtype)
    i = torch.randint(0, 8, (3, 10))
    for include_self in (True, False):
        for red in ("sum", "prod", "mean", "amax", "amin"):
            same(lambda x, i, s, r=red, inc=include_self: x.scatter_reduce(1, i, s, r,
                                                                           include_self=inc),
                 x, i, src, exact=dtype != torch.float32)
    nan = torch.tensor([[1., float("nan"), 3.]])
    same(lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), nan, torch.tensor([[0, 0, 2]]), nan)


def test_index_add_masked_scatter_and_inplace():
    x, s = torch.randn(5, 4), torch.randn(5, 3)
    same(lambda x, i, s: x.index_add(1, i, s, alpha=2.0), x, torch.tensor([3, 0, 3]), s,
         exact=False)
    same(lambda x, i, s: x.index_add(0, i, s.t()), x.t(), torch.tensor([1, 1, 0]), s,
         exact=False)
    same(lambda x, m, s: x.masked_scatter(m, s), x, x > 0, torch.randn(30))
    same(lambda x, m, s: x.masked_scatter(m, s), x, x[0] > 0, torch.randn(6, 5).t())

    def inplace(x, i, s):
        y = x.clone()
        y.index_add_(0, i, s)
        y.scatter_(1, (i[1:] + 3).view(1, 2).expand(5, 2), 9.0)
        y.masked_scatter_(y > 1, s.flatten())
        return y
    same(inplace, x, torch.tensor([4, 0, 0]), torch.randn(3, 4), exact=False)
    for acc in (False, True):
        same(lambda x, i, s, acc=acc: x.put(i, s, accumulate=acc), x, torch.tensor([0, -1, 7, 7]),
             torch.randn(4), exact=False)
    for red in ("prod", "mean", "amax", "amin"):
        same(lambda x, i, s, r=red: x.index_reduce(0, i, s, r, include_self=False), x,
             torch.tensor([4, 0, 0]), torch.randn(3, 4), exact=False)


# -- shape ops ------------------------------------------------------------------------------------

SHAPE_OPS = [
    lambda t: t.flip(0, -1),
    lambda t: t.roll((2, -1), (0, 2)),
    lambda t: t.roll(7),
    lambda t: t.repeat(2, 1, 1, 3),
    lambda t: F.pad(t, (1, 2, 0, -1), value=1),
    lambda t: t.tril(1),
    lambda t: t.triu(-1),
    lambda t: torch.cat([t, t[:1]], 0),
    lambda t: torch.cat([t[:, :2], t], -2),
    lambda t: torch.stack([t, t], 1),
    lambda t: torch.slice_scatter(t, t[:, :2], 1, 1, 4, 2),
    lambda t: torch.select_scatter(t, t[:, 0], 1, 2),
    lambda t: torch.diagonal_scatter(t, t.flip(0).diagonal(1, 0, 1), 1, 0, 1),
]


def test_shape_ops():
    x = torch.randn(4, 5, 3) * 5
    for t in (x, x.transpose(0, 2), x.long(), x > 0):
        for fn in SHAPE_OPS:
            same(fn, t)


def test_cat_mixed_dtypes_and_legacy_empty():
    a, b = torch.randn(2, 3), torch.arange(6).view(2, 3)
    same(lambda a, b: torch.cat([a, b, b > 2], 1), a, b)
    same(lambda a, b: torch.cat([a.new_empty(0), a, b], 0), a, b)
    same(lambda a: torch.cat([a[:, :0], a], 1), a)


def test_sort_topk_stable_with_ties_and_nan():
    x = torch.tensor([[3., 1., float("nan"), 1., -2., 3.], [0., 0., 5., -1., float("nan"), 0.]])
    for desc in (False, True):
        same(lambda x, d=desc: torch.sort(x, stable=True, descending=d), x)
        same(lambda x, d=desc: torch.sort(x.t(), dim=0, stable=True, descending=d), x)
        same(lambda x, d=desc: torch.argsort(x, stable=True, descending=d), x)
    same(lambda x: torch.sort(x, stable=True), torch.randint(0, 3, (4, 9)))
    y = torch.randn(5, 40)
    same(lambda y: torch.topk(y, 4), y)
    same(lambda y: torch.topk(y, 3, dim=0, largest=False), y)


# -- backward -------------------------------------------------------------------------------------

def test_backward():
    w, ids = torch.randn(10, 4), torch.tensor([[1, 2, 0], [3, 1, 9]])
    grads_match(lambda w, i: F.embedding(i, w, padding_idx=0), w, ids)
    grads_match(lambda w, i: F.embedding(i, w, scale_grad_by_freq=True), w, ids)
    grads_match(lambda x, i: x.gather(1, i), X, G)
    grads_match(lambda x, i: x.index_select(1, i), XT, torch.tensor([0, 2, 2]))
    grads_match(lambda x: torch.cat([x, x * 2, x[:1]], 0), X)
    grads_match(lambda x: torch.topk(x, 2)[0], X)
    grads_match(lambda x: F.pad(x.flip(1), (1, 2)), X)
    grads_match(lambda x, t: F.cross_entropy(x, t), X, torch.tensor([1, 2, 3, 4, 5, 6]))


def test_index_backward():
    grads_match(lambda x, i: x[:, i], X, IDX)
    grads_match(lambda x: x[x > 0], X)
    grads_match(lambda x, s: x.masked_scatter(x > 0, s), X, torch.randn(50))
    grads_match(lambda x, i: torch.take(x, i), X, torch.tensor([[0, 5], [41, 5]]))


def test_half_goes_through():
    x = torch.randn(4, 6).to(torch.bfloat16)
    same(lambda x, i: x.gather(1, i), x, G[:4] % 6)
    same(lambda x: torch.cat([x, x], 0), x)
    same(lambda x, i: x.index_put((i,), x[0, 0]), x, torch.tensor([1, 3]))
    same(lambda x: torch.sort(x, stable=True), x)


# -- errors, fallbacks, recompiles ----------------------------------------------------------------

BAD = [
    ("aten::embedding", lambda x: F.embedding(dev(torch.tensor([[1, 10]])), x)),
    ("aten::embedding", lambda x: F.embedding(dev(torch.tensor([-1])), x)),
    ("aten::index_select", lambda x: x.index_select(1, dev(torch.tensor([0, 7])))),
    ("aten::gather", lambda x: x.gather(1, dev(torch.tensor([[7]])))),
    ("aten::scatter", lambda x: x.scatter(1, dev(torch.tensor([[-1]])), 1.0)),
    ("aten::index_add", lambda x: x.index_add(0, dev(torch.tensor([6])), x[:1])),
    ("aten::index_put", lambda x: x.index_put((dev(torch.tensor([-7])),), x[0, 0])),
]


@pytest.mark.parametrize("op,fn", BAD, ids=[f"{op}{i}" for i, (op, _) in enumerate(BAD)])
def test_out_of_range_raises_naming_the_op(op, fn):
    # the CPU's type: IndexError for embedding/index_select/index_*, RuntimeError for
    # gather/scatter (tests/test_errors.py test_error_type_is_the_cpus compares with the CPU)
    x = dev(X)
    with pytest.raises((IndexError, RuntimeError), match=f"(?s)(?=.*{op})(?=.*out of bounds)"):
        fn(x)


def test_failed_inplace_put_leaves_self_untouched():
    x = dev(X)
    with pytest.raises((IndexError, eager_neuron.KernelError), match="out of bounds"):
        x.index_put_((dev(torch.tensor([0, 9])),), dev(torch.tensor(5.0)))
    assert torch.equal(x.cpu(), X)
    with pytest.raises(IndexError, match="(?s)(?=.*aten::index)(?=.*out of bounds)"):
        x[dev(torch.tensor([6]))]
    with pytest.raises(IndexError, match="shape of the mask"):
        x[dev(torch.tensor([True, False]))]


def test_new_batch_size_does_not_recompile():
    def step(b):
        w = torch.randn(50, 8, device=D, requires_grad=True)
        ids = dev(torch.randint(0, 50, (b, 5)))
        h = F.embedding(ids, w)
        h = torch.cat([h, h.flip(1)], 1)
        h = F.pad(h, (0, 1)).gather(2, dev(torch.randint(0, 9, (b, 10, 3))))
        h = h.scatter_add(1, dev(torch.randint(0, 10, (b, 2, 3))), h[:, :2])
        h = h.index_select(0, dev(torch.arange(b - 1, -1, -1)))
        v, _ = torch.topk(h, 2, dim=1)
        v.sum().backward()
    step(4)
    before = eager_neuron.stats()["compiles"]
    step(7)
    step(13)
    assert eager_neuron.stats()["compiles"] == before


def test_index_put_accumulate_bfloat16_rounds_each_add():
    # duplicate indices: the CPU adds in bfloat16 one value at a time (float32 sums differ)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 5, generator=g).bfloat16()
    idx = torch.tensor([0, 0, 0, 1, 1, 0, 0])
    v = torch.randn(7, 5, generator=g).bfloat16()
    want = x.index_put((idx,), v, accumulate=True)
    got = x.to("neuron").index_put((idx.to("neuron"),), v.to("neuron"), accumulate=True)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("sizes,dim,start,end,step", [
    ((6, 8), 1, 1, 7, 2), ((6, 8), 0, -4, 100, 1), ((5,), 0, 0, 5, 3), ((3, 4, 5), 2, -3, -1, 1),
    ((4, 4), 1, 2, 2, 1)])
def test_slice_backward_is_the_cpus(sizes, dim, start, end, step):
    # zeros and one strided copy (decomps._slice_backward): exact, contiguous, as on the CPU
    x = torch.zeros(sizes)
    g = torch.randn(x[(slice(None),) * dim + (slice(start, end, step),)].shape)
    want = torch.ops.aten.slice_backward(g, list(sizes), dim, start, end, step)
    got = torch.ops.aten.slice_backward(g.to("neuron"), list(sizes), dim, start, end, step)
    assert torch.equal(got.cpu(), want) and got.stride() == want.stride()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_accumulating_puts_round_each_add(dtype):
    # the CPU's index_put(accumulate=True) adds one value at a time in the half type (float32
    # add, rounded): float16 too, not only bfloat16. _unsafe_masked_index's backward (masked
    # values put with accumulate) is the same kernel. The reference replays those adds in
    # row-major order of the broadcast index, each rounded to the half type.
    g = torch.Generator().manual_seed(3)
    i0 = torch.randint(0, 4, (9, 1), generator=g)
    i1 = torch.randint(0, 3, (1, 8), generator=g)
    v = (torch.randn(9, 8, generator=g) * 3).to(dtype)
    mask = torch.rand(9, 8, generator=g) > 0.25
    x = torch.randn(4, 3, generator=g).to(dtype)

    want = x.clone()
    b0, b1 = torch.broadcast_tensors(i0, i1)
    for k, (a, b) in enumerate(zip(b0.flatten().tolist(), b1.flatten().tolist())):
        want[a, b] = (want[a, b].float() + v.flatten()[k].float()).to(dtype)
    dev = [t.to("neuron") for t in (x, i0, i1, v, mask)]
    got = dev[0].index_put((dev[1], dev[2]), dev[3], accumulate=True)
    assert torch.equal(got.cpu(), want)
    zero = torch.zeros(4, 3, dtype=dtype)
    want = zero.clone()
    vm = v.masked_fill(~mask, 0)
    for k, (a, b) in enumerate(zip(b0.flatten().tolist(), b1.flatten().tolist())):
        want[a, b] = (want[a, b].float() + vm.flatten()[k].float()).to(dtype)
    got = torch.ops.aten._unsafe_masked_index_put_accumulate(
        zero.to("neuron"), dev[4], [dev[1], dev[2]], dev[3])
    assert torch.equal(got.cpu(), want)


def _half(x: torch.Tensor, dtype) -> torch.Tensor:
    """x (float64) rounded as the CPU's half arithmetic rounds: to float32, then to the half
    type (an exact float64 sum or product of half values rounds as the float32 op does)."""
    return x.float().to(dtype).double()


def _half_ints(g, shape, lo, hi, dtype):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_index_add_rounds_as_the_cpu(dtype):
    # index_add_cpu_ (TensorAdvancedIndexing.cpp): a 1-d self is a scalar loop in the half
    # type, self[k] = h(self[k] + h(source[i] * h(alpha))); an n-d self adds one slice at a
    # time (add_, each add rounded) unless alpha is 1 along the first or last dim with an
    # int64 index: then scatter_add_, which sums in float32 and rounds once. References:
    # float64 replays of those steps; integers at the half type's last exact power of two,
    # so that the rounding points decide the result (the old float32 sums differed).
    g = torch.Generator().manual_seed(4)
    big = 256 if dtype == torch.bfloat16 else 2048   # from here on only even integers
    idx = torch.tensor([0, 2, 0, 0, 1, 2, 0, 2])
    dev = {}

    def check(self, dim, index, src, alpha, each, scaled):
        want = self.double().clone()
        if each:
            a = float(torch.tensor(alpha).to(dtype))
            for i, k in enumerate(index.tolist()):
                t = src.double().select(dim, i) * a
                t = _half(t, dtype) if scaled else t
                want.select(dim, k).copy_(_half(want.select(dim, k) + t, dtype))
        else:
            want.index_add_(dim, index, src.double(), alpha=alpha)
        want = want.to(dtype)
        cpu = self.index_add(dim, index, src, alpha=alpha)
        got = self.to(D).index_add(dim, index.to(D), src.to(D), alpha=alpha)
        assert torch.equal(got.cpu(), want) and torch.equal(cpu, want)
        inplace = self.to(D)
        inplace.index_add_(dim, index.to(D), src.to(D), alpha=alpha)
        assert torch.equal(inplace.cpu(), want)
        dev["differs"] = dev.get("differs", 0) + int(
            (self.index_add(dim, index, src, alpha=alpha)
             != (self.float().index_add(dim, index, src.float(), alpha=alpha)).to(dtype)).sum())

    # 1. 1-d: the product rounds before the add (alpha 0.3 is not a half value)
    self = (torch.rand(3, generator=g) * big + big).to(dtype)
    src = (torch.randn(8, generator=g) * 7).to(dtype)
    check(self, 0, idx, src, 0.3, True, True)
    # 2. a middle dim, and the last dim with an int32 index: one rounding per add
    self = _half_ints(g, (2, 3, 4), big, 2 * big, dtype)
    src = _half_ints(g, (2, 8, 4), -9, 9, dtype)
    check(self, 1, idx, src, 1, True, False)
    self = _half_ints(g, (4, 3), big, 2 * big, dtype)
    src = _half_ints(g, (4, 8), -9, 9, dtype)
    check(self, 1, idx.int(), src, 1, True, False)
    # 3. alpha 3 along dim 0: each add rounded; src * 3 is exact, so the CPU's vectorised
    # loop and its scalar tail agree (on every ISA)
    self = _half_ints(g, (3, 40), big, 2 * big, dtype)
    src = _half_ints(g, (8, 40), -9, 9, dtype)
    check(self, 0, idx, src, 3, True, False)
    # 4. alpha 1 along dims 0 and -1 with an int64 index: scatter_add's float32 sums
    check(self, 0, idx, src, 1, False, False)
    check(self.t(), 1, idx, src.t(), 1, False, False)
    assert dev["differs"] > 0   # the operands tell the rounding points apart


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_scatter_and_index_reduce_round_as_the_cpu(dtype):
    # scatter_reduce sums (and multiplies) in float32 and stores the half type, then a mean
    # divides that rounded sum by the count in the half type (the old code divided the float32
    # sum: one rounding). index_reduce works a source slice at a time in the half type: every
    # product (prod) or sum (mean) rounded, then the division. References: float64 replays.
    g = torch.Generator().manual_seed(5)
    big = 256 if dtype == torch.bfloat16 else 2048
    idx = torch.tensor([0, 2, 0, 0, 1, 2, 0, 2])
    self = _half_ints(g, (3, 5), big, 2 * big, dtype)
    src = _half_ints(g, (8, 5), -9, 9, dtype)
    full = idx.view(-1, 1).expand(8, 5).contiguous()
    for inc in (True, False):
        s64 = self.double().clone()
        if not inc:
            s64.index_fill_(0, idx, 0)
        count = torch.zeros(3, 5, dtype=torch.float64).index_add_(
            0, idx, torch.ones(8, 5, dtype=torch.float64))
        total = _half(s64.index_add(0, idx, src.double()), dtype)
        want = _half(total / (count + inc).clamp(min=1), dtype).to(dtype)
        want = torch.where(count > 0, want, self)
        got = self.to(D).scatter_reduce(0, full.to(D), src.to(D), "mean", include_self=inc)
        assert torch.equal(got.cpu(), want)
        assert torch.equal(self.scatter_reduce(0, full, src, "mean", include_self=inc), want)

    # index_reduce: prod of factors near 1 (products round), mean of integers; an n-d and a
    # 1-d self (the CPU's scalar loop)
    fac = (1 + torch.randint(-60, 60, (8, 5), generator=g) / 64).to(dtype)
    for red, source in (("prod", fac), ("mean", src)):
        for inc in (True, False):
            for x, y in ((self, source), (self[:, 0], source[:, 0])):
                want = _index_reduce_replay(x, idx, y, red, inc, dtype)
                got = x.to(D).index_reduce(0, idx.to(D), y.to(D), red, include_self=inc)
                assert torch.equal(got.cpu(), want), (red, inc, x.dim())
                assert torch.equal(x.index_reduce(0, idx, y, red, include_self=inc), want)


def _index_reduce_replay(self, idx, source, red, inc, dtype):
    """index_reduce along dim 0 as the CPU computes it in a half type, in float64."""
    want = self.double().clone()
    if not inc:
        want.index_fill_(0, idx, 1.0 if red == "prod" else 0.0)
    count = torch.full_like(want, float(inc))
    for i, k in enumerate(idx.tolist()):
        s = source.double()[i]
        want[k] = _half(want[k] * s if red == "prod" else want[k] + s, dtype)
        count[k] += 1
    if red == "mean":
        want = _half(want / count.clamp(min=1), dtype)
    return want.to(dtype)
