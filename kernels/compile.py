r"""Compile rendered kernel source with Numba: the one place kernels are compiled (numba is also
imported by cache/keys.py for its version, cache/rebuild.py to rebuild cached entries, and the
kernels written with the custom-kernel API, which need `prange` and `njit`).

>>> from eager_neuron.kernels.compile import compile_kernel
>>> k = compile_kernel("@njit\ndef k(x):\n    return x + 1\n", "k")
>>> k(1)
2
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import numpy as np

_numba = None
_lock = threading.Lock()
# NOTE: Numba's OpenMP/workqueue layers are not fork-safe: a forked child (a DataLoader worker)
# that runs a parallel kernel dies. Children fall back to the serial variant of each kernel.
_IN_FORKED_CHILD = False


def _after_fork_in_child() -> None:
    global _IN_FORKED_CHILD
    _IN_FORKED_CHILD = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_allowed() -> bool:
    return not _IN_FORKED_CHILD


def tune_target() -> str | None:
    """Let LLVM use 512-bit vectors on an AVX-512 host: the host's features plus
    `-prefer-256-bit`, as NUMBA_CPU_FEATURES (returned; None when nothing was set).

    Why: LLVM's tuning for Intel AVX-512 cores prefers 256-bit vectors, so a vectorized kernel
    ran at half the width torch's AVX-512 kernels use: the float32 GELU kernel measured 2.5x
    faster with 512-bit vectors (kernels/vmath.py helpers are compute-bound), memory-bound
    loops unchanged. Must run before Numba creates its code generator (numba() and the disk
    tier's toolchain key call it first); the features are part of that key, so kernels cached
    with other features are clean misses. A user's NUMBA_CPU_NAME or NUMBA_CPU_FEATURES wins.
    """
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        return None
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features()
    if not features.get("avx512f"):
        return None
    value = features.flatten() + ",-prefer-256-bit"
    os.environ["NUMBA_CPU_FEATURES"] = value
    config = sys.modules.get("numba.core.config")
    if config is not None:   # numba imported already (by the user): its codegen may not exist yet
        config.CPU_FEATURES = value
    return value


def numba():
    """Import numba lazily (0.4 s) and remember torch's thread count across it."""
    global _numba
    if _numba is None:
        import torch

        threads = torch.get_num_threads()
        tune_target()
        import numba as nb

        _unique_function_ids()
        _numba = nb
        torch.set_num_threads(threads)
    return _numba


def _unique_function_ids() -> None:
    """Start Numba's function counter at a random 40-bit offset in this process.

    Numba names a compiled function after its qualified name, argument types and a per-process
    counter (the `v<uid>` tag of the mangled name), and gives it linkonce_odr linkage: two
    definitions of one name are assumed identical and the JIT keeps the first it loads. Kernels
    compiled in different processes (the disk cache: workers, earlier runs) can reuse a counter
    value, so two same-named helpers with different bodies would share one symbol once both are
    loaded into one process (a resampling kernel once read another's table that way). With a
    random start per process, names from different processes do not meet.
    """
    import itertools
    import secrets

    from numba.core.bytecode import FunctionIdentity

    FunctionIdentity._unique_ids = itertools.count(secrets.randbits(40) + 1)


class KernelCompileError(RuntimeError):
    pass


_NJIT = []   # the kernels' njit (made once)


def _kernel_njit(nb):
    """numba.njit with `no_cfunc_wrapper=True` unless the source says otherwise.

    Why: Numba lowers a C-callable wrapper for every function it compiles, for `cfunc`-style
    callers; kernels and their helpers are called through the dispatcher (from Python) or
    directly (from other njit code), never through it. Skipping it is 13% of the compile time
    of a small elementwise kernel (tools/bench_coldcompile.py), and changes no instruction of
    the function itself. A dispatcher passed as an argument to another njit function still works
    (Numba calls it directly).
    """
    if not _NJIT:
        njit = nb.njit

        def kernel_njit(*args, **kwargs):
            kwargs.setdefault("no_cfunc_wrapper", True)
            return njit(*args, **kwargs)

        _NJIT.append(kernel_njit)
    return _NJIT[0]


def _namespace() -> dict:
    nb = numba()
    return {
        "np": np,
        "math": math,
        "numba": nb,
        "njit": _kernel_njit(nb),
        "prange": nb.prange,
    }


def compile_kernel(source: str, name: str, signature=None):
    """exec the rendered source and return the Numba dispatcher named `name`.

    With `signature` (a tuple of numba types) the machine code is built now, so compile time is
    measured here and not on the first call.
    """
    ns = _namespace()
    try:
        exec(compile(source, f"<eager_neuron kernel {name}>", "exec"), ns)
    except SyntaxError as exc:  # a renderer bug: say which kernel
        raise KernelCompileError(f"rendered source of kernel {name} is not valid Python: {exc}\n"
                                 f"{source}") from exc
    disp = ns[name]
    if signature is not None:
        import torch

        threads = torch.get_num_threads()
        with _lock:
            try:
                disp.compile(signature)
            except Exception as exc:
                raise KernelCompileError(
                    f"Numba failed to compile kernel {name} for {signature}: "
                    f"{type(exc).__name__}: {_short(exc)}\n"
                    f"--- source ---\n{source}") from exc
            finally:
                # NOTE: Numba's threading layer resets torch's intra-op thread count on init.
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
        disp.disable_compile()
    return disp


def _short(exc: Exception) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("During")]
    return "\n".join(lines[:12])


def typeof_args(args) -> tuple:
    nb = numba()
    return tuple(nb.typeof(a) for a in args)


def timed_compile(source: str, name: str, args):
    """Compile for the types of `args`; returns (dispatcher, seconds)."""
    t0 = time.perf_counter()
    disp = compile_kernel(source, name, typeof_args(args))
    return disp, time.perf_counter() - t0
