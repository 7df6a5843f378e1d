"""Kernel renderers: one module per family turns a plain-data spec into Numba source.

Nothing here knows about torch dispatch; `compile.py` is the only module that imports numba.

This directory installs as `eager_neuron.kernels`. Python run from the checkout's top directory
(`python train.py` there, `python -c`, `python -m`) has that directory on sys.path, where this
one would also import as a top-level `kernels` and shadow PyPI's `kernels` package (which
transformers >= 5.25 imports). Imported under that name, it hands the name to the package
found on the rest of sys.path, or raises ModuleNotFoundError as if this directory were absent.
Except under pytest: `make check` collects this directory's doctests, and pytest imports its
files by directory, as `kernels.<module>` (the test suite itself takes the top directory off
sys.path: tests/conftest.py).
"""

import sys as _sys

if __name__ == "kernels" and "_pytest" not in _sys.modules:
    import importlib.machinery as _machinery
    import os as _os

    _top = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _spec = _machinery.PathFinder.find_spec(
        "kernels", [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _top])
    if _spec is None or _spec.loader is None:
        raise ModuleNotFoundError(
            "No module named 'kernels' (this checkout's kernels/ directory is eager_neuron's "
            "eager_neuron.kernels, not a top-level package)", name="kernels")
    _module = __import__("importlib.util").util.module_from_spec(_spec)
    _sys.modules["kernels"] = _module   # the import statement returns what is here
    _spec.loader.exec_module(_module)
