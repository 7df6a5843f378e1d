"""Adaptive eager: fused groups give plain-eager results, with counted launches and flushes."""

import pytest
import torch

import eager_neuron


def _run(fn):
    eager_neuron.reset_stats()
    with eager_neuron.adaptive():
        out = fn()
    return out, eager_neuron.stats()


def test_chain_with_sum_is_one_launch():
    x = torch.randn(1000, device="neuron")
    expect = ((x.cpu() + 1) * 2).relu().sum().item()
    got, s = _run(lambda: ((x + 1) * 2).relu().sum().item())
    assert got == pytest.approx(expect, rel=1e-6)
    assert s["launches"] == 1
    assert s["flushes"] == {"item": 1}
    assert s["fused_ops"] == 4


def test_second_run_hits_cache_and_new_size_does_not_recompile():
    x = torch.randn(300, device="neuron")
    _run(lambda: (x * 3 - 1).tanh().mean().item())
    _, s = _run(lambda: (x * 3 - 1).tanh().mean().item())
    assert s["compiles"] == 0 and s["launches"] == 1
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

    code = ("import torch, eager_neuron; x = torch.ones(8, device='neuron'); "
            "eager_neuron.reset_stats(); v = ((x + 1) * 2).sum().item(); "
            "s = eager_neuron.stats(); print(v, s['launches'], s['fused_launches'])")
    env = dict(__import__("os").environ, EAGER_NEURON_ADAPTIVE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["32.0", "1", "1"]


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
