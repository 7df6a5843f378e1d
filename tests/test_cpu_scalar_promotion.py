"""0-d CPU tensors take part in ATen's type promotion (a dimensioned operand's category wins,
a 0-d one's dtype counts within it): the device answers and refuses as the CPU does.

Found by probing ops with 0-d CPU operands of every dtype: lerp of integer tensors with a
0-d float weight is a float lerp on the CPU (neuron refused "lerp_kernel_tensor" for 'Int'),
and a bool tensor minus a complex 0-d tensor is refused by ATen's sub_check (the complex route
answered it).
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_lerp_of_integers_with_a_0d_float_weight(dtype):
    a = (torch.arange(6) % 3).to(dtype)
    end = a if dtype == torch.bool else a * 2
    for w in (torch.tensor(2.5), torch.tensor(0.5, dtype=torch.float16),
              torch.tensor(0.25, dtype=torch.float64)):
        want = torch.lerp(a, end, w)
        got = torch.lerp(a.to("neuron"), end.to("neuron"), w)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (dtype, w)
    for w in (0.5, torch.tensor(3)):   # the CPU refuses these: so does neuron
        with pytest.raises(NotImplementedError, match="lerp_kernel"):
            torch.lerp(a, end, w)
        with pytest.raises(NotImplementedError, match="lerp_kernel"):
            torch.lerp(a.to("neuron"), end.to("neuron"), w)


def test_bool_minus_a_complex_0d_tensor_is_refused():
    mask = torch.ones(3, dtype=torch.bool)
    for f in (lambda m, z: m - z, lambda m, z: z - m, lambda m, z: torch.rsub(m, z)):
        with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
            f(mask, torch.tensor(1 + 2j))
        with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
            f(mask.to("neuron"), torch.tensor(1 + 2j))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bitwise_of_a_half_tensor_and_a_0d_float_names_the_half_type(dtype):
    """half & tensor(2.5): the common dtype is the half type, and the CPU names it; neuron's
    half route (float32 inside) named 'Float'."""
    t = torch.ones(3, dtype=dtype)
    for s in (torch.tensor(2.5), torch.tensor(2.5, dtype=torch.float64)):
        for f in (lambda a, b: a & b, lambda a, b: b | a, lambda a, b: a.bitwise_xor_(b)):
            with pytest.raises(NotImplementedError) as cpu:
                f(t.clone(), s)
            with pytest.raises(NotImplementedError) as got:
                f(t.to("neuron"), s)
            assert str(got.value).startswith(str(cpu.value)), (str(got.value), str(cpu.value))
