"""nn.LSTM and nn.GRU on neuron as sequence kernels (eager_neuron/lower/rnn_seq.py, kernels/rnn.py).

Forward and backward are judged against a float64 CPU copy of the same module, with a bound
derived from the dtype's eps and the sequence length (the errors of a recurrence grow with the
steps); kernel counts come from stats() (one launch per layer forward, one per layer backward);
the calls outside the kernels' scope must take the decomposition (counted by reason in
stats()["rnn_seq_fallbacks"]) and still equal the CPU.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import eager_neuron


def _bound(dtype, T: int) -> float:
    # NOTE: each step's error is a few eps of the gates' magnitude (sums of I + H products);
    # backpropagated through T steps it adds up about linearly (gates are contracting)
    return 200.0 * torch.finfo(dtype).eps * T


def _pair(dtype, seed=0, kind="LSTM", **kw):
    torch.manual_seed(seed)
    ref = getattr(nn, kind)(**kw).double()
    dev = copy.deepcopy(ref).to(dtype).to("neuron")
    return ref, dev


def _inputs(ref, T, B, dtype, with_hx, seed=1):
    g = torch.Generator().manual_seed(seed)
    bf, D = ref.batch_first, 2 if ref.bidirectional else 1
    x = torch.randn(*((B, T) if bf else (T, B)), ref.input_size, generator=g, dtype=torch.float64)
    hx = None
    if with_hx:
        hx = tuple(0.5 * torch.randn(ref.num_layers * D, B, ref.hidden_size, generator=g,
                                     dtype=torch.float64) for _ in range(2))
    return x, hx


def _run(m, x, hx, gy, gh, gc):
    """Forward, then backward of a weighted sum of all three outputs; returns values and grads."""
    x = x.detach().requires_grad_()
    hx = None if hx is None else tuple(h.detach().requires_grad_() for h in hx)
    if isinstance(m, nn.GRU):
        hx = None if hx is None else hx[:1]
        y, h = m(x, None if hx is None else hx[0])
        outs = [y, h]
    else:
        y, (h, c) = m(x, hx)
        outs = [y, h, c]
    loss = sum((o * w).sum() for o, w in zip(outs, (gy, gh, gc)))
    loss.backward()
    grads = [x.grad] + ([] if hx is None else [t.grad for t in hx])
    grads += [p.grad for p in m.parameters()]
    return outs + grads


def _check(ref, dev, T, B, dtype, with_hx=True):
    x, hx = _inputs(ref, T, B, dtype, with_hx)
    out_ref = _run(ref, x, hx, *_weights_for(ref, x, T, B))
    to = lambda t: None if t is None else t.to(dtype).to("neuron")   # noqa: E731
    eager_neuron.reset_stats()
    out_dev = _run(dev, to(x), None if hx is None else tuple(to(h) for h in hx),
                   *(to(w) for w in _weights_for(ref, x, T, B)))
    stats = eager_neuron.stats()
    bound = _bound(dtype, T)
    for i, (r, d) in enumerate(zip(out_ref, out_dev)):
        assert d.device.type == "neuron" and d.dtype == dtype, i
        err = (d.cpu().double() - r).abs().max().item()
        scale = max(1.0, r.abs().max().item())
        assert err <= bound * scale, f"output {i}: error {err:.3e} > {bound * scale:.3e}"
    return stats


def _weights_for(ref, x, T, B):
    g = torch.Generator().manual_seed(7)
    D = 2 if ref.bidirectional else 1
    yshape = (B, T, D * ref.hidden_size) if ref.batch_first else (T, B, D * ref.hidden_size)
    hshape = (ref.num_layers * D, B, ref.hidden_size)
    return (torch.randn(yshape, generator=g, dtype=torch.float64),
            torch.randn(hshape, generator=g, dtype=torch.float64),
            torch.randn(hshape, generator=g, dtype=torch.float64))


CONFIGS = [
    # (num_layers, bidirectional, batch_first, bias, with_hx)
    (1, False, False, True, True),
    (2, False, True, True, False),
    (2, True, True, True, True),
    (3, True, False, False, True),
    (1, True, True, False, False),
    (2, False, False, False, True),
]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layers,bidir,bf,bias,with_hx", CONFIGS)
def test_matches_float64_cpu(layers, bidir, bf, bias, with_hx, dtype, kind):
    ref, dev = _pair(dtype, kind=kind, input_size=5, hidden_size=7, num_layers=layers,
                     bidirectional=bidir, batch_first=bf, bias=bias)
    stats = _check(ref, dev, T=9, B=3, dtype=dtype, with_hx=with_hx)
    assert stats["rnn_seq_calls"] == 1 and not stats["rnn_seq_fallbacks"]
    assert not stats["fallbacks"]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_launches_per_layer(kind):
    """One forward launch and one backward launch per layer, whatever the sequence length."""
    ref, dev = _pair(torch.float32, kind=kind, input_size=6, hidden_size=10, num_layers=2,
                     batch_first=True)
    x = torch.randn(3, 25, 6, device="neuron")
    h = torch.zeros(2, 3, 10, device="neuron")
    hx = h if kind == "GRU" else (h, h)
    dev(x, hx)   # compiled and cached
    y, _ = dev(x, hx)
    gy = torch.ones_like(y)
    eager_neuron.reset_stats()
    y, _ = dev(x, hx)
    assert eager_neuron.stats()["launches"] == 2
    eager_neuron.reset_stats()
    y.backward(gy)
    # the two layers' BPTT, then the parameters' grads are added to the existing .grad (8 adds)
    # at most: nothing per time step
    assert eager_neuron.stats()["launches"] <= 2 + 8


def test_eval_dropout_and_no_grad_take_the_kernels():
    ref, dev = _pair(torch.float32, input_size=4, hidden_size=6, num_layers=2, dropout=0.3)
    ref.eval()
    dev.eval()
    x, hx = _inputs(ref, 6, 2, torch.float32, True)
    eager_neuron.reset_stats()
    with torch.no_grad():
        y, (h, c) = dev(x.float().to("neuron"), tuple(t.float().to("neuron") for t in hx))
    stats = eager_neuron.stats()
    assert stats["rnn_seq_calls"] == 1 and stats["launches"] == 2
    yr, (hr, cr) = ref(x, hx)
    for a, b in ((y, yr), (h, hr), (c, cr)):
        torch.testing.assert_close(a.cpu().double(), b, rtol=0, atol=_bound(torch.float32, 6))


def test_noncontiguous_input_and_expanded_hidden():
    ref, dev = _pair(torch.float32, input_size=4, hidden_size=5, num_layers=2, batch_first=True)
    g = torch.Generator().manual_seed(3)
    xw = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    h0 = torch.randn(1, 1, 5, generator=g, dtype=torch.float64).expand(2, 2, 5)
    yr, (hr, cr) = ref(xw[:, :, ::2], (h0, h0))
    xd = xw.float().to("neuron")
    hd = h0[:1, :1].float().to("neuron").expand(2, 2, 5)
    eager_neuron.reset_stats()
    y, (h, c) = dev(xd[:, :, ::2], (hd, hd))
    assert eager_neuron.stats()["rnn_seq_calls"] == 1
    for a, b in ((y, yr), (h, hr), (c, cr)):
        torch.testing.assert_close(a.cpu().double(), b, rtol=0, atol=_bound(torch.float32, 6))


def test_output_layout_as_cpu():
    for bf in (False, True):
        m = nn.LSTM(3, 4, batch_first=bf)
        x = torch.randn(2, 5, 3)
        y_cpu = m(x)[0]
        y = copy.deepcopy(m).to("neuron")(x.to("neuron"))[0]
        assert y.shape == y_cpu.shape and y.stride() == y_cpu.stride()


class _Watch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_autocast_takes_the_decomposition():
    """Under autocast the decomposition's products are autocast ops: it runs as before."""
    torch.manual_seed(0)
    m = nn.LSTM(3, 4).to("neuron")
    x = torch.randn(5, 2, 3, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        eager_neuron.reset_stats()
        y = m(x)[0]
        assert eager_neuron.stats()["rnn_seq_fallbacks"] == {"autocast": 1}
        h0 = torch.zeros(1, 2, 4, device="neuron")
        ref = torch.ops.aten.lstm.input.decompose(x, [h0, h0], m._flat_weights, True, 1, 0.0,
                                                  True, False, False)[0]
    assert y.dtype == ref.dtype
    torch.testing.assert_close(y.cpu(), ref.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["proj_size", "train_dropout", "dispatch_mode"])
def test_fallbacks_are_counted_and_equal_cpu(case):
    kw = dict(input_size=4, hidden_size=6, num_layers=2, batch_first=True)
    if case == "proj_size":
        kw["proj_size"] = 3
    if case == "train_dropout":
        kw["dropout"] = 0.4
    torch.manual_seed(0)
    cpu = nn.LSTM(**kw)
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(2, 5, 4)
    eager_neuron.reset_stats()
    torch.manual_seed(5)   # dropout masks come from the shared CPU generator on both devices
    if case == "dispatch_mode":
        with _Watch():
            y, (h, c) = dev(x.to("neuron"))
    else:
        y, (h, c) = dev(x.to("neuron"))
    y.sum().backward()
    reasons = eager_neuron.stats()["rnn_seq_fallbacks"]
    assert eager_neuron.stats()["rnn_seq_calls"] == 0
    want = {"proj_size": "shapes or proj_size", "train_dropout": "dropout while training",
            "dispatch_mode": "dispatch mode or tracer"}[case]
    assert reasons == {want: 1}
    torch.manual_seed(5)
    yc, (hc, cc) = cpu(x)   # dropout: the same masks (the fallback is ATen's C++ composite)
    yc.sum().backward()
    for a, b in ((y, yc), (h, hc), (c, cc)):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_double_backward_takes_the_decomposition(kind):
    ref, dev = _pair(torch.float64, kind=kind, input_size=3, hidden_size=4, num_layers=2)
    x, hx = _inputs(ref, 4, 2, torch.float64, False)
    outs = []
    eager_neuron.reset_stats()
    for m, dv in ((ref, "cpu"), (dev, "neuron")):
        xi = x.to(dv).requires_grad_()
        y, _ = m(xi)
        (gx,) = torch.autograd.grad(y.pow(2).sum(), xi, create_graph=True)
        gx.pow(2).sum().backward()
        outs.append([gx.detach().cpu()] + [p.grad.cpu() for p in m.parameters()])
    assert eager_neuron.stats()["rnn_seq_fallbacks"].get("create_graph or foreign grads") == 1
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_wrong_sizes_error_as_cpu():
    m = nn.LSTM(4, 3)
    md = copy.deepcopy(m).to("neuron")
    x = torch.randn(5, 2, 6)
    bad_h = (torch.zeros(1, 3, 3), torch.zeros(1, 3, 3))
    for args in ((x,), (x[..., :4], bad_h)):
        msgs = []
        for mod, dv in ((m, "cpu"), (md, "neuron")):
            with pytest.raises(RuntimeError) as info:
                mod(*(a.to(dv) if isinstance(a, torch.Tensor) else tuple(t.to(dv) for t in a)
                      for a in args))
            msgs.append(str(info.value).splitlines()[0])
        assert msgs[0] == msgs[1], msgs
    # the aten op called directly with a wrong feature size: the CPU's mkldnn path does not
    # check it (it returns a result); on neuron the decomposition raises, as it did before
    w = [p.detach().to("neuron") for p in m._flat_weights]
    hx = [torch.zeros(1, 2, 3, device="neuron")] * 2
    eager_neuron.reset_stats()
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.lstm(x.to("neuron"), hx, w, True, 1, 0.0, False, False, False)
    assert eager_neuron.stats()["rnn_seq_fallbacks"] == {"shapes or proj_size": 1}


def test_adaptive_eager_pending_input_and_grads():
    """The input is produced by ops adaptive eager is still holding: the kernel sees them."""
    ref, dev = _pair(torch.float32, input_size=4, hidden_size=5, num_layers=2)
    x, hx = _inputs(ref, 6, 3, torch.float32, True)
    yr, (hr, cr) = ref(x * 2.0 + 1.0, hx)
    (yr.sum() + hr.sum()).backward()
    with eager_neuron.adaptive():
        xd = x.float().to("neuron")
        xs = xd * 2.0 + 1.0      # pending in the fused group
        y, (h, c) = dev(xs, tuple(t.float().to("neuron") for t in hx))
        (y.sum() + h.sum()).backward()
        got = [y.cpu(), h.cpu(), c.cpu()] + [p.grad.cpu() for p in dev.parameters()]
    want = [yr, hr, cr] + [p.grad for p in ref.parameters()]
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=_bound(torch.float32, 6) * 10)


class _GRURegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size=6, hidden_size=10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 1)

    def forward(self, x):
        out, h = self.gru(x)
        return self.head(out[:, -1]) + h[-1].sum(-1, keepdim=True)


@pytest.mark.parametrize("mode", ["plain", "adaptive"])
def test_gru_training_matches_cpu(mode):
    """3 AdamW steps of a GRU model (as tests/test_models.py trains the LSTM one)."""
    torch.manual_seed(0)
    model = _GRURegressor()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(3, 7, 6, generator=g), torch.randn(3, 1, generator=g))
               for _ in range(3)]

    def train(m, device):
        m = m.to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)
        losses = []
        for x, y in batches:
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, m

    cpu_losses, cpu_m = train(copy.deepcopy(model), "cpu")
    eager_neuron.reset_stats()
    ctx = eager_neuron.adaptive() if mode == "adaptive" else contextlib.nullcontext()
    with ctx:
        losses, m = train(model, "neuron")
    stats = eager_neuron.stats()
    assert stats["rnn_seq_calls"] == 3 and not stats["rnn_seq_fallbacks"]
    assert not stats["fallbacks"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4,
                               atol=1e-5)
    for (name, a), b in zip(m.state_dict().items(), cpu_m.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=name)


def test_grads_accumulate_and_zero_in_place():
    """The parameters' grads of one backward share one allocation: accumulating a second
    backward into them, zeroing them in place and a third backward keep each grad its own."""
    torch.manual_seed(0)
    cpu = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    dev = copy.deepcopy(cpu).to("neuron")
    xs = [torch.randn(5, 2, 3) for _ in range(3)]
    for m, dv in ((cpu, "cpu"), (dev, "neuron")):
        for i, x in enumerate(xs):
            if i == 2:
                for p in m.parameters():
                    p.grad.zero_()
            y, (h, c) = m(x.to(dv))
            (y.pow(2).sum() + c.sum()).backward()
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_large_products_take_blas(kind):
    """Per-step products above kernels/rnn.py SMALL multiply-adds run in MKL (when torch exports
    it), the small ones as loops: both must match."""
    from eager_neuron.kernels import rnn as krnn

    B, H, I = 16, 48, 40
    assert B * 4 * H * I > krnn.SMALL and B * 3 * H * H > krnn.SMALL
    ref, dev = _pair(torch.float32, kind=kind, input_size=I, hidden_size=H, num_layers=2,
                     bidirectional=True, batch_first=True)
    stats = _check(ref, dev, T=5, B=B, dtype=torch.float32)
    assert stats["rnn_seq_calls"] == 1 and not stats["rnn_seq_fallbacks"]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_one_kernel_signature_for_every_layer(kind, monkeypatch):
    """Layer 0 of a batch_first call reads x as laid out, so every layer's launch has the same
    argument types: one compiled kernel forward and one backward, not one per layout."""
    from eager_neuron import launch as launch_mod
    from eager_neuron.lower import rnn_seq

    seen = set()
    real = rnn_seq.launch

    def spy(key, render, args, **kw):
        seen.add((key, launch_mod.arg_types(args)))
        real(key, render, args, **kw)

    monkeypatch.setattr(rnn_seq, "launch", spy)
    ref, dev = _pair(torch.float32, kind=kind, input_size=5, hidden_size=6, num_layers=3,
                     batch_first=True)
    x = torch.randn(2, 4, 5, device="neuron", requires_grad=True)
    y = dev(x)[0]
    y[:, -1].sum().backward()
    assert len(seen) == 2, seen


def test_packed_sequences_as_on_cuda():
    """pack_padded_sequence of a neuron batch: `batch_sizes` stays on the CPU (PackedSequence
    refuses any other device; the CPU fallback used to move it); a GRU over the packed batch,
    unpacked and backpropagated, equals float64 on the CPU, with no fallback."""
    ref, dev = _pair(torch.float32, kind="GRU", input_size=4, hidden_size=5, batch_first=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    lens = torch.tensor([4, 6, 2])   # unsorted: pack sorts, index_select on the device
    eager_neuron.reset_stats()
    outs = []
    for m, xin in ((ref, x), (dev, x.float().to("neuron"))):
        xin = xin.detach().requires_grad_()
        p = nn.utils.rnn.pack_padded_sequence(xin, lens, batch_first=True, enforce_sorted=False)
        assert p.batch_sizes.device.type == "cpu" and p.data.device == xin.device
        y, h = m(p)
        yp, ylens = nn.utils.rnn.pad_packed_sequence(y, batch_first=True)
        assert ylens.device.type == "cpu"
        (yp.square().sum() + h.sum()).backward()
        outs.append([yp, h, xin.grad, m.weight_hh_l0.grad])
    assert not eager_neuron.stats()["fallbacks"]
    for want, got in zip(*outs):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0,
                                   atol=_bound(torch.float32, 6) * (1 + want.abs().max().item()))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_dropout_between_layers_draws_the_cpus_masks(kind):
    """Same seed, same masks: a multi-layer LSTM/GRU with dropout, training, equals the CPU's
    (the fallback used torch's Python decomposition, which draws its masks in another order:
    outputs differed by ~0.1); gradients too."""
    ref, dev = _pair(torch.float32, kind=kind, input_size=4, hidden_size=6, num_layers=3,
                     dropout=0.4, bidirectional=True)
    ref = ref.float()
    x = torch.randn(5, 2, 4)
    outs = []
    for m, xin in ((ref, x), (dev, x.to("neuron"))):
        torch.manual_seed(11)
        y = m(xin)[0]
        y.square().sum().backward()
        outs.append([y, m.weight_ih_l1.grad])
    for want, got in zip(*outs):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
