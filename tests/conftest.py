"""Shared fixtures: counters, the strict-fallback switch, and the OpInfo fallback summary.

>>> def test_x(stats_delta):            # counters since the test started
...     torch.ones(3, device="neuron") + 1
...     assert stats_delta()["launches"] >= 1
"""

from __future__ import annotations

import collections
import os
import sys

# `python -m pytest` from the checkout puts its top directory on sys.path, where kernels/ (our
# eager_neuron.kernels, installed under that name) shadows PyPI's `kernels` package, which
# transformers >= 5.25 imports (ImportError: cannot import name 'CUDAProperties' from 'kernels').
# eager_neuron itself is found through its installed finder, not through this path entry.
_TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TOP]

import pytest  # noqa: E402
import torch  # noqa: E402

import eager_neuron  # noqa: E402
from eager_neuron.config import config as neuron_config  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "opinfo: one OpInfo op on neuron vs the CPU")
    config.addinivalue_line("markers", "models: real models train on neuron vs the CPU")
    config.addinivalue_line("markers", "isa: a test whose CPU reference could depend on the "
                            "CPU's instruction set; tests/test_isa.py reruns these under every "
                            "ATEN_CPU_CAPABILITY the machine has")
    # the fallback warns once per op; tests count fallbacks through stats() instead
    config.addinivalue_line("filterwarnings", "ignore:.*has no neuron kernel:UserWarning")


@pytest.fixture(autouse=True)
def _background_builds_done_first():
    """Fused kernels an earlier test queued build on adaptive eager's background thread, which
    waits for the main thread's kernel builds to go quiet first (adaptive_compile.QUIET): they
    finish before the next test starts, so no test counts another's compiles (a fast-path
    fuzz program saw one: `compiles` fast 1, slow 0). Returns at once when nothing is queued."""
    from eager_neuron import adaptive_compile

    adaptive_compile.wait(600)


@pytest.fixture
def stats_delta():
    """A function returning the counters accumulated since the fixture was set up (after an
    earlier test's adaptive fused kernels, built in the background, are done: their compiles
    are not this test's)."""
    from eager_neuron import adaptive_compile

    adaptive_compile.wait(600)
    eager_neuron.reset_stats()

    def delta() -> dict:
        return eager_neuron.stats()

    return delta


@pytest.fixture
def dynamo_reset():
    """torch._dynamo.reset() around the test and the compile counters zeroed before it (the
    compiled-mode test files use it for every test: `pytestmark = usefixtures(...)`)."""
    import torch._dynamo

    torch._dynamo.reset()
    eager_neuron.compile.reset_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture
def strict_fallback():
    """EAGER_NEURON_FALLBACK=error for the duration of the test."""
    prev = neuron_config.fallback
    neuron_config.fallback = "error"
    try:
        yield
    finally:
        neuron_config.fallback = prev


@pytest.fixture
def funnel_calls(monkeypatch):
    """A function counting the calls of a stage of the funnel's slow path from now on:
    `n = funnel_calls("_kernel_setup")`, then `n[0]` (the stage is eager_neuron.dispatch's
    module function of that name: a call that reached it did not repeat from a runner)."""
    from eager_neuron import dispatch

    def watch(name: str) -> list:
        count = [0]
        stage = getattr(dispatch, name)

        def counted(*args, **kwargs):
            count[0] += 1
            return stage(*args, **kwargs)

        monkeypatch.setattr(dispatch, name, counted)
        return count

    return watch


@pytest.fixture
def no_alone_verdicts(monkeypatch):
    """Adaptive eager's alone verdicts off (an op that only starts groups of one keeps
    starting them instead of running as plain eager): counts of recorded ops stay fixed."""
    from eager_neuron import adaptive_fast
    from eager_neuron.adaptive import MODULE as adaptive

    monkeypatch.setattr(adaptive, "ALONE_ON", [False])
    monkeypatch.setattr(adaptive_fast, "_ALONE_ON", adaptive.ALONE_ON)


@pytest.fixture
def seeded():
    """Seed the (shared CPU) generator; returns the seeding function for re-seeding."""
    def seed(s: int = 0) -> None:
        torch.manual_seed(s)

    seed()
    return seed


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    """After an OpInfo run: which ops reached the CPU fallback, and how often."""
    mod = sys.modules.get("test_opinfo") or sys.modules.get("tests.test_opinfo")
    seen: collections.Counter = getattr(mod, "FALLBACKS_SEEN", None) or collections.Counter()
    if not seen:
        return
    tr = terminalreporter
    tr.section("eager_neuron: CPU fallbacks met by the OpInfo sweep")
    tr.write_line(f"{sum(seen.values())} fallback calls in {len(seen)} ops "
                  "(these samples count as failures; see tests/opinfo_xfail.txt)")
    for name, count in seen.most_common(25):
        tr.write_line(f"  {count:6d}  {name}")
    if len(seen) > 25:
        tr.write_line(f"  ... and {len(seen) - 25} more ops")
