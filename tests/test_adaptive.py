"""Adaptive eager: fused groups give plain-eager results, with counted launches and flushes."""

import pytest
import torch

import eager_neuron
from eager_neuron import adaptive_group as _grp
from eager_neuron import adaptive_launch as _al
from eager_neuron.adaptive import MODULE as _ad


@pytest.fixture(autouse=True)
def _fused_kernels_compile_first():
    """Most tests here count fused launches: their groups compile before they run ("sync").
    By default a group whose fused kernel is not built yet runs op by op while the kernel
    builds in the background; the test of that mode switches to it itself."""
    prev = _ad.set_compile_mode("sync")
    # and every op records: the ops of light groups stop starting groups after a few steps
    # (adaptive.LIGHT_NUMEL); the tests of that switch it on themselves
    light, _ad.LIGHT_NUMEL[0] = _ad.LIGHT_NUMEL[0], 0
    _ad.LIGHT.clear()
    yield
    _ad.set_compile_mode(prev)
    _ad.LIGHT_NUMEL[0] = light
    _ad.LIGHT.clear()


def _run(fn):
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        out = fn()
    return out, eager_neuron.stats()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_whole_tensor_sums_give_plain_eager_bits(dtype):
    # plain eager sums into a float64 accumulator compiled with fastmath reassoc; a group's
    # epilogue added in program order, which changes a float64 sum's last bits (random data),
    # and a float32 sum's where magnitudes far apart cancel (12.0 plain, 14.001 fused): float
    # sums and means join the group as calls of plain eager's own reduction kernel
    # (adaptive_calls.JOINABLE), never as epilogues of its loops
    torch.manual_seed(7)
    far = torch.tensor([1e30, 1.0, -1e30, 1.0, 3.0, -2.0, 1e-3, 5.0, 7.0])
    for x in [torch.randn(n) for n in (7, 64, 1000, 4097)] + [far, far.flip(0)]:
        x = x.to(dtype).to("neuron")

        def progs(x=x):
            return [(x * 1.5).sum().item(), x.sum().item(), (x + 0.25).mean().item(),
                    (x * 1.0).sum().item()]

        plain = progs()
        with eager_neuron.adaptive():
            got = progs()
        assert got == plain, (x.numel(), got, plain)
    x = torch.randn(1000, device="neuron", dtype=dtype)
    _got, s = _run(lambda: ((x + 1) * 2).sum().item())
    # the chain and plain eager's sum kernel, called inside the fused kernel: one launch
    assert s["fused_ops"] == 3 and s["launches"] == 1, s


def test_chain_then_sum_is_one_fused_launch_and_plain_eagers_sum():
    x = torch.randn(1000, device="neuron")
    expect = ((x.cpu() + 1) * 2).relu().sum().item()
    got, s = _run(lambda: ((x + 1) * 2).relu().sum().item())
    assert got == pytest.approx(expect, rel=1e-6)
    assert s["launches"] == 1 and s["fused_launches"] == 1   # the sum joined (a call)
    assert s["flushes"] == {"item": 1}
    assert s["fused_ops"] == 4


def test_second_run_hits_cache_and_new_size_does_not_recompile():
    x = torch.randn(300, device="neuron")
    _run(lambda: (x * 3 - 1).tanh().mean().item())
    _, s = _run(lambda: (x * 3 - 1).tanh().mean().item())
    assert s["compiles"] == 0 and s["launches"] == 1 and s["fused_launches"] == 1
    y = torch.randn(777, device="neuron")
    got, s = _run(lambda: (y * 3 - 1).tanh().mean().item())
    assert s["compiles"] == 0
    assert got == pytest.approx((y.cpu() * 3 - 1).tanh().mean().item(), rel=1e-5)


def test_inplace_and_views_inside_group_match_eager():
    base = torch.randn(64, device="neuron")
    ref = base.cpu().clone()

    def body(t):
        y = t * 3
        y.add_(1)
        z = y.sigmoid() * y
        v = z.view(8, 8)
        return (v + 2).relu()

    got, s = _run(lambda: body(base).cpu())
    torch.testing.assert_close(got, body(ref))
    assert s["fused_launches"] >= 1


def test_host_reads_flush_with_named_reasons():
    x = torch.randn(16, device="neuron")
    with eager_neuron.adaptive():
        eager_neuron.reset_stats()
        y = x * 2
        text = repr(y)
        z = y + 1
        lst = z.tolist()
        w = z.exp()
        flag = bool((w > 1).any()) if False else None  # noqa: F841 (any may be a reduction)
        back = w.cpu()
    s = eager_neuron.stats()
    assert "device='neuron:0'" in text
    assert s["flushes"].get("print") == 1 and s["flushes"].get("tolist") == 1
    assert s["flushes"].get("copy to cpu") == 1
    torch.testing.assert_close(torch.tensor(lst), (x.cpu() * 2 + 1))
    torch.testing.assert_close(back, (x.cpu() * 2 + 1).exp())


def test_data_dependent_control_flow():
    x = torch.tensor([5.0], device="neuron")
    steps = 0
    with eager_neuron.adaptive():
        while (x > 1).item():
            x = x / 2
            steps += 1
    assert steps == 3
    assert eager_neuron.stats()["flushes"]["item"] >= 4


def test_non_fusible_op_flushes_and_training_matches_plain():
    def train(adaptive):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        m = m.to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x = torch.randn(32, 8, device="neuron")
        y = torch.randn(32, 1, device="neuron")
        losses = []
        eager_neuron.reset_stats()
        with eager_neuron.adaptive(adaptive):
            for _ in range(3):
                loss = torch.nn.functional.mse_loss(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, eager_neuron.stats()

    plain, sp = train(False)
    fused, sf = train(True)
    assert fused == pytest.approx(plain, rel=1e-5)
    assert sf["launches"] * 3 <= sp["launches"], (sf["launches"], sp["launches"])
    assert any(r.startswith("non-fusible op") for r in sf["flushes"])


def test_env_toggle_in_subprocess(tmp_path):
    import subprocess
    import sys

    code = ("import sys, torch, eager_neuron; x = torch.ones(8, device='neuron'); "
            "sys.modules['eager_neuron.adaptive'].set_compile_mode('sync'); "
            "eager_neuron.reset_stats(); v = ((x + 1) * 2).sum().item(); "
            "s = eager_neuron.stats(); print(v, s['launches'], s['fused_launches'])")
    env = dict(__import__("os").environ, EAGER_NEURON_ADAPTIVE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["32.0", "1", "1"]   # the fused chain with plain eager's sum joined


class _Block:
    """Stands in for a device block: adaptive eager only holds weak references to blocks."""


def test_store_read_only_through_a_reinterpreting_view_is_kept():
    # A float32 temporary whose tensor dies at once, read back only through an int32 view (a bit
    # cast): different dtype, same bytes. Buffers are identified by byte range, so the view's
    # read keeps the float32 store (by (address, size, dtype) the store looked unobservable).
    import numpy as np

    from eager_neuron.adaptive import MODULE as ad

    x = np.arange(1, 17, dtype=np.float32)
    tmp = np.zeros(16, np.float32)
    out = np.zeros(16, np.int32)
    tmp_block, x_block, out_block = _Block(), _Block(), _Block()
    srcs = [object(), object(), object(), object()]   # stand-ins for the torch tensors
    blocks = {id(srcs[0]): x_block, id(srcs[1]): tmp_block, id(srcs[3]): out_block}
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        assert ad.record("t::mul", "x0 * c0", ("flat",), ("np.float32",), ("np.float32",),
                         "np.float32({})", (tmp, srcs[1]), [(x, srcs[0])], (2.0,), 16,
                         blocks=blocks)
        del tmp_block, blocks[id(srcs[1])]   # the float32 temporary's tensor is gone ...
        view = tmp.view(np.int32)   # ... but a bit cast reads its bytes (no block of its own)
        assert ad.record("t::bits", "x0", ("flat",), ("np.int32",), (), "np.int32({})",
                         (out, srcs[3]), [(view, srcs[2])], (), 16, blocks=blocks)
    assert eager_neuron.stats()["fused_launches"] == 1
    np.testing.assert_array_equal(out, (x * 2).view(np.int32))


def test_overlapping_views_of_dead_storage_keep_stores():
    # two float32 views into one dead buffer: the second half is read through a shifted view
    import numpy as np

    from eager_neuron.adaptive import MODULE as ad

    x = np.arange(32, dtype=np.float32)
    tmp = np.zeros(32, np.float32)
    out = np.zeros(16, np.float32)
    tmp_block, half_block, x_block, out_block = _Block(), _Block(), _Block(), _Block()
    srcs = [object() for _ in range(4)]
    blocks = {id(srcs[0]): x_block, id(srcs[1]): tmp_block, id(srcs[2]): half_block,
              id(srcs[3]): out_block}
    with eager_neuron.adaptive():
        ad.record("t::add", "x0 + c0", ("flat",), ("np.float32",), ("np.float32",),
                  "np.float32({})", (tmp, srcs[1]), [(x, srcs[0])], (1.0,), 32, blocks=blocks)
        del tmp_block, blocks[id(srcs[1])]
        ad.record("t::neg", "-x0", ("flat",), ("np.float32",), (), "np.float32({})",
                  (out, srcs[3]), [(tmp[16:], srcs[2])], (), 16, blocks=blocks)
        del half_block, blocks[id(srcs[2])]
    np.testing.assert_array_equal(out, -(x[16:] + 1))


def test_single_op_flush_reuses_the_plain_kernel():
    # a flush of one recorded op launches plain eager's kernel (same key): no new compile
    x = torch.randn(96, device="neuron")
    y = torch.randn(96, device="neuron")
    expect = torch.atan2(x.cpu(), y.cpu()) * 3
    torch.atan2(x, y).mul_(3).cpu()   # plain eager: both kernels cached
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        a = torch.atan2(x, y)
        b = a.cpu()                   # flush of one node
        a.mul_(3)
        c = a.cpu()
    s = eager_neuron.stats()
    assert s["compiles"] == 0 and s["fused_launches"] == 2 and s["launches"] == 2
    torch.testing.assert_close(c, expect)
    torch.testing.assert_close(b * 3, expect)


def test_address_hint_mismatch_falls_back_to_numpy_addresses():
    # record() takes buffer addresses from the torch tensor given with each numpy view; a view
    # that is not the tensor's memory turns the shortcut off instead of aliasing wrongly
    import numpy as np

    from eager_neuron.adaptive import MODULE as ad

    x = torch.arange(8, dtype=torch.float32)
    other = np.arange(8, dtype=np.float32) + 100   # not x's memory
    out = np.zeros(8, np.float32)
    with eager_neuron.adaptive():
        ad.record("t::neg", "-x0", ("flat",), ("np.float32",), (), "np.float32({})",
                  (out, None), [(other, x)], (), 8, blocks={})
        assert ad.STATE.group.hints is False
    np.testing.assert_array_equal(out, -other)


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_on_views_match_plain(seed):
    # random elementwise programs over overlapping views and in-place updates of one storage
    def program(base, rng):
        t = base.clone()
        vals = [t, t[:32], t[16:48], t[32:], t.view(8, 8)[2]]
        errors = []
        for _ in range(14):
            k = rng.randrange(6)
            a = vals[rng.randrange(len(vals))]
            b = [v for v in vals if v.shape == a.shape]
            b = b[rng.randrange(len(b))]
            try:   # an in-place op on a partial overlap raises (torch's rule), in every mode
                if k == 0:
                    vals.append(a * 1.5 + b)
                elif k == 1:
                    a.add_(b, alpha=0.5)
                elif k == 2:
                    vals.append(torch.sigmoid(a - 0.25))
                elif k == 3:
                    a.mul_(0.75)
                elif k == 4:
                    vals.append(torch.where(a > 0, a, b))
                else:
                    a.copy_(b.relu())
            except RuntimeError as exc:
                assert "single memory location" in str(exc)
                errors.append(len(vals))
        return [v.cpu() if v.device.type != "cpu" else v for v in vals] + errors

    import random

    x = torch.randn(64)
    plain = program(x.to("neuron"), random.Random(seed))
    expect = program(x, random.Random(seed))
    with eager_neuron.adaptive():
        got = program(x.to("neuron"), random.Random(seed))
    assert len(plain) == len(got)
    for p, g in zip(plain, got):
        if isinstance(p, torch.Tensor):
            torch.testing.assert_close(g, p, rtol=0, atol=0)
        else:
            assert g == p
    if len(expect) == len(plain):   # NOTE: neuron does not raise torch's partial-overlap error
        for g, e in zip(got, expect):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)


def test_bfloat16_sum_and_mean_after_a_chain_match_plain():
    # sum/mean of bfloat16 is not a fused epilogue (numpy has no bfloat16): it flushes and runs
    # its own kernel; it once called .numpy() on the bfloat16 tensor and raised
    x = torch.randn(300).bfloat16()
    d = x.to("neuron")
    plain = [(d * 2 + 1).sum().cpu(), (d - 0.5).relu().mean().cpu()]
    with eager_neuron.adaptive():
        got = [(d * 2 + 1).sum().cpu(), (d - 0.5).relu().mean().cpu()]
    for g, p in zip(got, plain):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, p, rtol=0, atol=0)
    torch.testing.assert_close(got[0], (x * 2 + 1).sum(), rtol=1.6e-2, atol=1e-2)


def test_host_factory_reading_pending_values_flushes_first():
    # torch.signal.windows.kaiser: linspace(start, end) with 0-d device endpoints that adaptive
    # eager had only recorded; the host factory read unwritten memory (garbage) before this flush
    def window(dev):
        beta = torch.tensor(12.0, device=dev)
        start = -beta
        end = torch.minimum(beta, start + 3 * (2.0 * beta / 3))
        return torch.linspace(start, end, steps=4, device=dev)

    want = window("cpu")
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        got = window("neuron").cpu()
    torch.testing.assert_close(got, want)
    assert eager_neuron.stats()["flushes"].get("host compute", 0) >= 1


# ---------------------------------------------------------------------------------------------
# issue 11: adaptive eager never changes a result (each reproduction, by name, against the CPU)
# ---------------------------------------------------------------------------------------------

def _both_modes(fn):
    """fn(device) on the CPU, in plain eager and in adaptive eager: the three results."""
    want = fn("cpu")
    plain = fn("neuron")
    with eager_neuron.adaptive():
        got = fn("neuron")
    return want, plain, got


def _same(want, *gots):
    for got in gots:
        for w, g in zip(want, got):
            torch.testing.assert_close(g.cpu() if isinstance(g, torch.Tensor) else g, w,
                                       rtol=0, atol=0)


def test_issue11_item1_strided_views_are_not_keyed_by_start_and_length():
    def fn(dev):
        x = torch.arange(8., device=dev)
        a = x[:4] * 1
        b = x[::2] * 1
        y = torch.arange(8., device=dev)
        y[:4].mul_(3)
        y[::2].add_(1)
        z = torch.arange(8., device=dev)
        z[1::2].add_(100)
        t = z[6:] * 1
        return a, b, y, t
    want, plain, got = _both_modes(fn)
    _same(want, plain, got)


def test_issue11_item1_interleaved_views_do_not_conflict_but_strided_spans_do():
    import numpy as np

    from eager_neuron.adaptive import MODULE as ad

    x = np.zeros(16, np.float32)
    bufs = [ad._Buf(v, v.__array_interface__["data"][0], None)
            for v in (x[0::2], x[1::2], x[::4], x[6:8], x[8:], x[15:])]
    even, odd, four, mid, tail, last = bufs
    assert not ad._overlaps(even, odd)          # exact: equal strides, other residue
    assert ad._overlaps(even, four) and ad._overlaps(odd, mid)
    assert ad._overlaps(odd, last)              # the span of x[1::2] ends at x[15]
    assert not ad._overlaps(mid, tail)


def test_issue11_item1_autograd_loss_through_strided_views():
    def fn(dev):
        w = torch.linspace(-1, 1, 16, dtype=torch.float64, device=dev).requires_grad_()
        h = w * 2
        loss = (h[::2] * h[1::2] + h[::4].sum()).tanh().sum()
        loss.backward()
        return loss.detach(), w.grad
    want, plain, got = _both_modes(fn)
    for w, p, g in zip(want, plain, got):
        # NOTE: sums are not bitwise: a fused sum epilogue adds in another order
        torch.testing.assert_close(p.cpu(), w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g.cpu(), w, rtol=1e-12, atol=1e-12)


def test_issue11_item2_host_copies_never_reuse_a_pending_block():
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(64, 256, generator=gen) for _ in range(6)]
    want = torch.zeros(64, 256)
    for xb in batches:
        want += xb * 2 + 1
    acc = torch.zeros(64, 256, device="neuron")
    with eager_neuron.adaptive():
        for xb in batches:
            xb = xb.to("neuron")
            acc += xb * 2 + 1
        arr = torch.tensor(batches[0].numpy(), device="neuron") * 3
    torch.testing.assert_close(acc.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(arr.cpu(), batches[0] * 3, rtol=0, atol=0)


def test_issue11_item3_cpu_scalar_tensor_is_read_at_the_op():
    x = torch.arange(4., device="neuron")
    s = torch.tensor(2.)
    with eager_neuron.adaptive():
        y = x * s
        s.fill_(100)
        z = x + s
    assert y.tolist() == [0., 2., 4., 6.]
    assert z.tolist() == [100., 101., 102., 103.]


def test_issue11_item4_fault_raises_at_its_own_line_and_loses_nothing():
    x = torch.tensor([10, 20, 30, 40], device="neuron")
    zero = torch.tensor([1, 1, 0, 1], device="neuron")
    w = torch.zeros(4, dtype=torch.long, device="neuron")
    a = c = None
    with pytest.raises(RuntimeError) as info:
        with eager_neuron.adaptive():
            a = x * 2
            w.add_(1)
            b = x // zero   # the faulting line
            c = b + 1
    text = str(info.value)
    assert "floor_divide" in text and "x // zero" in text and "ZeroDivisionError" in text
    assert c is None                              # nothing after the op ran
    assert w.tolist() == [1, 1, 1, 1]             # the in-place op applied exactly once
    assert a.tolist() == [20, 40, 60, 80]         # earlier pending outputs written


def test_issue11_item5_threads_record_their_own_groups_and_share_kernels():
    import threading

    wrong = []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(5):
            w0 = torch.randn(257, generator=gen, dtype=torch.float64)
            w = w0.to("neuron").requires_grad_()
            (w.tanh() * w).sum().backward()
            ref = w0.clone().requires_grad_()
            (ref.tanh() * ref).sum().backward()
            if not torch.allclose(w.grad.cpu(), ref.grad, rtol=1e-12, atol=1e-12):
                wrong.append(seed)

    def run():
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        with eager_neuron.adaptive():
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    run()     # warm: compiles (or loads) the few fused kernels
    eager_neuron.reset_stats()
    run()
    s = eager_neuron.stats()
    assert wrong == []
    assert s["compiles"] == 0 and s["fused_launches"] >= 20   # every group hit the cache


def test_issue11_item5_read_of_an_element_the_same_op_writes():
    def fn(dev):
        b = torch.ones(3, device=dev)
        b.add_(b[:1].expand(3))
        c = torch.tensor([1., 2., 2.], device=dev)
        c.add_(c[:1].expand(3))
        return b, c
    want, plain, got = _both_modes(fn)
    _same(want, plain, got)


@pytest.mark.parametrize("adaptive", [False, True])
def test_issue11_item7_integer_inplace_with_float_result_raises(adaptive):
    msg = "result type Float can't be cast to the desired output type Long"
    with eager_neuron.adaptive(adaptive):
        i = torch.arange(5, device="neuron")
        with pytest.raises(RuntimeError, match=msg):
            i.mul_(1.5)
        with pytest.raises(RuntimeError, match="can't be cast"):   # via PyTorch's out= wrapper
            torch.mul(i, 0.5, out=torch.empty(5, dtype=torch.long, device="neuron"))
        with pytest.raises(RuntimeError, match="result type ComplexFloat can't be cast to "
                                               "the desired output type Float"):
            torch.ones(3, device="neuron").add_(torch.ones(3, dtype=torch.complex64,
                                                           device="neuron"))
        i.add_(2)                                        # Long result: fine
        f = torch.zeros(5, device="neuron").add_(i)      # Long into Float: fine
    assert i.tolist() == [2, 3, 4, 5, 6] and f.tolist() == [2., 3., 4., 5., 6.]


@pytest.mark.parametrize("adaptive", [False, True])
def test_issue11_item8_writes_through_expanded_views_raise(adaptive):
    msg = "more than one element of the written-to tensor refers to a single memory location"
    with eager_neuron.adaptive(adaptive):
        x = torch.ones(1, 4, device="neuron")
        for write in (lambda e: e.add_(1), lambda e: e.mul_(2), lambda e: e.exp_(),
                      lambda e: e.copy_(torch.zeros(4, 4, device="neuron")),
                      lambda e: torch.add(torch.ones(4, 4, device="neuron"), 1, out=e)):
            with pytest.raises(RuntimeError, match=msg):
                write(x.expand(4, 4))
        with pytest.raises(RuntimeError, match=msg):
            torch.ones(4, device="neuron").as_strided((4,), (0,)).add_(1)
    assert x.tolist() == [[1., 1., 1., 1.]]


def test_fused_group_charges_the_core_it_was_recorded_on():
    from eager_neuron.simulator import SIM

    x = torch.ones(1000, device="neuron:1")
    with eager_neuron.adaptive():
        before = [c.launches for c in SIM.cores]
        y = ((x + 1) * 2).relu()
        assert [c.launches for c in SIM.cores] == before     # recorded, not launched
        total = y.sum().item()
    after = [c.launches for c in SIM.cores]
    assert total == 4000.0
    # one fused launch (plain eager's sum joined as a call), on core 1
    assert after[0] == before[0] and after[1] == before[1] + 1


def test_adaptive_states_are_named_and_per_thread():
    import threading

    from eager_neuron.adaptive import MODULE as ad

    x = torch.ones(8, device="neuron")
    seen = {}
    with eager_neuron.adaptive():
        assert ad.STATE.name == ad.IDLE
        y = x * 2
        assert ad.STATE.name == ad.RECORDING
        t = threading.Thread(target=lambda: seen.setdefault("other", ad.STATE.name))
        t.start()
        t.join()
        assert y.sum().item() == 16.0
        assert ad.STATE.name == ad.IDLE
    assert ad.STATE.name == ad.OFF and seen["other"] == ad.IDLE


def test_set_and_data_assignment_inside_a_group_keep_pending_memory():
    # re-pointing a tensor (set_, .data =) while ops on its old memory are pending, and pooled
    # (>= 64 KiB) temporaries dying while pending: nothing lands in memory a group still uses
    def prog(dev):
        a = torch.arange(20000., device=dev)
        b = torch.ones(20000, device=dev)
        t = a * 2
        u = t + 1
        t.set_(b)
        v = t * 3
        w = torch.zeros(20000, device=dev)
        w.data = u * 1
        x = w + 1
        del u
        y = torch.arange(20000., device=dev) * 0 + 5
        return [z.cpu() for z in (a, b, t, v, w, x, y)]
    want, plain, got = _both_modes(prog)
    _same(want, plain, got)


def test_synchronize_launches_every_threads_group():
    import threading

    from eager_neuron.adaptive import MODULE as ad

    x = torch.ones(16, device="neuron")
    made = {}
    with eager_neuron.adaptive():
        t = threading.Thread(target=lambda: made.setdefault("y", x * 3))
        t.start()
        t.join()
        assert len(ad.PENDING) == 1 and ad.STATE.name == ad.IDLE   # the other thread's group
        torch.neuron.synchronize()
        assert not ad.PENDING
    assert made["y"].sum().item() == 48.0


# ---------------------------------------------------------------------------------------------
# issue 14: the trace cache (a repeated step replays its groups) and background compiles
# ---------------------------------------------------------------------------------------------

def _train_steps(adaptive, steps, counters_from=None):
    """Losses, final parameters and, from step `counters_from` on, the stats and adaptive
    counters of an MLP + AdamW training loop (ReLU, cross-entropy; few kernels to build)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                            torch.nn.ReLU(), torch.nn.Linear(32, 5)).to("neuron")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(16, 12).to("neuron")
    y = torch.randint(0, 5, (16,)).to("neuron")
    losses, seen = [], None
    with eager_neuron.adaptive(adaptive):
        for i in range(steps):
            if i == counters_from:
                eager_neuron.reset_stats()
                seen = dict(_ad.COUNTERS)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if seen is not None:
        seen = {k: _ad.COUNTERS[k] - v for k, v in seen.items()}
    return losses, [p.detach().cpu() for p in m.parameters()], eager_neuron.stats(), seen


def test_repeated_training_step_replays_its_traces_and_equals_plain():
    from eager_neuron import adaptive_fast

    plain_losses, plain_params, _, _ = _train_steps(False, 4)
    runs = adaptive_fast.COUNTERS["hits"]
    losses, params, s, counted = _train_steps(True, 4, counters_from=2)
    assert adaptive_fast.COUNTERS["hits"] > runs   # repeats recorded by their runners
    # steps 3 and 4 repeat step 2: every group is recognised as it is recorded (no placement
    # analysis), launched from its cached kernel (no spec, no render, no compile)
    assert counted["analyses"] == 0 and counted["renders"] == 0, counted
    assert s["trace_hits"] >= 2 and s["trace_misses"] == 0, (s["trace_hits"], s["trace_misses"])
    assert s["compiles"] == 0 and s["fused_launches"] >= 2
    assert losses == plain_losses
    for p, q in zip(params, plain_params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def _replays(fn, *args):
    """Run fn(*args) under adaptive eager: (result on the CPU, trace hits, trace misses,
    placement analyses)."""
    before = _ad.COUNTERS["analyses"]
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        out = fn(*args).cpu()
    s = eager_neuron.stats()
    return out, s["trace_hits"], s["trace_misses"], _ad.COUNTERS["analyses"] - before


def test_trace_with_a_changed_operand_signature_does_not_replay():
    def prog(a, b):
        t = a * 2.0 + 1.0
        b.add_(t)               # writes b: whether b shares memory with a changes the result
        return (b * a - t).relu() + b

    def ref(a, b):
        with eager_neuron.adaptive(False):
            return prog(a, b).cpu()

    def fresh(n=16, dtype=torch.float32):
        return torch.arange(n, dtype=dtype, device="neuron") / 3

    x, y = fresh(), fresh()
    _replays(prog, x, y)
    got, hits, misses, _ = _replays(prog, fresh(), fresh())     # same signature: replayed
    assert (hits, misses) == (1, 0)
    torch.testing.assert_close(got, ref(fresh(), fresh()), rtol=0, atol=0)
    base = torch.arange(24, dtype=torch.float32, device="neuron") / 3
    cases = {
        "dtype": lambda: (fresh(dtype=torch.float64), fresh(dtype=torch.float64)),
        "shape": lambda: (fresh(20), fresh(20)),
        "strides": lambda: (fresh(32)[::2], fresh(32)[::2]),
        "same tensor": lambda: (lambda t: (t, t))(fresh()),
        "partial overlap": lambda: (lambda t: (t[:16], t[4:20]))(base.clone()),
    }
    for name, make in cases.items():
        want = ref(*make())
        got, hits, misses, analyses = _replays(prog, *make())
        assert hits == 0 and misses >= 1 and analyses > 0, (name, hits, misses, analyses)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
        # and the new signature is now a trace of its own
        got, hits, misses, analyses = _replays(prog, *make())
        assert (hits, misses, analyses) == (1, 0, 0), (name, hits, misses, analyses)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


class _NotBuiltYet:
    """The memory tier as it is before a fused kernel's first build: fused keys miss until
    something (the background worker) puts them."""

    def __init__(self, real):
        self.real, self.built = real, set()

    def get(self, key):
        if len(key) > 1 and key[1] == "fused" and key not in self.built:
            return None
        return self.real.get(key)

    def put(self, key, kernel):
        self.built.add(key)
        self.real.put(key, kernel)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_background_compile_first_call_runs_op_by_op_with_the_same_values(monkeypatch):
    from eager_neuron import adaptive_compile as bg
    from eager_neuron import launch

    x = torch.randn(300, device="neuron")
    w = torch.randn(300, device="neuron")

    def prog():
        y = (x * 1.5 - w).sigmoid() * w
        y.add_(x)
        return y, (y * y).sum()

    def run():
        eager_neuron.reset_stats()
        with eager_neuron.adaptive():
            y, s = prog()
            out = (y.cpu(), s.cpu())
        return out, eager_neuron.stats()

    fused, _ = run()   # sync: the fused kernel is built (or loaded from disk) and run
    # now as in a new process whose disk cache lacks it: no trace, no kernel in memory
    _ad.set_compile_mode("background")
    monkeypatch.setattr(_grp, "_ROOT", [_ad._TNode()])
    monkeypatch.setattr(launch, "MEMORY", _NotBuiltYet(launch.MEMORY))
    monkeypatch.setattr(_al, "_from_disk", lambda *a: None)
    plain = (prog()[0].cpu(), prog()[1].cpu())
    deferred, queued = _ad.COUNTERS["deferred"], bg.COUNTERS["queued"]
    first, s1 = run()
    assert _ad.COUNTERS["deferred"] == deferred + 1          # ran op by op ...
    assert s1["fused_launches"] == 0 and s1["launches"] >= 6
    assert bg.COUNTERS["queued"] == queued                   # (seen once: nothing to build)
    again, s1 = run()
    assert _ad.COUNTERS["deferred"] == deferred + 2 and s1["fused_launches"] == 0
    assert bg.COUNTERS["queued"] == queued + 1               # ... it repeats: built, off
    assert bg.wait(120)                                      # the critical path
    second, s2 = run()
    assert s2["fused_launches"] == 1 and s2["trace_hits"] == 1
    assert s2["launches"] == 1   # plain eager's sum joined as a call
    assert s2["compiles"] == 0
    for a, b, c, d in zip(first, second, fused, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, d, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    torch.testing.assert_close(first[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(first[1], plain[1], rtol=1e-6, atol=1e-5)


def test_background_compile_waits_until_other_threads_stop_building_kernels(monkeypatch):
    """A fused kernel's compile holds Numba's compiler lock for up to a second, and every kernel
    another thread loads from disk or compiles needs it: the worker starts a compile only once
    other threads' builds have been quiet for QUIET seconds (a first adaptive step loading its
    plain kernels took 3-6x longer while fused kernels compiled beside it)."""
    import time

    import numpy as np

    from eager_neuron import adaptive_compile as bg
    from eager_neuron import launch

    assert bg.wait(600)
    monkeypatch.setattr(bg, "QUIET", 0.4)
    out = np.zeros(3, np.float32)
    stamp = time.time_ns()   # keys in neither cache
    before = launch.LAST_BUILD[0]
    launch.launch(("test", "quiet-main", stamp),
                  lambda: ("@njit\ndef k_main(o):\n    o[:] = 1\n", "k_main"), (out,))
    assert before < launch.LAST_BUILD[0] <= time.monotonic()   # this thread's build is noted
    started = []

    def render():
        started.append(time.monotonic())
        return "@njit\ndef k_quiet(o):\n    o[:] = 2\n", "k_quiet"

    assert bg.submit(launch.full_key(("test", "quiet-bg", stamp), (out,)), render, (out,))
    busy_until = time.monotonic() + 1.0
    while time.monotonic() < busy_until:   # this thread keeps building kernels for a second
        launch.LAST_BUILD[0] = time.monotonic()
        time.sleep(0.01)
    quiet_from = launch.LAST_BUILD[0]
    assert bg.wait(120)
    assert len(started) == 1 and started[0] >= quiet_from + 0.4 - 0.02
    assert out.tolist() == [1.0, 1.0, 1.0]   # the worker never runs what it builds
