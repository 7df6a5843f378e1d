"""torch.compile(backend="neuron") with compiled autograd (torch._dynamo.config.compiled_autograd).

The backward becomes one dynamo graph (boxed inputs: `neuron_backend` flattens them) run on the
caller's thread; each AccumulateGrad is dynamo's polyfill, a copy of the gradient into
`empty_like(param)`, which compile/elide.py turns back into the gradient itself where that is
the same tensor. Checked by values (neuron eager, a float64 CPU reference) and counters
(captures, copies elided, no recompile, no fallback), never by times.
"""

from __future__ import annotations

import pytest
import torch
from test_compile_runtime import _MLP, _Block, _close, _data
from torch.fx.experimental.proxy_tensor import make_fx

import eager_neuron
from eager_neuron.compile import elide
from eager_neuron.compile import stats as cstats

aten = torch.ops.aten
N = "neuron"


pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


def _train(kind, device, compiled, steps, dtype=torch.float32):
    """Steps as a user writes them (zero_grad first: the last step's gradients stay readable);
    returns the model, the losses and each step's gradients."""
    torch.manual_seed(0)
    m = (_Block() if kind == "gpt" else _MLP()).to(dtype).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad()
        loss = m(x, y)
        loss.backward()
        opt.step()
        return loss.detach()

    if compiled:
        step = torch.compile(step, backend="neuron")
    losses, grads, graphs = [], [], []
    for i in range(steps):
        x, y = _data(kind, i % 2)
        losses.append(step(x.to(dtype).to(device), y.to(device)))
        grads.append([p.grad for p in m.parameters()])
        graphs.append(cstats()["graphs_compiled"])
    return m, losses, grads, graphs


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_compiled_autograd_steps_equal_eager(kind):
    counters = torch._dynamo.utils.counters
    counters.clear()
    steps = 4
    torch._dynamo.config.compiled_autograd = True
    try:
        mc, lc, gc, graphs = _train(kind, N, True, steps)
    finally:
        torch._dynamo.config.compiled_autograd = False
    s = cstats()
    me, le, ge, _ = _train(kind, N, False, steps)
    m64, l64, _, _ = _train(kind, "cpu", False, steps, torch.float64)
    n_params = len(list(mc.parameters()))
    # the backward was one captured graph, compiled by the neuron backend (no fallback), and
    # every parameter's AccumulateGrad copy elided
    assert counters["compiled_autograd"]["captures"] >= 1
    assert s["copies_elided"] == n_params, s["copies_elided"]
    assert not s["graph_fallbacks"] and not s["group_fallbacks"], s
    assert s["planned_runs"] > 0
    # no recompile once steady (an elided gradient that was a view on the first call and not
    # on the next made dynamo recompile the optimizer's graph)
    assert graphs[0] == graphs[-1], graphs
    for step_grads in gc:
        for g in step_grads:
            assert type(g) is eager_neuron.NeuronTensor and g._base is None and \
                g.is_contiguous()
    for a, b in zip(gc[-1], ge[-1]):
        _close(a, b, torch.float32, 256)
    for a, b, c in zip(lc, le, l64):
        _close(a, b, torch.float32, 64)
        _close(a, c, torch.float32, 256)
    for pc, pe, p64 in zip(mc.parameters(), me.parameters(), m64.parameters()):
        _close(pc, pe, torch.float32, 4096)
        _close(pc, p64, torch.float32, 4096)


def _graph(f, *args):
    return make_fx(f, tracing_mode="fake")(*args)


def _copy_of(t):
    return aten.copy.default(aten.new_empty_strided.default(t, t.shape, t.stride()), t)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_fresh_copies_rules():
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    # a fresh value of the copy's layout: the value itself
    gm = _graph(lambda x, w: (_copy_of(x @ w),), x, w)
    assert elide.fresh_copies(gm) == 1
    assert aten.copy.default not in _targets(gm)
    assert torch.equal(gm(x, w)[0], x @ w)
    # a view source: a tensor of its own over the view's memory
    gm = _graph(lambda x, w: (_copy_of((x @ w).t().t()),), x, w)
    assert elide.fresh_copies(gm) == 1 and elide.unaliased in _targets(gm)
    out = gm(x, w)[0]
    assert torch.equal(out, x @ w) and out._base is None
    # kept: an input's memory, a value also returned, a copy read by another node, another
    # layout
    for f in (lambda x, w: (_copy_of(x),), lambda x, w: (_copy_of(x.t().t()),),
              lambda x, w: (lambda v: (_copy_of(v), v))(x @ w),
              lambda x, w: (lambda v: (_copy_of(v), v.t()))(x @ w),
              lambda x, w: (lambda c: (c, c + 1))(_copy_of(x @ w)),
              lambda x, w: (aten.copy.default(aten.new_empty_strided.default(
                  x, (5, 3), (3, 1)), (x @ w).t()),)):
        gm = _graph(f, x, w)
        ref = f(x, w)
        assert elide.fresh_copies(gm) == 0, gm.graph
        for a, b in zip(gm(x, w), ref):
            assert torch.equal(a, b)
    # two copies of one value: one of them may be the value, the other keeps its own memory
    gm = _graph(lambda x, w: (lambda v: (_copy_of(v), _copy_of(v)))(x @ w), x, w)
    assert elide.fresh_copies(gm) == 1
    a, b = gm(x, w)
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
