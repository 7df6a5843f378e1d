"""Backward of a graph rooted on neuron runs on the calling thread (eager_neuron/device.py)."""

from __future__ import annotations

import copy
import threading

import torch
import torch.utils.checkpoint

import eager_neuron  # noqa: F401
from eager_neuron import device


def _thread_of_backward(loss: torch.Tensor, leaf: torch.Tensor) -> int:
    seen = []
    leaf.register_hook(lambda g: seen.append(threading.get_ident()))
    loss.backward()
    assert seen
    return seen[0]


def test_backward_runs_on_the_callers_thread_and_restores_the_switch():
    x = torch.randn(4, 3, device="neuron", requires_grad=True)
    before = torch._C._is_multithreading_enabled()
    assert _thread_of_backward((x * 2).sum(), x) == threading.get_ident()
    assert torch._C._is_multithreading_enabled() == before
    device.BACKWARD_ON_CALLER[0] = False
    try:
        worker = _thread_of_backward((x * 2).sum(), x)
    finally:
        device.BACKWARD_ON_CALLER[0] = True
    assert worker != threading.get_ident()   # the engine's neuron worker (the A/B switch)


def test_backward_in_a_user_thread_runs_there():
    x = torch.randn(5, device="neuron", requires_grad=True)
    out = {}

    def work():
        out["caller"] = threading.get_ident()
        out["ran"] = _thread_of_backward((x.sin() * x).sum(), x)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["ran"] == out["caller"]
    torch.testing.assert_close(x.grad.cpu(), (x.detach().sin() + x.detach() * x.detach().cos())
                               .cpu(), rtol=1e-6, atol=1e-6)


def test_gradients_equal_on_either_thread_and_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 6)
    grads = []
    for on_caller in (True, False):
        m = copy.deepcopy(model).to("neuron")
        device.BACKWARD_ON_CALLER[0] = on_caller
        try:
            m(x.to("neuron")).square().sum().backward()
        finally:
            device.BACKWARD_ON_CALLER[0] = True
        grads.append([p.grad.cpu() for p in m.parameters()])
    model(x).square().sum().backward()
    for a, b, c in zip(grads[0], grads[1], (p.grad for p in model.parameters())):
        assert torch.equal(a, b)   # the same kernels in the same order: the same bits
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_reentrant_checkpoint_and_autograd_grad_on_the_callers_thread():
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    ln, xn = copy.deepcopy(lin).to("neuron"), x.detach().to("neuron")
    xn.requires_grad_()

    def f(m, v):
        return torch.utils.checkpoint.checkpoint(lambda t: m(t).tanh(), v, use_reentrant=True)

    f(lin, x).sum().backward()
    f(ln, xn).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ln.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-6)
    # torch.autograd.grad with create_graph (double backward) on the caller's thread
    y = torch.randn(5, device="neuron", requires_grad=True)
    g, = torch.autograd.grad((y ** 3).sum(), y, create_graph=True)
    g2, = torch.autograd.grad(g.sum(), y)
    torch.testing.assert_close(g2.cpu(), 6 * y.detach().cpu(), rtol=1e-6, atol=1e-6)


def test_a_graph_rooted_on_cpu_keeps_the_engines_default():
    # a loss moved to the CPU: the engine's own placement (neuron nodes on its worker)
    x = torch.randn(4, device="neuron", requires_grad=True)
    ran = _thread_of_backward((x * 3).cpu().sum(), x)
    assert ran != threading.get_ident()
    torch.testing.assert_close(x.grad.cpu(), torch.full((4,), 3.0))
