"""The op table (eager_neuron/ops.py): every op registered once, variants read off the schema,
docs/OPS.md current."""

import importlib
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import eager_neuron  # noqa: F401
import eager_neuron.lower
from eager_neuron import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _family_modules() -> dict:
    out = {}
    for info in pkgutil.iter_modules(eager_neuron.lower.__path__):
        mod = importlib.import_module(f"eager_neuron.lower.{info.name}")
        if hasattr(mod, "LOWERINGS"):
            out[info.name] = mod
    return out


def test_registering_an_op_twice_fails_loudly():
    before = (dict(ops.KERNELS), dict(ops.FAMILY_OF))
    with pytest.raises(ops.DuplicateOpError, match="aten::mm is registered by both the 'matmul' "
                       "and the 'elementwise' families"):
        ops.register("aten::mm", lambda func, a, outs: None, "elementwise")
    assert (ops.KERNELS, ops.FAMILY_OF) == before           # nothing half-registered


def test_no_two_lower_modules_export_the_same_op():
    # the only overlaps: a module that re-exports another family's dict (same functions), and
    # the OVERRIDES ops.py names explicitly
    mods = _family_modules()
    owner = {}
    for name, mod in sorted(mods.items()):
        reexported = {n for sub in ops.RE_EXPORTS.get(name, ()) for n in mods[sub].LOWERINGS}
        for op, fn in mod.LOWERINGS.items():
            if op in reexported:
                sub = next(s for s in ops.RE_EXPORTS[name] if op in mods[s].LOWERINGS)
                assert fn is mods[sub].LOWERINGS[op], f"{name} re-exports another {op}"
                continue
            if op in owner and ops.OVERRIDES.get(op) not in (owner[op], name):
                pytest.fail(f"{op} is exported by lower/{owner[op]}.py and lower/{name}.py")
            owner[op] = name


def test_every_family_module_is_in_the_table():
    missing = set(_family_modules()) - set(ops.TABLE)
    assert not missing, f"lower/ modules with LOWERINGS but no row in ops.TABLE: {missing}"


def test_each_op_runs_its_own_familys_lowering():
    mods = _family_modules()
    for op, family in ops.FAMILY_OF.items():
        fn = ops.KERNELS[op]
        if op in mods[family].LOWERINGS:
            assert mods[family].LOWERINGS[op] is fn, op
        else:                                   # an in-place variant read off the schema
            base, dot, overload = op.partition(".")
            assert base.endswith("_"), op
            assert mods[family].LOWERINGS[base[:-1] + dot + overload] is fn, op


def test_in_place_variants_are_read_off_the_schema_not_listed():
    # a family whose row reads in-place variants lists none that the schema would give it
    # (the same lowering under `op_` or `op_.overload`); scatter_.src & co. come from the schema
    mods = _family_modules()
    for family, kinds in ops.TABLE.items():
        if "inplace" not in kinds or family not in mods:
            continue
        table = mods[family].LOWERINGS
        for op, fn in table.items():
            base, dot, overload = op.partition(".")
            functional = base[:-1] + dot + overload
            assert not (base.endswith("_") and table.get(functional) is fn), \
                f"lower/{family}.py lists {op}: ops.py reads it off the schema"
    assert ops.KERNELS["aten::scatter_.src"] is ops.KERNELS["aten::scatter.src"]
    assert ops.family_of("aten::addmm_") == "matmul" and ops.family_of("aten::put_") == "index"


def test_variants_read_off_the_schema():
    # in-place and out= come from torch's schemas, for the families that allow them
    assert ops.KERNELS["aten::add_"] is ops.KERNELS["aten::add"]
    assert ops.family_of("aten::add.out") == "elementwise"
    assert "aten::add" in ops.OUT_OK and "aten::mm" not in ops.OUT_OK
    assert ops.family_of("aten::mm.out") is None               # matmul does not take out=
    for op in ops.FAMILY_OF:
        if op.endswith("_") and ops.FAMILY_OF[op] == "elementwise" and op[:-1] in ops.KERNELS:
            packet = getattr(torch.ops.aten, op.split("::")[1])
            assert all(getattr(packet, ov)._schema.arguments[0].alias_info.is_write
                       for ov in packet.overloads()), op


def test_shape_has_no_dead_sort():
    assert ops.family_of("aten::sort") == ops.family_of("aten::topk") == "sort"
    assert not {"aten::sort", "aten::topk"} & set(_family_modules()["shape"].LOWERINGS)


def test_docs_ops_md_is_current():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_ops_doc.py"),
                           "--check"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
