"""A foreach call whose lists differ in length is refused before any element is written.

The CPU checks the lists first ("Tensor list must have same number of elements as scalar
list."); neuron's per-element loop wrote the first elements, then failed at the missing one:
`torch._foreach_mul_([a, b], [2.0])` raised the CPU's words with `a` already doubled.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401

_CALLS = {
    "mul_ScalarList": lambda a, b: torch._foreach_mul_([a, b], [2.0]),
    "mul_ScalarList_out": lambda a, b: torch._foreach_mul([a, b], [2.0]),
    "add_List": lambda a, b: torch._foreach_add_([a, b], [a]),
    "addcmul_": lambda a, b: torch._foreach_addcmul_([a, b], [a], [b, a], [1.0, 2.0]),
    "lerp_ScalarList": lambda a, b: torch._foreach_lerp_([a, b], [b, a], [0.5]),
    "div_ScalarList_long": lambda a, b: torch._foreach_div_([a, b], [2.0, 3.0, 4.0]),
}


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_lists_of_other_lengths_write_nothing(name):
    call = _CALLS[name]
    base = torch.arange(8.).reshape(2, 4)
    with pytest.raises(RuntimeError) as cpu:
        call(base[0], base[1])
    assert torch.equal(base, torch.arange(8.).reshape(2, 4))   # the CPU wrote nothing
    dev = base.to("neuron")
    with pytest.raises(RuntimeError) as got:
        call(dev[0], dev[1])
    assert str(got.value).startswith(str(cpu.value).splitlines()[0])
    assert torch.equal(dev.cpu(), base), name
