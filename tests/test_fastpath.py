"""The fast path (eager_neuron/fastpath.py): a repeat call of a seen signature skips the funnel.

Every test compares against values computed another way (the CPU, float64, or the slow path
with EAGER_NEURON_FASTPATH off), and checks through the counters that the runner was used.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron
from eager_neuron import fastpath
from eager_neuron.config import config
from eager_neuron.launch import MEMORY
from eager_neuron.stats import STATS


def _hits() -> int:
    return fastpath.STATS_FAST["hits"]


def _twice(fn):
    """Run fn twice (learn, then replay); return the second result and the hits it made."""
    fn()
    before = _hits()
    out = fn()
    return out, _hits() - before


def test_repeat_elementwise_uses_runner_and_matches_cpu():
    a = torch.randn(5, 3)
    b = torch.randn(5, 3)
    an, bn = a.to("neuron"), b.to("neuron")
    out, hits = _twice(lambda: an * 2 + bn)
    assert hits == 2   # mul and add
    torch.testing.assert_close(out.cpu(), a * 2 + b, rtol=0, atol=0)
    # new operand values, same signature: the runner reads this call's buffers
    c = torch.randn(5, 3)
    cn = c.to("neuron")
    torch.testing.assert_close((cn * 2 + bn).cpu(), c * 2 + b, rtol=0, atol=0)


def test_scalar_value_is_a_runtime_argument():
    x = torch.arange(6, dtype=torch.float32).to("neuron")
    x * 1.5
    before = _hits()
    for k in (0.5, 2.0, -3.25):
        torch.testing.assert_close((x * k).cpu(), torch.arange(6, dtype=torch.float32) * k,
                                   rtol=0, atol=0)
    assert _hits() - before == 3


def test_one_element_tensor_operand_is_read_each_call():
    x = torch.ones(8, device="neuron")
    t = torch.tensor([2.0], device="neuron")
    x * t
    t.fill_(5.0)
    assert (x * t).cpu().tolist() == [5.0] * 8


def test_pow_exponent_value_changes_the_kernel():
    x = torch.tensor([4.0, 9.0, -1.0], device="neuron")
    x ** 2.0
    got = (x ** 0.5).cpu()
    want = torch.tensor([4.0, 9.0, -1.0], dtype=torch.float64) ** 0.5
    torch.testing.assert_close(got, want.float(), equal_nan=True)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(4, dtype=torch.float64),            # dtype
    lambda: torch.arange(4, dtype=torch.float32).view(2, 2),  # shape
    lambda: torch.arange(8, dtype=torch.float32).view(4, 2)[:, 1],   # strides
])
def test_changed_signature_does_not_replay(make):
    x = torch.arange(4, dtype=torch.float32).to("neuron")
    x + x
    x + x
    y = make()
    yn = y.to("neuron") if y.is_contiguous() else \
        torch.arange(8, dtype=torch.float32, device="neuron").view(4, 2)[:, 1]
    got = yn + yn
    assert got.dtype == y.dtype and got.shape == y.shape
    torch.testing.assert_close(got.cpu(), y + y, rtol=0, atol=0)


def test_default_dtype_is_part_of_the_signature():
    x = torch.arange(3, device="neuron")
    assert (x + 1.5).dtype == torch.float32
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert (x + 1.5).dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)


def test_partial_overlap_still_raises_after_learning():
    a = torch.arange(8, dtype=torch.float32, device="neuron")
    b = torch.arange(8, dtype=torch.float32, device="neuron")
    a[1:5].add_(b[:4])     # learn add_ for this signature on distinct buffers
    a[1:5].add_(b[:4])
    with pytest.raises(RuntimeError, match="single memory location"):
        a[1:5].add_(a[0:4])


def test_inplace_returns_the_same_object_and_bumps_version():
    x = torch.zeros(4, device="neuron")
    y = torch.ones(4, device="neuron")
    x.add_(y)
    v = x._version
    r = x.add_(y)
    assert r is x and x._version == v + 1
    assert x.cpu().tolist() == [2.0] * 4


def test_views_replay_and_alias():
    x = torch.zeros(2, 3, device="neuron")
    x.view(3, 2)
    v, hits = _twice(lambda: x.view(3, 2))
    assert hits == 1
    v.fill_(7.0)
    assert x.cpu().tolist() == [[7.0] * 3] * 2
    parts = x.split(1)
    parts = x.split(1)
    assert isinstance(parts, tuple) and len(parts) == 2 and parts[1].device == x.device


def test_matmul_and_reductions_replay_equal_cpu():
    a = torch.randn(16, 8, dtype=torch.float64)
    b = torch.randn(8, 4, dtype=torch.float64)
    bias = torch.randn(4, dtype=torch.float64)
    an, bn, cn = a.to("neuron"), b.to("neuron"), bias.to("neuron")
    out, hits = _twice(lambda: (torch.addmm(cn, an, bn), an.sum(0), torch.log_softmax(an, 1)))
    assert hits == 3
    torch.testing.assert_close(out[0].cpu(), torch.addmm(bias, a, b))
    torch.testing.assert_close(out[1].cpu(), a.sum(0))
    torch.testing.assert_close(out[2].cpu(), torch.log_softmax(a, 1))
    # fresh operands through the learned runners
    a2 = torch.randn(16, 8, dtype=torch.float64)
    torch.testing.assert_close((a2.to("neuron") @ bn).cpu(), a2 @ b)


@pytest.mark.parametrize("name, fn", [
    ("amax", lambda t: t.amax(1)), ("amin of a slice", lambda t: t[:, ::2].amin(0)),
    ("max.dim", lambda t: t.max(1)), ("argmax", lambda t: t.argmax(1)),
    ("argmin all", lambda t: t.argmin()), ("any", lambda t: (t > 0.5).any(1)),
    ("var", lambda t: t.var(1)), ("std_mean", lambda t: torch.std_mean(t, 0, correction=0)),
    ("logsumexp", lambda t: t.logsumexp(1)), ("prod", lambda t: t.prod(0)),
    ("vector_norm", lambda t: torch.linalg.vector_norm(t.t(), 3.0, dim=1)),
])
def test_reductions_replay_with_fresh_values(name, fn):
    # float64: each result compared exactly against the CPU's float64 reduction (the orders
    # differ, so within a few ulps); every call after the first replays the learned runner
    # on new data
    calls = [torch.rand(9, 6, dtype=torch.float64) for _ in range(4)]
    before = fastpath.STATS_FAST["hits"]
    for x in calls:
        got, want = fn(x.to("neuron")), fn(x)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-12, atol=1e-12)
    assert fastpath.STATS_FAST["hits"] - before >= len(calls) - 2, name


def test_counters_equal_the_slow_path():
    x = torch.randn(64, device="neuron")
    w = torch.randn(64, 64, device="neuron")

    def work():
        return ((x * 3 + 1).relu() @ w).sum()

    def counts(fast: bool):
        prev = config.fastpath
        config.fastpath = fast
        try:
            work()
            before = (STATS.ops, STATS.launches)
            work()
            return STATS.ops - before[0], STATS.launches - before[1]
        finally:
            config.fastpath = prev

    assert counts(True) == counts(False)


def test_simulated_time_equal_to_the_slow_path():
    x = torch.randn(128, device="neuron")
    core = eager_neuron.simulator.SIM.cores[0]

    def device_us(fast: bool):
        prev = config.fastpath
        config.fastpath = fast
        try:
            x * 2
            before = core.clock_us + sum(core.busy_us.values())
            x * 2
            return core.clock_us + sum(core.busy_us.values()) - before
        finally:
            config.fastpath = prev

    assert device_us(True) == pytest.approx(device_us(False))


def test_profiler_records_runner_ops_and_kernels():
    x = torch.ones(2, 4, device="neuron")
    w = torch.ones(4, 4, device="neuron")
    x + x
    x + x
    x @ w
    x @ w
    before = _hits()
    with eager_neuron.profile() as prof:
        x + x
        x @ w
    assert _hits() - before == 2   # the runners ran under the profiler's hooks
    rows = prof.rows()
    ops = [r for r in rows if r["type"] == "op"]
    kernels = [r for r in rows if r["type"] == "kernel"]
    assert [r["name"] for r in ops] == ["aten::add.Tensor", "aten::mm"]
    assert [rows[r["parent"]]["name"] for r in kernels] == ["aten::add.Tensor", "aten::mm"]
    assert all(r["outcome"] == "memory" and r["device_us"] > 0 for r in kernels)


def test_memory_cache_clear_forgets_runners():
    x = torch.ones(4, device="neuron")
    x - x
    x - x
    assert fastpath.TABLES
    MEMORY.clear()
    assert not fastpath.TABLES
    assert (x - x).cpu().tolist() == [0.0] * 4


def test_adaptive_mode_records_instead():
    x = torch.ones(4, device="neuron")
    x * 3
    x * 3
    before = _hits()
    with eager_neuron.adaptive():
        y = x * 3
    assert _hits() == before
    assert y.cpu().tolist() == [3.0] * 4


def test_integer_division_by_zero_is_never_fast():
    x = torch.tensor([4, 6], device="neuron")
    y = torch.tensor([2, 3], device="neuron")
    x // y
    x // y
    z = torch.tensor([2, 0], device="neuron")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):   # as the CPU raises it
        x // z


def test_attention_and_affineless_layer_norm_replay_equal_float64():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(3)]

    def run(dev):
        q, k, v = (t.to(dev).requires_grad_() for t in qkv)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (o * o).sum().backward()
        y = F.layer_norm(o.detach(), (4,))
        return [t.cpu() for t in (o.detach(), q.grad, k.grad, v.grad, y)]

    run("neuron")
    before = _hits()
    got = run("neuron")
    assert _hits() - before >= 3   # attention forward, backward, layer norm replayed
    for a, b in zip(got, run("cpu")):
        torch.testing.assert_close(a, b)


def test_repeated_training_step_runs_on_runners_and_equals_cpu():
    from torch import nn

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

    def steps(dev, n=3):
        model = make().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses = []
        before = None
        for _ in range(n):
            x = torch.randn(8, 16, generator=g).to(dev)
            y = torch.randint(0, 4, (8,), generator=g).to(dev)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if dev != "cpu" and len(losses) == 2:
                before = (_hits(), STATS.ops, STATS.compiles)
        return losses, before

    neuron, before = steps("neuron")
    hits, ops, compiles = _hits() - before[0], STATS.ops - before[1], STATS.compiles - before[2]
    assert compiles == 0
    assert hits >= 0.75 * ops, (hits, ops)   # the rest: transfers, RNG, foreach drivers, loss
    cpu, _ = steps("cpu")
    torch.testing.assert_close(torch.tensor(neuron), torch.tensor(cpu), rtol=1e-4, atol=1e-5)


def test_foreach_bumps_versions_like_cpu_and_autograd_refuses_stale_tensors():
    for dev in ("cpu", "neuron"):
        p = torch.ones(3, device=dev)
        q = torch.ones(3, device=dev)
        v = p._version
        torch._foreach_add_([p], [q])
        torch._foreach_mul_([p], 2.0)
        assert p._version - v == 2, dev
        w = torch.ones(3, device=dev, requires_grad=True)
        y = (w * w).sum()
        with torch.no_grad():
            torch._foreach_add_([w], 1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_backward_is_a_kernel_equal_to_cpu(dtype):
    g = torch.randn(257, dtype=torch.float64).to(dtype)
    g[0] = float("inf")     # 0 * inf is NaN where the mask drops it, as on the CPU
    mask = torch.rand(257) > 0.3
    mask[0] = False
    want = torch.ops.aten.native_dropout_backward(g, mask, 1 / 0.7)
    for _ in range(2):   # learn, then the runner
        got = torch.ops.aten.native_dropout_backward(g.to("neuron"), mask.to("neuron"), 1 / 0.7)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_new_zeros_ones_full_repeat_from_a_runner_in_both_modes(funnel_calls):
    """new_zeros / new_ones / new_full send their work down the funnel (new_empty, fill_): a
    repeat calls the lowering directly, plain or adaptive (the group stays pending: fill_ is
    recorded into it); a value the dtype cannot hold is refused on every call."""
    from eager_neuron.adaptive import MODULE as _ad

    plans = funnel_calls("_dispatch_plan")
    x = torch.randn(5, 3, device="neuron")
    for adaptive in (False, True):
        with eager_neuron.adaptive(adaptive):
            for i in range(3):
                y = x * 2.0
                before = plans[0]
                z, o = x.new_zeros((4, 2)), x.new_ones(7, dtype=torch.int64)
                f = x.new_full((2,), 3.5)
                if i:
                    assert plans[0] == before, (adaptive, i)
                if adaptive:
                    assert _ad.PENDING
                assert torch.equal(z.cpu(), torch.zeros(4, 2)) and z.device == x.device
                assert torch.equal(o.cpu(), torch.ones(7, dtype=torch.int64))
                assert torch.equal(f.cpu(), torch.full((2,), 3.5))
                assert torch.equal(y.cpu(), x.cpu() * 2.0)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="overflow"):
            x.new_full((2,), 300, dtype=torch.int8)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(257,), (3, 1, 5), (1,), (16, 33)])
def test_dropout_is_one_kernel_with_the_cpus_draw_and_bits(dtype, shape):
    """Plain eager's dropout: the CPU generator's draw, then one kernel making both outputs;
    each p gives the CPU's bits (scale rounded to the dtype: 1 / (1 - p) differs from
    1 / float32(1 - p) for about a fifth of p), inf * 0 -> NaN, -0.0 kept, same strides, and
    the generator left where the CPU leaves it."""
    for p in (0.1, 0.13, 0.3, 0.37, 0.5, 0.77, 0.999):
        x = torch.randn(shape, dtype=torch.float64).mul_(3).to(dtype)
        if x.numel() > 3:
            x.view(-1)[:3] = torch.tensor([float("inf"), float("nan"), -0.0], dtype=dtype)
        torch.manual_seed(7)
        want, want_keep = torch.ops.aten.native_dropout(x, p, True)
        want_next = torch.rand(3)
        xn = x.to("neuron")
        torch.manual_seed(7)
        launches = eager_neuron.stats()["launches"]
        got, keep = torch.ops.aten.native_dropout(xn, p, True)
        assert eager_neuron.stats()["launches"] - launches == 1
        assert torch.equal(torch.rand(3), want_next)
        assert torch.equal(_bits(got.cpu()), _bits(want)), p
        assert torch.equal(keep.cpu(), want_keep) and keep.dtype == torch.bool
        assert got.stride() == want.stride() and keep.stride() == want_keep.stride()


def test_dropout_of_other_layouts_and_dtypes_still_matches_the_cpu():
    x = torch.randn(6, 8)
    for t in (x.t(), x[:, ::2], x.to(torch.bfloat16), torch.empty(0, 3)):
        torch.manual_seed(3)
        want, want_keep = torch.ops.aten.native_dropout(t, 0.4, True)
        torch.manual_seed(3)
        got, keep = torch.ops.aten.native_dropout(t.to("neuron"), 0.4, True)
        assert torch.equal(got.cpu(), want) and torch.equal(keep.cpu(), want_keep)
        assert got.stride() == want.stride()
    with pytest.raises(RuntimeError, match="bernoulli"):   # p outside [0, 1]: the CPU's words
        torch.ops.aten.native_dropout(x.to("neuron"), 1.5, True)


def test_value_dependent_templates_are_keyed_by_value():
    # polygamma's order, round's decimals, pow's exponent change the kernel, not only its args
    x = torch.rand(7, dtype=torch.float64) + 0.5
    xn = x.to("neuron")
    for n in (0, 1, 2, 3, 1):
        torch.testing.assert_close(torch.polygamma(n, xn).cpu(), torch.polygamma(n, x))
    for d in (0, 1, 2, -1, 1):
        torch.testing.assert_close(torch.round(xn * 37, decimals=d).cpu(),
                                   torch.round(x * 37, decimals=d))
    for e in (2.0, 0.5, 3.0, -1.0, 1.7):
        torch.testing.assert_close((xn ** e).cpu(), x ** e)


@pytest.mark.parametrize("op", ["abs", "floor", "ceil", "round", "trunc", "relu"])
def test_ops_the_cpu_refuses_on_bool_are_refused(op):
    x = torch.tensor([True, False])
    with pytest.raises((NotImplementedError, RuntimeError)) as cpu:
        getattr(torch, op)(x)
    for _ in range(2):   # the refusal is never learned as a runner
        with pytest.raises(type(cpu.value), match=str(cpu.value).split(" not ")[0][:20]):
            getattr(torch, op)(x.to("neuron"))


def _adamw_like(params, grads, k):
    torch._foreach_mul_(params, 0.9)
    torch._foreach_add_(params, grads, alpha=0.1)
    denom = torch._foreach_sqrt([p.abs() for p in params])
    torch._foreach_addcdiv_(params, grads, [d.add(1) for d in denom],
                            [0.01 * i * (k + 1) for i in range(1, len(params) + 1)])
    torch._foreach_lerp_(params, grads, 0.3)
    return torch._foreach_div(params, [1.0 + 0.1 * k] * len(params))


def test_foreach_runner_equals_the_funnel_and_counts_every_element():
    torch.manual_seed(0)
    shapes = [(7, 3), (7,), (4, 4), (1,)]
    host = [torch.randn(s) for s in shapes]
    grads = [torch.randn(s).to("neuron") for s in shapes]
    fast = [h.to("neuron") for h in host]
    slow = [h.to("neuron") for h in host]
    for k in range(4):   # step sizes change every step: ScalarList values are kernel arguments
        before = _hits()
        ops = STATS.ops
        out_fast = _adamw_like(fast, grads, k)
        fast_ops, fast_hits = STATS.ops - ops, _hits() - before
        config.fastpath = False
        try:
            ops = STATS.ops
            out_slow = _adamw_like(slow, grads, k)
            slow_ops = STATS.ops - ops
        finally:
            config.fastpath = True
        for a, b in zip(fast + list(out_fast), slow + list(out_slow)):
            assert torch.equal(a.cpu(), b.cpu())
        assert fast_ops == slow_ops   # the elements are ops, whichever path ran them
    assert fast_hits >= 6 * len(shapes)
    assert torch.ops.aten._foreach_addcdiv_.ScalarList in fastpath.TABLES


def test_in_place_foreach_runner_calls_the_element_kernels_and_charges_as_the_funnel():
    # an in-place foreach op whose elements have flat runners: one runner calls their kernels
    # itself; launches, memory hits and the simulated busy time equal the funnel's
    from eager_neuron.simulator import SIM

    core = SIM.cores[0]
    torch.manual_seed(1)
    shapes = [(5, 3), (9,), (2, 2, 2)]
    host = [torch.randn(s) for s in shapes]
    grads = [torch.randn(s).to("neuron") for s in shapes]
    done = {}
    for fast in (True, False):
        config.fastpath = fast
        try:
            ps = [h.to("neuron") for h in host]
            for k in range(3):
                busy, launches, hits = dict(core.busy_us), STATS.launches, STATS.memory_hits
                torch._foreach_lerp_(ps, grads, 0.25)
                torch._foreach_addcdiv_(ps, grads, grads, [0.5 * (k + 1), -1.0, 2.0])
                cost = (STATS.launches - launches, STATS.memory_hits - hits,
                        {e: core.busy_us[e] - busy.get(e, 0.0) for e in core.busy_us})
            done[fast] = ([p.cpu() for p in ps], cost)
        finally:
            config.fastpath = True
    (fast_ps, fast_cost), (slow_ps, slow_cost) = done[True], done[False]
    assert all(torch.equal(a, b) for a, b in zip(fast_ps, slow_ps))
    assert fast_cost[:2] == slow_cost[:2] and fast_cost[0] == 2 * len(shapes)
    # (busy time: deltas of running float totals that started apart)
    assert fast_cost[2] == pytest.approx(slow_cost[2], rel=1e-9)
    ps = [h.to("neuron") for h in host]
    for op, call in ((torch.ops.aten._foreach_lerp_.Scalar, (ps, grads, 0.25)),
                     (torch.ops.aten._foreach_addcdiv_.ScalarList, (ps, grads, grads, [1.0] * 3))):
        values, runners = fastpath.TABLES[op]
        run = runners[fastpath.signature(call, {}, values)]
        assert "KS" in run.__code__.co_names   # the elements' kernels, called by the runner


def test_foreach_runner_sends_an_aliasing_element_down_the_funnel():
    # element 1 adds a tensor to itself: its flat runner declines (MISS), the funnel runs it;
    # element 0 before it ran on its runner once, and element 2 after it runs too
    a, b, c = (torch.arange(4.0).to("neuron") for _ in range(3))
    x, y, z = (torch.arange(4.0) for _ in range(3))
    one = torch.ones(4, device="neuron")
    for _ in range(4):
        before = _hits()
        torch._foreach_add_([a, b, c], [one, b, one])
        torch._foreach_add_([x, y, z], [torch.ones(4), y, torch.ones(4)])
    assert _hits() - before >= 2
    assert torch.equal(a.cpu(), x) and torch.equal(b.cpu(), y) and torch.equal(c.cpu(), z)


def test_cached_numpy_views_follow_in_place_view_ops_and_data_swaps():
    x = torch.arange(6.0).to("neuron")
    y = torch.ones(6, device="neuron")
    (x + y, x + y)                       # learn, and cache x's numpy view
    x.resize_(3)                          # an in-place view op: a fresh host view
    z = torch.ones(3, device="neuron")
    assert (x + z).cpu().tolist() == [1.0, 2.0, 3.0]
    (x + z)
    x.set_(torch.full((3,), 7.0, device="neuron"))   # another buffer, same shape
    assert (x + z).cpu().tolist() == [8.0, 8.0, 8.0]
    w = torch.zeros(3, device="neuron")
    (w + z, w + z)
    w.data = torch.full((3,), 2.0, device="neuron")
    assert (w + z).cpu().tolist() == [3.0, 3.0, 3.0]
    w.add_(z)
    w.add_(z)
    assert w.cpu().tolist() == [4.0, 4.0, 4.0]
    import copy

    c = copy.deepcopy(w)
    c.add_(z)
    assert c.cpu().tolist() == [5.0, 5.0, 5.0] and w.cpu().tolist() == [4.0, 4.0, 4.0]


def test_strided_matmul_operand_and_rnn_cells_replay_equal_float64():
    # mm copies a row-sliced operand into a scratch array, then multiplies: the replay makes
    # its own copy each call; the LSTM/GRU cells are learned from their one launch
    torch.manual_seed(0)
    w = torch.randn(6, 40, dtype=torch.float64)
    wn = w.float().to("neuron")
    before = _hits()
    for t in range(5):
        x = torch.randn(3, 7, 6)
        got = (x.to("neuron")[:, t, :] @ wn).cpu().double()
        want = x[:, t, :].double() @ w.float().double()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _hits() - before >= 3
    for cell in (torch.nn.LSTMCell(6, 5), torch.nn.GRUCell(6, 5)):
        dev = type(cell)(6, 5).to("neuron")
        dev.load_state_dict(cell.state_dict())
        before = _hits()
        for _ in range(3):
            x = torch.randn(3, 6, requires_grad=True)
            xn = x.detach().to("neuron").requires_grad_()
            out, outn = cell(x), dev(xn)
            out = out[0] if isinstance(out, tuple) else out
            outn = outn[0] if isinstance(outn, tuple) else outn
            out.sum().backward()
            outn.sum().backward()
            torch.testing.assert_close(outn.cpu(), out, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(xn.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
        assert _hits() - before > 0


def test_strided_and_expanded_elementwise_operands_replay_equal_cpu():
    # the lowering re-views a sliced or broadcast operand (coalesced dims, stride 0): the
    # replay takes the same view of this call's operand
    before = _hits()
    for _ in range(4):
        y = torch.randn(2, 2, 8, 16)
        x = torch.randn(2, 8, 1)
        yn, xn = y.to("neuron"), x.to("neuron")
        assert torch.equal((-yn[..., 8:]).cpu(), -y[..., 8:])
        assert torch.equal((xn.expand(2, 8, 64) / 64).cpu(), x.expand(2, 8, 64) / 64)
        z = yn[..., 8:]
        z.mul_(3.0)
        y[..., 8:].mul_(3.0)
        assert torch.equal(yn.cpu(), y)
    assert _hits() - before >= 6


def test_index_and_loss_replays_keep_their_error_checks():
    # embedding / gather / nll_loss / binary_cross_entropy flag bad input inside the kernel;
    # the replay checks the flags of its own launch (launch.checked)
    F = torch.nn.functional
    torch.manual_seed(0)
    w = torch.randn(10, 4)
    wn = w.to("neuron")
    logp = torch.randn(6, 5).log_softmax(1)
    lpn = logp.to("neuron")
    p = torch.rand(6)
    pn = p.to("neuron")
    for _ in range(3):
        idx = torch.randint(0, 10, (3, 2))
        assert torch.equal(F.embedding(idx.to("neuron"), wn).cpu(), F.embedding(idx, w))
        tgt = torch.randint(0, 5, (6,))
        torch.testing.assert_close(F.nll_loss(lpn, tgt.to("neuron")).cpu(),
                                   F.nll_loss(logp.double(), tgt).float(), rtol=1e-6, atol=1e-7)
        y = torch.rand(6)
        torch.testing.assert_close(F.binary_cross_entropy(pn, y.to("neuron")).cpu(),
                                   F.binary_cross_entropy(p.double(), y.double()).float(),
                                   rtol=1e-5, atol=1e-6)
        assert torch.equal(torch.gather(wn, 1, idx[:, :1].to("neuron") % 4).cpu(),
                           torch.gather(w, 1, idx[:, :1] % 4))
    aten = torch.ops.aten
    for op in (aten.embedding.default, aten.nll_loss_forward.default,
               aten.binary_cross_entropy.default, aten.gather.default):
        assert op in fastpath.TABLES, op   # learned: the bad calls below meet their runners
    with pytest.raises(IndexError, match="out of bounds") as info:
        F.embedding(torch.tensor([[1, 10], [0, 2], [3, 4]]).to("neuron"), wn)
    # worded as the funnel words it: the op, the error, your line
    assert "aten::embedding" in str(info.value) and "test_fastpath.py" in str(info.value)
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(lpn, torch.tensor([0, 1, 2, 3, 4, 7]).to("neuron"))
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(pn * 3, torch.rand(6).to("neuron"))
    with pytest.raises(RuntimeError, match="out of bounds"):   # the CPU's type for gather
        torch.gather(wn, 1, torch.tensor([[0], [1], [9]]).to("neuron"))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_conv_norm_pool_replays_equal_float64(layout):
    # a small CNN's forward and backward, three times with new data on the same shapes: the
    # second and third run on captured runners and still equal a float64 CPU reference
    torch.manual_seed(0)

    def net(m, x):
        y = m[0](x)
        y = m[1](y)
        y = F.max_pool2d(y, 2, ceil_mode=True)
        y = m[2](y)
        y = F.avg_pool2d(y, 2, count_include_pad=False, padding=1)
        return F.adaptive_avg_pool2d(y, 1).flatten(1)

    F = torch.nn.functional
    cpu = torch.nn.ModuleList([torch.nn.Conv2d(3, 4, 3, padding=1, stride=1, groups=1),
                               torch.nn.BatchNorm2d(4),
                               torch.nn.ConvTranspose2d(4, 2, 2, stride=1, dilation=2)])
    dev = torch.nn.ModuleList([torch.nn.Conv2d(3, 4, 3, padding=1),
                               torch.nn.BatchNorm2d(4),
                               torch.nn.ConvTranspose2d(4, 2, 2, dilation=2)]).to("neuron")
    dev.load_state_dict(cpu.state_dict())
    ref = cpu.double()
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    before = _hits()
    for _ in range(3):
        x = torch.randn(2, 3, 9, 9).to(memory_format=fmt)
        xd = x.double().requires_grad_()
        xn = x.to("neuron").requires_grad_()
        want = net(ref, xd)
        got = net(dev, xn)
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-5)
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(xn.grad.cpu().double(), xd.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(dev.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad.cpu().double(), b.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev[1].running_var.cpu().double(), ref[1].running_var,
                               rtol=1e-5, atol=1e-6)
    assert torch.ops.aten.convolution.default in fastpath.TABLES
    assert _hits() - before >= 10


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_clamp_bound_range_check_survives_replays(dtype):
    # clamp's int bounds are checked against the tensor's dtype on the host (c10's overflow
    # rule, under which uint8 takes -255..255): its runners are keyed by value, so a learned
    # in-range bound never lets an out-of-range one through
    c = torch.tensor([1, 2, 100], dtype=dtype)
    x = c.to("neuron")
    for b in (3, 3, 4, -1, -1, 127, 255, 256, 40000, -256, 3):
        try:
            want = c.clamp(min=b)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="overflow"):
                x.clamp(min=b)
            continue
        assert torch.equal(x.clamp(min=b).cpu(), want)


# ---------------------------------------------------------------------------------------------
# the per-op cost (issue 14): view runners call Tensor methods, flat runners the kernel's
# compiled entry point, runner outputs carry their signature part
# ---------------------------------------------------------------------------------------------

_VIEWS = {
    "view": lambda t: t.view(-1, 2),
    "view dtype": lambda t: t.view(torch.int32),
    "select": lambda t: t[1],
    "slice": lambda t: t[1:6:2],
    "slice dim 1": lambda t: t[:, 1:3],
    "t": lambda t: t.t(),
    "transpose": lambda t: t.transpose(0, 1),
    "permute": lambda t: t.permute(1, 0),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "expand": lambda t: t.unsqueeze(0).expand(3, 6, 4),
    "diagonal": lambda t: t.diagonal(1),
    "narrow": lambda t: t.narrow(1, 1, 2),
    "unfold": lambda t: t.unfold(0, 2, 2),
    "as_strided": lambda t: t.as_strided((2, 2), (1, 4), 1),
    "unbind": lambda t: t.unbind(1),
    "split": lambda t: t.split(4),
    "detach": lambda t: t.detach(),
}


@pytest.mark.parametrize("name", list(_VIEWS))
def test_view_runners_equal_cpu_at_every_offset(name):
    # the same signature (shape, strides, dtype) at three storage offsets: each call's views
    # must sit at that call's offset (a slice is the base's view at a fixed distance from it)
    fn = _VIEWS[name]
    base = torch.arange(3 * 6 * 4, dtype=torch.float32).view(3, 6, 4)
    dev = base.to("neuron")
    for k in (0, 1, 2, 0, 2):
        before = _hits()
        got, want = fn(dev[k]), fn(base[k])
        gots = list(got) if isinstance(got, (list, tuple)) else [got]
        wants = list(want) if isinstance(want, (list, tuple)) else [want]
        assert isinstance(got, torch.Tensor) == isinstance(want, torch.Tensor)
        assert len(gots) == len(wants)
        for g, w in zip(gots, wants):
            assert (g.shape, g.stride(), g.storage_offset(), g.dtype) == \
                (w.shape, w.stride(), w.storage_offset(), w.dtype)
            assert g._sgc is None or g._sgc[1] == fastpath._part(g._data.dtype, g._data.shape,
                                                                 g._data.stride(), g._index)
            assert torch.equal(g.cpu(), w)
        if k == 2:
            assert _hits() - before >= 1   # the repeat ran on the view runner
    # the views alias the base: a write through the last one shows in the device base
    g = gots[-1]
    if g.dtype == torch.float32 and name != "expand":
        g.fill_(-1.0)
        wants[-1].fill_(-1.0)
        assert torch.equal(dev.cpu(), base)


def test_view_runners_take_tensor_methods_and_keep_autograd_and_versions():
    methods = fastpath.STATS_FAST["view_methods"]
    x = torch.randn(4, 4, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_()
    for _ in range(3):
        y, yn = x.t()[1:3], xn.t()[1:3]
    assert fastpath.STATS_FAST["view_methods"] > methods   # t and slice learned as methods
    assert yn._base is xn and yn.grad_fn is not None
    (yn * 2).sum().backward()
    (y * 2).sum().backward()
    assert torch.equal(xn.grad.cpu(), x.grad)
    # an in-place write through a runner-made view bumps the base's version counter
    b = torch.zeros(4, 4, device="neuron")
    for _ in range(3):
        v = b[1:3]
    before = b._version
    v.add_(1.0)
    assert b._version == before + 1 and b.cpu()[1:3].eq(1.0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_flat_runners_call_the_kernel_entry_point_and_equal_cpu(dtype):
    fastpath.reset()   # every case learns its runner here
    entries = fastpath.STATS_FAST["entry_points"]
    a = torch.arange(1, 7).to(dtype)
    b = torch.arange(6, 0, -1).to(dtype)
    one = torch.tensor(3).to(dtype)
    an, bn, onen = a.to("neuron"), b.to("neuron"), one.to("neuron")
    cases = [lambda x, y, o: x + y, lambda x, y, o: x * o, lambda x, y, o: x.ne(y),
             lambda x, y, o: x.add(y, alpha=2) if dtype != torch.bool else x | y]
    if dtype.is_floating_point:
        cases += [lambda x, y, o: x * 2.5, lambda x, y, o: x.neg()]
    for fn in cases:
        for _ in range(3):
            assert torch.equal(fn(an, bn, onen).cpu(), fn(a, b, one))
        # new values, same signature: the runner reads this call's buffers
        a2 = a.flip(0)
        assert torch.equal(fn(a2.to("neuron"), bn, onen).cpu(), fn(a2, b, one))
    assert fastpath.STATS_FAST["entry_points"] - entries >= len(cases) - 1


def test_captured_runners_call_the_kernel_entry_point():
    # a captured runner (reductions, softmax, mm, scans) calls its kernel's compiled entry
    # point, not the Numba dispatcher (and its per-call type matching); its replays equal the
    # slow path's call bit for bit
    fastpath.reset()
    entries = fastpath.STATS_FAST["entry_points"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g)
    m = torch.randn(48, 8, generator=g)
    cases = [lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.amax(), lambda t: t.mean(0),
             lambda t: t.softmax(-1), lambda t: t @ m.to(t.device), lambda t: t.cumsum(1)]
    for fn in cases:
        hits = fastpath.STATS_FAST["hits"]
        first = fn(x.to("neuron")).cpu()   # the slow path: learns the runner
        for _ in range(2):
            assert torch.equal(fn(x.to("neuron")).cpu(), first)
        x2 = x.flip(0)   # new values, same signature: the runner reads this call's buffers
        assert torch.equal(fn(x2.to("neuron")).cpu(), fn(x2.to("neuron")).cpu())
        assert torch.allclose(fn(x2.to("neuron")).cpu(), fn(x2), rtol=1e-5, atol=1e-5)
        assert fastpath.STATS_FAST["hits"] > hits
    assert fastpath.STATS_FAST["entry_points"] - entries >= len(cases)


def test_large_outputs_reuse_their_numpy_array():
    # a runner's large (pooled) output comes with the numpy array its kernel writes through,
    # made once per pooled storage (buffers.alloc_np: .numpy() and its free cost ~11 us of a big
    # op's host path); an array someone still holds is never handed out again
    from eager_neuron import buffers

    fastpath.reset()
    n = 1 << 16   # 256 KiB: pooled
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    x, y = a.to("neuron"), b.to("neuron")
    before = buffers.VIEW_STATS["arrays_reused"]
    cases = [(lambda p, q: p + q), (lambda p, q: p.view(256, 256).softmax(-1)),
             (lambda p, q: p.view(256, 256) * 2.0)]
    for fn in cases:
        first = fn(x, y).cpu()   # the slow path
        assert torch.allclose(first, fn(a, b), rtol=1e-6, atol=1e-7)
        for _ in range(3):   # the runner's replays, in reused arrays: the same bits
            assert torch.equal(fn(x, y).cpu(), first)
    assert buffers.VIEW_STATS["arrays_reused"] - before >= 2 * len(cases)
    z = x + y
    held = fastpath.flat_np(z)   # the output's cached array, kept past the output
    assert held is z._npc[1]
    del z
    w = x + y   # z's storage again, and its view; the array is new
    assert w._npc[1] is not held and held.shape == (n,)
    assert torch.equal(w.cpu(), a + b)


def test_runner_outputs_carry_their_signature_part():
    # a runner's output caches the signature part a later op reads (fastpath.signature):
    # it must be what the output's own host view gives
    x = torch.randn(3, 5, device="neuron")
    m = torch.randn(5, 4, device="neuron")
    big = torch.randn(300, 100, device="neuron")   # above the small-block path
    cached = 0
    for _ in range(3):
        outs = [x + 1, x * x, x.exp(), x @ m, x.sum(0), x.view(-1), x[1:], x.t(), big * 2,
                big.sum(1), *x.unbind(0), torch.zeros(2, 0, device="neuron") + 1, x > 0]
        for o in outs:
            if o._sgc is not None:
                cached += 1
                assert o._sgc[0] is o._data
                assert o._sgc[1] == fastpath._part(o._data.dtype, o._data.shape,
                                                   o._data.stride(), o._index)
    assert cached >= 2 * 10


# --- recycled host buffers (fastpath._recycle_lines, simulator.HostBlock) ---------------------

def _reuses() -> int:
    return fastpath.STATS_FAST["host_reuses"]


def _adder(shape=(4,)):
    """Operands of a learned `a + b` runner whose list holds no dead buffer (all taken)."""
    a = torch.randn(shape, device="neuron")
    b = torch.randn(shape, device="neuron")
    for _ in range(3):
        a + b
    keep = [a + b for _ in range(6)]   # takes every dead buffer off the list
    assert _reuses() > 0
    return a, b, keep


def test_dead_outputs_host_buffers_are_reused_and_values_stay_right():
    a, b, keep = _adder()
    before = _reuses()
    for k in range(6):
        c = a + b * k if k % 2 else a + b   # b * k: its own runner; the adds share one
        want = a.cpu() + (b.cpu() * k if k % 2 else b.cpu())
        assert torch.equal(c.cpu(), want)
    del c
    assert _reuses() - before >= 5   # every add after the first takes the previous c's buffer
    # outputs alive together never share memory; each keeps its value
    ptrs = {t.data_ptr() for t in keep}
    assert len(ptrs) == len(keep)
    keep[0].add_(1.0)
    assert all(torch.equal(t.cpu(), a.cpu() + b.cpu()) for t in keep[1:])
    # counters and accounting are the funnel's: a dead small output frees its bytes
    core = eager_neuron.simulator.SIM.cores[0]
    held = core.allocated
    c = a + b
    assert core.allocated == held + 512
    del c
    assert core.allocated == held


# each escape: (what holds the host memory, a reader of the values it sees: called once, at the
# end, as a flat tensor)
def _escape_host_view(c):      # a CPU view of the host buffer, held without the block
    v = c._data.reshape(-1)[1:]
    return v, lambda: torch.cat([c_first(v), v])


def c_first(v):   # the element before a view's first one (the reader shows the whole buffer)
    return v.as_strided((1,), (1,), v.storage_offset() - 1)


def _escape_host_dlpack(c):    # an unconsumed DLPack capsule of the host buffer
    cap = c._data.__dlpack__()
    return cap, lambda: torch.from_dlpack(_Capsule(cap)).reshape(-1).clone()


def _escape_dlpack_consumer(c):   # a tensor a DLPack consumer made over the host buffer
    t = torch.from_dlpack(_Capsule(c._data.__dlpack__()))
    return t, lambda: t.reshape(-1).clone()


def _escape_host_storage(c):   # the host storage object alone (a neuron storage holds it)
    st = c._data.untyped_storage()
    return st, lambda: torch.frombuffer(bytearray(bytes(st)), dtype=torch.float32)


def _escape_host_numpy(c):     # Tensor.numpy() of the host tensor (holds the tensor)
    arr = c._data.numpy()
    return arr, lambda: torch.from_numpy(arr.reshape(-1).copy())


def _escape_flat_numpy(c):     # the cached flat numpy view (a group or a kernel keeps it)
    arr = fastpath.flat_np(c)
    return arr, lambda: torch.from_numpy(arr.copy())


def _escape_below_autograd(c):  # a tensor over the storage that autograd never saw
    with torch._C._AutoDispatchBelowADInplaceOrView():
        v = c._data.as_strided((2,), (1,), 0)
    return v, lambda: v.clone()


class _Capsule:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **_kw):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)   # kDLCPU


@pytest.mark.parametrize("escape", [_escape_host_view, _escape_host_dlpack,
                                    _escape_dlpack_consumer, _escape_host_storage,
                                    _escape_host_numpy, _escape_flat_numpy,
                                    _escape_below_autograd])
@pytest.mark.parametrize("shape", [(4,), (3, 5)])
def test_a_dead_output_whose_host_memory_escaped_is_never_reused(escape, shape):
    # the output's block dies with it, but something still reaches its host memory: the
    # runner must not hand that memory to a later output (the reference counts tell)
    a, b, keep = _adder(shape)
    c = a + b
    ptr = c.data_ptr()
    seen = c.cpu().reshape(-1)
    holder, read = escape(c)
    del c   # its buffer goes onto the runner's list: the next add pops it first
    before = _reuses()
    for k in range(4):
        d = a + b * (k + 2)
        assert d.data_ptr() != ptr
        assert torch.equal(d.cpu(), a.cpu() + b.cpu() * (k + 2))
    got = read()
    assert torch.equal(got, seen[:got.numel()])
    assert _reuses() - before >= 2   # the other dead outputs are reused meanwhile
    del holder, d, keep


def test_live_view_storage_and_saved_tensor_keep_a_buffer_from_reuse():
    # a neuron view, the neuron storage and an autograd graph each hold the output's block:
    # it does not die, so its buffer never reaches the list
    a, b, keep = _adder()
    w = torch.randn(4, device="neuron", requires_grad=True)
    c1, c2, c3 = a + b, a + b * 2, a + b * 3
    ptrs = {c1.data_ptr(), c2.data_ptr(), c3.data_ptr()}
    v = c1.view(2, 2)
    s = c2.untyped_storage()
    loss = (c3 * w).sum()   # mul saves c3 for w's gradient
    del c1, c2, c3
    before = _reuses()
    for k in range(6):
        d = a + b * (k + 5)
        assert d.data_ptr() not in ptrs
        assert torch.equal(d.cpu(), a.cpu() + b.cpu() * (k + 5))
    assert _reuses() - before >= 5
    assert torch.equal(v.cpu().reshape(-1), a.cpu() + b.cpu())
    assert torch.equal(torch.tensor(s.cpu().tolist(), dtype=torch.uint8)[:16],
                       (a.cpu() + b.cpu() * 2).view(torch.uint8))
    loss.backward()
    assert torch.equal(w.grad.cpu(), a.cpu() + b.cpu() * 3)
    del keep


def test_a_pending_adaptive_group_keeps_a_dead_output_from_reuse():
    # a group reads a runner's output lazily: it pins the block (and holds its arrays), so the
    # buffer is not reused while the group is pending, and is afterwards
    a, b, keep = _adder()
    c = a + b
    ptr = c.data_ptr()
    with eager_neuron.adaptive():
        y = c * 3          # recorded, not run
        del c
        z = a + b * 4      # adaptive eager's own runner: a fresh buffer
        assert z.data_ptr() != ptr
        out = y + z
    assert torch.equal(out.cpu(), (a.cpu() + b.cpu()) * 3 + (a.cpu() + b.cpu() * 4))
    del y, z, out
    before = _reuses()
    d = a + b   # the group has let go: the dead output's buffer is taken now
    assert _reuses() - before == 1 and d.data_ptr() == ptr
    assert torch.equal(d.cpu(), a.cpu() + b.cpu())
    del keep


def test_signature_parts_are_numbered_one_to_one(monkeypatch):
    # a tensor's signature part is a number standing for (dtype, sizes, strides, core): two
    # different layouts never share one, the same layout always gets the same one
    metas = [(torch.float32, (4,), (1,)), (torch.float64, (4,), (1,)), (torch.int64, (4,), (1,)),
             (torch.float32, (2, 2), (2, 1)), (torch.float32, (2, 2), (1, 2)),
             (torch.float32, (4, 1), (1, 1)), (torch.float32, (1, 4), (4, 1)),
             (torch.float32, (), ()), (torch.float32, (0,), (1,)), (torch.float32, (1,), (1,))]
    parts = {(m, i): fastpath._part(m[0], torch.Size(m[1]), m[2], i) for m in metas
             for i in (0, 1)}
    assert len(set(parts.values())) == len(parts)
    assert all(fastpath._part(m[0], torch.Size(m[1]), m[2], i) == p
               for (m, i), p in parts.items())
    x = torch.randn(2, 3, device="neuron")
    assert fastpath.signature((x, x.t()), {}, False) != fastpath.signature((x, x), {}, False)
    # the shortcut for one or two tensors gives the general loop's signature
    calls = [(x,), (x, x.t()), (x, x[0]), (x, 2), (x, [3, 2]), (x.double(), x), (1.5, x)]
    fast = [fastpath.signature(c, {}, v) for c in calls for v in (False, True)]
    monkeypatch.setattr(fastpath, "_BIN", False)
    assert fast == [fastpath.signature(c, {}, v) for c in calls for v in (False, True)]
    monkeypatch.setattr(fastpath, "_BIN", True)
    # a full numbering: new layouts keep their tuple (never equal to a number) and still run
    monkeypatch.setattr(fastpath, "_PART_MAX", 0)
    assert fastpath._part(torch.int8, torch.Size([3, 7]), (7, 1), 0) == \
        (torch.int8, (3, 7), (7, 1), 0)
    y = torch.randn(3, 7, 2).to("neuron")
    want = (y.cpu() * 2 + y.cpu())
    before = _hits()
    for _ in range(3):
        assert torch.equal((y * 2 + y).cpu(), want)
    assert _hits() - before >= 4


@pytest.mark.parametrize("escape", [_escape_host_view, _escape_host_numpy, _escape_flat_numpy])
def test_captured_outputs_reuse_dead_buffers_but_never_escaped_ones(escape):
    # captured runners (a reduction, a matmul: fastpath_capture) recycle as flat runners do
    m = torch.randn(6, 5, device="neuron")
    w = torch.randn(5, 3, device="neuron")
    ops = [lambda: m.sum(0), lambda: m @ w, lambda: m.amax(1)]
    for op in ops:
        for _ in range(3):
            op()
        keep = [op() for _ in range(6)]   # every dead buffer taken off the list
        c = op()
        ptr = c.data_ptr()
        seen = c.cpu().reshape(-1)
        holder, read = escape(c)
        del c
        before = _reuses()
        m2 = m * 1.0   # other values, same signature
        for _ in range(4):
            m2.mul_(-1.5)
            d = (m2.sum(0) if op is ops[0] else m2 @ w if op is ops[1] else m2.amax(1))
            assert d.data_ptr() != ptr
            want = (m2.cpu().double().sum(0) if op is ops[0] else
                    m2.cpu().double() @ w.cpu().double() if op is ops[1] else
                    m2.cpu().double().amax(1))
            torch.testing.assert_close(d.cpu().double(), want, rtol=1e-5, atol=1e-5)
        got = read()
        assert torch.equal(got, seen[:got.numel()])
        assert _reuses() - before >= 2
        del holder, keep, d


def test_an_empty_output_of_a_replay_has_the_cpus_strides():
    """A runner allocated a small contiguous output with np.empty: numpy gives an empty
    array zero strides, so a replayed x[:, :, i, j] of an empty batch had host strides
    (0, 0, 0, 0), and a cast of it (which copies its host's layout) reported them:
    F.interpolate(half (0, 3, 5, 5)) from the second call on."""
    x = torch.ones(0, 3, 5, 5)
    i, j = torch.arange(7).unsqueeze(-1) % 5, torch.arange(7) % 5
    want = x[:, :, i, j].half()
    nx, ni, nj = x.to("neuron"), i.to("neuron"), j.to("neuron")
    for _ in range(3):
        got = nx[:, :, ni, nj]
        assert got._data.stride() == got.stride() == want.stride()
        assert got.half().stride() == want.stride()
    for _ in range(3):
        got = torch.nn.functional.interpolate(x.half().to("neuron"), size=7)
        assert got.stride() == want.stride()


def test_to_with_its_own_device_repeats_from_the_casts_runner():
    """x.to(device=x.device, dtype=...) (Hugging Face's attention masks) runs as the cast
    without `device`: the cast's runner was learned under that inner signature only, so every
    call took the slow path and compiled the same runner again (~0.4 ms a call, 0.66 ms of a
    BERT step). Now the outer call repeats from the runner, and nothing is learned twice."""
    src = torch.tensor([[3, 0, -2, 7]])
    x = src.to("neuron")
    want = src.to(dtype=torch.bool)
    for device in (x.device, "neuron", "neuron:0"):
        x.to(device=device, dtype=torch.bool)
        learned = fastpath.STATS_FAST["learned"]
        before = _hits()
        for _ in range(3):
            got = x.to(device=device, dtype=torch.bool)
            assert got.device == x.device and torch.equal(got.cpu(), want)
        assert _hits() - before == 3
        assert fastpath.STATS_FAST["learned"] == learned
    # another core is a copy between cores, never the cast's runner
    if torch.neuron.device_count() > 1:
        got = x.to(device="neuron:1", dtype=torch.bool)
        assert got.device == torch.device("neuron:1") and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last"])
def test_slice_and_select_backward_repeat_as_one_zero_pad(layout):
    """A unit-step slice_backward (Llama's rotate_half gradient) and select_backward are one
    remap kernel writing zeros and the gradient into the CPU's contiguous layout (lower/shape.py
    _backward_pad), learned by the fast path whatever the gradient's layout (~50 -> ~10 us a
    call). Values and strides as the CPU's; a step other than 1 decomposes and is not learned."""
    sb, sel = torch.ops.aten.slice_backward.default, torch.ops.aten.select_backward.default

    def grad(shape):
        if layout == "transposed":
            return torch.randn(shape[::-1]).permute(*reversed(range(len(shape))))
        if layout == "channels_last" and len(shape) == 4:
            return torch.randn(shape).contiguous(memory_format=torch.channels_last)
        return torch.randn(shape)

    cases = [(sb, (2, 3, 4, 2), ([2, 3, 4, 5], 3, 1, 3, 1)),
             (sb, (2, 3, 4, 2), ([2, 3, 4, 5], 3, 0, 2, 1)),        # same grad, other slice
             (sb, (2, 3, 4, 2), ([2, 3, 4, 5], -1, -2, 2**63 - 1, 1)),
             (sb, (3, 5), ([3, 9], 1, 0, 9, 2)),                    # step 2: not one pad
             (sel, (4, 6), ([4, 5, 6], 1, 2)), (sel, (4, 6), ([4, 5, 6], 1, -1)),
             (sel, (5,), ([5, 7], 1, 3))]
    for op, shape, rest in cases:
        g = grad(shape)
        want = op(g, *rest)
        gn = g.to("neuron")
        op(gn, *rest)
        before = _hits()
        got = op(gn, *rest)
        hits = _hits() - before
        assert got.stride() == want.stride() and torch.equal(got.cpu(), want), (op, rest)
        learned = fastpath.TABLES.get(op, (True, {}))[1]
        if op is sel or rest[-1] == 1:   # the op's own runner served
            assert fastpath.signature((gn, *rest), {}, True) in learned and hits == 1
        else:
            assert fastpath.signature((gn, *rest), {}, True) not in learned


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_casts_repeat_from_runners_and_equal_cpu(half):
    """Casts between float32 and bfloat16/float16 (autocast casts every weight and activation)
    took the slow path on every call (~46 us): half dtypes were never learned. The cast is one
    bit-level kernel reading float32 as int32 and writing the half type as int16; its runner
    takes this call's operands reinterpreted the same way (bfloat16 as int16 bits: numpy has
    none). Values bit for bit the CPU's (ties to even, NaN, inf, subnormals), strides the
    CPU's, new values on every call; another dtype or layout is another signature."""
    special = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 65520.0, -70000.0, 1e-8, -1e-40,
                            float("nan"), float("inf"), -0.0, 2 ** -25 * 3, 3.0e38, 0.1])
    for make in (lambda t: t, lambda t: t[::2], lambda t: t.view(3, 4).t(),
                 lambda t: t[:1].expand(5)):
        for step in range(3):
            src = make(special * (1 + step))       # new values each call, one signature
            dev = make((special * (1 + step)).to("neuron"))
            before = _hits()
            down = dev.to(half)
            up = down.float()
            if step:   # learned at step 0: both casts repeat from their runners
                assert _hits() - before == 2
            want = src.to(half)
            assert down.dtype == half and down.stride() == want.stride()
            got = down.cpu()
            nan = want.isnan()   # (a NaN's bits are the CPU's ISA's: only NaN-ness is judged)
            assert torch.equal(got.isnan(), nan)
            assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
            torch.testing.assert_close(up.cpu(), want.float(), rtol=0, atol=0, equal_nan=True)
    # a float64 source is another signature (and, through float32 scratch, not learned)
    x = special.double().to("neuron")
    for _ in range(2):
        got = x.to(half)
    torch.testing.assert_close(got.cpu(), special.double().to(half), rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_ops_repeat_from_runners_equal_to_the_slow_path(half):
    """bfloat16/float16 ops run as casts up, the float32 op and casts down over float32
    scratch (lower/half.py), and were never learned: 50-140 us a call. The scratch is marked
    (context.scratch) and each replay allocates its own; a kernel reading an operand's bits
    reinterpreted (the casts' int16/int32 views) reads this call's operand. Every repeat equals
    the slow path bit for bit (the first version of this handed a cast's scratch to the next
    launch from a stale copy: caught here), with new values on every call."""
    F = torch.nn.functional

    def ops(a, b, e):
        return [a + b, a * b, a - e, a / e, F.gelu(a), torch.relu(b), a.sum(1, keepdim=True),
                torch.softmax(a, 1), torch.where(a > 0, a, b)]

    got = []
    for step in range(3):
        torch.manual_seed(step)   # new values, one signature per op
        a, b = (torch.randn(4, 5).to(half) for _ in range(2))
        e = torch.randn(4, 1).to(half).expand(4, 5)
        dev = [t.to("neuron") for t in (a, b)] + [e.contiguous().to("neuron")[:, :1].expand(4, 5)]
        before = _hits()
        outs = ops(*dev)
        if step:
            assert _hits() - before >= len(outs)
        config.fastpath = False
        try:
            slow = ops(*dev)
        finally:
            config.fastpath = True
        for o, s in zip(outs, slow):
            assert o.dtype == s.dtype == half and o.stride() == s.stride()
            assert torch.equal(o.cpu(), s.cpu())
        for o, w in zip(outs, ops(a, b, e)):   # the CPU's (its half math is float32's too)
            torch.testing.assert_close(o.cpu(), w, rtol=2 * torch.finfo(half).eps, atol=1e-6)
        got.append(outs)


def test_a_half_call_with_numbers_does_not_key_the_float32_runners_by_value():
    """A half op's launches take its numbers as constants (rounded to the half type where the
    CPU rounds them), so its runner is keyed by their values; an elementwise overload's
    float32 runners take numbers at run time, keyed by type. A half call with numbers must not
    start the overload's table keyed by value (float32 `x * k` for ever-new k would then miss
    every call): it is learned only into a table that already keys by value."""
    h = torch.ones(8, dtype=torch.bfloat16, device="neuron")
    op = torch.ops.aten.mul.Tensor
    fastpath.TABLES.pop(op, None)
    for _ in range(3):
        h * 3
    assert op not in fastpath.TABLES or not fastpath.TABLES[op][0]
    x = torch.arange(4.0, device="neuron")
    x * 1.5
    before = _hits()
    for k in (0.5, 2.0, -3.25):
        assert (x * k).cpu().tolist() == [v * k for v in range(4)]
    assert _hits() - before == 3


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_ops_read_unrounded_numbers_at_run_time(half):
    """`h * k` (GPT-2's GELU under autocast: 215 us a call) was never learned once float32
    `mul` runners keyed numbers by type. A number the half route passes to the float32 op
    unchanged (mul/div take the raw value, as the CPU's kernels do) is read at run time from
    the call; one it rounds to the half type first (add's, sub's) is read and rounded the same
    way at run time (it kept the op on the slow path before the nineteenth session). Every
    value as the CPU's."""
    x = torch.arange(4.0, device="neuron")
    x * 1.5                                  # the overload's float32 runners: by type
    src = torch.randn(50).to(half)
    h = src.to("neuron")
    cases = {"mul": (lambda t, k: t * k, True), "div": (lambda t, k: t / k, True),
             "add": (lambda t, k: t + k, True), "sub": (lambda t, k: t - k, True)}
    for name, (f, runtime) in cases.items():
        f(h, 0.7)
        hits = []
        for k in (2.0, 0.3, -1.7, 1e-3):
            before = _hits()
            got = f(h, k)
            hits.append(_hits() - before)
            assert torch.equal(got.cpu(), f(src, k)), (name, k)
        # a runner's hit (new values of one type, one signature); or the slow path throughout
        assert (min(hits) > 0) == runtime, (name, hits)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_fill_and_in_place_ops_repeat_from_runners(half):
    """Half `fill_` (twice a step in an autocast Llama, ~195 us each) keys its value as float32's
    fill_ runners do (by value: the value is range-checked), so a half call may start that table;
    in-place ops on bfloat16 tensors (`mul_`) are learned too (their written operand is viewed
    as its int16 bits). Values as the CPU's; a new fill value is another signature."""
    h = torch.empty(64, device="neuron", dtype=half)
    for v, learned in ((0.1, False), (0.1, True), (0.1, True), (3.3, False), (3.3, True)):
        before = _hits()
        h.fill_(v)
        assert (_hits() > before) == learned, v
        assert torch.equal(h.cpu(), torch.full((64,), v, dtype=half))
    src = torch.randn(64).to(half)
    g = src.to("neuron")
    for step in range(3):
        want, got = src.clone(), src.clone().to("neuron")
        before = _hits()
        got.mul_(g)
        want.mul_(src)
        assert torch.equal(got.cpu(), want)
        if step:
            assert _hits() - before == 1


def _learned(func, *args, **kwargs) -> bool:
    """Is a runner left for exactly this call's signature?"""
    tab = fastpath.TABLES.get(func)
    if tab is None:
        return False
    sig = fastpath.signature(args, kwargs, tab[0])
    return sig is not None and sig in tab[1]


def test_one_element_tensor_operands_are_learned_and_read_in_the_kernel():
    """A one-element tensor operand was read on the host as a kernel scalar, which a replay
    cannot repeat: `x * t`, where(mask, x, t) took the slow path on every call (T5's masks,
    CLIP's logit scale: ~90 us each). While the fast path learns a call, the element is a
    tensor operand the kernel reads, so each replay reads this call's value."""
    aten = torch.ops.aten
    x = torch.randn(3, 4)
    c = torch.rand(1, 1, 4) > 0.5
    xs = torch.randn(2, 4, 3).permute(0, 2, 1)       # an nd (strided, broadcast) operand
    t = torch.tensor(2.0, device="neuron")
    xn, cn, xsn = x.to("neuron"), c.to("neuron"), xs.to("neuron")
    for v in (2.0, -3.5, 0.25):
        t.fill_(v)
        assert torch.equal((xn * t).cpu(), x * v)
        assert torch.equal(torch.where(cn, xsn, t).cpu(), torch.where(c, xs, torch.tensor(v)))
    assert _learned(aten.mul.Tensor, xn, t)
    assert _learned(aten.where.self, cn, xsn, t)
    before = _hits()
    t.fill_(7.0)
    assert torch.equal((xn * t).cpu(), x * 7.0)
    assert _hits() - before >= 1


def test_sort_topk_and_index_writes_are_learned_and_see_new_values():
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    base = torch.zeros(6, 5, device="neuron")
    for _ in range(3):
        x = torch.randn(6, 5, generator=g)
        xn = x.to("neuron")
        for got, want in ((torch.topk(xn, 2), torch.topk(x, 2)),
                          (torch.sort(xn, 1), torch.sort(x, 1))):
            assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
        idx = torch.randint(0, 6, (6,), generator=g)   # duplicates accumulate
        idxn = idx.to("neuron")
        got = aten.index_put(base, [idxn], xn, True)
        want = aten.index_put(torch.zeros(6, 5), [idx], x, True)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-6)
        si = torch.randint(0, 6, (6, 5), generator=g)
        assert torch.equal(torch.scatter(base, 0, si.to("neuron"), xn).cpu(),
                           torch.scatter(torch.zeros(6, 5), 0, si, x))
    assert _learned(aten.topk.default, xn, 2)
    assert _learned(aten.index_put.default, base, [idxn], xn, True)
    # an out-of-range index on a replay: the CPU's IndexError, from the replay's own flags
    with pytest.raises(IndexError):
        aten.index_put(base, [torch.full((6,), 9, device="neuron")], xn, True)


def test_a_boolean_mask_index_put_is_never_learned():
    """Its coordinates are counted on the host: a replay would reuse one call's count."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1)
    base = torch.zeros(8, 3)
    one = torch.tensor(1.5)
    for _ in range(4):
        mask = torch.rand(8, generator=g) > 0.5
        mn = mask.to("neuron")
        got = aten.index_put(base.to("neuron"), [mn], one.to("neuron"))
        assert torch.equal(got.cpu(), aten.index_put(base, [mask], one))
    assert not _learned(aten.index_put.default, base.to("neuron"), [mn], one.to("neuron"))


def test_conv_weight_gradient_of_a_channels_last_grad_is_learned():
    """The grad's contiguous copy is scratch the replay allocates (context.scratch): the
    weight-only backward of CLIP's patch embedding took the slow path every call (280 us)."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(2)
    inp = torch.randn(2, 3, 16, 16, generator=g)
    w = torch.randn(32, 3, 8, 8, generator=g)
    inpn, wn = inp.to("neuron"), w.to("neuron")
    for _ in range(3):
        go = torch.randn(2, 32, 2, 2, generator=g).contiguous(
            memory_format=torch.channels_last)
        gon = go.to("neuron")
        call = ([0], [8, 8], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False])
        got = aten.convolution_backward(gon, inpn, wn, *call)[1]
        want = aten.convolution_backward(go.double(), inp.double(), w.double(), *call)[1]
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
    assert _learned(aten.convolution_backward.default, gon, inpn, wn, *call)


def test_allocations_like_a_neuron_tensor_repeat_from_a_runner():
    """empty_like / new_empty (the autograd engine's gradient buffers) allocate what the
    signature fixes; new_zeros / new_ones / new_full are new_empty then fill_, both fast."""
    x = torch.randn(3, 4, device="neuron").t()
    for _ in range(2):
        e = torch.empty_like(x)
        n = x.new_empty((2, 5), dtype=torch.int64)
    assert e.shape == x.shape and e.stride() == torch.empty_like(x.cpu()).stride()
    assert n.dtype == torch.int64 and n.device == x.device
    before = _hits()
    e2 = torch.empty_like(x)
    assert _hits() - before == 1 and e2._block is not e._block
    e2.fill_(3.0)
    assert e.cpu().ne(3.0).any() or not e.numel()   # its own memory (e was never filled)
    with torch.inference_mode():
        assert torch.empty_like(x).is_inference()
    for fn in (lambda t: t.new_zeros(3, 4), lambda t: t.new_ones((2,), dtype=torch.int64),
               lambda t: t.new_full((2, 2), 7.5), lambda t: t.new_zeros((0, 3))):
        for _ in range(2):
            got, want = fn(x), fn(x.cpu())
            assert got.device == x.device and got.dtype == want.dtype
            assert torch.equal(got.cpu(), want)
    with pytest.raises(RuntimeError, match="overflow"):
        x.new_full((2,), 300, dtype=torch.uint8)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_select_and_slice_backward_are_one_kernel_and_learned(dt):
    """Zeros with the gradient in place, one remap launch into the CPU's contiguous layout
    (any gradient layout), learned by the fast path; other patterns decompose as before."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 6, 5, generator=g) * 4).to(dt)
    cases = [(aten.select_backward.default, (x.select(1, -1), [2, 6, 5], 1, -1)),
             (aten.select_backward.default, (x[:, :, 2].t().contiguous().t(), [2, 6, 5], 2, 2)),
             (aten.slice_backward.default, (x[:, 1:4], [2, 6, 5], 1, 1, 4, 1)),
             (aten.slice_backward.default, (x[..., -2:], [2, 6, 5], -1, -2, 2 ** 62, 1))]
    for func, (grad, *rest) in cases:
        want = func(grad, *rest)
        gn = grad.to("neuron")
        for _ in range(2):
            eager_neuron.reset_stats()
            got = func(gn, *rest)
            assert eager_neuron.stats()["launches"] == 1
            assert not eager_neuron.stats()["decompositions"]
            assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
        assert _learned(func, gn, *rest)
    # a step: the decomposition, same values
    grad = x[:, ::2]
    want = aten.slice_backward(grad, [2, 6, 5], 1, 0, 6, 2)
    assert torch.equal(aten.slice_backward(grad.to("neuron"), [2, 6, 5], 1, 0, 6, 2).cpu(), want)


def test_histc_is_learned_and_checks_each_replays_range():
    """MoE routers count tokens per expert with histc of int32 ids every step; a float histc
    with min == max takes its range from the data, whose check each replay makes again."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        ids = torch.randint(0, 4, (24,), generator=g, dtype=torch.int32)
        idn = ids.to("neuron")
        got = torch.histc(idn, bins=4, min=0, max=3)
        assert got.cpu().tolist() == torch.bincount(ids.long(), minlength=4).float().tolist()
        x = torch.randn(50, generator=g)
        xn = x.to("neuron")
        assert torch.equal(torch.histc(xn, bins=5).cpu(), torch.histc(x, bins=5))
    assert _learned(aten.histc.default, idn, 4, 0, 3)
    assert _learned(aten.histc.default, xn, 5)
    x[3] = float("inf")
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(x.to("neuron"), bins=5)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_stack_copies_each_input_into_its_slot_and_is_learned(dt):
    """stack was a decomposition (an unsqueeze through the funnel per input, then cat)."""
    g = torch.Generator().manual_seed(5)
    for shape, dim, n in (((2, 8), 1, 12), ((3,), 0, 4), ((), 0, 3), ((2, 3, 4), -1, 2)):
        xs = [(torch.randn(shape, generator=g) * 4).to(dt) for _ in range(n)]
        want = torch.stack(xs, dim)
        xn = [x.to("neuron") for x in xs]
        for attempt in range(2):
            eager_neuron.reset_stats()
            before = _hits()
            got = torch.stack(xn, dim)
            assert eager_neuron.stats()["launches"] == n, (shape, dim)
            assert not eager_neuron.stats()["decompositions"]
            assert _hits() - before == attempt   # the repeat: the stack's own runner
            assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
    # strided inputs and a promoted dtype: the CPU's values; its errors
    xs = [torch.randn(3, 4, generator=g).t(), torch.arange(12).view(4, 3)]
    assert torch.equal(torch.stack([x.to("neuron") for x in xs]).cpu(), torch.stack(xs))
    with pytest.raises(RuntimeError, match="equal size"):
        torch.stack([torch.ones(3, device="neuron"), torch.ones(4, device="neuron")])


def test_ops_with_empty_outputs_repeat_from_a_runner():
    """An op whose every output is empty launches nothing, which left nothing to learn: the
    backward's zero_ of an empty gradient took the slow path every step (4 x 25 us in a Llama
    step). Its runner now only allocates (or returns the written tensor)."""
    e, e2 = torch.empty(0, device="neuron"), torch.empty(0, 3, device="neuron")
    for n in range(3):
        before = _hits()
        r = e.zero_()
        a = e2 + 1
        b = torch.exp(e2)
        assert r is e and a.shape == b.shape == (0, 3) and a.device == e.device
        assert a.stride() == (e2.cpu() + 1).stride()
        if n:
            assert _hits() - before == 3
    # a non-empty output of an empty input is computed as before (sum of nothing: zeros)
    for _ in range(2):
        assert e2.sum(0).cpu().tolist() == [0.0, 0.0, 0.0]


def test_safe_softmax_is_one_kernel_with_all_masked_rows_zero():
    """attention's math path (SDPA with dropout) calls _safe_softmax: softmax, except that a
    row whose every element is -inf is zeros (softmax makes it NaN); a NaN keeps its row NaN."""
    inf = float("inf")
    x = torch.randn(3, 4, 6)
    x[0, 1] = -inf
    x[1, 2, :3] = -inf
    x[2, 0] = -inf
    x[2, 0, 4] = float("nan")
    xs = x.to("neuron")
    for dim, dtype in ((-1, None), (-1, torch.float64), (1, None)):
        want = torch.ops.aten._safe_softmax(x, dim, dtype=dtype)
        eager_neuron.reset_stats()
        got = torch.ops.aten._safe_softmax(xs, dim, dtype=dtype)
        assert eager_neuron.stats()["launches"] == 1 and not eager_neuron.stats()["decompositions"]
        assert got.dtype == want.dtype and got.stride() == want.stride()
        ref = torch.ops.aten._safe_softmax(x.double(), dim)
        assert torch.equal(got.cpu().isnan(), ref.isnan())
        torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert got.cpu()[0, 1].eq(0).all() or dim != -1
    assert torch.ops.aten._safe_softmax(xs, -1).cpu()[0, 1].eq(0).all()
    assert torch.ops.aten._safe_softmax(xs, -1).cpu()[2, 0].isnan().all()
