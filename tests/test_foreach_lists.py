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


def _foreach_cases(ps, es, ss, xs):
    """(name, fn) of AdamW's in-place foreach updates and other list/scalar shapes."""
    n = len(ps)
    return [
        ("lerp_", lambda: torch._foreach_lerp_(es, ps, 0.1)),
        ("mul_", lambda: torch._foreach_mul_(es, 0.9)),
        ("addcmul_", lambda: torch._foreach_addcmul_(ss, es, es, 0.001)),
        ("addcdiv_.ScalarList", lambda: torch._foreach_addcdiv_(
            ps, es, ss, [0.01 * (i + 1) for i in range(n)])),
        ("add_.List", lambda: torch._foreach_add_(ps, xs, alpha=-0.5)),
        ("div_.Scalar", lambda: torch._foreach_div_(ss, 1.5)),
        # a list holding one tensor twice, and another list's tensor: element order matters
        ("add_.aliased", lambda: torch._foreach_add_([ps[3], ps[3], es[3]],
                                                     [es[3], ss[3], ps[3]])),
    ]


def test_foreach_in_one_kernel_equals_the_element_loop_bit_for_bit():
    """An optimizer's in-place foreach update whose elements are small flat kernels of one key
    runs as one kernel over a table of the tensors' addresses (fastpath_foreach._multi, built in
    the background), with the element loop's exact arithmetic (the element kernels' own tests
    judge that against the CPU), counted and charged as the element loop."""
    from eager_neuron import adaptive_compile, fastpath, fastpath_foreach

    g = torch.Generator().manual_seed(0)
    sizes = [7, 2, 33, 128, 5]

    def lists():
        g.manual_seed(0)
        return [[torch.randn(s, generator=g) for s in sizes] for _ in range(4)]

    results = {}
    launches = {}
    for multi in (False, True):
        fastpath_foreach.MULTI[0] = multi
        fastpath.reset()   # runners are learned with the switch as it is
        try:
            ps, es, ss, xs = ([t.to("neuron") for t in ls] for ls in lists())
            ss = [s.abs_() for s in ss]
            cases = _foreach_cases(ps, es, ss, xs)
            for name, fn in cases:
                for _ in range(3):        # learn, then repeat (the kernel builds meanwhile)
                    fn()
                adaptive_compile.wait(120)
                eager_neuron.reset_stats()
                one = fastpath.STATS_FAST["one_kernel"]
                fn()
                launches[multi, name] = (eager_neuron.stats()["launches"],
                                         fastpath.STATS_FAST["one_kernel"] - one)
            results[multi] = [t.cpu() for t in ps + es + ss + xs]
        finally:
            fastpath_foreach.MULTI[0] = True
            fastpath.reset()
    for a, b in zip(results[False], results[True]):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    for name in ("lerp_", "mul_", "addcmul_", "addcdiv_.ScalarList", "add_.List", "div_.Scalar",
                 "add_.aliased"):
        # one kernel, counted as the element loop's launches (same counters and cost)
        assert launches[False, name][1] == 0 and launches[True, name][1] == 1, (name, launches)
        assert launches[True, name][0] == launches[False, name][0] > 1
