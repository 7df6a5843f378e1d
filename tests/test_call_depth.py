"""The pipeline's depth (docs/ARCHITECTURE.md, "Call depth"): a kernel op of the common families
launches at most two Python calls below dispatch() — dispatch calls the lowering in its own
frame, the lowering makes the launch its family helper built. Counted with sys.setprofile on
the slow path (the fast path off), never timed."""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401 -- the device

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from call_depth import DepthProbe  # noqa: E402

aten = torch.ops.aten

# op -> a call on neuron tensors; each family whose helper builds its launch
CASES = {
    "add": lambda x, i: x + x,
    "gelu": lambda x, i: F.gelu(x),
    "clone": lambda x, i: x.t().clone(),
    "to float64": lambda x, i: x.to(torch.float64),
    "copy_": lambda x, i: torch.empty(8, 5, device="neuron").copy_(x.t()),
    "sum": lambda x, i: x.sum(1),
    "amax": lambda x, i: x.amax(0),
    "argmax": lambda x, i: x.argmax(1),
    "var_mean": lambda x, i: torch.var_mean(x, 1),
    "softmax": lambda x, i: torch.softmax(x, 1),
    "layer_norm": lambda x, i: F.layer_norm(x, (8,)),
    "mm": lambda x, i: x @ x.t(),
    "addmm": lambda x, i: torch.addmm(x[:, 0], x, x.t()),
    "bmm": lambda x, i: torch.bmm(x.unsqueeze(0), x.t().unsqueeze(0)),
    "cat": lambda x, i: torch.cat([x, x], 0),
    "pad": lambda x, i: F.pad(x, (1, 2)),
    "flip": lambda x, i: x.flip(0),
    "tril": lambda x, i: x.tril(),
    "index_select": lambda x, i: x.index_select(0, i),
    "embedding": lambda x, i: F.embedding(i, x),
    "gather": lambda x, i: x.gather(0, i.unsqueeze(1).expand(3, 8)),
    "scatter_add": lambda x, i: torch.zeros_like(x).scatter_add(0, i.unsqueeze(1).expand(3, 8),
                                                                x[:3]),
    "index_put": lambda x, i: x.clone().index_put_((i,), x[:3], accumulate=True),
    "sort": lambda x, i: x.sort(1),
    "topk": lambda x, i: x.topk(2, 1),
    "max_pool2d": lambda x, i: F.max_pool2d(x.view(1, 1, 5, 8), 2),
    "avg_pool2d": lambda x, i: F.avg_pool2d(x.view(1, 1, 5, 8), 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_launch_is_at_most_two_calls_below_dispatch(name):
    x = torch.randn(5, 8, device="neuron")
    i = torch.tensor([4, 0, 2], device="neuron")
    with DepthProbe() as probe:
        CASES[name](x, i)
    assert probe.depths, f"{name}: no launch seen"
    deepest = max(range(len(probe.depths)), key=probe.depths.__getitem__)
    assert probe.depths[deepest] <= 2, (
        f"{name}: launch {probe.depths[deepest]} calls below dispatch: dispatch > "
        + " > ".join(probe.chains[deepest] + ["launch"]))


def test_the_probe_sees_a_deeper_launch():
    # the probe itself: a lowering helper that launches (cast of a float16 source goes through
    # cast() and its half route) is counted deeper than two
    x = torch.randn(4, device="neuron", dtype=torch.float16)
    with DepthProbe() as probe:
        x.to(torch.float32)
    assert max(probe.depths) > 2
