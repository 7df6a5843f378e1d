"""What real libraries (sentence-transformers, Lightning, torchmetrics, torch.distributions,
torch.func, ...) do on `neuron`, reduced to pure torch: each test is the minimal reproduction of
a failure tools/probe_libraries.py found, run in plain and adaptive eager against the CPU.
"""

from __future__ import annotations

import contextlib
import math

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
    # x.view(dtype) is no autograd view: an inference tensor, as ATen makes it
    with torch.inference_mode():
        assert dev.view(torch.int32).is_inference() == ref.view(torch.int32).is_inference()


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


# ---------------------------------------------------------------------------------------------
# random ops that ran as CPU fallbacks (torch.distributions' Binomial and Dirichlet, F.rrelu_
# in training, functional random): they draw from the CPU generator on the host, as poisson and
# _standard_gamma already did: the CPU's numbers for the same seed, no fallback


def _draws(dev):
    out = {}
    torch.manual_seed(0)
    count = torch.tensor([3.0, 10.0, 0.0, 5.0]).to(dev)
    prob = torch.tensor([0.2, 0.5, 0.7, 1.0]).to(dev)
    out["binomial"] = torch.binomial(count, prob)
    conc = torch.tensor([[0.5, 1.0, 2.0], [3.0, 1.0, 0.1]]).to(dev)
    out["dirichlet"] = torch._sample_dirichlet(conc)
    x = torch.randn(3, 4).to(dev)
    out["rrelu_"] = torch.nn.functional.rrelu_(x.clone(), training=True)
    out["random"] = torch.ops.aten.random(torch.empty(5).to(dev), 0, 10)
    out["random_to"] = torch.ops.aten.random.to(torch.empty(5).to(dev), 7)
    d = torch.distributions
    out["Binomial"] = d.Binomial(torch.tensor([4.0, 9.0]).to(dev),
                                 probs=torch.tensor([0.3, 0.6]).to(dev)).sample((3,))
    out["Dirichlet"] = d.Dirichlet(torch.tensor([0.5, 2.0, 4.0]).to(dev)).sample((2,))
    out["after"] = torch.rand(3).to(dev)   # the generator advanced as on the CPU
    return out


@pytest.mark.parametrize("mode", MODES)
def test_random_ops_draw_on_the_host_not_a_fallback(mode, stats_delta):
    want = _draws("cpu")
    with _mode(mode):
        got = _draws("neuron")
        torch.neuron.synchronize()
    for k in want:
        assert got[k].device.type == "neuron", k
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k].cpu(), want[k]), k   # the CPU's own draws, moved
    assert stats_delta()["fallbacks"] == {}


# ---------------------------------------------------------------------------------------------
# forward-mode AD (torch.func.jvp / jacfwd / hessian, torch.autograd.forward_ad): two metadata
# ops autograd asks when a tangent is set ran as CPU fallbacks


@pytest.mark.parametrize("nb", [0, 1, 2])
def test_new_zeros_with_same_feature_meta(nb, stats_delta):
    for base in (torch.arange(10.0), torch.arange(12.0).view(3, 4)):
        other = base.flatten()[2:5] if base.dim() == 1 else base.t()
        self_ = torch.ones(2, 3, *other.shape)
        want = torch.ops.aten._new_zeros_with_same_feature_meta(self_, other,
                                                                 self_num_batch_dims=nb)
        dev_base = base.to("neuron")
        dev_other = dev_base.flatten()[2:5] if base.dim() == 1 else dev_base.t()
        got = torch.ops.aten._new_zeros_with_same_feature_meta(self_.to("neuron"), dev_other,
                                                                self_num_batch_dims=nb)
        assert got.device.type == "neuron"
        assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == (
            want.shape, want.stride(), want.storage_offset(), want.dtype)
        assert got.untyped_storage().nbytes() == want.untyped_storage().nbytes()
        assert torch.equal(got.cpu(), want)
    assert torch.ops.aten._has_same_storage_numel(dev_base[1:], dev_base)
    assert not torch.ops.aten._has_same_storage_numel(dev_base[1:], dev_base[1:].clone())
    assert stats_delta()["fallbacks"] == {}


@pytest.mark.parametrize("mode", MODES)
def test_forward_mode_ad_on_views(mode, stats_delta):
    import torch.autograd.forward_ad as fwAD
    from torch.func import hessian, jacfwd, jvp

    def run(dev):
        out = {}
        base = torch.arange(10.0, dtype=torch.float64, device=dev)
        with fwAD.dual_level():
            x = base.clone().view(2, 5)
            d = fwAD.make_dual(x.t(), torch.ones(5, 2, dtype=torch.float64, device=dev))
            y = (d * d).sum(0)
            out["tangent"] = fwAD.unpack_dual(y).tangent
            out["stride"] = torch.tensor(fwAD.unpack_dual(d).tangent.stride())
            v = fwAD.make_dual(base[2:5], torch.arange(3.0, dtype=torch.float64, device=dev))
            out["view_tangent"] = fwAD.unpack_dual(v.exp()).tangent
        v = torch.linspace(-1, 1, 4, dtype=torch.float64, device=dev)
        out["jvp"] = jvp(lambda t: t.sin() * t, (v,), (torch.ones_like(v),))[1]
        out["jacfwd"] = jacfwd(lambda t: t.sin() * t)(v)
        out["hessian"] = hessian(lambda t: (t.sin() * t).sum())(v)
        return out

    want = run("cpu")
    with _mode(mode):
        got = run("neuron")
    for k in want:   # float64 on both: the same formulas, at float64's rounding
        torch.testing.assert_close(got[k].cpu(), want[k], rtol=1e-12, atol=1e-12)
    assert stats_delta()["fallbacks"] == {}


# ---------------------------------------------------------------------------------------------
# Lightning (not a test dependency: skipped without it). Trainer(accelerator="neuron") was
# refused ("invalid accelerator name"), and a hand-written accelerator trained on the CPU:
# Lightning gives an accelerator it does not list a CPU single-device strategy


def _lit_run(accelerator, precision="32-true", dtype=torch.float64):
    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(8, 4, dtype=dtype)
            self.seen = set()

        def training_step(self, batch, idx):
            x, y = batch
            out = self.net(x)
            self.seen.add((x.device.type, out.dtype))
            return torch.nn.functional.cross_entropy(out, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(24, 8, generator=g, dtype=dtype),
                         torch.randint(0, 4, (24,), generator=g))
    lit = Lit()
    trainer = L.Trainer(accelerator=accelerator, devices=1, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, precision=precision)
    trainer.fit(lit, DataLoader(data, batch_size=8))
    return lit, trainer


def test_lightning_trainer_accelerator_neuron():
    want, _ = _lit_run("cpu")
    got, trainer = _lit_run("neuron")
    assert trainer.strategy.root_device == torch.device("neuron", 0)
    assert got.seen == {("neuron", torch.float64)}
    # float64 on both: the same SGD steps at float64's rounding
    torch.testing.assert_close(got.net.weight.cpu(), want.net.weight, rtol=1e-12, atol=1e-12)


def test_lightning_bf16_mixed_autocasts_on_neuron():
    got, trainer = _lit_run("neuron", "bf16-mixed", torch.float32)
    assert type(trainer.precision_plugin).__name__ == "MixedPrecision"
    assert got.seen == {("neuron", torch.bfloat16)}   # Lightning's "cuda" autocast: float32


def test_lightning_fabric_and_devices():
    L = pytest.importorskip("lightning")
    fabric = L.Fabric(accelerator="neuron", devices=1)
    assert fabric.device == torch.device("neuron", 0)
    model, opt = fabric.setup(torch.nn.Linear(3, 2), torch.optim.SGD([torch.nn.Parameter(
        torch.zeros(1))], lr=0.1))
    assert next(model.parameters()).device.type == "neuron"
    trainer = L.Trainer(accelerator="neuron", devices=[1], logger=False)
    assert trainer.strategy.root_device == torch.device("neuron", 1)
    with pytest.raises(ValueError, match="neuron cores"):
        L.Trainer(accelerator="neuron", devices=torch.neuron.device_count() + 1)


# ---------------------------------------------------------------------------------------------
# F.interpolate(mode="bicubic", antialias=True) (image resizing, torchvision-style Resize on
# tensors) and its backward ran as CPU fallbacks; antialiased bilinear already had kernels

_AA_CASES = [((5, 7), {}), ((16, 16), {}), ((3, 20), {}), (None, {"scale_factor": 0.37}),
             (None, {"scale_factor": 2.5}), ((4, 4), {"align_corners": True})]


@pytest.mark.parametrize("size,kw", _AA_CASES)
def test_bicubic_antialias_forward_backward(size, kw, stats_delta):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, 13, dtype=torch.float64, generator=g, requires_grad=True)
    ref = F.interpolate(x, size=size, mode="bicubic", antialias=True, **kw)
    grad_out = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    ref.backward(grad_out)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        xd = x.detach().to("neuron", dtype).requires_grad_()
        out = F.interpolate(xd, size=size, mode="bicubic", antialias=True, **kw)
        out.backward(grad_out.to("neuron", dtype))
        assert out.dtype == dtype and out.shape == ref.shape
        # the float64 CPU result is the reference for both (float32: its rounding bound)
        torch.testing.assert_close(out.cpu().double(), ref.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(xd.grad.cpu().double(), x.grad, rtol=tol, atol=tol)
    assert stats_delta()["fallbacks"] == {}


# ---------------------------------------------------------------------------------------------
# F.scaled_dot_product_attention with a boolean mask on the math path (dropout in training:
# BERT/sentence-transformers fine-tuning with attention dropout; float64; 3-d inputs): the mask
# was added to the scores as 0/1 instead of masking (a silent wrong answer, 2.5 off in float64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype,shape,p", [
    (torch.float64, (2, 2, 5, 4), 0.0), (torch.float64, (2, 2, 5, 4), 0.3),
    (torch.float32, (2, 2, 5, 4), 0.3), (torch.float32, (2, 5, 4), 0.0),
    (torch.float64, (2, 5, 4), 0.3)])
def test_sdpa_boolean_mask_on_the_math_path(mode, dtype, shape, p):
    F = torch.nn.functional

    def run(dev):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(*shape, dtype=dtype, generator=g).to(dev).requires_grad_()
                   for _ in range(3))
        keep = (torch.rand(5, 5, generator=g) > 0.3).to(dev)
        keep[:, 0] = True   # no fully masked row
        torch.manual_seed(3)   # the dropout mask: the CPU's generator on both devices
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        out.backward(torch.ones_like(out))
        return out, q.grad, k.grad, v.grad

    want = run("cpu")
    with _mode(mode):
        got = run("neuron")
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for w, gt in zip(want, got):
        torch.testing.assert_close(gt.cpu(), w, rtol=tol, atol=tol)
    if p == 0.0:
        # masked keys take no part: the same as dropping them from k and v (an exact check
        # independent of the CPU's kernel)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(*shape, dtype=dtype, generator=g).double() for _ in range(3))
        keep = torch.rand(5, 5, generator=g) > 0.3
        keep[:, 0] = True
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(shape[-1])
        ref = scores.masked_fill(~keep, -math.inf).softmax(-1) @ v
        torch.testing.assert_close(got[0].cpu().double(), ref, rtol=tol * 10, atol=tol * 10)


# ---------------------------------------------------------------------------------------------
# ATen's warnings at every call: var/std with degrees of freedom <= 0 (a batch of one in a
# normalization or a metric) warned at most on the first call on neuron (the fast path replays
# the kernel), and not at all from some call shapes


@pytest.mark.parametrize("mode", MODES)
def test_variance_dof_warning_every_call_at_the_users_line(mode):
    import warnings

    def calls(dev):
        x = torch.arange(3.0, device=dev).view(1, 3)
        return [lambda: x.std(dim=0), lambda: torch.ones(1, device=dev).var(),
                lambda: x.var(dim=0, correction=2), lambda: torch.var_mean(x, 0),
                lambda: torch.std_mean(x, 1, correction=3), lambda: x.std(dim=1),
                lambda: torch.ones(0, 3, device=dev).var(0),
                lambda: torch.ones(2, dtype=torch.cfloat, device=dev).var(correction=2)]

    def run(dev):
        seen = []
        for f in calls(dev):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for _ in range(3):   # repeats take the fast path
                    f()
                if dev != "cpu":
                    torch.neuron.synchronize()
            seen.append([(str(m.message).split(" (Triggered")[0], m.filename) for m in w])
        return seen

    want = run("cpu")
    with _mode(mode):
        got = run("neuron")
    # (ATen's complex variance warns once per part: real and imaginary)
    assert [len(w) for w in want] == [3, 3, 3, 3, 3, 0, 3, 6]
    assert got == want   # the same messages, three times each, at this file's lines


_ONCE_SCRIPT = """
import sys, warnings
import torch, eager_neuron
warnings.simplefilter("always")
dev = sys.argv[1]
A = torch.eye(3, device=dev) * 2 + 0.1
calls = [
    lambda: torch.cholesky(A),
    lambda: torch.cholesky(A, upper=True),
    lambda: torch.triangular_solve(torch.ones(3, 2, device=dev), A),
    lambda: torch.bucketize(A.t(), torch.tensor([0.5, 1.5], device=dev)),
    lambda: torch.searchsorted(torch.tensor([0.5, 1.5], device=dev), A.t()),
    lambda: torch.searchsorted(torch.tensor([[0.5, 1.5]] * 3, device=dev).t().contiguous().t(),
                               A),
    lambda: A.clone().index_reduce_(0, torch.tensor([0, 0], device=dev), A[:2], "prod"),
    lambda: A.clone().scatter_(0, torch.zeros(1, 3, dtype=torch.long, device=dev), A[:1],
                               reduce="add"),
    lambda: A.clone().scatter_(0, torch.zeros(1, 3, dtype=torch.long, device=dev), 2.0,
                               reduce="multiply"),
]
with warnings.catch_warnings(record=True) as w:
    for _ in range(3):
        for f in calls:
            f()
for m in w:
    print(repr((str(m.message).split(" (Triggered internally")[0], m.filename, m.lineno)))
"""


def test_once_per_process_warnings_of_aten_kernels(tmp_path):
    """ATen kernels neuron replaces warn once per process (TORCH_WARN_ONCE): torch.cholesky's
    and torch.triangular_solve's deprecations, searchsorted/bucketize's non-contiguous
    operands, index_reduce's beta notice, scatter's reduce= with a Tensor src. Neuron's
    kernels gave none of them."""
    import subprocess
    import sys

    script = tmp_path / "once.py"
    script.write_text(_ONCE_SCRIPT)
    seen = {}
    for dev in ("cpu", "neuron"):
        proc = subprocess.run([sys.executable, str(script), dev], capture_output=True,
                              text=True, timeout=300, check=False, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[dev] = proc.stdout.splitlines()
    assert len(seen["cpu"]) == 6, seen["cpu"]   # once each (input value and boundary apart)
    assert seen["neuron"] == seen["cpu"]   # same texts, file and lines


# ---------------------------------------------------------------------------------------------
# binary_cross_entropy with a target outside [0, 1] (soft labels gone wrong, label smoothing
# bugs): the CPU raises, neuron returned a number (a silent wrong answer)


@pytest.mark.parametrize("mode", MODES)
def test_bce_target_out_of_range_raises(mode):
    F = torch.nn.functional
    p = torch.full((2, 3), 0.25)
    cases = [(p, torch.full((2, 3), 1.5), "target"), (p, torch.full((2, 3), -0.1), "target"),
             (p, torch.full((2, 3), float("nan")), "target"), (p * 5, torch.full((2, 3), 2.0),
                                                                 "input")]
    with _mode(mode):
        for x, t, what in cases:
            for _ in range(3):   # repeats replay the fast path's runner and its check
                with pytest.raises(RuntimeError, match=f"all elements of {what} should be "
                                                       "between 0 and 1") as cpu:
                    F.binary_cross_entropy(x, t)
                with pytest.raises(RuntimeError) as dev:
                    F.binary_cross_entropy(x.to("neuron"), t.to("neuron"))
                    torch.neuron.synchronize()
                assert str(cpu.value) in str(dev.value)
        # in range: the value, float64 reference
        t = torch.tensor([[0.0, 0.3, 1.0], [1.0, 0.5, 0.0]])
        got = F.binary_cross_entropy(p.to("neuron"), t.to("neuron"))
        want = F.binary_cross_entropy(p.double(), t.double())
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_searchsorted_sorter_out_of_range_raises(mode):
    """torch.searchsorted(..., sorter=) with an index outside the sequence: the CPU raises
    before searching; neuron searched with it (reading outside the sequence). Repeats of one
    signature replay the fast path's runner, which must check its own sorter."""
    seq = torch.tensor([[3.0, 1.0, 2.0]])
    v = torch.tensor([[1.5, 2.5]])
    with _mode(mode):
        for s in ([[1, 2, 0]], [[1, 2, 0]], [[1, 2, 0]], [[1, 5, 0]], [[-1, 2, 0]],
                  [[1, 2, 0]]):
            sorter = torch.tensor(s)
            try:
                want = torch.searchsorted(seq, v, sorter=sorter)
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match="sorter index out of range"):
                    torch.searchsorted(seq.to("neuron"), v.to("neuron"),
                                       sorter=sorter.to("neuron"))
                    torch.neuron.synchronize()
                assert "sorter index out of range" in str(e)
                continue
            got = torch.searchsorted(seq.to("neuron"), v.to("neuron"), sorter=sorter.to("neuron"))
            assert torch.equal(got.cpu(), want)


# ---------------------------------------------------------------------------------------------
# nll_loss / cross_entropy target dtypes: an int32 target was accepted on neuron (the CPU
# refuses it: labels built with .int() silently trained), a uint8 target (the CPU takes it for
# 1-d nll_loss) was refused with an unrelated gather() error from the meta function

_NLL_DTYPES = [torch.int32, torch.uint8, torch.int16, torch.int8, torch.int64]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", _NLL_DTYPES)
def test_nll_loss_target_dtypes_as_the_cpu(mode, dtype):
    A = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64).log_softmax(1)
    x2 = torch.randn(2, 5, 3, 3, generator=g, dtype=torch.float64).log_softmax(1)
    t = torch.tensor([0, 2, 1, 3]).to(dtype)
    t2 = torch.randint(0, 5, (2, 3, 3), generator=g).to(dtype)

    def calls(d):
        X, X2, T, T2 = x.to(d), x2.to(d), t.to(d), t2.to(d)
        one = torch.tensor(1.0, dtype=torch.float64).to(d)
        return [lambda: A.nll_loss_forward(X, T, None, 1, -100),
                lambda: A.nll_loss2d_forward(X2, T2, None, 1, -100),
                lambda: A.nll_loss_backward(one, X, T, None, 1, -100, one * 4),
                lambda: A.nll_loss2d_backward(one, X2, T2, None, 1, -100, one * 18),
                lambda: torch.nn.functional.cross_entropy(X.exp(), T)]

    with _mode(mode):
        for fc, fn in zip(calls("cpu"), calls("neuron")):
            try:
                want = fc()
            except RuntimeError as e:
                with pytest.raises(RuntimeError) as got:
                    fn()
                assert str(got.value).splitlines()[0] == str(e).splitlines()[0]
                continue
            got = fn()
            wants = want if isinstance(want, tuple) else (want,)
            gots = got if isinstance(got, tuple) else (got,)
            for w, gt in zip(wants, gots):   # float64 on both
                torch.testing.assert_close(gt.cpu(), w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_median_of_empty_tensor_is_nan(mode):
    """torch.median()/nanmedian() of an empty tensor: the CPU returns NaN (converted to the
    dtype: -2**63 for int64, 0 for int16); neuron raised IndexError."""
    with _mode(mode):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32,
                      torch.int16):
            for f in (lambda t: t.median(), lambda t: t.view(0, 4).median(),
                      lambda t: t.nanmedian() if t.is_floating_point() else t.median()):
                for _ in range(3):   # repeats: no fast-path runner may skip the write
                    want = f(torch.empty(0, dtype=dtype))
                    got = f(torch.empty(0, dtype=dtype, device="neuron"))
                    assert got.dtype == want.dtype and got.shape == want.shape == ()
                    w, g = want.item(), got.cpu().item()
                    assert (math.isnan(w) and math.isnan(g)) if dtype.is_floating_point \
                        else w == g


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.bool])
def test_index_add_integer_alpha_converts_as_aten(mode, dtype):
    """index_add_(..., alpha=-1) on uint8 wraps on the CPU (alpha becomes 255); neuron crashed
    with numpy's OverflowError. An alpha outside the dtype's range is ATen's RuntimeError."""
    x = torch.tensor([5, 250, 7]).to(dtype)
    src = torch.tensor([1, 2]).to(dtype)
    idx = torch.tensor([0, 1])
    with _mode(mode):
        for alpha in (-1, 3, 200, 0, True, -255, -256, 255, 256, -128, -129, 127, 128, 40000,
                      -2**31, 2**31):
            try:
                want = x.index_add(0, idx, src, alpha=alpha)
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match="without overflow"):
                    x.to("neuron").index_add(0, idx.to("neuron"), src.to("neuron"),
                                             alpha=alpha)
                assert "without overflow" in str(e)
                continue
            got = x.to("neuron").index_add(0, idx.to("neuron"), src.to("neuron"), alpha=alpha)
            assert torch.equal(got.cpu(), want), alpha


@pytest.mark.parametrize("mode", MODES)
def test_python_shift_operators_have_no_fallback(mode, stats_delta):
    """`x >> n`, `x << n`, `>>=`, `<<=` (aten::__rshift__ & co.) ran as CPU fallbacks."""
    pairs = [(torch.tensor([8, -200, 5], dtype=torch.int16), 3),
             (torch.tensor([8, 200], dtype=torch.uint8), torch.tensor([9, 1], dtype=torch.uint8)),
             (torch.tensor([-8, 7]), 70), (torch.tensor([-8, 7], dtype=torch.int32),
                                           torch.tensor([1, 2]))]
    with _mode(mode):
        for a, b in pairs:
            bd = b.to("neuron") if isinstance(b, torch.Tensor) else b
            for f in (lambda x, y: x >> y, lambda x, y: x << y):
                want, got = f(a, b), f(a.to("neuron"), bd)
                assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
            x, xd = a.clone(), a.to("neuron")
            x >>= b
            xd >>= bd
            x <<= b
            xd <<= bd
            assert torch.equal(xd.cpu(), x)
        with pytest.raises(NotImplementedError, match="rshift_cpu"):
            torch.tensor([1.0], device="neuron") >> 1   # refused as on the CPU
        torch.neuron.synchronize()
    assert stats_delta()["fallbacks"] == {}
