"""Green on one x86-64 machine means green on the next: the ISA-sensitive tests rerun under every
CPU capability this machine can emulate.

Torch's CPU kernels round differently by instruction set (oneDNN's AMX bfloat16 path, AVX-512
gelu/matrix_exp/SVD), so tests that compare with them judge against float64 references with
dtype-derived bounds instead (marker `isa`; OpInfo triples in test_opinfo.ISA_SENSITIVE). This
test reruns exactly those tests in subprocesses with ATEN_CPU_CAPABILITY set to each capability
other than the native one (the plain suite covers native), oneDNN capped to AVX2 alongside
ATEN's avx2, and requires them to pass there too. The variants run concurrently.

    .venv/bin/python -m pytest tests/test_isa.py -q      # ~1 min on 2 cores
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = ("tests/test_conv.py", "tests/test_vmath.py", "tests/test_resample_u8.py")
TIMEOUT = 900


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def variants() -> list:
    """[{env var: value}] to run under: each ATEN capability the CPU has, except the native one."""
    flags = _cpu_flags()
    caps = ["default"]
    if "avx2" in flags:
        caps.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        caps.append("avx512")
    native = torch.backends.cpu.get_cpu_capability().lower()
    out = []
    for cap in caps:
        if cap == native:
            continue
        env = {"ATEN_CPU_CAPABILITY": cap}
        if cap == "avx2":
            env["ONEDNN_MAX_CPU_ISA"] = "AVX2"   # oneDNN picks its own ISA (AMX) otherwise
        out.append(env)
    return out


def _opinfo_ids() -> list:
    sys.path.insert(0, HERE)
    try:
        from test_opinfo import ISA_SENSITIVE
    finally:
        sys.path.remove(HERE)
    ops = sorted({op for op, _dt, _ph in ISA_SENSITIVE})
    return [f"tests/test_opinfo.py::test_op[{op}]" for op in ops]


def test_variants_cover_this_cpu():
    """The variant list is derived from this CPU: never empty on x86-64, never the native one."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY variants are x86-64 capabilities")
    vs = variants()
    native = torch.backends.cpu.get_cpu_capability().lower()
    assert vs and all(v["ATEN_CPU_CAPABILITY"] != native for v in vs)
    assert all(v["ATEN_CPU_CAPABILITY"] in ("default", "avx2", "avx512") for v in vs)


def test_isa_sensitive_tests_pass_under_every_capability():
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY variants are x86-64 capabilities")
    args = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-m",
            "isa or opinfo", *FILES, *_opinfo_ids()]
    procs = []
    for extra in variants():
        env = dict(os.environ, EAGER_NEURON_OPINFO_JOBS="0", EAGER_NEURON_OPINFO_ADAPTIVE="0",
                   **extra)
        procs.append((extra, subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)))
    failed = []
    for extra, p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            failed.append(f"{extra}: timed out after {TIMEOUT} s\n{out[-2000:]}")
            continue
        if p.returncode != 0:
            failed.append(f"{extra}: exit {p.returncode}\n{out[-3000:]}")
        elif "passed" not in out:
            failed.append(f"{extra}: no test ran\n{out[-2000:]}")
    assert not failed, "\n\n".join(failed)
