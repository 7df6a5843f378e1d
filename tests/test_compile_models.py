"""torch.compile(backend="neuron") of whole training steps of real models (issue 17, item 9).

Each model of `make sweep` with a graph worth compiling: the tiny Hugging Face models of
tests/test_hf_models.py (GPT-2, BERT, Llama, T5, BART, ViT) and the MLP and CNN of
tests/test_models.py. The step (zero_grad, forward, loss, backward, AdamW step) is compiled as
one function and must equal the same step in neuron eager, step by step: losses and every
parameter at the end, with the rtol/atol of tests/test_hf_models.py (compiled kernels sum in
another order than eager's). Dropout is off on both sides: compiled code draws its masks in
another order (as inductor's does), which is not a difference of arithmetic. No CPU fallback,
no graph that fell back to eager, every graph with fused kernels.
"""

from __future__ import annotations

import copy

import pytest
import test_hf_models as hf
import test_models as tm
import torch

import eager_neuron

RTOL, ATOL = hf.RTOL, hf.ATOL
STEPS = 3


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
    torch._dynamo.reset()


def _no_dropout(model):
    for sub in model.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 0.0
        for attr in ("dropout", "activation_dropout", "attention_dropout"):
            # functional dropout (BART: F.dropout(x, p=self.dropout, ...))
            if isinstance(getattr(sub, attr, None), float):
                setattr(sub, attr, 0.0)
        if getattr(getattr(sub, "config", None), "use_cache", None):
            sub.config.use_cache = False     # training: no KV cache
    return model


def _hf_case(name):
    model, batches = hf.build(name)

    def loss(m, batch):
        return m(**hf.to_device(batch, "neuron")).loss
    return model, batches, loss


def _small_case(name):
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 5))
        batches = tm._batches(lambda g: torch.randn(16, 12, generator=g),
                              lambda g: torch.randint(0, 5, (16,), generator=g))
    else:
        model = tm.SmallCNN()
        batches = tm._batches(lambda g: torch.randn(4, 3, 12, 12, generator=g),
                              lambda g: torch.randint(0, 4, (4,), generator=g))

    def loss(m, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x.to("neuron")), y.to("neuron"))
    return model, batches, loss


def _train(model, batches, loss, compiled):
    model = _no_dropout(copy.deepcopy(model)).to("neuron").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4)

    def step(batch):
        opt.zero_grad()
        out = loss(model, batch)
        out.backward()
        opt.step()
        return out.detach()

    if compiled:
        step = torch.compile(step, backend="neuron")
    losses = [step(batches[i % len(batches)]).cpu() for i in range(STEPS)]
    return torch.stack(losses), model


@pytest.mark.models
@pytest.mark.parametrize("name", ["mlp", "cnn", *hf.MODELS])
def test_compiled_training_step_equals_eager(name):
    model, batches, loss = (_small_case if name in ("mlp", "cnn") else _hf_case)(name)
    le, me = _train(model, batches, loss, compiled=False)
    eager_neuron.compile.reset_stats()
    eager_neuron.reset_stats()
    lc, mc = _train(model, batches, loss, compiled=True)
    s, cs = eager_neuron.stats(), eager_neuron.compile.stats()
    torch.testing.assert_close(lc, le, rtol=RTOL, atol=ATOL)
    pe = dict(me.named_parameters())
    for key, p in mc.named_parameters():
        assert p.device.type == "neuron", key
        torch.testing.assert_close(p.detach().cpu(), pe[key].detach().cpu(), rtol=RTOL,
                                   atol=ATOL, msg=lambda m, key=key: f"{name} {key}: {m}")
    assert not s["fallbacks"], s["fallbacks"]
    assert cs["graph_fallbacks"] == {}, cs["graph_fallbacks"]
    # forward, backward and the optimizer were compiled, each graph into fused kernels
    assert cs["graphs_compiled"] >= 3
    assert sum(cs["kernels_per_graph"]) >= 3
    assert cs["fused_kernel_launches"] >= STEPS
