"""PyTorch's own optimizer database (optim_db) as an oracle: every optimizer, in its for-loop,
foreach=True, fused=True and capturable=True (for-loop and foreach) forms, trained 5 steps on
the CPU and on neuron from the same weights; the parameters must agree to float32 rounding
(rtol = atol = 1e-5), and no step may fall back to the CPU.

Bounded by default (the first config of each optimizer and form);
EAGER_NEURON_OPTIM_DB=full runs every config optim_db lists (~190, a few minutes).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import eager_neuron

common_optimizers = pytest.importorskip("torch.testing._internal.common_optimizers")

FULL = os.environ.get("EAGER_NEURON_OPTIM_DB") == "full"
PER_FORM = None if FULL else 1
# Strict: an entry that starts passing fails the suite, so the list only shrinks.
XFAIL = {
    "SparseAdam": "sparse gradients: sparse tensors are not supported on neuron",
}


def _forms(info) -> list[str]:
    forms = ["loop"]
    if "foreach" in info.supported_impls:
        forms.append("foreach")
    if "fused" in info.supported_impls:
        forms.append("fused")
    if info.has_capturable_arg:
        # capturable: `step` lives on the device; the CPU refuses it, so its reference is the
        # CPU's for-loop form (the same float32 step and roundings)
        forms.append("capturable")
        if "foreach" in info.supported_impls:
            forms.append("capturable-foreach")
    return forms


def _cases():
    for info in common_optimizers.optim_db:
        name = info.optim_cls.__name__
        for form in _forms(info):
            inputs = info.optim_inputs_func("cpu")
            for j, oi in enumerate(inputs[:PER_FORM]):
                marks = []
                if name in XFAIL:
                    marks.append(pytest.mark.xfail(reason=XFAIL[name], strict=True))
                yield pytest.param(info, form, j, id=f"{name}-{form}-{oi.desc}", marks=marks)


def _train(info, form, j, device, steps=5):
    optim_input = info.optim_inputs_func(device)[j]
    kw = dict(optim_input.kwargs)
    if form in ("foreach", "fused"):
        kw[form] = True
    elif "foreach" in info.supported_impls:
        kw["foreach"] = form == "capturable-foreach"
    if form.startswith("capturable") and device != "cpu":
        kw["capturable"] = True
    torch.manual_seed(0)
    w = torch.randn(4, 3).to(device).requires_grad_()
    b = torch.randn(4).to(device).requires_grad_()
    x = torch.randn(5, 3).to(device)
    name = info.optim_cls.__name__
    params = [w] if name == "Muon" else [w, b]          # Muon takes 2-d parameters only
    if name == "SparseAdam":
        emb = torch.nn.Embedding(6, 3, sparse=True).to(device)
        params, x = list(emb.parameters()), torch.tensor([0, 2, 2, 5], device=device)
    opt = info.optim_cls(params, **kw)

    def closure():
        opt.zero_grad()
        if name == "SparseAdam":
            loss = emb(x).pow(2).sum()
        else:
            loss = ((x @ w.t() + (b if len(params) == 2 else b.detach())) ** 2).sum()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return [p.detach().cpu() for p in params]


@pytest.mark.parametrize(("info", "form", "j"), list(_cases()))
def test_optimizer_matches_cpu(info, form, j):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _train(info, form, j, "cpu")
        eager_neuron.reset_stats()
        got = _train(info, form, j, "neuron")
    assert eager_neuron.stats()["fallbacks"] == {}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD,
                                 torch.optim.Adagrad])
def test_fused_with_grad_scaler_matches_cpu(cls):
    """fused=True with GradScaler: the fused op unscales and skips inf steps itself."""
    def run(device):
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 2).to(device)
        opt = cls(lin.parameters(), lr=0.1, fused=True)
        scaler = torch.amp.GradScaler(device, init_scale=4.0)
        x = torch.randn(4, 3).to(device)
        for step in range(3):
            opt.zero_grad()
            loss = lin(x).pow(2).sum() * (float("inf") if step == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in lin.parameters()], scaler.get_scale()

    want, got = run("cpu"), run("neuron")
    assert got[1] == want[1]
    for g, w in zip(got[0], want[0]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
