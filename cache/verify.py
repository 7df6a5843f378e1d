"""EAGER_NEURON_CACHE_VERIFY=1: prove that a kernel key holds everything that changes the code.

A key is a flat tuple of exactly what changes the generated source (docs/CACHE.md). A field a
renderer reads but the key lacks is a silent wrong answer: a later call with a different value
hits the first call's kernel. In verify mode every lookup re-renders the kernel and compares the
source with the one first rendered under the same key; a difference raises CacheKeyError naming
the key and the first differing line. Costs one render per launch: a debugging switch.

The launch path calls `seen(full_key, render)` once per lookup when `config.cache_verify` is set.

>>> from eager_neuron.cache import verify
>>> v = verify.Verifier()
>>> v.seen(("doc", "fill"), lambda: ("def k(o):\\n    o[:] = 1\\n", "k"))
>>> v.seen(("doc", "fill"), lambda: ("def k(o):\\n    o[:] = 2\\n", "k"))
Traceback (most recent call last):
eager_neuron.cache.verify.CacheKeyError: kernel key ('doc', 'fill') renders different source: \
line 2 was '    o[:] = 1', now '    o[:] = 2'; a field the renderer reads is missing from the key
"""

from __future__ import annotations

import hashlib
import threading


class CacheKeyError(AssertionError):
    """Two renders under one kernel key differ: the key misses a field (a bug in a lowering)."""


class Verifier:
    """The first source rendered under each key; later renders must equal it."""

    def __init__(self) -> None:
        self._first: dict = {}       # key -> (sha256 of the source, the source)
        self._lock = threading.Lock()
        self.checked = 0             # lookups verified (tests assert it moved)

    def seen(self, key: tuple, render) -> None:
        """Render `key`'s kernel; record it the first time, raise CacheKeyError if it changed."""
        source, _name = render()
        digest = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            first = self._first.setdefault(key, (digest, source))
            self.checked += 1
        if first[0] == digest:
            return
        old, new = first[1].splitlines(), source.splitlines()
        i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        was = old[i] if i < len(old) else "<end>"
        now = new[i] if i < len(new) else "<end>"
        raise CacheKeyError(f"kernel key {key!r} renders different source: line {i + 1} was "
                            f"{was!r}, now {now!r}; a field the renderer reads is missing from "
                            "the key")

    def clear(self) -> None:
        with self._lock:
            self._first.clear()


VERIFIER = Verifier()
seen = VERIFIER.seen
