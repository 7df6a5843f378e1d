"""The PyTorch device conventions CUDA users take for granted, installed at import.

Each piece lives in its own module (storage.py: storages and checkpoints; amp.py: autocast and
GradScaler; pinned.py: pinned host memory); this module only wires them in once.
"""

from __future__ import annotations

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from . import storage

    storage.install()
