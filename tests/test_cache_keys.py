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
def test_elementwise_key_renders_what_the_lowering_renders(case):
    func, args, kwargs, op_name = _CASES[case]
    a = bind(func, args, kwargs)
    meta = func(*args, **kwargs)
    out = torch.empty_like(meta)
    req = ew.lower_elementwise(func, a, [out], op_name, defer=True)
    key, render = req[0], req[1]
    assert families.type_of(key) is families.ELEMENTWISE, key
    assert families.ELEMENTWISE.render(key) == render()


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
