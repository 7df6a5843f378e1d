"""Cached like NEFFs: a second process compiling the same training step (forward with row
kernels, backward, a compiled AdamW step) builds no Numba kernel: every fused and row kernel
comes from the disk cache, and its results are the first process's, bit for bit (same kernels,
same order)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
import torch

_STEP = r"""
import torch, eager_neuron
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                        torch.nn.Linear(16, 5)).to("neuron")
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
x = torch.randn(8, 12).to("neuron")
y = torch.randint(0, 5, (8,)).to("neuron")

@torch.compile(backend="neuron")
def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(torch.softmax(m(x), -1) * 3, y)
    loss.backward()
    opt.step()
    return loss.detach()

losses = [step().item() for _ in range(3)]
s, c = eager_neuron.stats(), eager_neuron.compile.stats()
print("RESULT", s["compiles"], s["disk_hits"], c["fused_kernel_launches"],
      c["row_kernel_launches"], sum(c["graph_fallbacks"].values()),
      " ".join(repr(v) for v in losses), m[0].weight.sum().item())
"""


def _result(out: str) -> list:
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT")]
    assert line, out[-2000:]
    return line[0].split()[1:]


def test_second_process_builds_no_kernel_for_a_training_step():
    from eager_neuron import launch
    from eager_neuron.config import config

    if launch.DISK is None:
        pytest.skip("the disk tier is off in this process (EAGER_NEURON_DISK_CACHE=0)")
    # this process fills the shared cache (or finds it filled) ...
    torch._dynamo.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_STEP, "<first process>", "exec"), {})
    torch._dynamo.reset()
    first = _result(out.getvalue())
    # ... and a second process on the same cache directory builds nothing
    env = dict(os.environ, EAGER_NEURON_CACHE_DIR=config.cache_dir, EAGER_NEURON_DISK_CACHE="1")
    r = subprocess.run([sys.executable, "-c", _STEP], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    second = _result(r.stdout)
    compiles, disk_hits, fused, rows, fallbacks = (int(v) for v in second[:5])
    assert compiles == 0, f"the second process compiled Numba kernels: {first} / {second}"
    assert fallbacks == 0, second
    assert fused > 0 and rows > 0           # both kernel kinds ran ...
    assert disk_hits >= 2                    # ... loaded from the disk cache
    assert second[5:] == first[5:], (first, second)   # the same kernels: the same numbers


# the same step, also printing what each process rendered and how it got its programs; the
# hash of eager_neuron's sources that keys the render index and the program cache is pinned
# (an edit of the tree between the two processes would otherwise be a clean miss of both)
_STEP_RENDERS = _STEP.replace('print("RESULT"', '''print("RENDERS", s["kernel_renders"],
      s["render_index_hits"], c["programs_saved"], c["programs_loaded"], c["programs_restored"])
print("RESULT"''').replace("import torch, eager_neuron\n", '''import torch, eager_neuron
from eager_neuron.cache import keys as _keys
_keys.source_hash = lambda: "pinned-by-the-test"
''', 1)


def _renders(out: str) -> list:
    line = [ln for ln in out.splitlines() if ln.startswith("RENDERS")]
    assert line, out[-2000:]
    return [int(v) for v in line[0].split()[1:]]


def test_warm_process_renders_no_kernel(tmp_path):
    """A warm process renders no kernel source: fused and row kernels come from the disk
    cache's render index by key, and each program is restored whole from torch's AOTAutograd
    cache (no partition, no row source built). Both processes are fresh, on caches of this
    test's own (with the source hash pinned, the shared cache must not hold its entries)."""
    env = dict(os.environ, EAGER_NEURON_CACHE_DIR=str(tmp_path / "kernels"),
               EAGER_NEURON_DISK_CACHE="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "torch"))
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _STEP_RENDERS], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    first, second = _result(outs[0]), _result(outs[1])
    renders1, _hits1, saved1, _loaded1, _restored1 = _renders(outs[0])
    renders2, hits2, saved2, loaded2, restored2 = _renders(outs[1])
    assert renders1 > 0 and saved1 >= 2, outs[0][-1000:]      # the first one built programs
    assert int(second[0]) == 0, second                         # no Numba compile ...
    assert renders2 == 0, (renders2, hits2, restored2)         # ... and no source rendered:
    assert hits2 >= 2 and int(second[1]) >= hits2             # kernels found by key
    assert saved2 == 0 and loaded2 == restored2 == saved1      # every program restored whole
    assert int(second[4]) == 0                                 # no graph fallback
    assert second[5:] == first[5:], (first, second)            # the same kernels, same numbers


_ERR = r"""
import torch, eager_neuron
from eager_neuron.cache import keys as _keys
_keys.source_hash = lambda: "pinned-by-the-test"   # (an edit of the tree between runs: a miss)

def f(x, i):
    return torch.index_select(x * 2, 0, i)

try:
    torch.compile(f, backend="neuron")(torch.randn(4, device="neuron"),
                                       torch.tensor([9], device="neuron"))
except IndexError as e:
    print("NOTES", "".join(getattr(e, "__notes__", [])).replace("\n", " | "))
print("LOADED", eager_neuron.compile.stats()["programs_loaded"])
"""


def test_warm_entry_names_the_moved_source_line(tmp_path):
    # torch's AOTAutograd key ignores the graph's source lines: a warm entry used to serve the
    # storing process's stack traces, so an error after an edit that moved the code named the
    # old line (and no code). Moved code is a miss; unmoved code still loads the entry. (The
    # source hash is pinned: the caches are this test's own.)
    env = dict(os.environ, EAGER_NEURON_CACHE_DIR=str(tmp_path / "neuron"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), EAGER_NEURON_DISK_CACHE="1")
    script = tmp_path / "user_model.py"

    def run(src):
        script.write_text(src)
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        notes = [ln for ln in r.stdout.splitlines() if ln.startswith("NOTES")]
        loaded = [ln for ln in r.stdout.splitlines() if ln.startswith("LOADED")]
        assert notes and loaded, r.stdout[-2000:]
        return notes[0], int(loaded[0].split()[1])

    line = _ERR.splitlines().index("    return torch.index_select(x * 2, 0, i)") + 1
    first, _ = run(_ERR)
    assert f"line {line}," in first and "return torch.index_select(x * 2, 0, i)" in first
    again, loaded = run(_ERR)
    assert again == first and loaded > 0           # the same source: the warm entry serves it
    moved, _ = run("\n" * 5 + _ERR)
    assert f"line {line + 5}," in moved, moved
    assert "return torch.index_select(x * 2, 0, i)" in moved, moved
