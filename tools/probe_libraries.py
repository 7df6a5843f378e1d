"""Run real libraries the way researchers use them, on the CPU and on `neuron` (plain eager, then
adaptive eager), with the same seed, and compare results, exceptions and warnings.

    python tools/probe_libraries.py                 # every case of every installed library
    python tools/probe_libraries.py einops peft     # only cases whose library or name matches
    python tools/probe_libraries.py -v              # tracebacks of failing cases

A case is a function of the device returning a pytree of results (tensors, numbers, strings);
the CPU run is the reference. Floats are compared with dtype-derived tolerances (training loops
amplify rounding, so a case may widen them), integers and everything else exactly; an exception
on the CPU must be the same exception type on neuron. Libraries that are not installed are
skipped (listed as `skip`). Prints one row per case: library, case, and the outcome in each mode.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import sys
import tempfile
import traceback
import warnings

_TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_TOP,)]

import torch  # noqa: E402

import eager_neuron  # noqa: E402

CASES: list[tuple[str, str, object, dict]] = []


def case(lib: str, requires: tuple[str, ...] = (), **opts):
    """Register `fn(device) -> results` under library `lib` (needs modules `requires`)."""

    def deco(fn):
        CASES.append((lib, fn.__name__, fn, dict(requires=requires or (lib,), **opts)))
        return fn

    return deco


def have(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


# ---------------------------------------------------------------------------------------------
# comparison


def _flatten(x, prefix="", out=None):
    out = [] if out is None else out
    if isinstance(x, dict):
        for k in sorted(x, key=str):
            _flatten(x[k], f"{prefix}.{k}", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out.append((prefix, x))
    return out


def _tol(dtype, scale):
    base = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5,
            torch.float64: 1e-10, torch.complex64: 1e-5, torch.complex128: 1e-10}.get(dtype)
    return None if base is None else base * scale


def compare(ref, got, scale=1.0) -> str | None:
    """None when `got` (from neuron) matches `ref` (from the CPU), else a description."""
    a, b = _flatten(ref), _flatten(got)
    if [k for k, _ in a] != [k for k, _ in b]:
        return f"structure differs: {[k for k, _ in a][:6]} vs {[k for k, _ in b][:6]}"
    for (k, x), (_, y) in zip(a, b):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor):
                return f"{k}: tensor vs {type(y).__name__}"
            if x.device.type == "cpu" and y.device.type != "cpu":
                pass  # the device is the point of the run; values are compared below
            if x.dtype != y.dtype or x.shape != y.shape:
                return f"{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
            yc = y.detach().cpu()
            xc = x.detach()
            if xc.layout != torch.strided:
                xc, yc = xc.to_dense(), yc.to_dense()
            tol = _tol(x.dtype, scale)
            if tol is None:
                if not torch.equal(xc, yc):
                    return f"{k}: values differ (exact dtype {x.dtype})"
            else:
                nan_a, nan_b = xc.isnan(), yc.isnan()
                if not torch.equal(nan_a, nan_b):
                    return f"{k}: NaN positions differ"
                xd = xc.to(torch.complex128 if x.is_complex() else torch.float64)
                yd = yc.to(xd.dtype)
                fin = ~nan_a
                if not torch.equal(xd[fin].isinf(), yd[fin].isinf()) or not torch.equal(
                        xd[fin & xd.isinf()], yd[fin & xd.isinf()]):
                    return f"{k}: Inf positions differ"
                fin = fin & ~xd.isinf()
                err = (xd[fin] - yd[fin]).abs()
                bound = tol * (1 + xd[fin].abs())
                if err.numel() and bool((err > bound).any()):
                    i = int((err - bound).argmax())
                    return (f"{k}: max err {float(err.max()):.3g} (tol {tol:.1g}), "
                            f"ref {xd[fin].flatten()[i].item()} got {yd[fin].flatten()[i].item()}")
        elif isinstance(x, float):
            if not isinstance(y, float):
                return f"{k}: float vs {type(y).__name__}"
            far = not math.isnan(x) and abs(x - y) > 1e-5 * scale * (1 + abs(x))
            if math.isnan(x) != math.isnan(y) or far:
                return f"{k}: {x!r} vs {y!r}"
        elif isinstance(x, torch.device) or isinstance(y, torch.device):
            continue
        else:
            if type(x) is not type(y) or x != y:
                return f"{k}: {x!r} vs {y!r}"
    return None


# ---------------------------------------------------------------------------------------------
# running


def run_one(fn, dev, mode):
    torch.manual_seed(0)
    ctx = eager_neuron.adaptive() if mode == "adaptive" else contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            with ctx:
                res = fn(dev)
                if dev != "cpu":
                    torch.neuron.synchronize()
            err = None
        except Exception as e:  # noqa: BLE001 - the outcome is what we compare
            res, err = None, e
    msgs = [f"{x.category.__name__}: {x.message} @{os.path.basename(x.filename)}:{x.lineno}"
            for x in w]
    return res, err, msgs


# the CPU fallback is reported from stats(); peft's BOFT warns with its compiler's output
_IGNORED_WARNINGS = ("has no neuron kernel", "Failed to load the CUDA extension",
                     "Traceback of forward call")   # anomaly mode: the harness' own frames


def _warn_diff(ref, got):
    """Warnings on neuron whose text the CPU did not give, and warnings the CPU gave that neuron
    attributes to another line."""
    def text(m):
        return m.rsplit(" @", 1)[0]

    ref_text = {text(m) for m in ref}
    extra = [m for m in got if text(m) not in ref_text]
    moved = [m for m in got if text(m) in ref_text and m not in set(ref)]
    return extra + [f"(at another line) {m}" for m in moved]


def run_case(lib, name, fn, opts, modes, verbose):
    ref, ref_err, ref_w = run_one(fn, "cpu", "plain")
    outcomes = []
    for mode in modes:
        before = eager_neuron.stats().get("fallbacks", {})
        before = dict(before)
        got, err, got_w = run_one(fn, "neuron", mode)
        after = eager_neuron.stats().get("fallbacks", {})
        fb = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        if ref_err is not None:
            if err is None:
                out = f"FAIL: CPU raised {type(ref_err).__name__}, neuron did not"
            elif type(err) is not type(ref_err) and not isinstance(err, type(ref_err)):
                out = (f"FAIL: {type(err).__name__} ({str(err)[:120]}) vs CPU "
                       f"{type(ref_err).__name__}")
            else:
                out = f"ok (both raise {type(ref_err).__name__})"
            if verbose and err is not None and out.startswith("FAIL"):
                traceback.print_exception(err)
        elif err is not None:
            first = str(err).splitlines()[0][:160] if str(err) else ""
            out = f"FAIL: {type(err).__name__}: {first}"
            if verbose:
                traceback.print_exception(err)
        else:
            diff = compare(ref, got, opts.get("scale", 1.0))
            out = "ok" if diff is None else f"FAIL: {diff}"
        extra = _warn_diff(ref_w, got_w)
        extra = [m for m in extra if not any(s in m for s in _IGNORED_WARNINGS)]
        if fb:
            out += f" [CPU fallback: {', '.join(sorted(fb))}]"
        if extra:
            out += f" [extra warnings: {'; '.join(x[:140] for x in extra[:3])}]"
        outcomes.append(out)
    if ref_err is not None and verbose:
        print(f"  ({lib}/{name}: CPU raised {type(ref_err).__name__}: {str(ref_err)[:200]})")
    return outcomes


# ---------------------------------------------------------------------------------------------
# helpers for the cases


def _seq_model(dev, d_in=8, d_hidden=16, d_out=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.GELU(),
                               torch.nn.Linear(d_hidden, d_out)).to(dev)


def _state(model, opt=None):
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if opt is not None:
        st = opt.state_dict()["state"]
        out["opt"] = {str(k): {n: (t.detach().clone() if isinstance(t, torch.Tensor) else t)
                               for n, t in v.items()} for k, v in st.items()}
    return out


# ---- CASES ----
# einops


@case("einops")
def einops_ops(dev):
    import einops

    x = torch.randn(2, 3, 4, 6, device=dev)
    return {
        "rearrange": einops.rearrange(x, "b c h (w p) -> b (c p) h w", p=2),
        "reduce_mean": einops.reduce(x, "b c (h h2) w -> b c h w", "mean", h2=2),
        "reduce_max": einops.reduce(x, "b c h w -> b c", "max"),
        "reduce_sum": einops.reduce(x, "b c h w -> c", "sum"),
        "reduce_prod": einops.reduce(x, "b c h w -> b h", "prod"),
        "repeat": einops.repeat(x[0, 0], "h w -> h w r", r=3),
        "einsum": einops.einsum(x, x, "b c h w, b c h v -> b w v"),
        "pack": einops.pack([x[:, 0], x[:, 1, :, :2]], "b h *")[0],
        "unpack": einops.unpack(torch.randn(2, 5, device=dev), [[2], [3]], "b *")[1],
        "parse": einops.parse_shape(x, "b c _ _"),
    }


@case("einops")
def einops_layers_train(dev):
    from einops.layers.torch import EinMix, Rearrange, Reduce

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2),
        torch.nn.Linear(12, 16),
        EinMix("b t c -> b t d", weight_shape="c d", bias_shape="d", c=16, d=8),
        Reduce("b t d -> b d", "mean"),
        torch.nn.Linear(8, 3),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 3, 8, 8).to(dev)
    y = torch.tensor([0, 1, 2, 1]).to(dev)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": _state(model, opt)}


# ---------------------------------------------------------------------------------------------
# torchmetrics


@case("torchmetrics")
def tm_classification(dev):
    import torchmetrics as tm

    metrics = {
        "acc": tm.Accuracy(task="multiclass", num_classes=5),
        "f1": tm.F1Score(task="multiclass", num_classes=5, average="macro"),
        "prec": tm.Precision(task="multiclass", num_classes=5, average="weighted"),
        "recall": tm.Recall(task="multiclass", num_classes=5, average="micro"),
        "cm": tm.ConfusionMatrix(task="multiclass", num_classes=5),
        "auroc": tm.AUROC(task="multiclass", num_classes=5),
        "ap": tm.AveragePrecision(task="multiclass", num_classes=5),
        "topk": tm.Accuracy(task="multiclass", num_classes=5, top_k=2),
    }
    out = {}
    for k, m in metrics.items():
        m = m.to(dev)
        step = []
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            logits = torch.randn(16, 5, generator=g).to(dev)
            target = torch.randint(0, 5, (16,), generator=g).to(dev)
            step.append(m(logits, target))
        out[k] = {"steps": step, "total": m.compute()}
        m.reset()
    return out


@case("torchmetrics")
def tm_binary(dev):
    import torchmetrics as tm

    out = {}
    for name, m in {
        "acc": tm.Accuracy(task="binary"),
        "auroc": tm.AUROC(task="binary"),
        "auroc_binned": tm.AUROC(task="binary", thresholds=11),
        "f1": tm.F1Score(task="binary"),
        "roc": tm.ROC(task="binary"),
        "prc": tm.PrecisionRecallCurve(task="binary"),
        "mcc": tm.MatthewsCorrCoef(task="binary"),
        "stat": tm.StatScores(task="binary"),
        "calib": tm.CalibrationError(task="binary"),
    }.items():
        m = m.to(dev)
        for i in range(2):
            g = torch.Generator().manual_seed(10 + i)
            p = torch.rand(32, generator=g).to(dev)
            t = torch.randint(0, 2, (32,), generator=g).to(dev)
            m.update(p, t)
        out[name] = m.compute()
    return out


@case("torchmetrics")
def tm_multilabel(dev):
    import torchmetrics as tm

    out = {}
    for name, m in {
        "acc": tm.Accuracy(task="multilabel", num_labels=4),
        "f1": tm.F1Score(task="multilabel", num_labels=4, average="macro"),
        "auroc": tm.AUROC(task="multilabel", num_labels=4),
        "hamming": tm.HammingDistance(task="multilabel", num_labels=4),
        "ap": tm.AveragePrecision(task="multilabel", num_labels=4),
    }.items():
        m = m.to(dev)
        g = torch.Generator().manual_seed(3)
        p = torch.rand(20, 4, generator=g).to(dev)
        t = torch.randint(0, 2, (20, 4), generator=g).to(dev)
        out[name] = m(p, t)
    return out


@case("torchmetrics")
def tm_regression(dev):
    import torchmetrics as tm

    out = {}
    for name, m in {
        "mse": tm.MeanSquaredError(),
        "rmse": tm.MeanSquaredError(squared=False),
        "mae": tm.MeanAbsoluteError(),
        "r2": tm.R2Score(),
        "pearson": tm.PearsonCorrCoef(),
        "spearman": tm.SpearmanCorrCoef(),
        "cos": tm.CosineSimilarity(reduction="mean"),
        "explvar": tm.ExplainedVariance(),
        "mape": tm.MeanAbsolutePercentageError(),
        "kendall": tm.KendallRankCorrCoef(),
    }.items():
        m = m.to(dev)
        for i in range(2):
            g = torch.Generator().manual_seed(20 + i)
            p = torch.randn(25, generator=g).to(dev)
            t = (p + 0.3 * torch.randn(25, generator=g).to(dev))
            if name == "cos":
                p, t = p.view(5, 5), t.view(5, 5)
            m.update(p, t)
        out[name] = m.compute()
    return out


@case("torchmetrics")
def tm_aggregation_collection(dev):
    import torchmetrics as tm

    coll = tm.MetricCollection({
        "acc": tm.Accuracy(task="multiclass", num_classes=3),
        "f1": tm.F1Score(task="multiclass", num_classes=3),
    }, prefix="val_").to(dev)
    mean = tm.MeanMetric().to(dev)
    mx = tm.MaxMetric().to(dev)
    cat = tm.CatMetric().to(dev)
    for i in range(3):
        g = torch.Generator().manual_seed(i)
        logits = torch.randn(8, 3, generator=g).to(dev)
        t = torch.randint(0, 3, (8,), generator=g).to(dev)
        coll.update(logits, t)
        v = logits.sum()
        mean.update(v)
        mx.update(v)
        cat.update(logits[:, 0])
    res = {"coll": coll.compute(), "mean": mean.compute(), "max": mx.compute(),
           "cat": cat.compute()}
    res["state_on_device"] = coll["acc"].tp.device.type == torch.device(dev).type
    sd = coll.state_dict()
    res["sd_keys"] = sorted(sd)
    return res


@case("torchmetrics")
def tm_text_image(dev):
    import torchmetrics as tm

    g = torch.Generator().manual_seed(5)
    a = torch.rand(2, 3, 16, 16, generator=g).to(dev)
    b = (a + 0.05 * torch.randn(2, 3, 16, 16, generator=g).to(dev)).clamp(0, 1)
    out = {
        "psnr": tm.image.PeakSignalNoiseRatio(data_range=1.0).to(dev)(b, a),
        "ssim": tm.image.StructuralSimilarityIndexMeasure(data_range=1.0).to(dev)(b, a),
        "perp": tm.text.Perplexity().to(dev)(torch.randn(2, 6, 7, generator=g).to(dev),
                                              torch.randint(0, 7, (2, 6), generator=g).to(dev)),
    }
    return out


# ---------------------------------------------------------------------------------------------
# pure torch: data, nn.utils, distributions, special, fft, func, hooks, autocast


@case("torch.utils.data", requires=("torch",))
def data_loader_collate(dev):
    from torch.utils.data import (
        BatchSampler,
        DataLoader,
        RandomSampler,
        TensorDataset,
        WeightedRandomSampler,
        random_split,
    )

    x = torch.randn(20, 3)
    y = torch.arange(20)
    ds = TensorDataset(x, y)
    tr, va = random_split(ds, [15, 5], generator=torch.Generator().manual_seed(1))
    out = []

    def collate(batch):
        xs, ys = zip(*batch)
        return torch.stack(xs).to(dev), torch.stack(ys).to(dev)

    dl = DataLoader(tr, batch_size=4, shuffle=True, collate_fn=collate,
                    generator=torch.Generator().manual_seed(2))
    for xb, yb in dl:
        out.append((xb * 2).sum(1))
        out.append(yb)
    ws = WeightedRandomSampler(torch.rand(20), 10, generator=torch.Generator().manual_seed(3))
    out.append(list(ws))
    rs = RandomSampler(range(10), generator=torch.Generator().manual_seed(4))
    bs = BatchSampler(rs, 3, False)
    out.append(list(bs))
    # a dataset of device tensors
    dds = TensorDataset(x.to(dev), y.to(dev))
    for xb, yb in DataLoader(dds, batch_size=6, shuffle=False):
        out.append(xb.mean(0))
        out.append(yb)
    return out


@case("torch.nn.utils", requires=("torch",))
def rnn_packing(dev):
    from torch.nn.utils import rnn

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 5, batch_first=True, bidirectional=True).to(dev)
    seqs = [torch.randn(n, 4).to(dev) for n in (5, 3, 2)]
    lengths = torch.tensor([5, 3, 2])
    padded = rnn.pad_sequence(seqs, batch_first=True)
    packed = rnn.pack_padded_sequence(padded, lengths, batch_first=True)
    out, (h, c) = lstm(packed)
    unpacked, lens = rnn.pad_packed_sequence(out, batch_first=True)
    ps = rnn.pack_sequence([s for s in seqs], enforce_sorted=True)
    unsorted = rnn.pack_sequence([seqs[2], seqs[0], seqs[1]], enforce_sorted=False)
    o2, _ = lstm(unsorted)
    unpacked.sum().backward()
    return {"unpacked": unpacked, "lens": lens, "h": h, "c": c, "ps": ps.data,
            "bs": ps.batch_sizes, "o2": rnn.pad_packed_sequence(o2)[0],
            "grad": lstm.weight_ih_l0.grad,
            "unpad": rnn.unpad_sequence(padded, lengths, batch_first=True)}


@case("torch.nn.utils", requires=("torch",))
def nn_utils_misc(dev):
    from torch.nn.utils import parametrize, prune

    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6).to(dev)
    res = {}

    class Sym(torch.nn.Module):
        def forward(self, X):
            return X.triu() + X.triu(1).transpose(-1, -2)

    parametrize.register_parametrization(lin, "weight", Sym())
    x = torch.randn(3, 6).to(dev)
    lin(x).sum().backward()
    res["sym_w"] = lin.weight
    res["sym_grad"] = lin.parametrizations.weight.original.grad
    orth = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(5, 5).to(dev))
    res["orth"] = orth.weight @ orth.weight.T
    sn = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(5, 4).to(dev))
    res["sn"] = sn(torch.randn(2, 5).to(dev))
    wn = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(5, 4).to(dev))
    res["wn"] = wn(torch.randn(2, 5).to(dev))
    old_sn = torch.nn.utils.spectral_norm(torch.nn.Linear(5, 4).to(dev))
    res["old_sn"] = old_sn(torch.randn(2, 5).to(dev))
    p = torch.nn.Linear(8, 8).to(dev)
    prune.l1_unstructured(p, "weight", amount=0.3)
    prune.random_structured(p, "weight", amount=0.25, dim=0)
    prune.random_unstructured(p, "bias", amount=0.25)
    res["pruned_mask"] = p.weight_mask
    res["pruned_b"] = p.bias_mask
    prune.remove(p, "weight")
    res["pruned_w"] = p.weight
    g = torch.nn.Linear(8, 8).to(dev)
    prune.global_unstructured([(g, "weight"), (p, "bias")], pruning_method=prune.L1Unstructured,
                              amount=0.4)
    res["global"] = g.weight_mask
    m = _seq_model(dev)
    m(torch.randn(5, 8).to(dev)).pow(2).sum().backward()
    res["clip_norm"] = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    res["clip_norm_inf"] = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, norm_type="inf")
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)
    res["grads"] = [q.grad for q in m.parameters()]
    vec = torch.nn.utils.parameters_to_vector(m.parameters())
    torch.nn.utils.vector_to_parameters(vec * 2, m.parameters())
    res["vec"] = vec
    res["params"] = list(m.parameters())
    res["gn"] = torch.nn.utils.get_total_norm([q.grad for q in m.parameters()])
    return res


@case("torch.distributions", requires=("torch",))
def distributions(dev):
    D = torch.distributions
    loc = torch.randn(4).to(dev).requires_grad_()
    scale = torch.rand(4).to(dev).add(0.5).requires_grad_()
    res = {}
    dists = {
        "normal": D.Normal(loc, scale),
        "laplace": D.Laplace(loc, scale),
        "cauchy": D.Cauchy(loc, scale),
        "gumbel": D.Gumbel(loc, scale),
        "lognormal": D.LogNormal(loc, scale),
        "studentt": D.StudentT(scale * 3, loc, scale),
        "gamma": D.Gamma(scale, scale + 1),
        "beta": D.Beta(scale, scale + 1),
        "dirichlet": D.Dirichlet(scale),
        "exponential": D.Exponential(scale),
        "uniform": D.Uniform(loc, loc + scale),
        "mvn": D.MultivariateNormal(loc, scale_tril=torch.diag(scale)),
        "lowrank": D.LowRankMultivariateNormal(loc, torch.ones(4, 2).to(dev) * 0.1, scale),
        "independent": D.Independent(D.Normal(loc, scale), 1),
        "bernoulli": D.Bernoulli(logits=loc),
        "categorical": D.Categorical(logits=loc),
        "onehot": D.OneHotCategorical(logits=loc),
        "binomial": D.Binomial(10, logits=loc),
        "poisson": D.Poisson(scale),
        "geometric": D.Geometric(logits=loc),
        "relaxed": D.RelaxedOneHotCategorical(torch.tensor(0.5).to(dev), logits=loc),
        "mixture": D.MixtureSameFamily(D.Categorical(logits=loc), D.Normal(loc, scale)),
        "transformed": D.TransformedDistribution(D.Normal(loc, scale),
                                                 [D.transforms.TanhTransform()]),
        "vonmises": D.VonMises(loc, scale),
        "chi2": D.Chi2(scale),
        "halfnormal": D.HalfNormal(scale),
        "weibull": D.Weibull(scale, scale + 1),
        "kumaraswamy": D.Kumaraswamy(scale, scale + 1),
    }
    total = 0
    for name, d in dists.items():
        torch.manual_seed(0)
        s = d.rsample((3,)) if d.has_rsample else d.sample((3,))
        lp = d.log_prob(s.detach() if not d.has_rsample else s)
        r = {"sample": s, "log_prob": lp}
        try:
            r["entropy"] = d.entropy()
        except NotImplementedError:
            pass
        try:
            r["mean"] = d.mean
        except NotImplementedError:
            pass
        total = total + lp.sum() + (s.sum() if d.has_rsample else 0)
        res[name] = r
    total.backward()
    res["grad_loc"] = loc.grad
    res["grad_scale"] = scale.grad
    res["kl_nn"] = D.kl_divergence(D.Normal(loc, scale), D.Normal(loc * 0, scale * 0 + 1))
    res["kl_cat"] = D.kl_divergence(D.Categorical(logits=loc), D.Categorical(logits=loc.flip(0)))
    res["kl_mvn"] = D.kl_divergence(dists["mvn"],
                                    D.MultivariateNormal(loc * 0, torch.eye(4).to(dev)))
    return res


@case("torch.special/fft", requires=("torch",))
def special_fft(dev):
    x = torch.linspace(-3, 3, 37).to(dev)
    p = torch.linspace(0.01, 0.99, 11).to(dev)
    S = torch.special
    names = ("erf", "erfc", "erfcx", "expit", "i0", "i0e", "i1", "i1e", "ndtr", "log_ndtr",
             "sinc", "entr", "expm1", "exp2", "bessel_j0", "bessel_j1", "spherical_bessel_j0",
             "digamma")
    res = {f: getattr(S, f)(x) for f in names}
    res["ndtri"] = S.ndtri(p)
    res["logit"] = S.logit(p, eps=1e-6)
    res["erfinv"] = S.erfinv(p * 2 - 1)
    res["gammaln"] = S.gammaln(x.abs() + 0.1)
    res["polygamma"] = S.polygamma(2, x.abs() + 0.5)
    res["multigammaln"] = S.multigammaln(x.abs() + 2, 3)
    res["xlogy"] = S.xlogy(x, x.abs())
    res["xlog1py"] = S.xlog1py(x, x.abs())
    res["zeta"] = S.zeta(x.abs() + 1.5, torch.tensor(2.0).to(dev))
    res["softmax"] = S.softmax(x.view(1, -1), 1)
    res["logsumexp"] = S.logsumexp(x, 0)
    res["gammainc"] = S.gammainc(x.abs() + 0.1, x.abs())
    res["chebyshev"] = S.chebyshev_polynomial_t(x / 3, 4)
    res["hermite"] = S.hermite_polynomial_h(x, 3)
    sig = torch.randn(4, 32).to(dev)
    F = torch.fft
    res["fft"] = F.fft(sig)
    res["ifft"] = F.ifft(F.fft(sig)).real
    res["rfft"] = F.rfft(sig, norm="ortho")
    res["irfft"] = F.irfft(F.rfft(sig), n=32)
    res["fft2"] = F.fft2(sig)
    res["rfftn"] = F.rfftn(sig.view(4, 4, 8))
    res["hfft"] = F.hfft(F.rfft(sig))
    res["fftshift"] = F.fftshift(sig, dim=-1)
    res["fftfreq"] = F.fftfreq(8, device=dev)
    res["rfftfreq"] = F.rfftfreq(8, d=0.5, device=dev)
    w = torch.hann_window(16, device=dev)
    st = torch.stft(sig, 16, hop_length=4, window=w, return_complex=True)
    res["stft"] = st
    res["istft"] = torch.istft(st, 16, hop_length=4, window=w, length=32)
    s2 = sig.clone().requires_grad_()
    F.rfft(s2).abs().sum().backward()
    res["fft_grad"] = s2.grad
    return res


@case("torch.func", requires=("torch",))
def torch_func(dev):
    from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vjp, vmap

    m = _seq_model(dev, 3, 5, 2)
    params = {k: v.detach() for k, v in m.named_parameters()}
    x = torch.randn(4, 3).to(dev)

    def loss(p, xb):
        return functional_call(m, p, (xb,)).pow(2).sum()

    res = {"grad": grad(loss)(params, x)}
    res["per_sample"] = vmap(grad(loss), in_dims=(None, 0))(params, x.unsqueeze(1))
    f = lambda v: torch.sin(v) * v.pow(2)  # noqa: E731
    v = torch.randn(3).to(dev)
    res["jacrev"] = jacrev(f)(v)
    res["jacfwd"] = jacfwd(f)(v)
    res["hessian"] = hessian(lambda v: (v.sin() * v).sum())(v)
    out, fn = vjp(f, v)
    res["vjp"] = fn(torch.ones_like(out))
    res["vmap_mm"] = vmap(torch.mv, in_dims=(0, None))(torch.randn(5, 2, 3).to(dev), v)
    res["jvp"] = torch.func.jvp(f, (v,), (torch.ones_like(v),))
    return res


@case("torch.hooks", requires=("torch",))
def hooks(dev):
    m = _seq_model(dev)
    seen = {}

    def fwd_hook(mod, inp, out):
        seen.setdefault("fwd", []).append(out.detach().clone())
        return out * 2

    def pre_hook(mod, args):
        return (args[0] + 1,)

    def bwd_hook(mod, gin, gout):
        seen.setdefault("bwd", []).append(gout[0].clone())

    def tensor_hook(g):
        seen.setdefault("tensor", []).append(g.clone())
        return g * 0.5

    h1 = m[0].register_forward_hook(fwd_hook)
    m[2].register_forward_pre_hook(pre_hook)
    m[0].register_full_backward_hook(bwd_hook)
    m[2].weight.register_hook(tensor_hook)
    acc = []
    m[0].weight.register_post_accumulate_grad_hook(lambda p: acc.append(p.grad.clone()))
    x = torch.randn(3, 8).to(dev).requires_grad_()
    y = m(x)
    y.sum().backward()
    h1.remove()
    y2 = m(x)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):
        z = (x.sin() * x).sum()
    z.backward()
    return {"y": y, "y2": y2, "seen": seen, "acc": acc, "grads": [p.grad for p in m.parameters()],
            "xgrad": x.grad}


@case("torch.amp", requires=("torch",))
def autocast_training(dev):
    m = _seq_model(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    dt = "neuron" if dev != "cpu" else "cpu"
    scaler = torch.amp.GradScaler(dt, init_scale=2.0 ** 8)
    x = torch.randn(6, 8).to(dev)
    out = []
    for _ in range(3):
        with torch.autocast(dt, dtype=torch.bfloat16):
            y = m(x)
            loss = y.float().pow(2).mean()
        out.append((y.dtype, loss.dtype))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return {"dtypes": out, "scale": scaler.get_scale(), "state": _state(m)}


@case("safetensors", requires=("safetensors",))
def safetensors_roundtrip(dev):
    from safetensors.torch import load, load_file, load_model, save, save_file, save_model

    m = _seq_model(dev)
    sd = m.state_dict()
    blob = save(sd)
    back = load(blob)
    with tempfile.TemporaryDirectory() as d:
        save_file(sd, os.path.join(d, "m.safetensors"), metadata={"a": "b"})
        f = load_file(os.path.join(d, "m.safetensors"))
        m2 = _seq_model(dev)
        with torch.no_grad():
            for p in m2.parameters():
                p.zero_()
        save_model(m, os.path.join(d, "mm.safetensors"))
        missing, unexpected = load_model(m2, os.path.join(d, "mm.safetensors"))
        m3 = _seq_model("cpu")
        m3.load_state_dict({k: v.to(dev) for k, v in f.items()})
    return {"blob": back, "file": f, "m2": m2.state_dict(), "m3": m3.state_dict(),
            "m2_on_device": next(m2.parameters()).device.type == torch.device(dev).type,
            "missing": sorted(missing)}


@case("torch.save", requires=("torch",))
def state_dict_roundtrip(dev):
    m = _seq_model(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x = torch.randn(4, 8).to(dev)
    m(x).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, map_location=dev, weights_only=True)
    m2 = _seq_model(dev)
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    m2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    m2(x).sum().backward()
    opt2.step()
    return _state(m2, opt2)


# ---------------------------------------------------------------------------------------------
# Hugging Face: peft, diffusers, sentence-transformers (tiny configs, nothing downloaded)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the cat sat on a mat dog ran far".split()) + [f"w{i}" for i in range(40)]


def _tokenizer():
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", eos_token="[SEP]")


def _tiny_llama():
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(_WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=2, eos_token_id=3))


def _tiny_bert(cls="BertModel", **kw):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, cls)(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=len(_WORDS), max_position_embeddings=32, pad_token_id=0, **kw))


def _quiet_hf():
    import transformers

    transformers.logging.set_verbosity_error()


@case("peft", requires=("peft", "transformers"), scale=10)
def peft_lora_train(dev):
    import peft

    _quiet_hf()
    base = _tiny_llama().to(dev)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.1, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, cfg)
    trainable = model.get_nb_trainable_parameters()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(5, len(_WORDS), (2, 10)).to(dev)
    losses = []
    model.train()
    for _ in range(3):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    model.eval()
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with model.disable_adapter():
            base_logits = model(input_ids=ids).logits
    res = {"trainable": trainable, "losses": losses, "before": before, "base": base_logits}
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        names = sorted(os.listdir(d))
        base2 = _tiny_llama().to(dev)
        loaded = peft.PeftModel.from_pretrained(base2, d)
        with torch.no_grad():
            res["loaded"] = loaded(input_ids=ids).logits
        res["loaded_dev"] = next(loaded.parameters()).device.type == torch.device(dev).type
    res["files"] = names
    merged = model.merge_and_unload()
    with torch.no_grad():
        res["merged"] = merged(input_ids=ids).logits
    res["gen"] = merged.generate(ids[:, :4], max_new_tokens=5, do_sample=False)
    return res


@case("peft", requires=("peft", "transformers"), scale=10)
def peft_merge_unmerge_multi(dev):
    import peft

    _quiet_hf()
    base = _tiny_bert("BertForSequenceClassification", num_labels=3).to(dev)
    cfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"],
                          init_lora_weights=False)
    model = peft.get_peft_model(base, cfg)
    model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["key"],
                                                init_lora_weights="gaussian"))
    ids = torch.randint(5, len(_WORDS), (2, 7)).to(dev)
    mask = torch.ones(2, 7, dtype=torch.long).to(dev)
    mask[1, 5:] = 0
    model.eval()
    with torch.no_grad():
        res = {"a": model(input_ids=ids, attention_mask=mask).logits}
        model.set_adapter("second")
        res["b"] = model(input_ids=ids, attention_mask=mask).logits
        model.set_adapter("default")
        model.merge_adapter()
        res["merged"] = model(input_ids=ids, attention_mask=mask).logits
        model.unmerge_adapter()
        res["unmerged"] = model(input_ids=ids, attention_mask=mask).logits
        attn = model.base_model.model.bert.encoder.layer[0].attention
        res["q_w"] = attn.self.query.base_layer.weight
        model.add_weighted_adapter(["default", "second"], [0.5, 0.5], "mix", combination_type="cat")
        model.set_adapter("mix")
        res["mix"] = model(input_ids=ids, attention_mask=mask).logits
    sd = peft.get_peft_model_state_dict(model, adapter_name="default")
    res["sd"] = sd
    return res


@case("peft", requires=("peft", "transformers"), scale=10)
def peft_other_tuners(dev):
    import peft

    _quiet_hf()
    res = {}
    for name, cfg in {
        "ia3": peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                              feedforward_modules=["down_proj"], task_type="CAUSAL_LM"),
        "prefix": peft.PrefixTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"),
        "prompt": peft.PromptTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"),
        "loha": peft.LoHaConfig(r=2, target_modules=["q_proj"], init_weights=False),
        "lokr": peft.LoKrConfig(r=2, target_modules=["q_proj"], init_weights=False),
        "dora": peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True,
                                init_lora_weights=False),
        "boft": peft.BOFTConfig(boft_block_size=4, target_modules=["q_proj"], init_weights=False),
    }.items():
        model = peft.get_peft_model(_tiny_llama().to(dev), cfg)
        ids = torch.randint(5, len(_WORDS), (2, 6)).to(dev)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        res[name] = {"loss": out.loss, "g": grads}
    return res


def _unet():
    import diffusers

    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), norm_num_groups=4, attention_head_dim=4,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))


@case("diffusers", scale=30)
def diffusers_unet_train_sample(dev):
    import diffusers

    unet = _unet().to(dev)
    sched = diffusers.DDPMScheduler(num_train_timesteps=50)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    x0 = torch.randn(2, 3, 8, 8).to(dev)
    losses = []
    for _ in range(2):
        noise = torch.randn(x0.shape).to(dev)
        t = torch.randint(0, 50, (2,)).to(dev)
        noisy = sched.add_noise(x0, noise, t)
        pred = unet(noisy, t).sample
        loss = torch.nn.functional.mse_loss(pred, noise)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    res = {"losses": losses}
    for sname, S in (("ddpm", diffusers.DDPMScheduler), ("ddim", diffusers.DDIMScheduler),
                     ("euler", diffusers.EulerDiscreteScheduler),
                     ("dpm", diffusers.DPMSolverMultistepScheduler)):
        s = S(num_train_timesteps=50)
        s.set_timesteps(4, device=dev)
        g = torch.Generator(device=dev).manual_seed(1)
        sample = torch.randn(1, 3, 8, 8, generator=g, device=dev) * s.init_noise_sigma
        with torch.no_grad():
            for t in s.timesteps:
                inp = s.scale_model_input(sample, t)
                eps = unet(inp, t).sample
                sample = s.step(eps, t, sample, generator=g).prev_sample
        res[sname] = sample
    return res


@case("diffusers", scale=30)
def diffusers_pipeline_ema(dev):
    import diffusers
    from diffusers.training_utils import EMAModel

    unet = _unet().to(dev)
    ema = EMAModel(unet.parameters(), decay=0.9)
    with torch.no_grad():
        for p in unet.parameters():
            p.mul_(0.99)
    ema.step(unet.parameters())
    pipe = diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(
        num_train_timesteps=20))
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator(device=dev).manual_seed(0)
    img = pipe(batch_size=1, generator=g, num_inference_steps=3, output_type="np").images
    ema.copy_to(unet.parameters())
    return {"img": torch.from_numpy(img), "shadow": [p.clone() for p in ema.shadow_params],
            "unet": _state(unet)}


@case("sentence-transformers", requires=("sentence_transformers", "transformers"), scale=10)
def sentence_transformers_encode_fit(dev):
    import sentence_transformers as st
    from sentence_transformers.sentence_transformer import losses as st_losses
    from sentence_transformers.sentence_transformer import modules as st_modules

    _quiet_hf()
    with tempfile.TemporaryDirectory() as d:
        _tiny_bert().save_pretrained(d)
        _tokenizer().save_pretrained(d)
        torch.manual_seed(0)
        word = st_modules.Transformer(d, max_seq_length=16)
        pool = st_modules.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
        dense = st_modules.Dense(32, 8, activation_function=torch.nn.Tanh())
        model = st.SentenceTransformer(modules=[word, pool, dense], device=dev)
    sents = ["the cat sat on a mat", "a dog ran far", "the dog sat", "w1 w2 w3 w4 w5 w6 w7"]
    emb = model.encode(sents, convert_to_tensor=True)
    res = {"emb": emb, "emb_dev": emb.device.type == torch.device(dev).type,
           "np": torch.from_numpy(model.encode(sents, convert_to_numpy=True)),
           "sim": model.similarity(emb, emb),
           "cos": st.util.cos_sim(emb, emb), "dot": st.util.dot_score(emb, emb)}
    hits = st.util.semantic_search(emb[:2], emb, top_k=2)
    res["hits"] = [[h["corpus_id"] for h in q] for q in hits]
    # a manual contrastive training step (what model.fit does inside)
    loss_fn = st_losses.MultipleNegativesRankingLoss(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    feats = [model.tokenize(sents[:2]), model.tokenize(sents[2:])]
    feats = [{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in f.items()}
             for f in feats]
    loss = loss_fn(feats, None)
    loss.backward()
    opt.step()
    res["loss"] = loss
    res["after"] = model.encode(sents, convert_to_tensor=True)
    return res


# ---------------------------------------------------------------------------------------------
# lightning


def _lit_module(dev):
    import lightning as L

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _seq_model("cpu")
            self.seen = []
            self.devs = set()

        def training_step(self, batch, idx):
            x, y = batch
            self.devs.add(x.device.type == torch.device(dev).type)
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            self.seen.append(loss.detach().clone())
            return loss

        def validation_step(self, batch, idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return Lit()


def _lit_data():
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(24, 8, generator=g), torch.randint(0, 4, (24,), generator=g))
    return DataLoader(ds, batch_size=8)


@case("lightning")
def lightning_fabric(dev):
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = _seq_model("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # a user moves the wrapped model to neuron: Fabric's accelerator is "cpu", so to_device is
    # done by hand
    model = model.to(dev)
    model, opt = fabric.setup(model, opt, move_to_device=False)
    dl = fabric.setup_dataloaders(_lit_data(), move_to_device=False)
    losses = []
    for xb, yb in dl:
        xb, yb = xb.to(dev), yb.to(dev)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        fabric.backward(loss)
        fabric.clip_gradients(model, opt, max_norm=1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": _state(model)}


@case("lightning")
def lightning_trainer(dev):
    import lightning as L

    lit = _lit_module(dev)
    kw = dict(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0)
    # eager_neuron registers Lightning's "neuron" accelerator
    trainer = L.Trainer(accelerator="cpu" if dev == "cpu" else "neuron", devices=1, **kw)
    trainer.fit(lit, _lit_data(), _lit_data())
    return {"seen": lit.seen, "state": _state(lit.net), "devs": sorted(lit.devs),
            "metrics": {k: v for k, v in trainer.callback_metrics.items()}}


@case("lightning")
def lightning_custom_accelerator(dev):
    """A user's own Accelerator subclass (before eager_neuron registered one)."""
    import lightning as L

    lit = _lit_module(dev)
    kw = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0)
    acc = "cpu" if dev == "cpu" else _neuron_accelerator()
    trainer = L.Trainer(accelerator=acc, devices=1, **kw)
    trainer.fit(lit, _lit_data())
    return {"seen": lit.seen, "devs": sorted(lit.devs), "state": _state(lit.net)}


@case("lightning")
def lightning_metrics_predict(dev):
    import lightning as L
    import torchmetrics as tm

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _seq_model("cpu")
            self.acc = tm.Accuracy(task="multiclass", num_classes=4)
            self.val_f1 = tm.F1Score(task="multiclass", num_classes=4, average="macro")
            self.logged = []

        def training_step(self, batch, idx):
            x, y = batch
            logits = self.net(x)
            self.acc(logits, y)
            self.log("acc", self.acc, on_step=True, on_epoch=True)
            return torch.nn.functional.cross_entropy(logits, y)

        def validation_step(self, batch, idx):
            x, y = batch
            self.val_f1.update(self.net(x), y)
            self.log("val_f1", self.val_f1)

        def predict_step(self, batch, idx):
            return self.net(batch[0]).softmax(-1)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)]

    lit = Lit()
    trainer = L.Trainer(accelerator="cpu" if dev == "cpu" else "neuron", devices=1, max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=0.5,
                        accumulate_grad_batches=2)
    trainer.fit(lit, _lit_data(), _lit_data())
    preds = trainer.predict(lit, _lit_data())
    val = trainer.validate(lit, _lit_data(), verbose=False)
    return {"metrics": dict(trainer.callback_metrics), "preds": preds, "val": val,
            "state": _state(lit.net)}


@case("accelerate", requires=("accelerate",), scale=10)
def accelerate_loop(dev):
    import accelerate

    accelerate.state.AcceleratorState._reset_state(True)
    acc = accelerate.Accelerator(cpu=dev == "cpu", gradient_accumulation_steps=2)
    m = _seq_model("cpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LinearLR(opt, total_iters=4)
    dl = _lit_data()
    m, opt, dl, sched = acc.prepare(m, opt, dl, sched)
    losses = []
    for x, y in dl:
        with acc.accumulate(m):
            loss = torch.nn.functional.cross_entropy(m(x), y)
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(acc.gather(loss.detach()).mean().item())
    with tempfile.TemporaryDirectory() as d:
        acc.save_state(d)
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
        acc.load_state(d)
    return {"losses": losses, "state": _state(acc.unwrap_model(m), opt),
            "dev": acc.device.type == torch.device(dev).type}


def _neuron_accelerator():
    """A minimal custom Lightning accelerator for `neuron`, as a user would write one."""
    from lightning.pytorch.accelerators import Accelerator

    class NeuronAccelerator(Accelerator):
        @classmethod
        def name(cls):
            return "neuron"

        def setup_device(self, device):
            pass

        def teardown(self):
            pass

        @staticmethod
        def parse_devices(devices):
            return devices

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("neuron", i) for i in range(devices)]

        @staticmethod
        def auto_device_count():
            return torch.neuron.device_count()

        @staticmethod
        def is_available():
            return True

        def get_device_stats(self, device):
            return {}

    return NeuronAccelerator()

# ---------------------------------------------------------------------------------------------
# more pure torch, the way training scripts use it


@case("torch.inference_mode", requires=("torch",))
def inference_mode_usage(dev):
    m = _seq_model(dev)
    x = torch.randn(5, 8).to(dev)
    with torch.inference_mode():
        y = m(x)
        w = m[0].weight.detach()[:2]
        parts = y.split(2)
        top = y.topk(2, dim=-1)
        soft = y.softmax(-1)[:, :2].contiguous()
        am = y.argmax(-1)
        inf = [y.is_inference(), w.is_inference()]
    # inference tensors outside: used in a new computation (allowed), in-place refused
    z = y * 2
    try:
        y.add_(1)
        inplace = "ok"
    except RuntimeError as e:
        inplace = type(e).__name__
    m(x).sum().backward()
    return {"y": y, "w": w, "parts": parts, "top": top, "soft": soft, "am": am, "inf": inf,
            "z": z, "inplace": inplace, "grad": m[0].weight.grad}


@case("torch.nn", requires=("torch",), scale=10)
def transformer_training(dev):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True,
                                             norm_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(dev)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).to(dev)
    opt = torch.optim.AdamW(list(enc.parameters()) + list(mha.parameters()), lr=1e-3)
    x = torch.randn(3, 7, 16).to(dev)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(7).to(dev)
    pad = torch.tensor([[False] * 7, [False] * 5 + [True] * 2, [False] * 3 + [True] * 4]).to(dev)
    losses = []
    for _ in range(2):
        h = enc(x, mask=mask, is_causal=True)
        a, w = mha(h, h, h, key_padding_mask=pad, need_weights=True)
        loss = a.pow(2).mean() + w.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    enc.eval()
    with torch.no_grad():
        ev = enc(x, src_key_padding_mask=pad)
    return {"losses": losses, "eval": ev, "state": _state(enc)}


@case("torch.nn.functional", requires=("torch",))
def functional_zoo(dev):
    F = torch.nn.functional
    x = torch.randn(2, 3, 8, 8).to(dev).requires_grad_()
    res = {
        "interp_bilinear": F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
        "interp_nearest": F.interpolate(x, size=(5, 7), mode="nearest"),
        "interp_bicubic": F.interpolate(x, scale_factor=0.5, mode="bicubic", antialias=True),
        "grid": F.grid_sample(x, torch.rand(2, 4, 4, 2).to(dev) * 2 - 1, align_corners=True),
        "affine": F.affine_grid(torch.eye(2, 3).unsqueeze(0).repeat(2, 1, 1).to(dev),
                                [2, 3, 4, 4], align_corners=False),
        "unfold": F.unfold(x, 3, padding=1, stride=2),
        "fold": F.fold(F.unfold(x, 2, stride=2), (8, 8), 2, stride=2),
        "pixel_shuffle": F.pixel_shuffle(torch.randn(1, 8, 3, 3).to(dev), 2),
        "pad_reflect": F.pad(x, (1, 2, 3, 0), mode="reflect"),
        "pad_circ": F.pad(x, (1, 1, 1, 1), mode="circular"),
        "one_hot": F.one_hot(torch.tensor([0, 3, 1]).to(dev), 5),
        "avgpool": F.adaptive_avg_pool2d(x, (3, 5)),
        "maxpool": F.max_pool2d(x, 3, 2, 1, return_indices=True),
        "lppool": F.lp_pool2d(x.abs() + 0.1, 2, 2),
        "gn": F.group_norm(x, 3),
        "in": F.instance_norm(x),
        "lrn": F.local_response_norm(x, 2),
        "cos": F.cosine_similarity(x[0], x[1], dim=0),
        "pdist": F.pdist(x.flatten(1)),
        "triplet": F.triplet_margin_loss(x[0, 0], x[0, 1], x[0, 2]),
        "ctc": F.ctc_loss(torch.randn(6, 2, 5).log_softmax(-1).to(dev),
                          torch.tensor([[1, 2], [3, 3]]).to(dev), [6, 5], [2, 2]),
        "kl": F.kl_div(x.flatten(1).log_softmax(-1), x.flatten(1).softmax(-1).detach(),
                       reduction="batchmean"),
        "gumbel": None,
        "embbag": F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3]).to(dev),
                                  torch.randn(10, 3).to(dev), torch.tensor([0, 2]).to(dev),
                                  mode="mean"),
        "sdpa_causal": F.scaled_dot_product_attention(*(torch.randn(2, 2, 5, 4).to(dev)
                                                        for _ in range(3)), is_causal=True),
        "sdpa_mask": F.scaled_dot_product_attention(
            *(torch.randn(2, 2, 5, 4).to(dev) for _ in range(3)),
            attn_mask=torch.rand(5, 5).to(dev) > 0.3),
    }
    del res["gumbel"]
    total = sum(v.float().sum() for k, v in res.items() if isinstance(v, torch.Tensor)
                and v.dtype.is_floating_point and v.requires_grad)
    total.backward()
    res["xgrad"] = x.grad
    return res


@case("torch.linalg", requires=("torch",), scale=10)
def linalg_ops(dev):
    a = torch.randn(4, 4, dtype=torch.float64)
    spd = (a @ a.T + 4 * torch.eye(4, dtype=torch.float64)).to(dev)
    b = torch.randn(4, 2, dtype=torch.float64).to(dev)
    a = a.to(dev)
    L = torch.linalg
    q, r = L.qr(a)
    u, s, vh = L.svd(a)
    ev, evec = L.eigh(spd)
    return {
        "solve": L.solve(a, b), "inv": L.inv(a), "chol": L.cholesky(spd), "det": L.det(a),
        "slogdet": L.slogdet(a), "qr": q @ r, "s": s, "usv": u @ torch.diag(s) @ vh,
        "eigvals": ev, "recon": evec @ torch.diag(ev) @ evec.T, "pinv": L.pinv(a),
        "lstsq": L.lstsq(a, b).solution, "norm": L.matrix_norm(a), "vnorm": L.vector_norm(b, 3),
        "cond": L.cond(a), "rank": L.matrix_rank(a), "expm": torch.matrix_exp(a * 0.1),
        "lu": L.lu_factor(a)[0], "cholsolve": torch.cholesky_solve(b, L.cholesky(spd)),
        "triangular": L.solve_triangular(L.cholesky(spd), b, upper=False),
    }


@case("torch.sorting", requires=("torch",))
def sort_search_count(dev):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (50,), generator=g).to(dev)
    f = torch.randn(6, 9, generator=g).to(dev)
    u, inv, cnt = torch.unique(x, return_inverse=True, return_counts=True)
    return {
        "unique": u, "inv": inv, "cnt": cnt, "uc": torch.unique_consecutive(x.sort().values),
        "bincount": torch.bincount(x, minlength=25), "histc": torch.histc(f, 5, -2, 2),
        "search": torch.searchsorted(torch.arange(0, 20, 3).to(dev), x),
        "bucket": torch.bucketize(f, torch.tensor([-1.0, 0.0, 1.0]).to(dev)),
        "topk": f.topk(3, dim=1), "kth": f.kthvalue(2, dim=0), "median": f.median(dim=1),
        "argsort": f.argsort(dim=0, stable=True), "msort": torch.msort(f),
        "nonzero": (f > 0.5).nonzero(), "where": torch.where(f > 0),
        "masked": f[f > 0], "cummax": f.cummax(1), "quantile": torch.quantile(f, 0.3, dim=1),
        "mode": x.view(5, 10).mode(1), "cdist": torch.cdist(f, f[:3]),
        "tril_idx": torch.tril_indices(4, 4, device=dev), "cartesian": torch.cartesian_prod(
            torch.arange(3).to(dev), torch.arange(2).to(dev)),
        "multinomial": torch.multinomial(f.softmax(1), 4, replacement=True,
                                         generator=torch.Generator(device=dev).manual_seed(3)),
    }


@case("torch.autograd", requires=("torch",), scale=10)
def gradient_penalty_double_backward(dev):
    m = _seq_model(dev)
    x = torch.randn(4, 8).to(dev).requires_grad_()
    y = m(x).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    gp = g.norm(2, dim=1).sub(1).pow(2).mean()
    gp.backward()
    h = torch.autograd.functional.hessian(lambda t: m(t).tanh().sum(), x[:1].detach())
    jv = torch.autograd.functional.jvp(lambda t: m(t), x.detach(), torch.ones_like(x))[1]
    return {"gp": gp, "grads": [p.grad for p in m.parameters()], "xgrad": x.grad, "h": h,
            "jv": jv}


@case("torch.nn.init", requires=("torch",))
def init_and_copy(dev):
    import copy
    import pickle

    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5).to(dev)
    conv = torch.nn.Conv2d(3, 4, 3).to(dev)
    emb = torch.nn.Embedding(7, 4, padding_idx=0).to(dev)
    init = torch.nn.init
    init.trunc_normal_(lin.weight, std=0.02)
    init.orthogonal_(conv.weight)
    init.kaiming_uniform_(lin.weight, a=0.1)
    init.xavier_normal_(emb.weight)
    init.zeros_(lin.bias)
    init.sparse_(torch.empty(6, 4).to(dev), 0.5)
    init.dirac_(torch.empty(4, 4, 3, 3).to(dev))
    init.eye_(torch.empty(3, 5).to(dev))
    twin = copy.deepcopy(lin)
    with torch.no_grad():
        twin.weight.add_(1)
    back = pickle.loads(pickle.dumps(conv))
    return {"lin": _state(lin), "conv": conv.weight, "emb": emb.weight, "twin": twin.weight,
            "pickled": back.weight, "dev": back.weight.device.type == torch.device(dev).type}


@case("torch.optim", requires=("torch",), scale=10)
def swa_schedulers(dev):
    from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8),
                            torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=6)
    swa = AveragedModel(m)
    ema = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    swa_sched = SWALR(opt, swa_lr=0.05)
    data = [(torch.randn(6, 8).to(dev), torch.randint(0, 2, (6,)).to(dev)) for _ in range(3)]
    for i in range(6):
        x, y = data[i % 3]
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step() if i < 5 else swa_sched.step()
        swa.update_parameters(m)
        ema.update_parameters(m)
    update_bn([(x,) for x, _ in data], swa)
    return {"m": _state(m, opt), "swa": _state(swa), "ema": _state(ema),
            "lr": opt.param_groups[0]["lr"]}


@case("torch.utils.checkpoint", requires=("torch",))
def checkpoint_and_compile_free(dev):
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2),
                                                       torch.nn.GELU()) for _ in range(4)]).to(dev)
    x = torch.randn(5, 8).to(dev).requires_grad_()
    y = checkpoint(blocks[0], x, use_reentrant=False)
    y = checkpoint_sequential(blocks[1:], 2, y, use_reentrant=False)
    y.sum().backward()
    return {"y": y, "grads": [p.grad for p in blocks.parameters()], "x": x.grad}

@case("transformers", requires=("transformers",), scale=10)
def hf_train_with_dropout(dev):
    """Tiny models in training mode with their default dropout (attention dropout included)."""
    import transformers as T

    _quiet_hf()
    res = {}
    builds = {
        "bert_sdpa": lambda: _tiny_bert("BertForMaskedLM"),
        "bert_eager": lambda: T.BertForMaskedLM(T.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
            vocab_size=len(_WORDS), max_position_embeddings=32, attn_implementation="eager")),
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=len(_WORDS), n_positions=32)),
        "llama_attn_dropout": lambda: T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=len(_WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.2)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=len(_WORDS), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            decoder_start_token_id=0)),
    }
    for name, build in builds.items():
        torch.manual_seed(0)
        model = build().to(dev)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(5, len(_WORDS), (2, 8), generator=g).to(dev)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 6:] = 0
        mask = mask.to(dev)
        losses = []
        for _ in range(2):
            out = model(input_ids=ids, attention_mask=mask, labels=ids)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(out.loss.item())
        res[name] = losses
    return res


@case("transformers", requires=("transformers", "peft"), scale=10)
def hf_trainer_with_lora(dev):
    import peft
    import transformers as T

    _quiet_hf()
    model = peft.get_peft_model(_tiny_llama(), peft.LoraConfig(r=4, target_modules=["q_proj",
                                                                                     "v_proj"]))
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(5, len(_WORDS), (8,), generator=g)} for _ in range(8)]
    for d in data:
        d["labels"] = d["input_ids"].clone()
    with tempfile.TemporaryDirectory() as out:
        args = T.TrainingArguments(out, per_device_train_batch_size=4, num_train_epochs=1,
                                   learning_rate=1e-2, report_to=[], save_strategy="no",
                                   logging_steps=1, use_cpu=dev == "cpu", seed=0,
                                   dataloader_pin_memory=False)
        trainer = T.Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        logs = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        device_ok = next(model.parameters()).device.type == torch.device(dev).type
    return {"logs": logs, "lora": {k: v for k, v in model.state_dict().items() if "lora" in k},
            "device_ok": device_ok}

@case("torch.func", requires=("torch",), scale=10)
def func_ensembles_per_sample(dev):
    import copy

    from torch.func import functional_call, grad, stack_module_state, vmap

    torch.manual_seed(0)
    models = [_seq_model(dev, 8, 8, 3) for _ in range(3)]
    for i, m in enumerate(models):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.1 * i)
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def f(p, b, x):
        return functional_call(base, (p, b), (x,))

    x = torch.randn(5, 8).to(dev)
    ens = vmap(f, in_dims=(0, 0, None))(params, buffers, x)
    conv = torch.nn.Conv2d(2, 3, 3).to(dev)
    cparams = {k: v.detach() for k, v in conv.named_parameters()}
    imgs = torch.randn(4, 2, 6, 6).to(dev)

    def loss(p, img):
        return functional_call(conv, p, (img.unsqueeze(0),)).pow(2).mean()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(cparams, imgs)
    aux = grad(lambda p, img: (loss(p, img), img.sum()), has_aux=True)(cparams, imgs[0])
    bn = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(dev)
    torch.func.replace_all_batch_norm_modules_(bn)
    bn_out = vmap(bn)(torch.randn(3, 2, 4).to(dev))
    return {"ens": ens, "per_sample": per_sample, "aux": aux, "bn": bn_out}


@case("torch.amp", requires=("torch",), scale=10)
def fp16_scaler_inf_and_low_precision_params(dev):
    m = _seq_model(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    dt = "neuron" if dev != "cpu" else "cpu"
    scaler = torch.amp.GradScaler(dt, init_scale=2.0 ** 16, growth_interval=1)
    x = torch.randn(6, 8).to(dev)
    scales, steps = [], []
    for i in range(3):
        with torch.autocast(dt, dtype=torch.float16):
            loss = m(x).float().pow(2).mean() * (1e30 if i == 1 else 1.0)   # step 1 overflows
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        steps.append(len(opt.state))
    res = {"scales": scales, "steps": steps, "state": _state(m, opt)}
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        mm = _seq_model(dev).to(dtype)
        o = torch.optim.AdamW(mm.parameters(), lr=1e-2)
        for _ in range(2):
            mm(x.to(dtype)).float().pow(2).mean().backward()
            o.step()
            o.zero_grad()
        res[str(dtype)] = _state(mm, o)
    return res


@case("torch.autograd", requires=("torch",))
def save_on_cpu_anomaly(dev):
    m = _seq_model(dev)
    x = torch.randn(4, 8).to(dev)
    with torch.autograd.graph.save_on_cpu(pin_memory=True):
        y = m(x).tanh().sum()
    y.backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    with torch.autograd.detect_anomaly(check_nan=True):
        z = m(x).sum()
        z.backward()
    try:
        with torch.autograd.detect_anomaly():
            w = (m(x) * torch.tensor(float("nan")).to(dev)).sqrt().sum()
            w.backward()
        err = None
    except RuntimeError as e:
        err = "Function" in str(e) and "nan" in str(e).lower()
    return {"g1": g1, "g2": [p.grad for p in m.parameters()], "err": err}

@case("torchmetrics")
def tm_wrappers_retrieval(dev):
    import torchmetrics as tm

    g = torch.Generator().manual_seed(7)
    preds = torch.rand(30, generator=g).to(dev)
    target = torch.randint(0, 2, (30,), generator=g).to(dev)
    indexes = torch.randint(0, 4, (30,), generator=g).to(dev)
    out = {}
    for name, m in {"map": tm.retrieval.RetrievalMAP(), "mrr": tm.retrieval.RetrievalMRR(),
                    "ndcg": tm.retrieval.RetrievalNormalizedDCG(top_k=3),
                    "prec": tm.retrieval.RetrievalPrecision(top_k=2)}.items():
        out[name] = m.to(dev)(preds, target, indexes=indexes)
    torch.manual_seed(0)
    boot = tm.wrappers.BootStrapper(tm.MeanSquaredError(), num_bootstraps=4,
                                    sampling_strategy="multinomial").to(dev)
    boot.update(preds, target.float())
    out["boot"] = boot.compute()
    cw = tm.wrappers.ClasswiseWrapper(tm.Accuracy(task="multiclass", num_classes=3,
                                                  average=None)).to(dev)
    logits = torch.randn(12, 3, generator=g).to(dev)
    labels = torch.randint(0, 3, (12,), generator=g).to(dev)
    out["classwise"] = cw(logits, labels)
    mm = tm.wrappers.MinMaxMetric(tm.MeanSquaredError()).to(dev)
    for i in range(3):
        mm.update(preds[i * 10:(i + 1) * 10], target[i * 10:(i + 1) * 10].float())
        out[f"minmax{i}"] = mm.compute()
    run = tm.wrappers.Running(tm.SumMetric(), window=2).to(dev)
    for i in range(4):
        run.update(preds[i])
    out["running"] = run.compute()
    mt = tm.wrappers.MultitaskWrapper({"a": tm.MeanAbsoluteError(), "b": tm.R2Score()}).to(dev)
    mt.update({"a": preds, "b": preds}, {"a": target.float(), "b": target.float()})
    out["multitask"] = mt.compute()
    out["functional"] = {
        "acc": tm.functional.accuracy(logits, labels, task="multiclass", num_classes=3),
        "auroc": tm.functional.auroc(logits.softmax(-1), labels, task="multiclass",
                                     num_classes=3),
        "ssim": tm.functional.structural_similarity_index_measure(
            logits.view(1, 1, 6, 6).sigmoid(), logits.view(1, 1, 6, 6).sigmoid().flip(-1)),
        "pairwise": tm.functional.pairwise_cosine_similarity(logits, logits),
        "dice": tm.functional.dice_score(logits.argmax(-1), labels, num_classes=3)
        if hasattr(tm.functional, "dice_score") else torch.zeros(1).to(dev),
    }
    m64 = tm.MeanSquaredError().to(dev).double()
    m64.update(preds.double(), target.double())
    out["double"] = m64.compute()
    sd = tm.Accuracy(task="binary").to(dev)
    sd.persistent(True)
    sd.update(preds, target)
    state = sd.state_dict()
    fresh = tm.Accuracy(task="binary").to(dev)
    fresh.persistent(True)
    fresh.load_state_dict(state)
    out["restored"] = fresh.compute()
    return out


@case("diffusers", scale=30)
def diffusers_vae_cond_unet(dev):
    import diffusers

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                                  block_out_channels=(8, 16), layers_per_block=1,
                                  norm_num_groups=4,
                                  down_block_types=("DownEncoderBlock2D",) * 2,
                                  up_block_types=("UpDecoderBlock2D",) * 2).to(dev)
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=12,
        attention_head_dim=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")).to(dev)
    img = torch.rand(2, 3, 16, 16).to(dev) * 2 - 1
    gen = torch.Generator(device=dev).manual_seed(0)
    post = vae.encode(img).latent_dist
    lat = post.sample(generator=gen) * 0.18
    rec = vae.decode(lat / 0.18).sample
    cond = torch.randn(2, 5, 12).to(dev)
    t = torch.tensor([3, 17]).to(dev)
    eps = unet(lat, t, encoder_hidden_states=cond).sample
    loss = eps.pow(2).mean() + (rec - img).abs().mean() + post.kl().mean() * 1e-3
    loss.backward()
    grads = {k: p.grad for k, p in list(unet.named_parameters())[:6]}
    return {"lat": lat, "rec": rec, "eps": eps, "loss": loss, "grads": grads,
            "vae_grad": next(vae.parameters()).grad}

@case("transformers", requires=("transformers",), scale=10)
def hf_generate_strategies(dev):
    import transformers as T

    _quiet_hf()
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=32, n_head=2,
                                           vocab_size=len(_WORDS), n_positions=64,
                                           bos_token_id=2, eos_token_id=3,
                                           pad_token_id=0)).to(dev).eval()
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]]).to(dev)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]).to(dev)
    res = {}
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0)
    res["greedy"] = model.generate(**kw, do_sample=False)
    res["beam"] = model.generate(**kw, num_beams=3, do_sample=False, num_return_sequences=2,
                                 length_penalty=0.7, no_repeat_ngram_size=2)
    torch.manual_seed(1)
    res["sample"] = model.generate(**kw, do_sample=True, top_k=5, top_p=0.9, temperature=0.7,
                                   repetition_penalty=1.3)
    torch.manual_seed(2)
    res["beam_sample"] = model.generate(**kw, do_sample=True, num_beams=2)
    out = model.generate(**kw, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, output_logits=True)
    res["scores"] = out.scores
    res["min_len"] = model.generate(**kw, min_new_tokens=4, do_sample=False,
                                    bad_words_ids=[[11], [12]])
    return res


def main(argv):
    verbose = "-v" in argv
    sel = [a for a in argv if not a.startswith("-")]
    modes = ["plain", "adaptive"]
    rows = []
    for lib, name, fn, opts in CASES:
        if sel and not any(s in lib or s in name for s in sel):
            continue
        missing = [m for m in opts["requires"] if not have(m)]
        if missing:
            rows.append((lib, name, [f"skip (no {missing[0]})"] * len(modes)))
            continue
        rows.append((lib, name, run_case(lib, name, fn, opts, modes, verbose)))
        print(f"{lib:22s} {name:40s} " + " | ".join(rows[-1][2]), flush=True)
    print()
    print(f"{'library':22s} {'case':40s} {'plain':10s} adaptive")
    nfail = 0
    for lib, name, outs in rows:
        short = [o if len(o) < 60 else o[:57] + "..." for o in outs]
        nfail += any(o.startswith("FAIL") for o in outs)
        print(f"{lib:22s} {name:40s} " + " | ".join(short))
    print(f"\n{len(rows)} cases, {nfail} failing")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
