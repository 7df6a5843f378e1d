"""PyTorch's OpInfo database for the half and complex dtypes: bfloat16, float16 and complex64,
forward and backward, on `neuron` against the CPU, bounded so `make test` stays short.

tests/test_opinfo.py covers float32/int64/bool/bfloat16 forward and float32 backward; this file
adds the gradients of bfloat16, and float16 and complex64 in both phases, at PyTorch's
`test_compare_cpu` tolerances (atol = rtol = 1e-3, raised by the OpInfo's own overrides), the
same judge as tools/dtype_sweep.py.

The budget is fixed: 1 in EAGER_NEURON_OPINFO_DTYPES_EVERY (default 2) ops of op_db, chosen by
a stable hash of the name, run their first EAGER_NEURON_OPINFO_DTYPES_SAMPLES (default 1)
samples in SHARE of the three dtypes (EAGER_NEURON_OPINFO_DTYPES_SHARE, default 1: each op in
one of bfloat16/float16/complex64 by the same hash; SHARE=3 and EVERY=1 run everything). The
full sweep is tools/dtype_sweep.py (docs/NUMERICS.md).
Verdicts are checked against tests/opinfo_dtypes_xfail.txt, strictly: a listed triple that
passes fails the test (the list can only shrink); one that fails unlisted fails it too.

    .venv/bin/python -m pytest tests/test_opinfo_dtypes.py -k 'acos or addbmm'
    .venv/bin/python tests/test_opinfo_dtypes.py --update-xfail    # regenerate the list
"""

from __future__ import annotations

import os
import re
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_opinfo as T  # noqa: E402 - the harness (run_op, verdict, xfail format)

HERE = os.path.dirname(os.path.abspath(__file__))
XFAIL_FILE = os.path.join(HERE, "opinfo_dtypes_xfail.txt")
DTYPES = (torch.bfloat16, torch.float16, torch.complex64)
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.complex64: "complex64"}
SAMPLES = int(os.environ.get("EAGER_NEURON_OPINFO_DTYPES_SAMPLES", "1"))
SHARE = int(os.environ.get("EAGER_NEURON_OPINFO_DTYPES_SHARE", "1"))
# 1 in EVERY ops of op_db (by the same hash): the cold-cache cost is the kernels' compiles
EVERY = int(os.environ.get("EAGER_NEURON_OPINFO_DTYPES_EVERY", "2"))
MAX_NUMEL = 2 ** 14   # small samples: the point is each op's dtype handling, not its sizes
for _d, _n in NAMES.items():   # run_op names results by dtype
    T.DTYPE_NAMES.setdefault(_d, _n)


def compare_cpu_tol(op, dtype) -> tuple:
    """test_compare_cpu's (atol, rtol): 1e-3 each, raised by the OpInfo's CPU overrides."""
    atol = rtol = 1e-3
    a2, r2 = T.tolerances(op, dtype)
    if a2 is not None:
        atol, rtol = max(atol, a2), max(rtol, r2)
    return atol, rtol


def selected_dtypes(op) -> tuple:
    """The dtypes this op runs in: SHARE of the three, chosen by a stable hash of its name,
    among those the op supports on the CPU."""
    h = zlib.crc32(T.op_id(op).encode())
    if (h // len(DTYPES)) % EVERY:
        return ()
    supported = op.supported_dtypes("cpu")
    return tuple(d for i, d in enumerate(DTYPES)
                 if (h + i) % len(DTYPES) < SHARE and d in supported)


def load() -> dict:
    xfail, _crash = T.load_xfail(XFAIL_FILE, names=set(NAMES.values()))
    return xfail


def run(op) -> dict:
    dts = selected_dtypes(op)
    return T.run_op(op, dtypes=dts, max_samples=SAMPLES, max_numel=MAX_NUMEL,
                    bwd_dtypes=dts, tol=compare_cpu_tol)


_OPS = [op for op in T.all_ops() if T.comparable(op) and selected_dtypes(op)]
_XFAIL = load()


@pytest.mark.opinfo
@pytest.mark.parametrize("op", _OPS, ids=[T.op_id(op) for op in _OPS])
def test_op_dtypes(op):
    name = T.op_id(op)
    results = run(op)
    bad, fixed = T.verdict(name, results, _XFAIL)
    msg = []
    if bad:
        msg.append("failures not in tests/opinfo_dtypes_xfail.txt:\n  " + "\n  ".join(bad))
    if fixed:
        msg.append("now passing: remove from tests/opinfo_dtypes_xfail.txt (strict xfail):\n  "
                   + "\n  ".join(fixed))
    if msg:
        pytest.fail("\n".join(msg), pytrace=False)
    if not any(o.status == "pass" for o in results.values()):
        if any(o.status == "fail" for o in results.values()):
            pytest.xfail("every phase is a listed failure")
        pytest.skip("no sample ran")


def test_xfail_list_names_real_ops_and_has_reasons():
    names = {T.op_id(op) for op in T.all_ops()}
    unknown = sorted({k[0] for k in _XFAIL} - names)
    assert not unknown, f"tests/opinfo_dtypes_xfail.txt names ops not in op_db: {unknown}"
    assert all(r.strip() for r in _XFAIL.values()), "every xfail line needs a reason"
    selected = {(T.op_id(op), NAMES[d]) for op in _OPS for d in selected_dtypes(op)}
    dead = sorted(k for k in _XFAIL if k[:2] not in selected)
    assert not dead, f"listed but never run (not in the bounded selection): {dead}"


def _update(pattern: str) -> None:
    """Rerun the bounded pass and rewrite the xfail list (keeping hand-written reasons)."""
    import warnings

    warnings.simplefilter("ignore")
    old = load()
    rx = re.compile(pattern)
    keep = {k: r for k, r in old.items() if not rx.search(k[0])}
    failures = dict(keep)
    for op in _OPS:
        name = T.op_id(op)
        if not rx.search(name):
            continue
        for (dt, ph), o in run(op).items():
            if o.status == "fail":
                failures[(name, dt, ph)] = old.get((name, dt, ph)) or o.reason
        print(name, flush=True)
    rows = sorted(failures.items())
    width = max((len(" ".join(k)) for k, _ in rows), default=0)
    with open(XFAIL_FILE, "w") as f:
        f.write("# (op, dtype, phase) of tests/test_opinfo_dtypes.py's bounded pass that fail on\n"
                "# neuron; strict: a listed triple that passes fails the test. Text after '#' is\n"
                "# the reason (the first failure seen, or why it is not fixed).\n"
                "# Regenerate: .venv/bin/python tests/test_opinfo_dtypes.py --update-xfail\n")
        for key, reason in rows:
            reason = re.sub(r"\s+", " ", reason)[:140]
            f.write(f"{' '.join(key):<{width}}  # {reason}\n")


if __name__ == "__main__":
    if "--update-xfail" in sys.argv:
        import eager_neuron  # noqa: F401 - registers the device

        _update(sys.argv[sys.argv.index("--update-xfail") + 1]
                if len(sys.argv) > sys.argv.index("--update-xfail") + 1 else ".")
