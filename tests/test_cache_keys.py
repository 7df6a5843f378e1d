"""Typed kernel keys (cache/families.py): each family's key renders its kernel from the key alone,
and the keys the lowerings build are instances of their type."""

import pytest
import torch

import eager_neuron  # noqa: F401
from eager_neuron import launch
from eager_neuron.cache import families
from eager_neuron.cache.keys import KeyType
from eager_neuron.lower import elementwise as ew
from eager_neuron.lower.common import bind

aten = torch.ops.aten

# (overload, args, kwargs, the elementwise op name) over every key shape: flat and broadcast
# (nd) operands, one-element operands, Scalars, integer helpers, vmath, special functions
_CASES = [
    (aten.add.Tensor, (torch.randn(5), torch.randn(5)), {"alpha": 2}, "aten::add"),
    (aten.add.Tensor, (torch.randn(3, 4), torch.randn(4)), {}, "aten::add"),
    (aten.mul.Tensor, (torch.randn(4), torch.tensor(3.0)), {}, "aten::mul"),
    (aten.div.Tensor_mode, (torch.arange(-6, 6), torch.tensor(4)), {"rounding_mode": "floor"},
     "aten::div"),
    (aten.remainder.Scalar, (torch.arange(-6, 6, dtype=torch.int32), 5), {}, "aten::remainder"),
    (aten.pow.Tensor_Scalar, (torch.rand(6) + 0.5, 0.5), {}, "aten::pow"),
    (aten.gelu.default, (torch.randn(8),), {"approximate": "none"}, "aten::gelu"),
    (aten.where.self, (torch.rand(6) > 0.5, torch.randn(6), torch.randn(6)), {}, "aten::where"),
    (aten.digamma.default, (torch.rand(6, dtype=torch.float64) + 1,), {}, "aten::digamma"),
    (aten.lt.Tensor, (torch.randn(2, 3), torch.randn(2, 3).t().contiguous().t()), {},
     "aten::lt"),
]


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_elementwise_lowering_renders_through_its_key_type(case):
    func, args, kwargs, op_name = _CASES[case]
    a = bind(func, args, kwargs)
    meta = func(*args, **kwargs)
    out = torch.empty_like(meta)
    req = ew.lower_elementwise(func, a, [out], op_name, defer=True)
    key, render = req[0], req[1]
    assert families.type_of(key) is families.ELEMENTWISE, key
    # the render launch() calls on a miss is the key type's, on this key: nothing else
    assert render.func == families.ELEMENTWISE.render and render.args == (key,)
    src, name = render()
    fields = dict(zip(families.ELEMENTWISE.fields, key[1:]))
    assert f"def {name}(" in src and fields["prelude_id"] == ew.PRELUDE_ID
    assert fields["in_place"] is False   # (the output is a fresh tensor here)
    assert fields["op"] == op_name and fields["expr"] in src
    # special-function helpers are added exactly when the expression calls one
    assert (ew.SPECIAL_PRELUDE in src) == (op_name == "aten::digamma")


def test_cache_verify_rerenders_elementwise_hits_through_the_key_type(monkeypatch):
    """The debug switch (EAGER_NEURON_CACHE_VERIFY=1): every lookup, memory hits included,
    re-renders the elementwise kernel through ELEMENTWISE; a renderer that reads anything but
    the key (here: a flag) fails on the next hit, naming the key."""
    from eager_neuron.cache import verify
    from eager_neuron.config import config

    real = families.ELEMENTWISE.renderer
    calls, flag = [], {"extra": ""}

    def renderer(*fields):
        calls.append(fields)
        src, name = real(*fields)
        return src + flag["extra"], name

    monkeypatch.setattr(families.ELEMENTWISE, "renderer", renderer)
    monkeypatch.setattr(config, "cache_verify", True)
    x = torch.randn(7, device="neuron")
    before = verify.VERIFIER.checked
    for _ in range(3):
        y = x * 3.0 + 1.0              # the 2nd and 3rd rounds are memory hits
    assert torch.allclose(y.cpu(), x.cpu() * 3.0 + 1.0)
    assert verify.VERIFIER.checked - before == 6
    assert len(calls) >= 6 and {c[0] for c in calls} >= {"aten::mul", "aten::add"}
    flag["extra"] = "# read from outside the key\n"
    with pytest.raises(Exception, match="renders different source") as info:
        x * 3.0
    assert "aten::mul" in str(info.value)


def _keys_of(run) -> list:
    """The lowering keys of the launches `run()` makes (launch appends the argument types)."""
    seen = []
    hook = seen.append
    launch.HOOKS.append(hook)
    try:
        run()
    finally:
        launch.HOOKS.remove(hook)
    return [e["key"] for e in seen]


def test_reduce_and_matmul_keys_are_typed():
    x = torch.randn(6, 5, device="neuron")
    i = torch.arange(12, device="neuron").reshape(3, 4)

    def run():
        x.sum(1), x.mean(), x.var(0), x.amax(1), x.logsumexp(1), x.norm(p=3.0)
        x @ x.t(), torch.bmm(x[None], x.t()[None]), torch.addmm(x, x, x[:5]), i @ i.t()

    typed = {}
    for key in _keys_of(run):
        for t in families.TYPES:
            n = len(t.fields) + 1
            if t.matches(key[:n]):
                typed.setdefault(t.fields, []).append(key[:n])
                src, name = t.render(key[:n])
                assert f"def {name}(" in src
    assert len(typed.get(families.REDUCE.fields, [])) >= 5, typed.keys()
    assert families.MATMUL_BLAS.fields in typed and families.MATMUL_LOOP.fields in typed


def test_a_key_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="is not a reduce key"):
        families.REDUCE.render(("reduce", "sum", 1))
    assert families.type_of(("matmul", "mm", 1, "neither", (), "none")) is None
    k = KeyType("t", ("a",), lambda a: (f"def k{a}():\n    pass\n", f"k{a}"))
    assert k.describe(("t", 1)) == "t(a=1)" and not k.matches(("u", 1))
