"""Compiled graphs: values no input decides are computed once and kept (compile/fold.py).

Each case runs a compiled function several times and compares with the same function on the
CPU (exact: integer, comparison and elementwise float32 math the CPU rounds the same way), and
checks the counters: the folded steps are skipped, and what must run every time (random
draws, values handed to the caller, shapes that are inputs) still does.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    eager_neuron.compile.reset_stats()
    yield
    torch._dynamo.reset()


def _causal(x):
    # the shape of Hugging Face's mask building: aranges, a comparison, a where over scores
    t = x.shape[-1]
    q = torch.arange(t, device=x.device)
    mask = q[:, None] >= q[None, :]
    pos = torch.arange(t, device=x.device).cumsum(0) * 2 + 1
    return torch.where(mask, x, torch.full_like(x, -1e4)) + pos.to(x.dtype)


def test_mask_chain_folded_and_exact():
    f = torch.compile(_causal, backend="neuron")
    for i in range(4):
        x = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(i))
        got = f(x.to("neuron")).cpu()
        assert torch.equal(got, _causal(x)), i
    s = eager_neuron.compile.stats()
    assert s["folded_steps"] > 0
    # once folded, the aranges and the cumsum no longer run as eager nodes every launch
    assert s["graph_eager_ops"].get("aten::arange", 0) < 2 * s["graph_launches"]


def test_returned_constant_is_fresh_each_call():
    def g(x):
        return torch.arange(4, device=x.device) * 3, x + 1

    f = torch.compile(g, backend="neuron")
    x = torch.zeros(4, device="neuron")
    for _ in range(4):
        a, b = f(x)
        assert a.tolist() == [0, 3, 6, 9]
        assert b.tolist() == [1.0, 1.0, 1.0, 1.0]
        a.add_(100)                   # the caller owns what it receives


def test_random_draws_are_not_kept():
    def g(x):
        return x + torch.rand(64, device=x.device)

    f = torch.compile(g, backend="neuron")
    x = torch.zeros(64, device="neuron")
    outs = [f(x).cpu() for _ in range(4)]
    assert all(not torch.equal(outs[0], o) for o in outs[1:])
    assert eager_neuron.compile.stats()["folded_steps"] == 0


def test_dynamic_size_is_an_input():
    def g(x):
        return x * torch.arange(x.shape[0], device=x.device)

    f = torch.compile(g, backend="neuron", dynamic=True)
    for n in (5, 7, 5, 9, 7):
        x = torch.ones(n)
        assert torch.equal(f(x.to("neuron")).cpu(), g(x)), n


def _mask_from_returned_ids(x):
    # GPT-2's shape: position ids returned with the result (AOTAutograd saves them for the
    # embedding's backward) and a mask built from them through new memory (cat, cumsum, index)
    t = x.shape[-1]
    ids = torch.arange(t, device=x.device).unsqueeze(0)
    diff = torch.diff(ids, prepend=ids[:, :1] - 1, dim=-1)
    seq = (diff != 1).cumsum(-1)
    q = torch.arange(t, device=x.device)
    mask = (seq[0][q][:, None] == seq[0][q][None, :]) & (q[:, None] >= q[None, :])
    return torch.where(mask, x, torch.full_like(x, -1e4)), ids


def test_values_built_from_a_returned_constant_are_folded():
    f = torch.compile(_mask_from_returned_ids, backend="neuron")
    for i in range(6):
        x = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(i))
        got, ids = f(x.to("neuron"))
        want, want_ids = _mask_from_returned_ids(x)
        assert torch.equal(got.cpu(), want), i
        assert torch.equal(ids.cpu(), want_ids), i
        ids.add_(100)                 # the caller owns the returned ids: the mask stays right
    s = eager_neuron.compile.stats()
    # the cumsum over the returned ids' diff runs until the program keeps it (the first two
    # launches), not on every launch
    assert s["graph_launches"] == 6
    assert s["graph_eager_ops"].get("aten::cumsum", 0) <= 2, s["graph_eager_ops"]
    assert s["folded_steps"] > 0
