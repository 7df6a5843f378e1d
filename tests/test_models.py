"""Real models train on `neuron` and match the CPU; NeuronMode; views and in-place aliasing.

Each model trains 3 AdamW steps from the same initial weights and the same seed on both
devices (dropout masks come from the shared CPU generator, so they are identical); losses and
final parameters (and buffers, e.g. BatchNorm running stats) must agree within rtol 1e-4 /
atol 1e-5.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import eager_neuron

RTOL, ATOL = 1e-4, 1e-5
STEPS = 3


def _train(model: nn.Module, batches, loss_fn, device: str, seed: int = 0, eps: float = 1e-8):
    """STEPS AdamW steps on `device`; returns (losses, model)."""
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, eps=eps)
    torch.manual_seed(seed)
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.fixture(params=["plain", "adaptive"])
def eager_mode(request):
    """Each model trains in plain eager and under adaptive eager (which must not change results)."""
    if request.param == "plain":
        return contextlib.nullcontext
    adaptive = getattr(eager_neuron, "adaptive", None)
    if adaptive is None:
        pytest.skip("adaptive eager not built yet")
    return adaptive


def _check_same_training(model: nn.Module, batches, loss_fn, stats_delta, mode, eps=1e-8):
    cpu_model = copy.deepcopy(model)
    cpu_losses, cpu_model = _train(cpu_model, batches, loss_fn, "cpu", eps=eps)
    eager_neuron.reset_stats()
    with mode():
        n_losses, n_model = _train(model, batches, loss_fn, "neuron", eps=eps)
    stats = stats_delta()
    assert stats["launches"] > 0
    torch.testing.assert_close(torch.tensor(n_losses), torch.tensor(cpu_losses), rtol=RTOL,
                               atol=ATOL)
    n_state, c_state = n_model.state_dict(), cpu_model.state_dict()
    assert n_state.keys() == c_state.keys()
    for name, ref in c_state.items():
        got = n_state[name]
        assert got.device.type == "neuron", name
        torch.testing.assert_close(got.cpu(), ref, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert not stats["fallbacks"], f"CPU fallbacks while training: {stats['fallbacks']}"


def _batches(make_x, make_y, n=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(make_x(g), make_y(g)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------

@pytest.mark.models
def test_mlp(stats_delta, eager_mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 5))
    batches = _batches(lambda g: torch.randn(16, 12, generator=g),
                       lambda g: torch.randint(0, 5, (16,), generator=g))
    _check_same_training(model, batches, F.cross_entropy, stats_delta, eager_mode)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # NOTE: no conv bias before BatchNorm: BN cancels it, so its gradient is rounding noise
        # that AdamW's normalisation would amplify into an lr-sized random step
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.gap(x).flatten(1)
        return self.fc(self.drop(x))


@pytest.mark.models
def test_cnn_batchnorm_pool_dropout(stats_delta, eager_mode):
    torch.manual_seed(0)
    batches = _batches(lambda g: torch.randn(4, 3, 12, 12, generator=g),
                       lambda g: torch.randint(0, 4, (4,), generator=g))
    _check_same_training(SmallCNN(), batches, F.cross_entropy, stats_delta, eager_mode)


class LSTMRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=6, hidden_size=10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 1)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1])


@pytest.mark.models
def test_lstm(stats_delta, eager_mode):
    torch.manual_seed(0)
    batches = _batches(lambda g: torch.randn(3, 7, 6, generator=g),
                       lambda g: torch.randn(3, 1, generator=g))
    _check_same_training(LSTMRegressor(), batches, F.mse_loss, stats_delta, eager_mode)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                                dropout=0.1, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


@pytest.mark.models
def test_transformer_encoder_layer(stats_delta, eager_mode):
    torch.manual_seed(0)
    batches = _batches(lambda g: torch.randn(2, 5, 16, generator=g),
                       lambda g: torch.randint(0, 3, (2,), generator=g))
    # NOTE: the key projection's bias has an exactly-zero gradient (softmax is invariant to a
    # per-row constant), so on both devices it is rounding noise of ~1e-9; AdamW with eps=1e-8
    # turns noise into lr-sized steps of random sign. eps=1e-4 keeps noise noise.
    _check_same_training(TinyTransformer(), batches, F.cross_entropy, stats_delta, eager_mode,
                         eps=1e-4)


# ---------------------------------------------------------------------------------------------
# NeuronMode: unmodified CPU code
# ---------------------------------------------------------------------------------------------

def test_neuron_mode_runs_cpu_code_through_kernels(stats_delta):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    expected = model(x)
    eager_neuron.reset_stats()
    with eager_neuron.NeuronMode():
        out = model(x)
    stats = stats_delta()
    assert out.device.type == "cpu" and type(out) is torch.Tensor
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)
    assert stats["launches"] > 0


def test_neuron_mode_elementwise_and_cast(stats_delta):
    x = torch.linspace(-2, 2, 9)
    eager_neuron.reset_stats()
    with eager_neuron.NeuronMode():
        y = (torch.sigmoid(x) * 3).to(torch.int64) + 1
    assert stats_delta()["launches"] >= 3
    torch.testing.assert_close(y, (torch.sigmoid(x) * 3).to(torch.int64) + 1)


# ---------------------------------------------------------------------------------------------
# views and in-place aliasing
# ---------------------------------------------------------------------------------------------

def test_inplace_through_slice_shows_in_base():
    a = torch.zeros(4, 3, device="neuron")
    a[1:].add_(1)
    ref = torch.zeros(4, 3)
    ref[1:].add_(1)
    torch.testing.assert_close(a.cpu(), ref)


def test_inplace_through_strided_view_and_setitem():
    a = torch.arange(12.0).reshape(3, 4).to("neuron")
    ref = torch.arange(12.0).reshape(3, 4)
    for t in (a, ref):
        t[:, ::2].mul_(10)
        t.t()[1].sub_(0.5)
        t[2, 3] = -1.0
        t.view(-1)[0:2].fill_(7)
    torch.testing.assert_close(a.cpu(), ref)


def test_transpose_contiguous():
    x = torch.randn(3, 5)
    xn = x.to("neuron")
    y = xn.t().contiguous()
    assert y.is_contiguous() and y.shape == (5, 3)
    assert y.stride() == (3, 1)
    torch.testing.assert_close(y.cpu(), x.t().contiguous())
    # the copy is independent of its source
    xn.add_(1)
    torch.testing.assert_close(y.cpu(), x.t().contiguous())


def test_views_share_memory_both_ways():
    base = torch.zeros(6, device="neuron")
    v = base.view(2, 3)
    v[1].fill_(2)
    base[0] = 5
    assert base.cpu().tolist() == [5.0, 0.0, 0.0, 2.0, 2.0, 2.0]
    assert v.cpu().tolist() == [[5.0, 0.0, 0.0], [2.0, 2.0, 2.0]]


def test_inplace_on_view_of_parameter():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3).to("neuron")
    ref = lin.weight.detach().cpu().clone()
    with torch.no_grad():
        lin.weight[0].mul_(2)
        lin.weight[:, 1:2].zero_()
    ref[0].mul_(2)
    ref[:, 1:2].zero_()
    torch.testing.assert_close(lin.weight.detach().cpu(), ref)
    # the parameter is still a trainable leaf on neuron
    assert lin.weight.is_leaf and lin.weight.requires_grad and lin.weight.device.type == "neuron"
    lin(torch.randn(2, 4, device="neuron")).sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.device.type == "neuron"


def test_inplace_view_autograd():
    x = torch.randn(5, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_(True)
    outs = []
    for t in (x, xn):
        y = t * 2
        y[1:3].mul_(3)
        outs.append(y)
        y.sum().backward()
    torch.testing.assert_close(outs[1].detach().cpu(), outs[0].detach())
    torch.testing.assert_close(xn.grad.cpu(), x.grad)


# ---------------------------------------------------------------------------------------------
# the strict fallback: the error names the op, the arguments and the user's line
# ---------------------------------------------------------------------------------------------

# aten ops with neither a kernel nor a decomposition today; the test uses the first one that
# still is (a kernel family may grow to cover some of them)
_NO_KERNEL = [
    ("aten::histc", lambda x: torch.histc(x, bins=4)),
    ("aten::kthvalue", lambda x: torch.kthvalue(x, 2)),
    ("aten::median", lambda x: torch.median(x)),
    ("aten::mode", lambda x: torch.mode(x)),
    ("aten::histogram", lambda x: torch.histogram(x, bins=4)),
    ("aten::unique_dim", lambda x: torch.unique(x, dim=0)),
    ("aten::segment_reduce", lambda x: torch.segment_reduce(
        x, "sum", lengths=torch.tensor([20, 4], device=x.device))),
]


def _unsupported_op():
    from eager_neuron import dispatch

    for name, fn in _NO_KERNEL:
        packet = getattr(torch.ops.aten, name.split("::")[1])
        if all(dispatch._plan(getattr(packet, ov)).kind == "fallback"
               for ov in packet.overloads()):
            return name, fn
    pytest.skip("every candidate op has a kernel or decomposition now: add a new candidate")


def test_strict_fallback_error_names_op_args_and_line(strict_fallback):
    name, fn = _unsupported_op()
    x = torch.randn(8, 3, device="neuron")
    with pytest.raises(eager_neuron.UnsupportedOpError) as info:
        fn(x.flatten())  # the user's line
    msg = str(info.value)
    assert name in msg
    assert "f32[24]@neuron:0" in msg, msg               # argument shapes and dtypes
    assert "test_models.py:" in msg, msg                # the user's file:line
    assert "fn(x.flatten())" in msg or "lambda" in msg, msg
    assert "EAGER_NEURON_FALLBACK=cpu" in msg           # and the fix


def test_fallback_cpu_counts(stats_delta):
    name, fn = _unsupported_op()
    x = torch.randn(24)
    out = fn(x.to("neuron"))
    ref = fn(x)
    stats = stats_delta()
    assert sum(stats["fallbacks"].values()) >= 1, stats["fallbacks"]
    assert any(k.startswith(name) for k in stats["fallbacks"])
    torch.testing.assert_close(torch.utils._pytree.tree_map(
        lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tuple(out) if isinstance(
            out, tuple) else out), tuple(ref) if isinstance(ref, tuple) else ref)
