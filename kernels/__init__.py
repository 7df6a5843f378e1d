"""Kernel renderers: one module per family turns a plain-data spec into Numba source.

Nothing here knows about torch dispatch; `compile.py` is the only module that imports numba.
"""
