"""Knobs, read from the environment once at import; each has a Python setter too.

TorchNeuron's own variable names are honoured as aliases so that scripts written for it behave
the same here.
"""

from __future__ import annotations

import os


def _env(*names: str, default: str | None = None) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value != "":
            return value
    return default


def _flag(*names: str, default: bool = False) -> bool:
    value = _env(*names)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "eager_neuron")


class Config:
    """Process-wide settings. Tests and users may assign attributes directly."""

    def __init__(self) -> None:
        self.reload()

    def reload(self) -> None:
        self.adaptive = _flag("EAGER_NEURON_ADAPTIVE", "TORCH_NEURONX_ENABLE_CONCATENATION")
        self.cache_dir = _env(
            "EAGER_NEURON_CACHE_DIR", "TORCH_NEURONX_NEFF_CACHE_DIR", default=_default_cache_dir()
        )
        self.disk_cache = _flag("EAGER_NEURON_DISK_CACHE", default=True)
        self.cache_size_mb = int(_env("EAGER_NEURON_CACHE_SIZE_MB", default="1024"))
        fallback = (_env("EAGER_NEURON_FALLBACK", default="cpu") or "cpu").lower()
        if fallback not in ("cpu", "error"):
            raise ValueError(
                f"EAGER_NEURON_FALLBACK={fallback!r}: expected 'cpu' (run unsupported ops on the "
                "CPU with a warning) or 'error' (raise)"
            )
        self.fallback = fallback
        log = _env("EAGER_NEURON_LOG", default="") or ""
        self.log = {part.strip() for part in log.split(",") if part.strip()}
        self.device = (_env("EAGER_NEURON_DEVICE", default="trn2") or "trn2").lower()
        self.cores = int(_env("EAGER_NEURON_CORES", default="2"))
        hbm = _env("EAGER_NEURON_HBM_BYTES")
        self.hbm_bytes = int(hbm) if hbm else None
        self.launch_blocking = _flag("NEURON_LAUNCH_BLOCKING", "EAGER_NEURON_LAUNCH_BLOCKING")


config = Config()
