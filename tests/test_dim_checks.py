"""A dimension out of range raises the CPU's IndexError on neuron, for every op taking a dim
(sort, argsort and softmax wrapped any dim modulo the rank and answered: sort(dim=5) of a 2-d
tensor), also once the op's fast-path runner is warm; an in-range dim answers as on the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import eager_neuron  # noqa: F401

N = "neuron"


def _idx(t):
    return torch.zeros(2, 3, dtype=torch.long, device=t.device)


OPS = {
    "sort": lambda t, d: t.sort(dim=d), "sort_stable": lambda t, d: t.sort(stable=True, dim=d),
    "argsort": lambda t, d: t.argsort(dim=d), "topk": lambda t, d: t.topk(1, dim=d),
    "sum": lambda t, d: t.sum(d), "mean": lambda t, d: t.mean(d), "amax": lambda t, d: t.amax(d),
    "argmax": lambda t, d: t.argmax(d), "max_dim": lambda t, d: t.max(d),
    "cumsum": lambda t, d: t.cumsum(d), "cummax": lambda t, d: t.cummax(d),
    "logcumsumexp": lambda t, d: t.logcumsumexp(d), "softmax": lambda t, d: t.softmax(d),
    "log_softmax": lambda t, d: t.log_softmax(d), "flip": lambda t, d: t.flip(d),
    "roll": lambda t, d: t.roll(1, d), "select": lambda t, d: t.select(d, 0),
    "index_select": lambda t, d: t.index_select(d, torch.tensor([0], device=t.device)),
    "gather": lambda t, d: t.gather(d, _idx(t)), "cat": lambda t, d: torch.cat([t, t], d),
    "split": lambda t, d: t.split(1, d), "transpose": lambda t, d: t.transpose(0, d),
    "norm": lambda t, d: t.norm(dim=d), "var": lambda t, d: t.var(d),
    "prod": lambda t, d: t.prod(d),
    "median": lambda t, d: t.median(d), "kthvalue": lambda t, d: t.kthvalue(1, d),
    "logsumexp": lambda t, d: t.logsumexp(d), "diff": lambda t, d: t.diff(dim=d),
    "scatter": lambda t, d: t.scatter(d, _idx(t), 1.0),
    "normalize": lambda t, d: torch.nn.functional.normalize(t, dim=d),
}


def _outcome(f, t, d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            r = f(t, d)
        except Exception as e:        # noqa: BLE001 - the type is what is compared
            return type(e)
    return "ok", r


@pytest.mark.parametrize("name", list(OPS))
def test_dim_out_of_range_raises_as_the_cpu(name):
    f = OPS[name]
    x = torch.randn(2, 3)
    xn = x.to(N)
    for d in (1, -1, 0):          # in range (and a warm runner for the op)
        ref, got = _outcome(f, x, d), _outcome(f, xn, d)
        assert ref[0] == got[0] == "ok", (d, ref, got)
    for d in (2, 5, -3, -6):
        ref, got = _outcome(f, x, d), _outcome(f, xn, d)
        assert ref is IndexError and got is IndexError, (d, ref, got)


@pytest.mark.parametrize("name", ["sort", "argsort", "softmax"])
def test_zero_dim_tensors_take_dims_minus_one_and_zero(name):
    f = OPS[name]
    x = torch.tensor(3.0)
    for d in (0, -1):
        assert _outcome(f, x.to(N), d)[0] == "ok"
    for d in (1, -2):
        assert _outcome(f, x, d) is IndexError and _outcome(f, x.to(N), d) is IndexError
