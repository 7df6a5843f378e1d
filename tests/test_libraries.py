"""What real libraries (sentence-transformers, Lightning, torchmetrics, torch.distributions,
torch.func, ...) do on `neuron`, reduced to pure torch: each test is the minimal reproduction of
a failure tools/probe_libraries.py found, run in plain and adaptive eager against the CPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import eager_neuron

MODES = ["plain", "adaptive"]


def _mode(mode):
    return eager_neuron.adaptive() if mode == "adaptive" else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# torch.inference_mode(): views of normal tensors (sentence-transformers' encode, Lightning's
# validation and predict loops, torchmetrics' updates run under it)


def _views(x):
    return {
        "detach": lambda: x.detach(),
        "slice": lambda: x[:, 1:3],
        "select": lambda: x[1],
        "view": lambda: x.view(-1),
        "t": lambda: x.t(),
        "expand": lambda: x[:1].expand(3, -1),
        "diagonal": lambda: x.diagonal(),
        "split": lambda: x.split(2),
        "unbind": lambda: x.unbind(),
        "in_place_on_view": lambda: x[0].mul_(2),
    }


@pytest.mark.parametrize("mode", MODES)
def test_views_of_normal_tensors_under_inference_mode(mode):
    """Every view of a normal neuron tensor raised "Cannot set version_counter for inference
    tensor" under torch.inference_mode() (the wrapper was made as an inference tensor); on the
    CPU it is a normal tensor sharing its base's version counter."""
    ref = torch.arange(12.0).view(3, 4)
    dev = ref.to("neuron")
    with _mode(mode):
        for name in _views(ref):
            if name != "in_place_on_view":
                for _ in range(2):   # outside inference mode first: the fast path's runners
                    _views(dev)[name]()
            with torch.inference_mode():
                want = _views(ref)[name]()
                got = _views(dev)[name]()
            wants = [want] if isinstance(want, torch.Tensor) else list(want)
            gots = [got] if isinstance(got, torch.Tensor) else list(got)
            assert len(gots) == len(wants), name
            for w, g in zip(wants, gots):
                assert g.device.type == "neuron", name
                assert g.is_inference() == w.is_inference() is False, name
                assert torch.equal(g.cpu(), w), name
        # repeats take the fast path's view runners: the same answer
        with torch.inference_mode():
            for _ in range(3):
                v = dev.detach()
                assert not v.is_inference()
    assert dev._version == ref._version
    assert torch.equal(dev.cpu(), ref)


@pytest.mark.parametrize("mode", MODES)
def test_views_of_inference_tensors_stay_inference_tensors(mode):
    with _mode(mode):
        with torch.inference_mode():
            x = torch.arange(6.0, device="neuron") + 1
            assert x.is_inference()
            for v in (x.view(2, 3), x[1:], x.detach(), *x.split(2)):
                assert v.is_inference()
            assert x.view(2, 3).t().sum().item() == 21.0


@pytest.mark.parametrize("mode", MODES)
def test_module_forward_under_inference_mode_then_training(mode):
    """An encoder-style forward under inference_mode (buffers sliced, weights detached, outputs
    pooled), then a training step on the same model: the CPU's numbers."""

    def run(dev, dtype):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 8).to(dev, dtype)
        lin = torch.nn.Linear(8, 8).to(dev, dtype)
        pos = torch.arange(16, device=dev).expand((1, -1))
        ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]], device=dev)
        with torch.inference_mode():
            p = pos[:, :4]
            h = lin(emb(ids) + emb(p)).tanh()
            mask = (ids != 0).unsqueeze(-1)
            pooled = (h * mask).sum(1) / mask.sum(1)
            enc = torch.nn.functional.normalize(pooled.detach(), dim=-1)
        loss = lin(emb(ids)).pow(2).mean()
        loss.backward()
        return enc, lin.weight.grad, pos.is_inference(), enc.is_inference()

    want = run("cpu", torch.float64)   # the float64 reference; float32 on the device
    with _mode(mode):
        got = run("neuron", torch.float32)
    torch.testing.assert_close(got[0].cpu().double(), want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1].cpu().double(), want[1], rtol=1e-5, atol=1e-6)
    assert got[2:] == want[2:]
