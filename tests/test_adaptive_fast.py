"""Adaptive eager's recording runners (eager_neuron/adaptive_fast.py): a repeat of a joined call,
a foreach update, or an op the group declined takes a runner, and gives plain eager's bits."""

import pytest
import torch

import eager_neuron
from eager_neuron import adaptive_calls, adaptive_fast, fastpath
from eager_neuron.adaptive import MODULE as _ad


@pytest.fixture(autouse=True)
def _fused_kernels_compile_first():
    # the tests count fused work: groups compile before they run (see test_adaptive.py)
    prev = _ad.set_compile_mode("sync")
    # and every op records: the ops of light groups stop starting groups after a few steps
    # (adaptive.LIGHT_NUMEL); the tests of that switch it on themselves
    light, _ad.LIGHT_NUMEL[0] = _ad.LIGHT_NUMEL[0], 0
    _ad.LIGHT.clear()
    # nor a verdict an earlier test (another file, in this worker) left: an op it saw start
    # groups of one only runs as plain eager here (adaptive.ALONE), which these tests count
    _ad.ALONE.clear()
    yield
    _ad.set_compile_mode(prev)
    _ad.LIGHT_NUMEL[0] = light
    _ad.LIGHT.clear()
    _ad.ALONE.clear()


def _bitwise(plain, got):
    for p, g in zip(plain, got):
        torch.testing.assert_close(g, p, rtol=0, atol=0)


def test_repeated_linear_layers_record_their_calls_on_runners():
    torch.manual_seed(0)
    x, w, b, w2 = (torch.randn(6, 5), torch.randn(7, 5), torch.randn(7), torch.randn(3, 7))

    def f(x, w, b, w2):
        h = torch.relu(torch.nn.functional.linear(x, w, b)) * 2.0    # addmm, t
        return [h, (h @ w2.t()).sum(), torch.bmm(h.view(2, 3, 7), w2.t().expand(2, 7, 3))]

    args = [t.to("neuron") for t in (x, w, b, w2)]
    plain = [t.cpu() for t in f(*args)]
    with eager_neuron.adaptive():
        [t.cpu() for t in f(*args)]   # learns (the host reads launch the groups)
        hits = adaptive_fast.COUNTERS["call_hits"]
        staged = eager_neuron.adaptive_calls.COUNTERS["staged"]
        before = _ad.COUNTERS["analyses"], _ad.COUNTERS["renders"]
        got = [t.cpu() for t in f(*args)]
        after = _ad.COUNTERS["analyses"], _ad.COUNTERS["renders"]
    _bitwise(plain, got)
    # addmm, mm, the sum and bmm of the repeat were recorded by runners, staged as the funnel
    # stages
    assert adaptive_fast.COUNTERS["call_hits"] - hits == 4
    assert eager_neuron.adaptive_calls.COUNTERS["staged"] - staged == 4
    assert after == before   # recognised traces: nothing analysed or rendered


def test_a_call_with_other_strides_or_shared_operands_takes_the_slow_path():
    torch.manual_seed(1)
    a, w = torch.randn(4, 4, device="neuron"), torch.randn(4, 4, device="neuron")
    with eager_neuron.adaptive():
        for _ in range(2):
            a @ w
        hits = adaptive_fast.COUNTERS["call_hits"]
        got_t = a @ w.t()            # a new signature (strides): no runner yet
        got_same = w @ w             # the same signature, one tensor twice: the runner
        got_t, got_same = got_t.cpu(), got_same.cpu()   # is kept (operands never alias)
    assert adaptive_fast.COUNTERS["call_hits"] - hits == 1
    _bitwise([(a @ w.t()).cpu(), (w @ w).cpu()], [got_t, got_same])


def test_adamw_steps_take_foreach_runners_and_match_plain():
    def train(adaptive):
        torch.manual_seed(2)
        m = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 2)).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x = torch.randn(4, 5).to("neuron")
        with eager_neuron.adaptive(adaptive):
            for _ in range(4):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                opt.step()
        return [p.detach().cpu() for p in m.parameters()]

    plain = train(False)
    got = train(True)
    _bitwise(plain, got)
    learned = [f for f in adaptive_fast.TABLES if f._schema.name.startswith("aten::_foreach_")]
    assert torch.ops.aten._foreach_lerp_.Scalar in learned, learned


def test_a_declined_op_learns_plain_eagers_runner_in_an_adaptive_only_process(
        funnel_calls, no_alone_verdicts):
    """A broadcast or strided operand ends the group and the op launches as plain eager; its
    plain runner is learned from that launch (after the group's), so repeats skip the funnel
    even when plain eager never ran the op (was: the slow path on every call, ~100 us). (No
    alone verdicts: x * 3.0 keeps starting its group.)"""
    setups = funnel_calls("_kernel_setup")
    fastpath.reset()
    adaptive_fast.reset()
    torch.manual_seed(5)
    x = torch.randn(2, 16, 8, 8, device="neuron")
    t = torch.randn(2, 16, 1, 1, device="neuron")
    w = torch.randn(2, 16, 8, 8, device="neuron").transpose(2, 3)
    want = [((x * 3.0).cpu() + t.cpu()) * w.cpu() for _ in range(4)]
    got, hits, slow = [], [], []
    with eager_neuron.adaptive():
        for _ in range(4):
            h, before = fastpath.STATS_FAST["hits"], setups[0]
            y = x * 3.0          # recorded
            z = (y + t) * w      # broadcast, then strided: each ends the pending group
            got.append(z.cpu())
            hits.append(fastpath.STATS_FAST["hits"] - h)
            slow.append(setups[0] - before)
    _bitwise(want, got)
    assert hits == [0, 2, 2, 2], hits   # plain runners for + t and * w from the 2nd step
    assert slow[2:] == [0, 0], slow


def test_a_call_that_needs_a_scratch_buffer_repeats_as_plain_eager(funnel_calls,
                                                                    no_alone_verdicts):
    """A bmm whose strided operand the matmul lowering copies into a scratch buffer does not
    join the group; the first call runs as plain eager and leaves its runner, which repeats of
    the signature take after the group launches (they took the whole slow path: Mamba's scan,
    ~100 us a call, 24 a step)."""
    setups = funnel_calls("_kernel_setup")
    fastpath.reset()
    adaptive_fast.reset()
    torch.manual_seed(11)
    a = torch.randn(2, 64, 8, device="neuron")
    b = torch.randn(2, 15, 8, device="neuron").transpose(1, 2)[:, :, 3:4]   # (2, 8, 1), strided
    want = [(torch.bmm(a * 0.5, b) + 1.0).cpu()] * 4   # plain eager's bits
    got, slow = [], []
    with eager_neuron.adaptive():
        for _ in range(4):
            before = setups[0]
            got.append((torch.bmm(a * 0.5, b) + 1.0).cpu())   # recorded, plain bmm, recorded
            slow.append(setups[0] - before)
    _bitwise(want, got)
    assert slow[2:] == [0, 0], slow


def test_an_op_with_empty_outputs_repeats_from_a_runner_with_the_group_pending(
        funnel_calls, no_alone_verdicts):
    """zero_ of an empty gradient computes nothing: never recorded, its plain runner is
    learned and repeats take it without the slow path and without launching the group."""
    setups = funnel_calls("_kernel_setup")
    x = torch.randn(32, device="neuron")
    e = torch.empty(0, device="neuron")
    slow = []
    with eager_neuron.adaptive():
        for _ in range(4):
            y = x + 1.0                  # pending
            flushes = sum(eager_neuron.stats()["flushes"].values())
            before = setups[0]
            assert e.zero_() is e and e.add_(2.0) is e
            slow.append(setups[0] - before)
            assert _ad.PENDING and sum(eager_neuron.stats()["flushes"].values()) == flushes
            assert torch.equal(y.cpu(), x.cpu() + 1.0)
    assert slow[2:] == [0, 0], slow   # (a table keying scalars by type: one more slow call)


def test_an_allocation_repeats_from_its_runner_and_leaves_the_group_pending(
        funnel_calls, no_alone_verdicts):
    """empty_like / new_empty read and write no memory: under adaptive eager a repeat takes
    plain eager's allocation runner, even with a group pending, which stays pending."""
    plans = funnel_calls("_dispatch_plan")
    x = torch.randn(64, device="neuron")
    with eager_neuron.adaptive():
        for i in range(3):
            before, flushes = plans[0], sum(eager_neuron.stats()["flushes"].values())
            y = x * 2.0                       # pending
            e = torch.empty_like(y)           # y's buffer exists: nothing to launch for it
            g = y.new_empty((3, 4))
            assert _ad.PENDING, i             # the group is still pending
            assert sum(eager_neuron.stats()["flushes"].values()) == flushes
            if i:
                assert plans[0] == before, i   # both allocations from their runners
            assert e.shape == y.shape and e.device == y.device and g.shape == (3, 4)
            assert torch.equal(y.cpu(), x.cpu() * 2.0)


def test_a_declined_strided_op_repeats_as_plain_eager_after_the_same_flush():
    torch.manual_seed(3)
    x = torch.randn(2, 3, 4, device="neuron").transpose(1, 2)    # strided
    b = torch.randn(3, device="neuron")
    (x + b).cpu()   # plain eager: its runner
    ref = ((x.cpu() + b.cpu()) * 2.0, x.cpu().contiguous())
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        for _ in range(3):
            y = (b * 1.0) + 0         # a pending group, launched by the declined op
            z = (x + b) * 2.0         # broadcast, strided: declined (flush), then plain
            c = x.contiguous()        # a strided clone: declined as well
        hits = fastpath.STATS_FAST["hits"]
        z2 = (x + b) * 2.0
        # plain eager's runners for x + b and for `* 2.0` of its strided result (declined too:
        # its runner was learned when the funnel launched it after the decline)
        assert fastpath.STATS_FAST["hits"] - hits == 2, fastpath.STATS_FAST["hits"] - hits
        got = (z.cpu(), c.cpu(), z2.cpu())
    _bitwise([ref[0], ref[1], ref[0]], got)
    assert torch.equal(y.cpu(), b.cpu() * 1.0 + 0)
    flushes = eager_neuron.stats()["flushes"]
    assert flushes["strided or broadcast operand"] >= 3, flushes


def test_a_runners_fresh_output_is_still_found_by_a_later_view():
    # a recording runner's output is fresh heap memory: its overlaps are not searched, but its
    # start is recorded, so a later flat view of it (a new buffer of the group) overlaps it,
    # and the in-place op on the view keeps program order (values: plain eager's, exactly)
    x = torch.arange(8, dtype=torch.float32)
    y = torch.full((8,), 0.5)

    def f(x, y):
        z = x + y          # fresh output (the runner's)
        v = z[2:6]         # a flat view of it: a new buffer overlapping z's
        v.mul_(2.0)
        return [z * 3.0, v + 1.0]

    args = [t.to("neuron") for t in (x, y)]
    plain = [t.cpu() for t in f(*args)]
    with eager_neuron.adaptive():
        for _ in range(2):
            [t.cpu() for t in f(*args)]   # learns the runners
        hits = adaptive_fast.COUNTERS["hits"]
        outs = f(*args)
        g = _ad.STATE.group
        assert adaptive_fast.COUNTERS["hits"] - hits >= 3   # recorded by runners
        z_buf = next(j for j, b in enumerate(g.bufs) if b.hi - b.lo == 32 and b.ov)
        view_buf = next(j for j, b in enumerate(g.bufs) if b.hi - b.lo == 16)
        assert view_buf in g.bufs[z_buf].ov and z_buf in g.bufs[view_buf].ov
        got = [t.cpu() for t in outs]
    _bitwise(plain, got)
    assert plain[0].tolist() == [(i + 0.5) * (2 if 2 <= i < 6 else 1) * 3 for i in range(8)]


def _foreach_update(ps, ms, gs, scales):
    # an AdamW-like in-place update: Scalar, List, ScalarList overloads and a keyword scalar
    torch._foreach_mul_(ps, 0.99)
    torch._foreach_lerp_(ms, gs, 0.1)
    torch._foreach_addcmul_(ms, gs, gs, value=0.5)
    torch._foreach_div_(ms, scales)            # one scalar per element
    torch._foreach_addcdiv_(ps, ms, gs, scales)
    torch._foreach_add_(ps, gs, alpha=-0.25)


def _foreach_lists(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (7,), (2, 2, 2), (9,)]
    ps, ms, gs = ([torch.randn(s, generator=g).to("neuron") for s in shapes] for _ in range(3))
    return ps, ms, [g_.abs() + 0.5 for g_ in gs], [1.5, 3.0, 0.25, 7.0]


def test_a_repeated_inplace_foreach_records_its_elements_in_one_call():
    plain = _foreach_lists(4)
    for _ in range(4):
        _foreach_update(*plain)
    got = _foreach_lists(4)
    with eager_neuron.adaptive():
        for step in range(4):
            if step == 3:
                batched = adaptive_fast.COUNTERS["batched"]
                before = _ad.COUNTERS["analyses"], _ad.COUNTERS["renders"]
                hits = eager_neuron.stats()["trace_hits"]
            _foreach_update(*got)
            got[0][0].sum().item()   # a host read: the group launches
        after = _ad.COUNTERS["analyses"], _ad.COUNTERS["renders"]
    # every element of the six foreach calls of the last step was recorded by a batched runner
    assert adaptive_fast.COUNTERS["batched"] - batched == 6 * 4
    assert after == before                                  # the trace an earlier step made
    assert eager_neuron.stats()["trace_hits"] - hits >= 1
    for plain_list, got_list in zip(plain[:3], got[:3]):
        _bitwise([t.cpu() for t in plain_list], [t.cpu() for t in got_list])


def test_a_batched_foreach_call_with_an_aliasing_element_takes_the_slow_path():
    def run(adaptive):
        xs, _ms, ys, _s = _foreach_lists(5)
        with eager_neuron.adaptive(adaptive):
            for _ in range(3):   # learns the batched runner for this signature
                torch._foreach_add_(xs, ys, alpha=0.5)
            batched = adaptive_fast.COUNTERS["batched"]
            # the same signature, but element 1 adds the written tensor to itself
            torch._foreach_add_(xs, [ys[0], xs[1], ys[2], ys[3]], alpha=0.5)
            if adaptive:
                assert adaptive_fast.COUNTERS["batched"] == batched   # not recorded by it
            return [t.cpu() for t in xs]

    _bitwise(run(False), run(True))


def test_a_batched_foreach_call_crossing_the_buffer_limit_launches_mid_call(monkeypatch):
    # a group that cannot take the next element launches (as element by element) and the
    # rest of the call records into a new group: values are plain eager's
    def run(adaptive):
        lists = _foreach_lists(6)
        with eager_neuron.adaptive(adaptive):
            for _ in range(4):
                _foreach_update(*lists)
                lists[0][0].sum().item()
        return [t.cpu() for lst in lists[:3] for t in lst]

    plain = run(False)
    monkeypatch.setattr(_ad, "MAX_BUFS", 7)
    eager_neuron.reset_stats()
    batched = adaptive_fast.COUNTERS["batched"]
    got = run(True)
    assert adaptive_fast.COUNTERS["batched"] > batched
    assert eager_neuron.stats()["flushes"]["buffer limit"] >= 4
    _bitwise(plain, got)


def test_a_batched_foreach_call_whose_elements_read_each_others_outputs():
    # element 1 reads what element 0 wrote in the same call (and the reverse the next time):
    # the batched runner records them in order, as element by element
    def run(adaptive):
        xs, ms, _gs, _s = _foreach_lists(7)
        a, b = xs[1], ms[1]    # both of 7 elements
        with eager_neuron.adaptive(adaptive):
            for _ in range(4):
                torch._foreach_add_([a, b], [b, a], alpha=0.5)
                torch._foreach_mul_([a, b], 1.5)
            return [a.cpu(), b.cpu()]

    batched = adaptive_fast.COUNTERS["batched"]
    plain = run(False)
    got = run(True)
    assert adaptive_fast.COUNTERS["batched"] - batched >= 4
    _bitwise(plain, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_sum_over_some_dims_joins_the_group_and_repeats_by_its_runner(dtype):
    # a bias gradient: elementwise ops recorded, then a sum over the batch dim. It joins the
    # group as a call of plain eager's own reduction kernel (adaptive_calls.JOINABLE): the
    # group does not launch before it, the step is one launch, and the sum's bits are plain
    # eager's (its float64 accumulation in its own order). Calls 2..6 take the recording
    # runner learned on call 1 (adaptive_fast.learn_call: the dims list is in the signature)
    torch.manual_seed(0)
    a, b = torch.randn(16, 64, dtype=dtype), torch.randn(16, 64, dtype=dtype)
    a[0, :] = 1e30                     # cancellation: an order-dependent float sum
    a[1, :] = -1e30
    an, bn = a.to("neuron"), b.to("neuron")
    plain = [((an * bn + float(i)).relu().sum(0) * 0.5).cpu() for i in range(6)]
    plain.append((an * bn).mean([0], keepdim=True).cpu())
    joined, call_hits = adaptive_calls.COUNTERS["joined"], adaptive_fast.COUNTERS["call_hits"]
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        outs = [((an * bn + float(i)).relu().sum(0) * 0.5).cpu() for i in range(6)]
        outs.append((an * bn).mean([0], keepdim=True).cpu())
    s = eager_neuron.stats()
    _bitwise(plain, outs)
    assert adaptive_calls.COUNTERS["joined"] - joined == 7
    assert adaptive_fast.COUNTERS["call_hits"] - call_hits >= 5
    assert s["launches"] == 7, s["launches"]   # one fused launch per result, nothing else
    assert not any("sum" in r or "mean" in r for r in s.get("flushes", {})), s.get("flushes")


def _light_on():
    _ad.LIGHT_NUMEL[0] = 1 << 14
    _ad.LIGHT.clear()


def test_ops_of_light_groups_run_as_plain_eager_once_learned():
    # a chain on 64 elements: recording it costs the host more than plain eager's runners
    # spend launching it (adaptive.LIGHT_NUMEL). Its group is judged light twice, then its
    # ops start no group: plain eager's runners run them (same values, no fused launch)
    _light_on()
    torch.manual_seed(0)
    x, w = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    xn, wn = x.to("neuron"), w.to("neuron")

    def f(v):
        return (torch.relu(xn * v + wn) * wn - 1.0).cpu()

    plain = [f(float(i)) for i in range(6)]          # (leaves plain eager's runners)
    fused, light = [], []
    with eager_neuron.adaptive():
        got = []
        for i in range(6):
            eager_neuron.reset_stats()
            n = adaptive_fast.COUNTERS["light"]
            got.append(f(float(i)))
            fused.append(eager_neuron.stats()["fused_launches"])
            light.append(adaptive_fast.COUNTERS["light"] - n)
    _bitwise(plain, got)
    assert fused == [1, 1, 0, 0, 0, 0] and light == [0, 0, 5, 5, 5, 5], (fused, light)


def test_light_groups_still_fuse_by_default(monkeypatch):
    # the host-time policy is opt-in (EAGER_NEURON_ADAPTIVE_LIGHT): by default adaptive eager
    # fuses small groups too, which is what cuts launches and simulated device time
    from eager_neuron.config import Config

    assert Config({}).adaptive_light == 0
    assert Config({"EAGER_NEURON_ADAPTIVE_LIGHT": "65536"}).adaptive_light == 65536
    with pytest.raises(ValueError, match="EAGER_NEURON_ADAPTIVE_LIGHT"):
        Config({"EAGER_NEURON_ADAPTIVE_LIGHT": "-1"})
    with pytest.raises(ValueError, match="set_light_numel"):
        _ad.set_light_numel(-5)
    prev = _ad.set_light_numel(0)
    torch.manual_seed(0)
    xn, wn = torch.randn(64).to("neuron"), torch.randn(64).to("neuron")
    fused = []
    with eager_neuron.adaptive():
        for i in range(5):
            eager_neuron.reset_stats()
            (torch.relu(xn * float(i) + wn) * wn - 1.0).cpu()
            fused.append(eager_neuron.stats()["fused_launches"])
    assert fused == [1] * 5 and not _ad.LIGHT, (fused, _ad.LIGHT)
    # switched on, the same chain is judged light twice and then runs as plain eager
    assert _ad.set_light_numel(1 << 14) == 0
    fused = []
    with eager_neuron.adaptive():
        for i in range(5):
            eager_neuron.reset_stats()
            (torch.relu(xn * float(i) + wn) * wn - 1.0).cpu()
            fused.append(eager_neuron.stats()["fused_launches"])
    _ad.set_light_numel(prev)
    assert fused == [1, 1, 0, 0, 0], fused


def test_light_ops_without_plain_runners_learn_them_on_the_slow_path():
    # adaptive eager only (no plain runner for this signature yet): a light op is sent down
    # the slow path unrecorded, launches as plain eager and leaves plain eager's runner
    _light_on()
    torch.manual_seed(1)
    x = torch.randn(37, 3, dtype=torch.float64)
    xn = x.to("neuron")
    got, fused = [], []
    with eager_neuron.adaptive():
        for i in range(6):
            eager_neuron.reset_stats()
            got.append(((xn - float(i)).abs() * 0.5).cpu())
            fused.append(eager_neuron.stats()["fused_launches"])
    for i, g in enumerate(got):
        torch.testing.assert_close(g, (x - float(i)).abs() * 0.5, rtol=0, atol=0)
    assert fused == [1, 1, 0, 0, 0, 0], fused
    assert torch.ops.aten.abs.default in fastpath.TABLES


def test_ops_of_heavy_groups_keep_recording():
    # the same chain on 2**15 elements: fusing it saves passes over memory; it stays fused
    _light_on()
    torch.manual_seed(2)
    x, w = torch.randn(1 << 15), torch.randn(1 << 15)
    xn, wn = x.to("neuron"), w.to("neuron")

    def f(v):
        return (torch.relu(xn * v + wn) * wn - 1.0).cpu()

    plain = [f(float(i)) for i in range(5)]
    fused = []
    with eager_neuron.adaptive():
        got = []
        for i in range(5):
            eager_neuron.reset_stats()
            got.append(f(float(i)))
            fused.append(eager_neuron.stats()["fused_launches"])
    _bitwise(plain, got)
    assert fused == [1] * 5, fused
    assert not any(n > 0 for n in _ad.LIGHT.values())


def test_host_and_data_dependent_ops_take_plain_runners_while_nothing_is_pending():
    # x[idx] (a data-dependent op) and .cpu() (a host op): with no group pending anywhere,
    # plain eager's runners (they took the slow path under adaptive eager); with one pending,
    # the slow path (the group launches first, its flush counted)
    torch.manual_seed(3)
    x = torch.randn(10)
    xn, idx = x.to("neuron"), torch.tensor([1, 3, 3], device="neuron")
    for _ in range(2):
        xn[idx].cpu()                               # plain eager's runners
    with eager_neuron.adaptive():
        # (run() takes the runner the first time; once the op's kind is learned, dispatch
        # takes it itself: adaptive_fast.IDLE_PLAIN. Either way a plain runner's hit)
        n, hits = adaptive_fast.COUNTERS["quiet"], fastpath.STATS_FAST["hits"]
        a = xn[idx].cpu()
        quiet = adaptive_fast.COUNTERS["quiet"] - n
        idle_hits = fastpath.STATS_FAST["hits"] - hits
        eager_neuron.reset_stats()
        n = adaptive_fast.COUNTERS["quiet"]
        b = (xn * 2.0)[idx].cpu()                   # x * 2 pending: the gather flushes it
        quiet_pending = adaptive_fast.COUNTERS["quiet"] - n
        flushes = eager_neuron.stats()["flushes"]
    torch.testing.assert_close(a, x[[1, 3, 3]], rtol=0, atol=0)
    torch.testing.assert_close(b, (x * 2.0)[[1, 3, 3]], rtol=0, atol=0)
    assert idle_hits >= 1 and quiet_pending == 0, (idle_hits, quiet, quiet_pending)
    assert flushes == {"non-fusible op aten::index.Tensor": 1}, flushes


def test_views_and_non_fusible_ops_take_plain_fast_path_while_nothing_is_pending():
    # adaptive eager on, no group pending anywhere: a view (t) and a non-fusible op (cumsum)
    # take plain eager's fast path in dispatch itself (adaptive_fast.IDLE_PLAIN); with a group
    # pending, a view still does (adaptive_fast.VIEWS: it touches no memory) and a non-fusible
    # op goes through adaptive_fast.run, which launches the group first. A sum over a dim joins
    # the pending group instead (adaptive_calls.JOINABLE)
    torch.manual_seed(4)
    a = torch.randn(8, 5, dtype=torch.float64)
    an = a.to("neuron")
    for _ in range(2):
        an.t().cumsum(1).cpu()                      # plain eager's runners
        an.t().sum(1).cpu()
    with eager_neuron.adaptive():
        an.t().cumsum(1).cpu()                      # (the kinds of t and cumsum, learned)
        n, hits = adaptive_fast.COUNTERS["plain"], fastpath.STATS_FAST["hits"]
        idle = an.t().cumsum(1).cpu()
        idle_runs = adaptive_fast.COUNTERS["plain"] - n
        idle_hits = fastpath.STATS_FAST["hits"] - hits
        n = adaptive_fast.COUNTERS["plain"]
        eager_neuron.reset_stats()
        busy = (an * 2.0).t().cumsum(1).cpu()       # a * 2 pending
        busy_runs = adaptive_fast.COUNTERS["plain"] - n
        flushes = eager_neuron.stats()["flushes"]
        eager_neuron.reset_stats()
        joined = (an * 2.0).t().sum(1).cpu()        # a * 2 pending, the sum joins it
        joined_flushes = eager_neuron.stats()["flushes"]
    torch.testing.assert_close(idle, a.t().cumsum(1), rtol=0, atol=8 * 2.0 ** -52 * 10)
    torch.testing.assert_close(busy, (a * 2.0).t().cumsum(1), rtol=0, atol=8 * 2.0 ** -51 * 10)
    assert torch.equal(joined, (an * 2.0).t().sum(1).cpu())   # plain eager's bits
    assert idle_runs == 0 and idle_hits >= 2, (idle_runs, idle_hits)
    assert busy_runs == 1 and flushes == {"non-fusible op aten::cumsum": 1}, (busy_runs, flushes)
    assert joined_flushes == {"copy to cpu": 1}, joined_flushes


class _FusedMiss:
    """The memory tier as in a new process: fused kernels miss until built here."""

    def __init__(self, real):
        self.real, self.built = real, set()

    def get(self, key):
        if len(key) > 1 and key[1] == "fused" and key not in self.built:
            return None
        return self.real.get(key)

    def put(self, key, kernel):
        self.built.add(key)
        self.real.put(key, kernel)


@pytest.mark.parametrize("light_on", [True, False])
def test_a_light_trace_queues_no_background_build(light_on, monkeypatch):
    # background compile mode: a trace queues its fused kernel's build when it repeats. A
    # trace whose ops are all judged light by then starts no group again (its ops run as plain
    # eager): its build is not queued (adaptive_launch.LIGHT_DEFER). With the switch off it is.
    # (as in a new process whose caches lack the fused kernel: no trace, no kernel)
    from eager_neuron import adaptive_compile, launch
    from eager_neuron import adaptive_group as _grp
    from eager_neuron import adaptive_launch as _al

    if light_on:
        _light_on()
    monkeypatch.setattr(_grp, "_ROOT", [_ad._TNode()])
    monkeypatch.setattr(launch, "MEMORY", _FusedMiss(launch.MEMORY))
    monkeypatch.setattr(_al, "_from_disk", lambda *a: None)
    torch.manual_seed(5)
    x, w = torch.randn(29, dtype=torch.float64), torch.randn(29, dtype=torch.float64)
    xn, wn = x.to("neuron"), w.to("neuron")

    def f(v):
        return (torch.relu(xn * v - wn) * wn + 3.0).cpu()

    plain = [f(float(i)) for i in range(5)]
    prev = _ad.set_compile_mode("background")
    try:
        adaptive_compile.wait(600)
        queued = adaptive_compile.COUNTERS["queued"]
        with eager_neuron.adaptive():
            got = []
            for i in range(5):
                got.append(f(float(i)))
                adaptive_compile.wait(600)   # (a build in flight is not queued again)
        queued = adaptive_compile.COUNTERS["queued"] - queued
    finally:
        _ad.set_compile_mode(prev)
    _bitwise(plain, got)
    assert queued == (0 if light_on else 1), queued

