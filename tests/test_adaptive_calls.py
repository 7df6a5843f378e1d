"""Adaptive eager: ops joined as calls (eager_neuron/adaptive_calls.py) — a matmul and its
epilogue, the copies around it — run inside one fused kernel and give plain eager's bits."""

import pytest
import torch

import eager_neuron
from eager_neuron import adaptive_calls, adaptive_compile
from eager_neuron.adaptive import MODULE as _ad


@pytest.fixture(autouse=True)
def _fused_kernels_compile_first():
    # these tests count fused launches: groups compile before they run (see test_adaptive.py)
    prev = _ad.set_compile_mode("sync")
    # and every op records: the ops of light groups stop starting groups after a few steps
    # (adaptive.LIGHT_NUMEL); the tests of that switch it on themselves
    light, _ad.LIGHT_NUMEL[0] = _ad.LIGHT_NUMEL[0], 0
    _ad.LIGHT.clear()
    yield
    _ad.set_compile_mode(prev)
    _ad.LIGHT_NUMEL[0] = light
    _ad.LIGHT.clear()


def _plain_and_adaptive(fn, *cpu_args):
    """fn(*neuron args) in plain eager and in adaptive eager (fresh copies of the arguments
    each): (plain result, adaptive result, adaptive stats, calls joined, calls declined)."""
    plain = fn(*[a.to("neuron") for a in cpu_args])
    plain = [t.cpu() for t in plain]
    args = [a.to("neuron") for a in cpu_args]
    joined, declined = adaptive_calls.COUNTERS["joined"], adaptive_calls.COUNTERS["declined"]
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        got = fn(*args)
        got = [t.cpu() for t in got]
    return (plain, got, eager_neuron.stats(), adaptive_calls.COUNTERS["joined"] - joined,
            adaptive_calls.COUNTERS["declined"] - declined)


def _bitwise(plain, got):
    for p, g in zip(plain, got):
        torch.testing.assert_close(g, p, rtol=0, atol=0)


def test_linear_bias_activation_residual_scale_is_one_launch():
    torch.manual_seed(0)
    x, w, b = torch.randn(16, 24), torch.randn(8, 24), torch.randn(8)

    def f(x, w, b):
        h = torch.nn.functional.linear(x, w, b)          # addmm: bias, transposed weight
        y = torch.nn.functional.gelu(h) * 0.5 + h        # activation, scale, residual
        return [y, (y @ w).sum()]                         # a second matmul, a reduction

    plain, got, s, joined, declined = _plain_and_adaptive(f, x, w, b)
    _bitwise(plain, got)
    # the two matmuls and plain eager's float sum joined as calls (never an epilogue of the
    # loops: its bits): one fused launch
    assert joined == 3 and declined == 0
    assert s["launches"] == 1 and s["fused_launches"] == 1, s["launches"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bmm_baddbmm_with_expanded_and_transposed_operands_match_plain(dtype):
    torch.manual_seed(1)
    a, w, c = torch.randn(3, 5, 4, dtype=dtype), torch.randn(4, 6, dtype=dtype), \
        torch.randn(3, 6, 5, dtype=dtype)

    def f(a, w, c):
        y = torch.bmm(a, w.expand(3, 4, 6)).relu()
        bias = c.transpose(1, 2)[:, :4, :]                 # (3, 4, 6), strided
        z = torch.baddbmm(bias, a.transpose(1, 2), y, beta=0.5, alpha=2.0)
        return [z * 2.0 - 1.0]

    plain, got, s, joined, _declined = _plain_and_adaptive(f, a, w, c)
    _bitwise(plain, got)
    assert joined == 2 and s["launches"] == 1


def test_operand_written_after_the_call_is_read_before_the_write():
    # the call runs where it was recorded: a later in-place write to its operand (the group's
    # loops after the call) and its dropped output (pinned until the launch) change nothing
    torch.manual_seed(2)
    a, b = torch.randn(6, 5), torch.randn(5, 7)

    def f(a, b):
        y = a @ b
        a.mul_(3.0)                 # a is read by the matmul before this write
        z = y.relu() + 1.0
        del y
        b.zero_()
        return [z, a, (a @ b).sum()]

    plain, got, s, joined, _declined = _plain_and_adaptive(f, a, b)
    _bitwise(plain, got)
    assert joined == 3 and s["launches"] == 1 and s["fused_launches"] == 1   # the sum joined


def test_store_before_a_call_that_reads_it_is_kept():
    # a temporary the group writes and nothing holds is still stored when a call reads it
    torch.manual_seed(3)
    x, w = torch.randn(4, 8), torch.randn(8, 3)

    def f(x, w):
        return [((x * 2.0 - 1.0) @ w).tanh()]

    plain, got, s, joined, _declined = _plain_and_adaptive(f, x, w)
    _bitwise(plain, got)
    assert joined == 1 and s["launches"] == 1


def test_a_call_with_a_scratch_copy_runs_at_once_with_plain_values():
    # an operand BLAS cannot read in place (neither C nor F contiguous) is copied to host
    # scratch by the lowering: the call does not join; the group launches, then the call
    torch.manual_seed(4)
    a, b = torch.randn(6, 10), torch.randn(5, 4)

    def f(a, b):
        t = a * 2.0
        return [(t[:, ::2] @ b) + 1.0]

    plain, got, s, joined, declined = _plain_and_adaptive(f, a, b)
    _bitwise(plain, got)
    assert declined == 1 and joined == 0
    assert s["flushes"].get("non-fusible op aten::mm") == 1


def test_copies_and_scatters_join_and_one_element_sources_do_not():
    torch.manual_seed(5)
    x = torch.randn(4, 6)

    def f(x):
        t = (x + 1.0).t().contiguous()                          # clone: joins
        u = torch.select_scatter(t, t[0] * 2.0, 0, 3)           # joins
        v = torch.slice_scatter(u, u[:3], 0, 3)                 # joins
        w = torch.select_scatter(x[0], x[0, 0], 0, 1)           # a 0-d source: does not join
        return [v * 1.5, w]

    plain, got, s, joined, _declined = _plain_and_adaptive(f, x)
    _bitwise(plain, got)
    assert joined >= 3
    assert s["flushes"].get("non-fusible op aten::select_scatter") == 1


def test_repeated_mlp_steps_replay_with_a_fifth_of_the_launches_and_plain_bits():
    def steps(adaptive):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 5)).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x = torch.randn(8, 12).to("neuron")
        losses, launches, s = [], [], None
        with eager_neuron.adaptive(adaptive):
            for _ in range(4):
                # fused kernels a step queued build in the background: let them land first, so
                # a render counts in the step that asked for it (not, by timing, the next one)
                adaptive_compile.wait(120.0)
                before = _ad.COUNTERS["analyses"], _ad.COUNTERS["renders"]
                eager_neuron.reset_stats()
                loss = m(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                s = eager_neuron.stats()
                launches.append(s["launches"])
                work = (_ad.COUNTERS["analyses"] - before[0], _ad.COUNTERS["renders"] - before[1])
        return losses, [p.detach().cpu() for p in m.parameters()], launches, s, work

    plain_losses, plain_params, plain_launches, _, _ = steps(False)
    losses, params, launches, s, work = steps(True)
    assert losses == plain_losses
    _bitwise(plain_params, params)
    assert launches[-1] * 5 <= plain_launches[-1], (launches, plain_launches)
    # the last step repeats the third: recognised, replayed, nothing analysed or rendered
    assert work == (0, 0) and s["trace_misses"] == 0 and s["trace_hits"] >= 1


def test_a_changed_operand_layout_does_not_replay_a_call():
    torch.manual_seed(6)
    a, w = torch.randn(5, 4, device="neuron"), torch.randn(6, 4, device="neuron")

    def prog(w2):
        return ((a @ w2) * 2.0).cpu()

    plain_t, plain_c = prog(w.t()), prog(w.t().contiguous())
    with eager_neuron.adaptive():
        prog(w.t())
        eager_neuron.reset_stats()
        got_t = prog(w.t())                       # same layout: replayed
        hits_t = eager_neuron.stats()["trace_hits"]
        eager_neuron.reset_stats()
        got_c = prog(w.t().contiguous())          # C instead of F layout: a new trace
        s = eager_neuron.stats()
    assert hits_t == 1 and s["trace_misses"] >= 1 and s["trace_hits"] == 0
    # (BLAS rounds the two layouts differently: each equals plain eager's own)
    torch.testing.assert_close(got_t, plain_t, rtol=0, atol=0)
    torch.testing.assert_close(got_c, plain_c, rtol=0, atol=0)


def test_background_build_of_a_group_with_calls_types_its_nd_arguments():
    # the background compiler types the kernel on stand-ins of the arguments: a call's 2-D C
    # and F operands must keep their rank and layout (a rank-1 stand-in fails to build and the
    # group would run op by op for ever)
    from eager_neuron import adaptive_compile as bg

    torch.manual_seed(7)
    x, w = torch.randn(6, 5, device="neuron"), torch.randn(3, 5, device="neuron")
    want = ((x.cpu() @ w.cpu().t()) * 3.0 - 1.0)
    _ad.set_compile_mode("background")
    failed = bg.COUNTERS["failed"]
    with eager_neuron.adaptive():
        for _ in range(3):                       # seen twice: queued
            got = ((x @ w.t()) * 3.0 - 1.0).cpu()
        assert bg.wait(300)
        eager_neuron.reset_stats()
        got = ((x @ w.t()) * 3.0 - 1.0).cpu()
        s = eager_neuron.stats()
    assert bg.COUNTERS["failed"] == failed
    assert s["launches"] == 1 and s["fused_launches"] == 1 and s["fusion_fallbacks"] == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_lowering_that_refuses_raises_as_plain_and_loses_nothing(adaptive):
    # an addmm bias that does not broadcast to (M, N): refused with the CPU's words (by meta's
    # CPU check since 7920b5d, else by the lowering): under adaptive eager nothing is staged,
    # the pending group survives, and plain eager's path raises
    a, b = torch.ones(3, 4, device="neuron"), torch.ones(4, 5, device="neuron")
    bias = torch.ones(2, 5, device="neuron")
    with eager_neuron.adaptive(adaptive):
        y = a * 2.0
        with pytest.raises(RuntimeError, match="broadcast|expanded size"):
            torch.addmm(bias, y, b)
        assert y.sum().item() == 24.0


def test_the_neutral_elementwise_constants_are_the_lowerings():
    # adaptive eager's flush keys a one-op group with plain eager's key (so it reuses plain's
    # kernel) from eager_neuron/elementwise_base.py; lower/elementwise.py must agree with it
    from eager_neuron import elementwise_base as ewb
    from eager_neuron.lower import elementwise as ew

    assert ew.PRELUDE_ID == ewb.PRELUDE_ID and ew.PARALLEL_MIN == ewb.PARALLEL_MIN
    assert ew.PRELUDE == ewb.PRELUDE and ew.SPECIAL_PRELUDE == ewb.SPECIAL_PRELUDE


def test_a_launcher_that_declines_lets_the_launch_run():
    # the op context's launcher (adaptive eager's staging) takes a launch by returning True; a
    # group flushed while a joined matmul is lowered must still launch for real (False)
    import numpy as np

    from eager_neuron import context
    from eager_neuron.launch import launch

    seen = []

    def launcher(*staged):
        seen.append(staged[0])
        return len(seen) == 1   # take the first, decline the second

    src = ("@njit\ndef k(o):\n    o[:] = 7\n", "k")
    for expect in (0.0, 7.0):
        out = np.zeros(3, np.float32)
        with context.using(context.OpContext(0, launcher=launcher)):
            launch(("test", "launcher"), lambda: src, (out,))
        assert out.tolist() == [expect] * 3
    assert len(seen) == 2


def test_a_group_launched_while_a_call_is_staged_runs_for_real():
    # a group that launches while a joinable op's launches are staged (memory pressure inside
    # its lowering) runs its own launches under no context: the stager (the op context's
    # launcher, its list its own) never sees them, and the group's values are written
    from eager_neuron import context

    x = torch.arange(6, dtype=torch.float32, device="neuron")
    stager = adaptive_calls.Stager()
    with eager_neuron.adaptive():
        y = (x + 1) * 2
        assert _ad.STATE.name == _ad.RECORDING
        launches = eager_neuron.stats()["launches"]
        with context.using(context.OpContext(0, launcher=stager)):
            with _ad._lock:
                _ad._flush_locked(_ad.stream_key(), "buffer limit")
        assert stager.staged == []
        assert eager_neuron.stats()["launches"] > launches
        assert _ad.STATE.name == _ad.IDLE
    assert y.cpu().tolist() == [2.0 * (i + 1) for i in range(6)]
