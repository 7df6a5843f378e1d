"""Kernel caches: the memory tier, the disk tier (diskcache) and their keys.

Nothing here renders or compiles; `eager_neuron.launch` asks memory, then disk, then compiles.
"""

from .keys import FORMAT_VERSION, toolchain
from .memory import MemoryCache

__all__ = ["FORMAT_VERSION", "toolchain", "MemoryCache"]
