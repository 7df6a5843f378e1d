"""Issue 14's hot ops of a training step: a repeat call takes the fast path (counters, never
wall time) and equals the CPU (exact, or a float64 reference with dtype-derived bounds).

Each op here once cost 5-40x its kernel's host time on every repeat (the funnel, a meta or
reference decomposition each call); see fastpath_capture.py for how a runner is learned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401 -- registers the device
from eager_neuron import fastpath
from eager_neuron.stats import STATS

DEV = "neuron"


def _hits() -> int:
    return fastpath.STATS_FAST["hits"]


def _ulp_bound(ref64: torch.Tensor, dtype=torch.float32, k: float = 64.0) -> float:
    return k * torch.finfo(dtype).eps * max(1.0, float(ref64.abs().max()))


def _qkv(seed: int, requires_grad: bool = False):
    """q, k, v as GPT-2 makes them: interleaved views of one (B, T, 3C) projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, 8, 192, generator=g)
    dev = qkv.to(DEV).requires_grad_(requires_grad)
    cpu = qkv.double().requires_grad_(requires_grad)

    def heads(x):
        return [t.view(2, 8, 4, 16).transpose(1, 2) for t in x.split(64, 2)]
    return dev, cpu, heads


def test_attention_on_interleaved_qkv_views_replays_and_equals_float64():
    mask_cpu = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    mask = mask_cpu.to(DEV)
    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default
    for seed in range(4):
        dev, cpu, heads = _qkv(seed, requires_grad=True)
        before, ops0 = _hits(), STATS.ops
        out = F.scaled_dot_product_attention(*heads(dev), attn_mask=mask, scale=0.25)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + seed))
        out.backward(g.to(DEV))
        hits = _hits() - before
        ref = F.scaled_dot_product_attention(*heads(cpu), attn_mask=mask_cpu, scale=0.25)
        ref.backward(g.double())
        assert (out.detach().cpu().double() - ref.detach()).abs().max() <= _ulp_bound(ref)
        assert (dev.grad.cpu().double() - cpu.grad).abs().max() <= _ulp_bound(cpu.grad)
        if seed >= 2:   # learned on the first calls: forward and backward replay
            assert fwd in fastpath.TABLES and bwd in fastpath.TABLES
            assert hits >= 2 and STATS.ops > ops0


def test_one_tensor_as_every_operand_is_never_confused():
    """q is k is v (and mm(m, m)): every array lies in two sources' spans, so nothing is
    learned from the ambiguous call, and new values are still right."""
    for seed in range(3):
        x = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(seed))
        m = x[0, 0]
        xd, md = x.to(DEV), m.to(DEV)
        out = F.scaled_dot_product_attention(xd, xd, xd)
        ref = F.scaled_dot_product_attention(x.double(), x.double(), x.double())
        assert (out.cpu().double() - ref).abs().max() <= _ulp_bound(ref)
        mm = (md @ md.T).cpu().double()
        ref = m.double() @ m.double().T
        assert (mm - ref).abs().max() <= _ulp_bound(ref)


def test_integer_index_replays_with_fresh_index_values_and_equals_cpu():
    """x[:, idx] (GPT-2's last-token gather) by an integer index: its size is the shapes', so
    a repeat takes a runner; the runner reads this call's index values (negative ones too)."""
    x = torch.arange(48).view(2, 3, 8)
    xd = x.to(DEV)
    for n, idx in enumerate(([1, 0], [7, -8], [-1, 3], [2, 2])):
        i = torch.tensor(idx)
        before = _hits()
        out = torch.ops.aten.index.Tensor(xd, [None, None, i.to(DEV)])
        assert torch.equal(out.cpu(), x[:, :, i])
        if n >= 2:
            assert _hits() - before == 1
    # a changed signature (another index length, int32, another indexed dim) learns anew
    for idx, dims in (([0, 1, 2], 2), ([1, 0], 1), ([0], 0)):
        i = torch.tensor(idx, dtype=torch.int32)
        key = [None] * dims + [i]
        for _ in range(3):
            got = torch.ops.aten.index.Tensor(xd, [None if k is None else k.to(DEV) for k in key])
            assert torch.equal(got.cpu(), torch.ops.aten.index.Tensor(x, key))


def test_index_out_of_range_on_a_runner_raises_as_the_funnel():
    x = torch.arange(16.0).view(2, 8).to(DEV)
    good, bad = torch.tensor([1, 2]).to(DEV), torch.tensor([1, 9]).to(DEV)
    for _ in range(3):
        x[:, good]
    before = _hits()
    try:
        x[:, bad]
    except IndexError as exc:
        words = str(exc)
    else:
        raise AssertionError("no IndexError")
    assert _hits() == before   # the runner raised: no hit counted
    assert "index 9 is out of bounds" in words and "aten::index.Tensor" in words
    assert x[:, good].cpu().tolist() == [[1.0, 2.0], [9.0, 10.0]]


def test_bool_mask_index_is_never_replayed_and_follows_the_data():
    x = torch.arange(12.0).view(3, 4)
    xd = x.to(DEV)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        m = torch.rand(3, 4, generator=g) > 0.5
        md, rowd = m.to(DEV), m[0].to(DEV)
        before = _hits()
        got, got_row = xd[md], xd[:, rowd]
        assert _hits() == before
        assert torch.equal(got.cpu(), x[m]) and torch.equal(got_row.cpu(), x[:, m[0]])


def test_arange_on_the_device_is_one_host_factory_equal_to_cpu():
    """torch.arange(..., device="neuron") is one op (was an empty tensor, then arange.out
    resizing it as an in-place view op: two funnel trips and a regrown block)."""
    cases = [((8,), {}), ((0, 8), {}), ((0, 1, 0.25), {}), ((2.5, -3, -0.7), {}),
             ((5,), {"dtype": torch.float16}), ((0, 3), {"dtype": torch.int32}),
             ((3,), {"dtype": torch.bfloat16, "requires_grad": True}), ((4, 4), {})]
    for a, k in cases:
        ops0 = STATS.ops
        n = torch.arange(*a, device=DEV, **k)
        assert STATS.ops - ops0 == 1
        c = torch.arange(*a, **k)
        assert n.dtype == c.dtype and n.shape == c.shape and n.stride() == c.stride()
        assert n.requires_grad == c.requires_grad and n.device.type == DEV
        assert torch.equal(n.detach().cpu(), c.detach())
    for bad in ((0, 5, 0), (5, 0, 1)):
        try:
            torch.arange(*bad)
        except RuntimeError as exc:
            cpu_words = str(exc)
        try:
            torch.arange(*bad, device=DEV)
        except RuntimeError as exc:
            assert cpu_words in str(exc) and "aten::arange" in str(exc)
        else:
            raise AssertionError("no error")
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    torch.arange(0, 6, out=out)
    assert out.cpu().tolist() == list(range(6))


def _replays(fn_of, inputs, check):
    """fn_of(x) on neuron for each input (the first learns): the rest replay (one hit each)
    and every result passes check(neuron result, x)."""
    for n, x in enumerate(inputs):
        xd = x.to(DEV)
        before = _hits()
        out = fn_of(xd)
        if n:
            assert _hits() - before == 1, fn_of
        check(out, x)


def test_scans_and_remaps_replay_with_fresh_values_equal_cpu():
    """cumsum (HF's position ids from a bool mask), constant_pad_nd (the labels' shift), and
    the other scans and remaps of the same lowerings: captured runners, exact results."""
    g = torch.Generator().manual_seed(0)
    bools = [torch.rand(2, 8, generator=g) > 0.4 for _ in range(3)]
    ints = [torch.randint(-50, 50, (2, 8), generator=g) for _ in range(3)]
    floats = [torch.randn(3, 5, 4, generator=g) for _ in range(3)]

    def same(f):
        return lambda out, x: _equal(out, f(x))

    def _equal(out, ref):
        if isinstance(ref, tuple):
            assert all(torch.equal(o.cpu(), r) for o, r in zip(out, ref))
        else:
            assert out.dtype == ref.dtype and torch.equal(out.cpu(), ref)

    fns = [lambda x: x.cumsum(-1), lambda x: torch.cumprod(x, 0),
           lambda x: torch.cummax(x, 1), lambda x: torch.cummin(x, -1),
           lambda x: F.pad(x, (0, 1), value=-100), lambda x: F.pad(x, (2, 1), value=7),
           lambda x: x.flip(0), lambda x: x.roll(3, 1), lambda x: x.repeat(2, 1, 1),
           lambda x: x.tril(-1), lambda x: x.triu(1)]
    for f in fns:
        _replays(f, ints, same(f))
    _replays(lambda x: x.cumsum(-1), bools, same(lambda x: x.cumsum(-1)))
    for f in (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), lambda x: x.flip(-1, 0),
              lambda x: x.roll((1, -2), (0, 2)), lambda x: x.tril(), lambda x: x.cummax(2)):
        _replays(f, floats, same(f))
    ref = [x.double().cumsum(1) for x in floats]
    for x, r in zip(floats, ref):
        assert (x.to(DEV).cumsum(1).cpu().double() - r).abs().max() <= _ulp_bound(r)


def test_host_to_device_moves_keep_the_cpu_copys_strides_and_values():
    """A plain move (the step's batch) copies straight into the device buffer: the same
    values, sizes and strides _to_copy gives on the CPU (odd size-1 strides, transposes,
    gaps, casts and conj views included)."""
    base = torch.arange(24, dtype=torch.int64).view(2, 3, 4)
    odd = torch.empty_strided((2, 1, 4), (4, 99, 1), dtype=torch.float32).copy_(
        torch.randn(2, 1, 4))
    z = torch.randn(3, dtype=torch.complex64)
    cases = [(base, {}), (base.float(), {"dtype": torch.float32}), (odd, {}),
             (base.transpose(0, 2), {}), (base[:, ::2], {}), (base, {"dtype": torch.float64}),
             (base[1], {"non_blocking": True}), (torch.tensor(3.5), {}), (z.conj(), {}),
             (base.permute(2, 0, 1), {"memory_format": torch.contiguous_format})]
    for t, kw in cases:
        got = t.to(DEV, **kw)
        want = torch.ops.aten._to_copy.default(t, **kw)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride(), (t.stride(), kw)
        assert torch.equal(got.cpu().resolve_conj(), want.resolve_conj())
    src = base.clone()
    moved = src.to(DEV)
    src.add_(100)   # the device copy is its own memory
    assert torch.equal(moved.cpu(), base)


def test_select_and_slice_backward_and_new_filled_equal_cpu_through_runners():
    """select_backward (a [CLS] token's gradient), slice_backward (Llama's rotate_half) and
    new_zeros/new_ones: one remap kernel writing zeros and the gradient (lower/shape.py
    _backward_pad), its own runner on a repeat, or zeros (new_empty + fill_) and one strided
    copy (torch's reference went through select_scatter and torch.full)."""
    A = torch.ops.aten
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.int64, torch.bool):
        gr = (torch.randn(2, 5, generator=g) * 10).to(dtype)
        grd = gr.to(DEV)
        for dim, index, sizes in ((1, 0, [2, 3, 5]), (0, -1, [4, 2, 5]), (2, 4, [2, 5, 6])):
            want = A.select_backward.default(gr, sizes, dim, index)
            for n in range(3):
                before = _hits()
                got = A.select_backward.default(grd, sizes, dim, index)
                assert got.dtype == want.dtype and got.stride() == want.stride()
                assert torch.equal(got.cpu(), want)
                if n:
                    assert _hits() - before == 1   # select_backward's own runner
        x = torch.ones(3, dtype=dtype)
        for f in (lambda t: t.new_zeros([2, 3]), lambda t: t.new_ones((4,), dtype=torch.bool),
                  lambda t: t.new_ones([2, 2], dtype=torch.float64)):
            got, want = f(x.to(DEV)), f(x)
            assert got.dtype == want.dtype and got.device.type == DEV
            assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
    g4 = torch.randn(2, 3, 4, 4, generator=g)
    for start, end, step in ((4, 2**63 - 1, 1), (0, 8, 2), (1, 7, 3)):
        gs = g4[..., :len(range(start, min(end, 8), step))].contiguous()
        want = A.slice_backward.default(gs, [2, 3, 4, 8], 3, start, end, step)
        got = A.slice_backward.default(gs.to(DEV), [2, 3, 4, 8], 3, start, end, step)
        assert got.stride() == want.stride() and torch.equal(got.cpu(), want)


def test_one_tensor_passed_twice_replays_only_for_one_tensor_again():
    """cat((freqs, freqs)) (Llama's rotary embedding) and mm(m, m): learned with the guard
    that one tensor is passed twice again; two distinct tensors of the same layout never take
    that runner's choice (they are right, on the funnel or a runner of their own)."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(1, 8, 8, generator=g) for _ in range(4)]
    for n, x in enumerate(xs):
        xd = x.to(DEV)
        before = _hits()
        got = torch.cat((xd, xd), -1)
        if n >= 2:
            assert _hits() - before == 1
        assert torch.equal(got.cpu(), torch.cat((x, x), -1))
        m, md = x[0], xd[0]
        ref = m.double() @ m.double()
        assert ((md @ md).cpu().double() - ref).abs().max() <= _ulp_bound(ref)
    for a, b in zip(xs, xs[1:]):
        got = torch.cat((a.to(DEV), b.to(DEV)), -1)
        assert torch.equal(got.cpu(), torch.cat((a, b), -1))
        ref = a[0].double() @ b[0].double()
        assert ((a[0].to(DEV) @ b[0].to(DEV)).cpu().double() - ref).abs().max() <= \
            _ulp_bound(ref)
    for x in xs:   # and back: one tensor twice, after distinct ones
        xd = x.to(DEV)
        assert torch.equal(torch.cat((xd, xd), -1).cpu(), torch.cat((x, x), -1))


def test_row_strided_matmul_operands_are_read_in_place_and_replay():
    """A [CLS] token's rows (x[:, 0]: unit-stride rows, leading dimension 512) reach BLAS in
    place, so the product is learned (its 512-byte contiguous copy was a scratch array no
    runner could replay: every call took the funnel); strides BLAS cannot address still copy."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(64, 64, generator=g), torch.randn(64, generator=g)
    wd, bd = w.to(DEV), b.to(DEV)
    for n in range(4):
        h = torch.randn(2, 8, 64, generator=g)
        hd = h.to(DEV)
        cases = [(lambda x, W, B: (B, x[:, 0], W.t()), torch.addmm, True),
                 (lambda x, W, B: (x[:, 0].t(), x[:, 1]), torch.mm, True),
                 (lambda x, W, B: (x[:, 0], W[:, ::2]), torch.mm, False)]   # copied
        for views, op, in_place in cases:
            operands = views(hd, wd, bd)
            before = _hits()
            got = op(*operands)
            hits = _hits() - before
            ref = op(*views(h.double(), w.double(), b.double()))
            assert (got.cpu().double() - ref).abs().max() <= _ulp_bound(ref, k=256)
            if n >= 2 and in_place:
                assert hits == 1   # the product replays
