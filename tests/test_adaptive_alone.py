"""Adaptive eager: an op that only ever starts groups of one runs as plain eager (adaptive.ALONE).

A group of one op fuses nothing (it launches plain eager's kernel for that op) and costs a
recording and a flush; the op that starts such groups every time, and never a larger one, is
run by plain eager's runner once its verdict is in (adaptive.LIGHT_AFTER groups). Values are
plain eager's either way; these tests check the verdicts and that fusion is kept wherever the
op starts a larger group."""

import pytest
import torch

import eager_neuron
from eager_neuron.adaptive import MODULE as _ad


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    prev = _ad.set_compile_mode("sync")
    light, _ad.LIGHT_NUMEL[0] = _ad.LIGHT_NUMEL[0], 0
    on = _ad.ALONE_ON[0]
    _ad.ALONE_ON[0] = True
    _ad.set_light_numel(0)       # (forgets every verdict: ALONE and the trace nodes' counts)
    yield
    _ad.set_compile_mode(prev)
    _ad.ALONE_ON[0] = on
    _ad.set_light_numel(light)


def _bitwise(plain, got):
    assert len(plain) == len(got)
    for p, g in zip(plain, got):
        torch.testing.assert_close(g, p, rtol=0, atol=0)


def _per_iteration(fn, n, adaptive=True):
    """fn()'s results and, per call, (groups of one flushed, ops run alone, fused ops)."""
    got, counts = [], []
    with eager_neuron.adaptive(adaptive):
        for i in range(n):
            eager_neuron.reset_stats()
            got.append(fn(i))
            s = eager_neuron.stats()
            counts.append((s["adaptive_singletons"], s["adaptive_alone"], s["fused_ops"]))
    return got, counts


def test_an_op_that_only_starts_groups_of_one_runs_as_plain_eager():
    torch.manual_seed(0)
    x = torch.randn(6, 33, dtype=torch.float64).to("neuron")
    b = torch.randn(33, dtype=torch.float64).to("neuron")

    def f(i):
        y = x * float(i)       # starts a group ...
        z = y * b              # ... which this broadcast operand launches: a group of one
        return (z + 1.0).cpu()

    plain, _ = _per_iteration(f, 6, adaptive=False)   # (leaves plain eager's runners)
    got, counts = _per_iteration(f, 6)
    _bitwise(plain, got)
    # two verdicts (LIGHT_AFTER), then `x * i` starts no group: plain eager's runner runs it
    # (`z + 1.0` starts a group of one too, ended by the host read: the same verdicts)
    assert [c[:2] for c in counts] == [(2, 0), (2, 0), (0, 2), (0, 2), (0, 2), (0, 2)], counts


def test_without_plain_runners_an_alone_op_takes_the_slow_path_unrecorded():
    # adaptive eager only: no plain runner for `x - i` yet; the op sent down the slow path
    # unrecorded launches as plain eager does (and leaves that runner)
    torch.manual_seed(1)
    x = torch.randn(7, 5, dtype=torch.float64)
    xn, bn = x.to("neuron"), torch.arange(5, dtype=torch.float64).to("neuron")
    got, counts = _per_iteration(lambda i: ((xn - float(i)) * bn).cpu(), 5)
    for i, g in enumerate(got):
        torch.testing.assert_close(g, (x - float(i)) * torch.arange(5, dtype=torch.float64),
                                   rtol=0, atol=0)
    assert [c[:2] for c in counts] == [(1, 0), (1, 0), (0, 1), (0, 1), (0, 1)], counts


def test_an_op_that_also_starts_a_larger_group_keeps_recording():
    # `x * i` starts a group of one at A and a group of three at B, every call: its verdict
    # is "not alone" (-1), and B keeps fusing its three ops into one launch
    torch.manual_seed(2)
    x = torch.randn(6, 33, dtype=torch.float64).to("neuron")
    b = torch.randn(33, dtype=torch.float64).to("neuron")

    def f(i):
        a = (x * float(i)) * b                     # A: a group of one, then a broadcast
        c = ((x * float(i)).exp() - 2.0).cpu()     # B: three ops in one group
        return a.cpu(), c

    plain, _ = _per_iteration(f, 6, adaptive=False)
    got, counts = _per_iteration(f, 6)
    for p, g in zip(plain, got):
        _bitwise(p, g)
    assert all(alone == 0 for _s, alone, _f in counts), counts
    # per call: A's group of one (one fused op) and B's three
    assert all(fused == 4 for _s, _a, fused in counts), counts


def test_repeated_training_steps_run_alone_ops_as_plain_eager_with_plain_bits():
    # an RMS norm with a weight (broadcast operands end groups) and a max-abs scale (amax, not
    # fusible: the abs before it is a group of one) before a linear layer, AdamW
    def steps(adaptive, n=5):
        torch.manual_seed(3)
        w = torch.nn.Parameter(torch.ones(16, dtype=torch.float64, device="neuron"))
        lin = torch.nn.Linear(16, 4, dtype=torch.float64).to("neuron")
        opt = torch.optim.AdamW([w, *lin.parameters()], lr=1e-2)
        x = torch.randn(8, 16, dtype=torch.float64).to("neuron")
        losses, alone = [], []
        with eager_neuron.adaptive(adaptive):
            for _ in range(n):
                eager_neuron.reset_stats()
                h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
                h = h / h.abs().amax(-1, keepdim=True)
                loss = lin(h).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                alone.append(eager_neuron.stats()["adaptive_alone"])
        return losses, [p.detach().cpu() for p in (w, *lin.parameters())], alone

    plain_losses, plain_params, _ = steps(False)
    losses, params, alone = steps(True)
    assert losses == plain_losses
    _bitwise(plain_params, params)
    assert alone[:2] == [0, 0] and alone[-1] > 0, alone


def test_the_switch_turns_the_verdicts_off():
    torch.manual_seed(4)
    x = torch.randn(6, 33, dtype=torch.float64).to("neuron")
    b = torch.randn(33, dtype=torch.float64).to("neuron")

    def f(i):
        return ((x * float(i)) * b).cpu()

    plain, _ = _per_iteration(f, 4, adaptive=False)
    _ad.ALONE_ON[0] = False
    got, counts = _per_iteration(f, 4)
    _bitwise(plain, got)
    assert [c[:2] for c in counts] == [(1, 0)] * 4 and not _ad.ALONE, counts
    _ad.ALONE_ON[0] = True      # the verdicts start now
    got, counts = _per_iteration(f, 4)
    _bitwise(plain, got)
    assert [c[:2] for c in counts] == [(1, 0), (1, 0), (0, 1), (0, 1)], counts


def test_an_alone_op_inside_a_pending_group_is_recorded():
    # `y * i` (the same op as `x * i`: same code, size and scalar type) is alone at A; at C it
    # reads `x + 2.0`, still pending in C's group: it must join that group (run at once as
    # plain eager, it would read memory the group has not written yet)
    torch.manual_seed(5)
    x = torch.randn(6, 33, dtype=torch.float64).to("neuron")
    b = torch.randn(33, dtype=torch.float64).to("neuron")

    def f(i):
        a = ((x * float(i)) * b).cpu()             # A
        c = ((x + 2.0) * float(i)).cpu()           # C: a group of two
        return a, c

    plain, _ = _per_iteration(f, 6, adaptive=False)
    got, counts = _per_iteration(f, 6)
    for p, g in zip(plain, got):
        _bitwise(p, g)
    assert [alone for _s, alone, _f in counts] == [0, 0, 1, 1, 1, 1], counts
    assert all(fused >= 2 for _s, _a, fused in counts), counts
