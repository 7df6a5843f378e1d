"""Adaptive eager's process-wide switch with blocks in several threads (adaptive.py)."""

from __future__ import annotations

import contextlib
import copy
import threading

import torch

import eager_neuron
from eager_neuron.adaptive import MODULE as ad


def test_blocks_closing_out_of_order_never_switch_off_an_open_one():
    # thread A enters, thread B enters, A leaves first: B's block stays on; when B leaves, the
    # state from before both is back (each block's own exit order, as two threads produce it)
    base = ad.STATE.enabled
    a, b = eager_neuron.adaptive(), eager_neuron.adaptive()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    still_on = ad.STATE.enabled
    b.__exit__(None, None, None)
    assert still_on is True and ad.STATE.enabled == base
    # nested in one thread: the usual last-in first-out restore
    with eager_neuron.adaptive():
        with eager_neuron.adaptive(False):
            inner = ad.STATE.enabled
        outer = ad.STATE.enabled
    assert (inner, outer, ad.STATE.enabled) == (False, True, base)


def test_a_group_pending_when_the_switch_turns_off_launches_before_the_next_op():
    # the race made deterministic: this thread's group is pending (x * 2 recorded) when the
    # switch turns off without a flush (another thread's block closing in between); the next
    # op reads the pending result and must see it computed
    torch.manual_seed(0)
    x = torch.randn(64)
    xn = x.to("neuron")
    with eager_neuron.adaptive():
        for _ in range(3):
            ((xn * 2.0) + 1.0).cpu()            # runners learned, kernels built
        eager_neuron.reset_stats()
        y = xn * 2.0                             # pending in this thread's group
        assert ad.PENDING
        ad.STATE.enabled = False                 # off, the group still pending
        try:
            z = y + 1.0                          # a fusible op, now run as plain eager
        finally:
            ad.STATE.enabled = True
        got = z.cpu()
        flushes = eager_neuron.stats()["flushes"]
    assert torch.equal(got, x * 2.0 + 1.0)
    assert flushes.get("adaptive toggled", 0) >= 1, flushes


def test_record_after_the_switch_turned_off_makes_a_group_instead_of_raising():
    # an op that chose to record just before another thread switched adaptive eager off
    key = ad.stream_key()
    prev = ad.STATE.enabled
    ad.STATE.enabled = False
    try:
        with ad._lock:
            g = ad._group_for(key, 0, 1)
        assert ad.PENDING.get(key) is g
    finally:
        ad.PENDING.pop(key, None)
        ad.STATE.enabled = prev


def _train(model, xs, ys, device, adaptive, out, k):
    m = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses = []
    with eager_neuron.adaptive() if adaptive else contextlib.nullcontext():
        for x, y in zip(xs, ys):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    out[k] = (losses, [p.detach().cpu() for p in m.parameters()])


def test_threads_training_in_their_own_adaptive_blocks_match_the_cpu():
    specs = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 5))
        specs.append((model, [torch.randn(16, 12) for _ in range(8)],
                      [torch.randint(0, 5, (16,)) for _ in range(8)]))
    base = ad.STATE.enabled
    ref, got, errors = {}, {}, []
    for k, s in enumerate(specs):
        _train(*s, "cpu", False, ref, k)

    def work(k, s):
        try:
            _train(*s, "neuron", True, got, k)
        except BaseException as exc:   # noqa: BLE001 -- reported below
            errors.append(exc)

    for _ in range(2):
        threads = [threading.Thread(target=work, args=(k, s)) for k, s in enumerate(specs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for k in range(len(specs)):
            torch.testing.assert_close(torch.tensor(got[k][0]), torch.tensor(ref[k][0]),
                                       rtol=1e-4, atol=1e-5)
            for a, b in zip(got[k][1], ref[k][1]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert ad.STATE.enabled == base and not ad._BLOCKS


def test_a_group_another_thread_launches_stays_pending_until_it_has_run(monkeypatch):
    """Another thread launching this thread's group (flush_all, flush_others) took it out of
    PENDING first: meanwhile this thread saw nothing pending and its plain runners read the
    group's outputs before they were computed (a cold cache widened the window to a compile:
    the threads test above lost its first losses to log(5), all-zero logits, about one run in
    five under load). Now the group stays pending until its launch is over, and a reader waits."""
    torch.manual_seed(0)
    x = torch.randn(64)
    xn = x.to("neuron")
    started, release = threading.Event(), threading.Event()
    real = ad.launch_group

    def slow_launch(g, reason):
        started.set()
        release.wait(10)
        real(g, reason)

    with eager_neuron.adaptive():
        y = xn * 2.0                               # pending in this thread's group
        key = ad.stream_key()
        assert key in ad.PENDING
        monkeypatch.setattr(ad, "launch_group", slow_launch)
        other = threading.Thread(target=ad.flush_all, args=("synchronize",))
        other.start()
        assert started.wait(10)
        still = key in ad.PENDING                  # seen without the lock, mid-launch
        release.set()
        got = (y + 1.0).cpu()                      # waits for the launch, then reads
        other.join(10)
    monkeypatch.setattr(ad, "launch_group", real)
    assert still
    assert key not in ad.PENDING
    assert torch.equal(got, x * 2.0 + 1.0)
