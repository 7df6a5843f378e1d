"""The *_copy forms of views (what functionalized graphs, torch.export and HOP autograd traces
are made of) run on neuron, not as CPU fallbacks, and equal the CPU's: values, dtype, shape and
strides (a contiguous copy), every result of the multi-output ones."""

from __future__ import annotations

import pytest
import torch

import eager_neuron

aten = torch.ops.aten

CASES = {
    "select_copy": lambda t: aten.select_copy(t, 1, 2),
    "select_copy_neg": lambda t: aten.select_copy(t.transpose(0, 2), -1, -1),
    "slice_copy": lambda t: aten.slice_copy(t, 2, 1, 4),
    "slice_copy_step": lambda t: aten.slice_copy(t.transpose(1, 2), 1, 0, 5, 2),
    "detach_copy": lambda t: aten.detach_copy(t.transpose(0, 1)),
    "split_copy": lambda t: aten.split_copy(t, 2, 1),
    "split_with_sizes_copy": lambda t: aten.split_with_sizes_copy(t, [1, 3], 1),
    "reshape_copy": lambda t: aten._reshape_copy(t.transpose(0, 2), [60]),
    "view_as_real_copy": lambda t: aten.view_as_real_copy(t.to(torch.complex64)),
    "view_as_complex_copy": lambda t: aten.view_as_complex_copy(t.reshape(3, 10, 2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_view_copy_runs_on_neuron_as_the_cpu(name):
    f = CASES[name]
    x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    ref = f(x)
    eager_neuron.reset_stats()
    got = f(x.to("neuron"))
    assert eager_neuron.stats()["fallbacks"] == {}
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    gots = got if isinstance(got, (list, tuple)) else [got]
    assert len(gots) == len(refs)
    for g, r in zip(gots, refs):
        assert g.device.type == "neuron"
        g = g.cpu()
        assert g.dtype == r.dtype and g.shape == r.shape and g.stride() == r.stride()
        assert torch.equal(g, r)

