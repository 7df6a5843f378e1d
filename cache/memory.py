"""The memory tier: a dict from kernel key to a compiled kernel, with hit/miss counters."""

from __future__ import annotations


class MemoryCache:
    def __init__(self) -> None:
        self._kernels: dict = {}
        self.on_clear: list = []   # callbacks: what holds kernels outside this dict forgets them

    def get(self, key):
        return self._kernels.get(key)

    def put(self, key, kernel) -> None:
        self._kernels[key] = kernel

    def clear(self) -> None:
        self._kernels.clear()
        for callback in self.on_clear:
            callback()

    def __len__(self) -> int:
        return len(self._kernels)

    def keys(self):
        return list(self._kernels)
