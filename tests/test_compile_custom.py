"""torch.compile(backend="neuron") over custom kernels: `eager_neuron.kernel` ops and the
kernel_lib wrappers trace into the graph as custom-op nodes (no graph break: fullgraph=True
holds) and run as their own kernels in the compiled program, forward and backward."""

from __future__ import annotations

import pytest
import torch

import eager_neuron
from eager_neuron.compile import stats as cstats
from eager_neuron.kernel_lib import rms_norm

N = "neuron"


pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


@eager_neuron.kernel("test_compile_custom::scaled_square", outputs=lambda x, s: x)
def scaled_square(x, s: float, out):
    for i in range(x.size):
        out.flat[i] = s * x.flat[i] * x.flat[i]


def _close(a, b, scale=8.0):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    tol = scale * torch.finfo(torch.float32).eps * (1 + b.abs())
    assert ((a - b).abs() <= tol).all(), f"max error {(a - b).abs().max().item()}"


def test_user_kernel_is_a_graph_node_and_runs_as_its_kernel():
    x = torch.randn(5, 3, device=N)

    def f(x):
        return scaled_square(x * 2, 0.5) + 1

    out = torch.compile(f, backend="neuron", fullgraph=True)(x)
    _close(out, f(x))
    _close(out, (x.cpu() * 2) ** 2 * 0.5 + 1)
    assert cstats()["graph_eager_ops"].get("test_compile_custom::scaled_square") == 1


def test_kernel_lib_rms_norm_trains_compiled_like_eager():
    g = torch.Generator().manual_seed(4)
    x0, w0 = torch.randn(6, 16, generator=g), torch.randn(16, generator=g)

    def f(x, w):
        return (rms_norm(x, w, 1e-6) * 3).sum()

    xs = [x0.to(N).requires_grad_() for _ in range(2)]
    ws = [w0.to(N).requires_grad_() for _ in range(2)]
    out = torch.compile(f, backend="neuron", fullgraph=True)(xs[0], ws[0])
    ref = f(xs[1], ws[1])
    out.backward()
    ref.backward()
    _close(out, ref, 64)
    _close(xs[0].grad, xs[1].grad, 64)
    _close(ws[0].grad, ws[1].grad, 64)
    ops = cstats()["graph_eager_ops"]
    assert ops.get("neuronlib::rms_norm_fwd") == 1 and ops.get("neuronlib::rms_norm_bwd") == 1
