"""Higher-order operators on neuron (eager_neuron/hops.py): torch.cond, while_loop, scan, map and
associative_scan on neuron tensors in eager, with autograd, inside graphs compiled with
backend="neuron" (their first and planned calls), and under NeuronMode. Each raised before
(eager: "no rule registered for HOP cond and subclass NeuronTensor"; compiled: a TypeError
from the NotImplemented AOTAutograd's first-call check answered). Bodies use ops whose results
are exact in float32 (sums, products by powers of two, negation), so results equal the CPU's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import eager_neuron

N = "neuron"
pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


def _x(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (4, 5), generator=g).float()


def _cond(x, w):
    return torch.cond(x.sum() > 0, lambda t, w: t * 2 + w, lambda t, w: -t - w, (x, w))


def _loop(x):
    return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2 + 1),
                      (torch.tensor(0, device=x.device), x))


def _scan(x):
    return scan(lambda c, xs: (c + xs, c * 2 - xs), x[0].clone(), x)


def _same(got, ref):
    got = got if isinstance(got, (tuple, list)) else (got,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.device.type == N
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.equal(g.cpu(), r)


@pytest.mark.parametrize("sign", [1, -1], ids=["true", "false"])
def test_cond_in_eager_takes_the_cpus_branch(sign):
    x, w = sign * _x(), _x(1)
    _same(_cond(x.to(N), w.to(N)), _cond(x, w))


def test_loops_scans_and_maps_in_eager_equal_the_cpu():
    x = _x()
    _same(_loop(x.to(N)), _loop(x))
    _same(_scan(x.to(N)), _scan(x))
    _same(hop_map(lambda t: t * 4 - 1, x.to(N)), hop_map(lambda t: t * 4 - 1, x))
    _same(associative_scan(lambda a, b: a + b, x.to(N), dim=0, combine_mode="generic"),
          associative_scan(lambda a, b: a + b, x, dim=0, combine_mode="generic"))


def _cond_gradient(fn, sign):
    x, w = sign * _x(), _x(1)
    xc = x.clone().requires_grad_()
    (_cond(xc, w) * w).sum().backward()
    xn = x.to(N).requires_grad_()
    (fn(xn, w.to(N)) * w.to(N)).sum().backward()
    _same(xn.grad, xc.grad)


@pytest.mark.parametrize("sign", [1, -1], ids=["true", "false"])
def test_cond_gradient_in_eager_equals_the_cpus(sign):
    _cond_gradient(_cond, sign)


def test_compiled_hops_equal_the_cpu_on_their_first_and_planned_calls():
    eager_neuron.compile.reset_stats()
    fc = torch.compile(_cond, backend="neuron")
    fl = torch.compile(_loop, backend="neuron")
    fs = torch.compile(_scan, backend="neuron")
    for k in range(3):          # the interpreted calls, then planned ones
        for sign in (1, -1):
            x, w = sign * _x(k), _x(k + 1)
            _same(fc(x.to(N), w.to(N)), _cond(x, w))
            _same(fl(x.to(N)), _loop(x))
            _same(fs(x.to(N)), _scan(x))
    s = eager_neuron.compile.stats()
    assert s["graph_fallbacks"] == {}, s["graph_fallbacks"]
    assert s["graph_eager_ops"]["higher_order.cond"] >= 6, s["graph_eager_ops"]


def test_compiled_cond_gradient_equals_the_cpus():
    fc = torch.compile(_cond, backend="neuron")
    for sign in (1, -1):
        _cond_gradient(fc, sign)


def test_hops_under_neuron_mode_run_on_neuron_cpu_in_cpu_out():
    # in a subprocess: a dispatch mode around torch.cond leaves torch 2.13's dynamo unable to
    # compile later torch.cond calls of the process (any mode: a torch bug, docs/CONVENTIONS.md)
    code = textwrap.dedent("""
        import torch, eager_neuron
        from torch._higher_order_ops.scan import scan
        from torch._higher_order_ops.while_loop import while_loop
        x = torch.randint(-8, 8, (4, 5)).float()
        f = lambda x: torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: -t, (x,))
        g = lambda x: while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2 + 1),
                                 (torch.tensor(0), x))
        h = lambda x: scan(lambda c, xs: (c + xs, c * 2 - xs), x[0].clone(), x)
        ref = [f(x), *g(x), *h(x)]
        eager_neuron.reset_stats()
        with eager_neuron.NeuronMode():
            got = [f(x), *g(x), *h(x)]
        assert all(a.device.type == "cpu" and torch.equal(a, b) for a, b in zip(got, ref))
        assert eager_neuron.stats()["launches"] > 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_a_hop_writing_an_operand_under_neuron_mode_writes_the_callers_tensor():
    # NeuronMode moves a HOP's CPU operands to neuron: one the HOP writes in place (a
    # subgraph's add_) is written back to the caller's tensor, as on the CPU
    import torch.fx
    from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

    def body(a, b):
        a.add_(b)
        return (a * 2,)

    gm = torch.fx.symbolic_trace(body)
    y = torch.arange(3.0)
    want_x = torch.ones(3)
    want = invoke_subgraph(gm, "ref", want_x, y)
    x = torch.ones(3)
    with eager_neuron.NeuronMode():
        got = invoke_subgraph(gm, "mode", x, y)
    assert got[0].device.type == "cpu" and torch.equal(got[0], want[0])
    assert torch.equal(x, want_x)


@pytest.mark.parametrize("name", ["cond", "while_loop", "scan", "map_impl", "associative_scan",
                                  "invoke_subgraph", "hints_wrapper", "strict_mode", "out_dtype",
                                  "with_effects", "auto_functionalized", "print"])
def test_torchs_dense_hops_have_a_neuron_rule(name):
    from eager_neuron.tensor import NeuronTensor

    assert NeuronTensor in torch._ops._higher_order_ops[name].python_key_table


def test_compiled_activation_checkpointing_replays_dropout_as_the_cpu():
    # a checkpointed block with dropout in a compiled graph saves the generator state before
    # the random op and replays it in the recompute (run_and_save_rng_state /
    # run_with_rng_state: device kernels only, no rule for neuron before); the CPU's compiled
    # graph (aot_eager) draws the same masks from the same generator
    from torch.utils.checkpoint import checkpoint

    lin0 = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def run(dev, backend):
        lin = torch.nn.Linear(8, 8).to(dev)
        lin.load_state_dict(lin0.state_dict())

        def block(t):
            return torch.nn.functional.dropout(lin(t).relu(), p=0.5, training=True)

        f = torch.compile(lambda t: checkpoint(block, t, use_reentrant=False).sum(),
                          backend=backend)
        torch.manual_seed(7)
        xx = x.clone().to(dev).requires_grad_()
        out = f(xx)
        out.backward()
        return out.detach().cpu(), xx.grad.cpu(), lin.weight.grad.cpu()

    for got, ref in zip(run(N, "neuron"), run("cpu", "aot_eager")):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)   # (masks: O(1) apart)
