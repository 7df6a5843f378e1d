"""The BLAS thread count per product: SciPy's OpenBLAS (what Numba's np.dot calls) is set to one
thread for small products and its own default for large ones, by the lowering that launches
the product (lower/matmul.py, lower/conv.py); the fast path and adaptive eager's runners replay
the same call (a context capturing the op records it).

>>> from eager_neuron.blas import blas_threads
>>> blas_threads(1e3)    # a small product: one thread (a no-op without SciPy's OpenBLAS)
"""

from __future__ import annotations

from .context import _TLS

BLAS_THREADED_MIN = 1 << 26   # flops of one BLAS call below which it runs on one thread


class _BlasThreads:
    """SciPy's OpenBLAS (what Numba's np.dot calls) thread count, set per launch by size.

    Why: OpenBLAS threads busy-wait for each other on every call. For small products (a conv's
    per-sample gemms, an MLP's layers) that sync costs more than the second thread saves, and on
    a busy machine it is catastrophic (measured: 128^3 gemm 0.3 ms on 1 thread, 4.8 ms on 2; a
    conv forward 20 ms vs 1.5 s). Large products keep OpenBLAS's own default (as MKL would).
    The setting is process-wide for SciPy's OpenBLAS (user scipy.linalg calls see the last one);
    no OpenBLAS found (another BLAS, another SciPy build): a no-op.
    """

    def __init__(self) -> None:
        self.setter = None
        self.default = 1
        self.current = None
        self.loaded = False

    def _load(self) -> None:
        import ctypes
        import glob
        import os

        self.loaded = True
        try:
            import scipy

            root = os.path.dirname(os.path.dirname(scipy.__file__))
            for path in glob.glob(os.path.join(root, "scipy.libs", "*openblas*")):
                lib = ctypes.CDLL(path)
                for prefix in ("scipy_openblas", "openblas"):
                    setter = getattr(lib, f"{prefix}_set_num_threads", None)
                    getter = getattr(lib, f"{prefix}_get_num_threads", None)
                    if setter is not None and getter is not None:
                        self.setter, self.default = setter, max(1, int(getter()))
                        self.current = self.default
                        return
        except Exception:  # noqa: BLE001 - a missing library only costs speed
            self.setter = None

    def __call__(self, flops_per_call: float) -> None:
        if not self.loaded:
            self._load()
        if self.setter is None:
            return
        want = self.default if flops_per_call >= BLAS_THREADED_MIN else 1
        ctx = getattr(_TLS, "ctx", None)
        if ctx is not None and ctx.capture is not None:   # the fast path replays this call
            ctx.capture.append(("call", self, (flops_per_call,)))
        if want != self.current:
            self.setter(want)
            self.current = want


blas_threads = _BlasThreads()
