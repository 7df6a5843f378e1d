"""The disk tier's public face: the process's tier and the switch that installs it.

The tier lives in four modules, in the order a kernel meets them:
  cache/format.py   the entry's bytes: magic, JSON header (format, toolchain, key, checksum)
  cache/rebuild.py  Numba internals: serialise a compiled dispatcher, rebuild it on load
  cache/tier.py     DiskTier: open (and repair), load, store, the compile lock
  cache/admin.py    what the cache tool does: info, entries, clear, export, import
Every name that used to live here is re-exported, so `from eager_neuron.cache.disk import
DiskTier` (and `disk.pack`, `disk.unpack`, `disk._Miss`, `disk.DiskCacheWarning`) keep working.

>>> from eager_neuron.cache.disk import DiskTier
>>> DiskTier("/tmp/eager_neuron_doctest_cache").info()["directory"]
'/tmp/eager_neuron_doctest_cache'
"""

from __future__ import annotations

from eager_neuron.cache.format import (
    DB_TIMEOUT_S,
    MAGIC,
    DiskCacheWarning,
    _Miss,
    pack,
    unpack,
)
from eager_neuron.cache.rebuild import undefined_symbols
from eager_neuron.cache.tier import LOCK_TIMEOUT_S, N_LOCK_STRIPES, DiskTier

__all__ = ["MAGIC", "DiskCacheWarning", "_Miss", "pack", "unpack", "undefined_symbols",
           "DB_TIMEOUT_S", "LOCK_TIMEOUT_S", "N_LOCK_STRIPES", "DiskTier", "TIER", "install",
           "uninstall"]

TIER = DiskTier()


def install(tier: DiskTier | None = None) -> DiskTier:
    """Make `tier` (default: the configured one) the launch path's disk tier.

    >>> from eager_neuron.cache import disk
    >>> disk.install() is disk.TIER
    True
    """
    from eager_neuron import launch

    launch.DISK = tier or TIER
    return launch.DISK


def uninstall() -> None:
    """No disk tier: every memory miss compiles (as EAGER_NEURON_DISK_CACHE=0)."""
    from eager_neuron import launch

    launch.DISK = None
