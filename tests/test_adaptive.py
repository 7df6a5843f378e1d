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
