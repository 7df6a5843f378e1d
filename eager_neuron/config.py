"""Knobs, read from the environment once at import and validated there; each has a Python setter.

A bad value fails `import eager_neuron` with a ValueError that names the variable, the value and
what is allowed, instead of a bare `int()` error or a silent default. Numbers are read as a user
would write them: `EAGER_NEURON_HBM_BYTES=1e6` is one million bytes,
`EAGER_NEURON_CACHE_SIZE_MB=0.5` is half a megabyte; zero and negative sizes are refused (turn
the disk tier off with `EAGER_NEURON_DISK_CACHE=0`). An `EAGER_NEURON_*` name that nothing
reads (a typo) warns once.

TorchNeuron's own variable names are honoured as aliases so that scripts written for it behave
the same here.

>>> from eager_neuron.config import Config
>>> Config({"EAGER_NEURON_HBM_BYTES": "1e6"}).hbm_bytes
1000000
>>> Config({"EAGER_NEURON_CORES": "0"})
Traceback (most recent call last):
ValueError: EAGER_NEURON_CORES='0': expected a whole number >= 1 (the number of simulated cores)
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Mapping

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
LOG_TOPICS = ("ops", "kernels", "flush", "graphs")

# the settings this module reads and validates
SETTINGS = frozenset({
    "EAGER_NEURON_ADAPTIVE", "EAGER_NEURON_CACHE_DIR", "EAGER_NEURON_DISK_CACHE",
    "EAGER_NEURON_CACHE_SIZE_MB", "EAGER_NEURON_FALLBACK", "EAGER_NEURON_LOG",
    "EAGER_NEURON_DEVICE", "EAGER_NEURON_CORES", "EAGER_NEURON_HBM_BYTES",
    "EAGER_NEURON_LAUNCH_BLOCKING", "EAGER_NEURON_CACHE_VERIFY", "EAGER_NEURON_FASTPATH",
    "EAGER_NEURON_ADAPTIVE_LIGHT",
})
# every variable something in the project reads; an unknown EAGER_NEURON_* name warns
# (tests/test_config.py fails when a source file reads a name missing here)
KNOWN = SETTINGS | frozenset({
    "EAGER_NEURON_CHECK",        # the numerics debugger (eager_neuron/numerics.py)
    "EAGER_NEURON_DIST_CHECK",   # collective agreement check (eager_neuron/distributed)
    # read by the tests and tools, not by the library
    "EAGER_NEURON_OPINFO_SAMPLES", "EAGER_NEURON_OPINFO_MAX_NUMEL", "EAGER_NEURON_OPINFO_JOBS",
    "EAGER_NEURON_OPINFO_TIMEOUT", "EAGER_NEURON_OPINFO_ADAPTIVE", "EAGER_NEURON_FUZZ_PROGRAMS",
    "EAGER_NEURON_MODULE_DB", "EAGER_NEURON_OPTIM_DB",
    "EAGER_NEURON_OPINFO_DTYPES_EVERY", "EAGER_NEURON_OPINFO_DTYPES_SAMPLES",
    "EAGER_NEURON_ERROR_INPUTS_EVERY",
    "EAGER_NEURON_OPINFO_DTYPES_SHARE",
    "EAGER_NEURON_COMPILE_FUZZ_PROGRAMS",   # tests/test_compile_fuzz.py's bounded run
})


class _Env:
    """Reads variables from one mapping and names the one that was set in every error."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def get(self, *names: str, default: str | None = None) -> tuple[str | None, str]:
        """(value, the name it came from); empty counts as unset."""
        for name in names:
            value = self.environ.get(name)
            if value is not None and value.strip() != "":
                return value.strip(), name
        return default, names[0]

    def flag(self, *names: str, default: bool = False) -> bool:
        value, name = self.get(*names)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"{name}={value!r}: expected one of {'/'.join(_TRUE)} (on) or "
                         f"{'/'.join(_FALSE)} (off)")

    def number(self, name: str, default: float | None, what: str, *, whole: bool,
               minimum: float, exclusive: bool = False) -> float | int | None:
        """A number written as a user would ("1e6", "0.5", "1_000"), checked against a bound."""
        value, name = self.get(name)
        if value is None:
            return default
        kind = "a whole number" if whole else "a number"
        bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        ok = math.isfinite(x) and (x > minimum if exclusive else x >= minimum)
        if ok and whole:
            ok = x == int(x)
        if not ok:
            raise ValueError(f"{name}={value!r}: expected {kind} {bound} ({what})")
        return int(x) if whole else x


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "eager_neuron")


def _device_names() -> tuple:
    from .cost import PROFILES  # cost is pure data and functions: no import cycle

    return tuple(sorted(PROFILES))


class Config:
    """Process-wide settings. Tests and users may assign attributes directly."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.reload(environ)

    def reload(self, environ: Mapping[str, str] | None = None) -> None:
        """Read (again) and validate every variable; raises ValueError naming a bad one."""
        env = _Env(os.environ if environ is None else environ)
        self.adaptive = env.flag("EAGER_NEURON_ADAPTIVE", "TORCH_NEURONX_ENABLE_CONCATENATION")
        # adaptive eager's host-time policy (adaptive.LIGHT_NUMEL): ops whose groups average
        # fewer elements a node than this run as plain eager once judged; 0 (the default)
        # fuses always, which launches fewest kernels and charges the least device time
        self.adaptive_light = env.number(
            "EAGER_NEURON_ADAPTIVE_LIGHT", 0, "elements a node under which adaptive eager runs "
            "an op's groups as plain eager; 0 fuses always", whole=True, minimum=0)
        self.cache_dir = env.get("EAGER_NEURON_CACHE_DIR", "TORCH_NEURONX_NEFF_CACHE_DIR",
                                 default=_default_cache_dir())[0]
        self.disk_cache = env.flag("EAGER_NEURON_DISK_CACHE", default=True)
        self.cache_size_mb = env.number(
            "EAGER_NEURON_CACHE_SIZE_MB", 1024, "the disk cache's size cap in MB; "
            "EAGER_NEURON_DISK_CACHE=0 turns the disk tier off", whole=False, minimum=0,
            exclusive=True)
        self.cache_verify = env.flag("EAGER_NEURON_CACHE_VERIFY")
        # repeat calls of a seen signature skip the funnel (eager_neuron/fastpath.py); 0 sends
        # every op down the whole funnel (bisecting a suspected fast-path bug)
        self.fastpath = env.flag("EAGER_NEURON_FASTPATH", default=True)
        fallback, name = env.get("EAGER_NEURON_FALLBACK", default="cpu")
        if fallback.lower() not in ("cpu", "error"):
            raise ValueError(
                f"{name}={fallback!r}: expected 'cpu' (run unsupported ops on the "
                "CPU with a warning) or 'error' (raise)"
            )
        self.fallback = fallback.lower()
        log, name = env.get("EAGER_NEURON_LOG", default="")
        self.log = {part.strip().lower() for part in log.split(",") if part.strip()}
        if not self.log <= set(LOG_TOPICS):
            raise ValueError(f"{name}={log!r}: expected a comma-separated list of "
                             f"{', '.join(LOG_TOPICS)}")
        device, name = env.get("EAGER_NEURON_DEVICE", default="trn2")
        self.device = device.lower()
        if self.device not in _device_names():
            raise ValueError(f"{name}={device!r}: expected one of {', '.join(_device_names())} "
                             "(the simulated device profile)")
        self.cores = env.number("EAGER_NEURON_CORES", 2, "the number of simulated cores",
                                whole=True, minimum=1)
        self.hbm_bytes = env.number("EAGER_NEURON_HBM_BYTES", None, "each core's HBM capacity "
                                    "in bytes; unset for the device profile's", whole=True,
                                    minimum=1)
        self.launch_blocking = env.flag("NEURON_LAUNCH_BLOCKING", "EAGER_NEURON_LAUNCH_BLOCKING")
        unknown = sorted(n for n in env.environ if n.startswith("EAGER_NEURON_")
                         and n not in KNOWN)
        if unknown:
            warnings.warn(f"{', '.join(unknown)}: not an eager_neuron setting (ignored); "
                          f"known: {', '.join(sorted(SETTINGS))}",
                          stacklevel=2)


config = Config()
