"""Kernels for ops that used to reach the CPU fallback: embedding_bag (forward and backward).

References are float64 computations on the CPU (deterministic sums), compared at bounds derived
from the dtype; every case also asserts that no CPU fallback ran.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.stats import STATS

DEV = "neuron"


def _no_fallback(before):
    assert dict(STATS.fallbacks) == before, f"CPU fallback ran: {dict(STATS.fallbacks)}"


def _case(dtype, mode, pad, last, psw, adaptive=False):
    g = torch.Generator().manual_seed(7)
    w64 = torch.randn(12, 5, generator=g, dtype=torch.float64)
    idx = torch.tensor([0, 2, 4, 5, 4, 3, 11, 11, 1, 7])
    off = torch.tensor([0, 2, 2, 6] + ([10] if last else []))
    p64 = torch.rand(10, generator=g, dtype=torch.float64) if psw else None
    gout = None
    w = w64.to(dtype).requires_grad_()
    p = p64.to(dtype).requires_grad_() if psw else None
    # float64 reference from the same (rounded) values
    wr = w.detach().double().requires_grad_()
    pr = p.detach().double().requires_grad_() if psw else None
    ref = F.embedding_bag(idx, wr, off, mode=mode, padding_idx=pad, include_last_offset=last,
                          per_sample_weights=pr)
    gout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, [wr] + ([pr] if psw else []), gout)
    wn = w.detach().to(DEV).requires_grad_()
    pn = p.detach().to(DEV).requires_grad_() if psw else None
    before = dict(STATS.fallbacks)
    ctx = eager_neuron.adaptive() if adaptive else _null()
    with ctx:
        out = F.embedding_bag(idx.to(DEV), wn, off.to(DEV), mode=mode, padding_idx=pad,
                              include_last_offset=last, per_sample_weights=pn)
        grads = torch.autograd.grad(out, [wn] + ([pn] if psw else []), gout.to(dtype).to(DEV))
    _no_fallback(before)
    eps = torch.finfo(dtype).eps
    tol = dict(atol=8 * eps, rtol=8 * eps)
    assert out.dtype == dtype and out.device.type == DEV
    torch.testing.assert_close(out.cpu().double(), ref, **tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.cpu().double(), want, atol=16 * eps, rtol=16 * eps)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("mode,pad,last,psw", [
    c for c in itertools.product(("sum", "mean", "max"), (None, 4), (False, True), (False, True))
    if not (c[3] and c[0] != "sum")])
def test_embedding_bag_float32(mode, pad, last, psw):
    _case(torch.float32, mode, pad, last, psw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_embedding_bag_dtypes(dtype):
    _case(dtype, "mean", 4, False, False)
    _case(dtype, "sum", None, True, True)


def test_embedding_bag_adaptive_and_module():
    _case(torch.float32, "sum", None, False, True, adaptive=True)
    bag = torch.nn.EmbeddingBag(20, 3, mode="max")
    x = torch.randint(0, 20, (4, 6))
    want = bag(x)
    before = dict(STATS.fallbacks)
    got = bag.to(DEV)(x.to(DEV))   # 2-d input: the module builds the offsets on the device
    _no_fallback(before)
    torch.testing.assert_close(got.cpu(), want)


def test_embedding_bag_errors_name_the_problem():
    w = torch.randn(5, 2).to(DEV)
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        F.embedding_bag(torch.tensor([0, 1]).to(DEV), w, torch.tensor([1]).to(DEV))
    with pytest.raises(RuntimeError, match="takes value 7 which is not in the valid range"):
        F.embedding_bag(torch.tensor([0, 7]).to(DEV), w, torch.tensor([0]).to(DEV))


def test_embedding_bag_aux_outputs_match_cpu():
    w = torch.randn(6, 3)
    idx, off = torch.tensor([4, 4, 1, 2, 4]), torch.tensor([0, 2, 2])
    for mode in (0, 1, 2):
        want = torch.ops.aten._embedding_bag(w, idx, off, False, mode, False, None, False, 4)
        got = torch.ops.aten._embedding_bag(w.to(DEV), idx.to(DEV), off.to(DEV), False, mode,
                                            False, None, False, 4)
        for g, e in zip(got, want):
            assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(got[0].cpu(), want[0])
        for g, e in zip(got[1:], want[1:]):
            assert torch.equal(g.cpu(), e), (mode, g.cpu(), e)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bfloat16, torch.bool])
def test_unique_dim(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 3, (7, 3, 2), generator=g).to(dtype)
    before = dict(STATS.fallbacks)
    for d in (0, 1, -1):
        got = torch.unique(x.to(DEV), dim=d, return_inverse=True, return_counts=True)
        # the reference: distinct slices, lexicographically sorted, from Python tuples
        slices = [tuple(s.reshape(-1).tolist()) for s in x.movedim(d, 0)]
        keys = sorted(set(slices))
        assert got[0].shape[d] == len(keys)
        assert [tuple(s.reshape(-1).tolist()) for s in got[0].cpu().movedim(d, 0)] == keys
        assert got[1].cpu().tolist() == [keys.index(s) for s in slices]
        assert got[2].cpu().tolist() == [slices.count(k) for k in keys]
    _no_fallback(before)


def test_repeat_interleave_tensor():
    r = torch.tensor([2, 0, 3, 1])
    before = dict(STATS.fallbacks)
    got = torch.repeat_interleave(r.to(DEV)).cpu()
    assert got.tolist() == [0, 0, 2, 2, 2, 3]
    assert torch.repeat_interleave(r.int().to(DEV)).dtype == torch.int32
    y = torch.randn(4, 3)
    assert torch.equal(y.to(DEV).repeat_interleave(r.to(DEV), dim=0).cpu(),
                       torch.cat([y[i:i + 1].expand(int(n), 3) for i, n in enumerate(r)]))
    _no_fallback(before)
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([2, -1]).to(DEV))
    with pytest.raises(RuntimeError, match="does not match"):
        torch.repeat_interleave(r.to(DEV), output_size=3)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_renorm(p):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(6, 5, generator=g) * 2
    idx = torch.tensor([[1, 4], [1, 0]])
    wn = w.to(DEV)
    before = dict(STATS.fallbacks)
    torch.embedding_renorm_(wn, idx.to(DEV), 1.5, p)
    _no_fallback(before)
    # float64 reference: rows 0, 1, 4 scaled once if their norm exceeds 1.5; others untouched
    want = w.double().clone()
    for j in (0, 1, 4):
        norm = want[j].norm(p)
        if norm > 1.5:
            want[j] *= 1.5 / (norm + 1e-7)
    torch.testing.assert_close(wn.cpu().double(), want, atol=0, rtol=4e-7)
    emb = torch.nn.Embedding(10, 3, max_norm=1.0).to(DEV)
    out = emb(torch.tensor([1, 2, 1]).to(DEV))
    assert bool((out.detach().norm(dim=1) <= 1.0 + 1e-6).all())
    _no_fallback(before)


def test_histogramdd():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    before = dict(STATS.fallbacks)
    got = torch.histogramdd(x.to(DEV), bins=[3, 4], weight=w.to(DEV))
    _no_fallback(before)
    # reference: edges from min/max, each sample's bin by explicit comparison with the edges
    edges = [torch.linspace(float(x[:, d].min()), float(x[:, d].max()), n + 1,
                            dtype=torch.float64) for d, n in enumerate((3, 4))]
    for e, want in zip(got.bin_edges, edges):
        torch.testing.assert_close(e.cpu(), want)
    want = torch.zeros(3, 4, dtype=torch.float64)
    for (a, b), wi in zip(x.tolist(), w.tolist()):
        i = min(int((edges[0] <= a).sum()) - 1, 2)
        j = min(int((edges[1] <= b).sum()) - 1, 3)
        want[i, j] += wi
    torch.testing.assert_close(got.hist.cpu(), want)
    # explicit edges, a sample on the last edge counts, outside ones do not; density
    bins = [torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([0.0, 1.0])]
    pts = torch.tensor([[2.0, 1.0], [-1.0, 0.0], [3.0, 0.5], [0.5, -0.1]])
    h = torch.histogramdd(pts.to(DEV), bins=[b.to(DEV) for b in bins], density=True).hist
    torch.testing.assert_close(h.cpu(), torch.tensor([[0.5], [0.25]]))
    _no_fallback(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
def test_linalg_eig(dtype):
    g = torch.Generator().manual_seed(6)
    a = torch.randn(3, 5, 5, generator=g, dtype=torch.float64).to(dtype)
    before = dict(STATS.fallbacks)
    w, v = torch.linalg.eig(a.to(DEV))
    _no_fallback(before)
    cdt = torch.complex64 if dtype == torch.float32 else torch.complex128
    assert w.dtype == cdt and v.dtype == cdt and w.shape == (3, 5) and v.shape == (3, 5, 5)
    # the definition, in float64: A v = v diag(w), unit-norm eigenvectors
    a64, w64, v64 = (t.cpu().to(torch.complex128) for t in (a, w, v))
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(a64 @ v64, v64 * w64.unsqueeze(-2), atol=tol, rtol=tol)
    torch.testing.assert_close(v64.abs().pow(2).sum(-2), torch.ones(3, 5, dtype=torch.float64),
                               atol=tol, rtol=tol)
    if dtype != torch.complex128:   # real input: conjugate pairs, as LAPACK returns them
        torch.testing.assert_close(torch.sort(w64.imag, dim=-1).values,
                                   torch.sort(-w64.imag, dim=-1).values, atol=tol, rtol=0)
    with pytest.raises(RuntimeError, match="infs or NaNs"):
        torch.linalg.eig(torch.full((2, 2), float("nan")).to(DEV))


_CPLX = {
    "acos": (torch.acos, np.arccos), "acosh": (torch.acosh, np.arccosh),
    "asin": (torch.asin, np.arcsin), "asinh": (torch.asinh, np.arcsinh),
    "atan": (torch.atan, np.arctan), "atanh": (torch.atanh, np.arctanh),
    "sinh": (torch.sinh, np.sinh), "cosh": (torch.cosh, np.cosh), "tan": (torch.tan, np.tan),
    "log10": (torch.log10, np.log10), "log2": (torch.log2, np.log2),
    "log1p": (torch.log1p, np.log1p), "expm1": (torch.expm1, np.expm1),
    "rsqrt": (torch.rsqrt, lambda z: 1 / np.sqrt(z)),
    "sigmoid": (torch.sigmoid, lambda z: 1 / (1 + np.exp(-z))),
    "pow": (lambda z: torch.pow(z, 1.5 - 0.5j), lambda z: z ** (1.5 - 0.5j)),
    "addcmul": (lambda z: torch.addcmul(z, z, z.conj(), value=0.5),
                lambda z: z + 0.5 * z * z.conj()),
    "silu": (torch.nn.functional.silu, lambda z: z / (1 + np.exp(-z))),
    "lerp": (lambda z: torch.lerp(z, z * 2j, 0.3), lambda z: z + 0.3 * (z * 2j - z)),
}


@pytest.mark.parametrize("name", sorted(_CPLX))
def test_complex_elementwise(name):
    # numpy's complex128 (C99 branch cuts) as the reference, at complex64 resolution
    g = torch.Generator().manual_seed(8)
    z = torch.complex(torch.randn(64, generator=g), torch.randn(64, generator=g)) * 0.8
    t_fn, np_fn = _CPLX[name]
    before = dict(STATS.fallbacks)
    got = t_fn(z.to(DEV)).cpu()
    _no_fallback(before)
    want = torch.from_numpy(np.asarray(np_fn(z.to(torch.complex128).numpy())))
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got.to(torch.complex128), want, atol=2e-6, rtol=2e-6)


def test_complex_logical():
    z = torch.tensor([0j, 1 + 0j, 1j, 0j]).to(DEV)
    w = torch.tensor([0j, 0j, 2j, 3 + 0j]).to(DEV)
    assert torch.logical_and(z, w).cpu().tolist() == [False, False, True, False]
    assert torch.logical_or(z, w).cpu().tolist() == [False, True, True, True]
    assert torch.logical_xor(z, w).cpu().tolist() == [False, True, False, True]
    assert torch.logical_not(z).cpu().tolist() == [True, False, False, True]
    assert torch.isreal(z).cpu().tolist() == [True, True, False, True]


@pytest.mark.parametrize("targets_2d", [True, False], ids=["padded", "concatenated"])
def test_ctc_loss_forward_backward(targets_2d):
    # float64 on both sides: the recursions are the CPU's, so the results agree to rounding
    g = torch.Generator().manual_seed(9)
    T, B, C = 12, 3, 5
    lp = torch.randn(T, B, C, generator=g, dtype=torch.float64).log_softmax(2)
    tl, il = torch.tensor([3, 0, 5]), torch.tensor([12, 7, 10])
    tg = torch.randint(1, C, (B, 5), generator=g) if targets_2d else \
        torch.randint(1, C, (int(tl.sum()),), generator=g)
    x = lp.clone().requires_grad_()
    want = F.ctc_loss(x, tg, il, tl, reduction="sum")
    (gw,) = torch.autograd.grad(want, x)
    xn = lp.to(DEV).requires_grad_()
    before = dict(STATS.fallbacks)
    got = F.ctc_loss(xn, tg.to(DEV), il.to(DEV), tl.to(DEV), reduction="sum")
    (gg,) = torch.autograd.grad(got, xn)
    _no_fallback(before)
    torch.testing.assert_close(got.cpu(), want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gg.cpu(), gw, atol=1e-12, rtol=1e-12)
    # lengths (and targets) left on the CPU, as speech code passes them on CUDA: CUDA reads
    # the lengths on the host and moves the targets itself
    xc = lp.to(DEV).requires_grad_()
    got = F.ctc_loss(xc, tg, il, tl, reduction="sum")
    (gc,) = torch.autograd.grad(got, xc)
    torch.testing.assert_close(got.cpu(), want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gc.cpu(), gw, atol=1e-12, rtol=1e-12)
    # ... and 'mean', which divides by the target lengths: CUDA reads CPU int64 lengths into
    # int lists first, and so does eager_neuron/functional.py (ATen's composite path for a
    # tensor subclass divided the device loss by the CPU lengths: a device-mix error before)
    want = F.ctc_loss(lp, tg, il, tl, reduction="mean")
    got = F.ctc_loss(xc, tg, il, tl, reduction="mean")
    torch.testing.assert_close(got.cpu(), want, atol=1e-12, rtol=1e-12)


def test_ctc_loss_impossible_alignment():
    lp = torch.randn(2, 1, 3, dtype=torch.float64).log_softmax(2)
    tg = torch.tensor([[1, 1, 1]])   # needs 5 frames, has 2
    for zero_inf, loss in ((False, float("inf")), (True, 0.0)):
        xn = lp.to(DEV).requires_grad_()
        got = F.ctc_loss(xn, tg.to(DEV), [2], [3], zero_infinity=zero_inf, reduction="sum")
        assert got.item() == loss
        if zero_inf:
            (gg,) = torch.autograd.grad(got, xn)
            assert bool((gg.cpu() == 0).all())


def test_complex_variance_and_truthiness():
    # var(z) = E|z - E z|^2, against float64 on the CPU; any/all by z != 0
    g = torch.Generator().manual_seed(12)
    z = torch.complex(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g))
    z64 = z.to(torch.complex128)
    zn = z.to(DEV)
    before = dict(STATS.fallbacks)
    want = ((z64 - z64.mean(1, keepdim=True)).abs() ** 2).sum(1) / 5
    torch.testing.assert_close(zn.var(1).cpu().double(), want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(zn.conj().std(1).cpu().double(), want.sqrt(), atol=1e-6, rtol=1e-6)
    v, m = torch.var_mean(zn, 1, correction=0)
    torch.testing.assert_close(v.cpu().double(), want * 5 / 6, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(m.cpu().to(torch.complex128), z64.mean(1), atol=1e-6, rtol=1e-6)
    w = torch.tensor([[0j, 1j], [0j, 0j]]).to(DEV)
    assert w.any(1).cpu().tolist() == [True, False] and w.all(0).cpu().tolist() == [False, False]
    _no_fallback(before)


@pytest.mark.parametrize("dim", [0, -1], ids=["first", "last"])
def test_weight_norm_backward_without_fallback(dim):
    # the fused weight_norm's backward (wav2vec2's positional conv, HiFi-GAN) used to run on
    # the CPU: now torch.nn.utils.parametrizations.weight_norm trains on the device; float64
    # on both sides, so the two agree to rounding
    g = torch.Generator().manual_seed(5)
    conv = torch.nn.Conv1d(3, 4, 3).double()
    x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    grads = []
    for dev in ("cpu", DEV):
        m = torch.nn.utils.parametrizations.weight_norm(
            torch.nn.Conv1d(3, 4, 3).double(), dim=dim % 3)
        m.load_state_dict(torch.nn.utils.parametrizations.weight_norm(conv, dim=dim % 3)
                          .state_dict())
        m.to(dev)
        before = dict(STATS.fallbacks)
        m(x.to(dev)).square().sum().backward()
        if dev == DEV:
            _no_fallback(before)
        p = m.parametrizations.weight
        grads.append([p.original0.grad.cpu(), p.original1.grad.cpu()])
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_distribution_argument_checks_without_fallback():
    # torch.distributions validates its arguments with _is_all_true on every construction
    before = dict(STATS.fallbacks)
    loc = torch.zeros(3, device=DEV)
    # (validate_args explicit: the first torch.compile in a process turns the default off)
    d = torch.distributions.Normal(loc, torch.ones(3, device=DEV), validate_args=True)
    with pytest.raises(ValueError, match="scale"):
        torch.distributions.Normal(loc, -torch.ones(3, device=DEV), validate_args=True)
    torch.distributions.Categorical(logits=torch.zeros(2, 4, device=DEV),
                                    validate_args=True).sample()
    _no_fallback(before)
    assert d.log_prob(loc).device.type == DEV
    b = torch.tensor([True, False], device=DEV)
    e = torch.zeros(0, dtype=torch.bool, device=DEV)
    got = [bool(torch._is_all_true(t)) for t in (b, b[:1], e)] + \
        [bool(torch._is_any_true(t)) for t in (b, b[1:], e)]
    assert got == [False, True, True, True, False, False]
    with pytest.raises(RuntimeError, match="bool"):
        torch._is_all_true(torch.ones(2, device=DEV))
