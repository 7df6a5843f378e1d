"""Settings: every EAGER_NEURON_* variable is validated at import with its name, value and range.

Numbers are read as a user writes them (1e6, 0.5, 1_000); zero, negative, fractional counts and
words are refused with a ValueError naming the variable, the value and what is allowed.
"""

import os
import re
import subprocess
import sys

import pytest

from eager_neuron.config import KNOWN, SETTINGS, Config


@pytest.mark.parametrize("name, value, attr, expected", [
    ("EAGER_NEURON_HBM_BYTES", "1e6", "hbm_bytes", 1_000_000),
    ("EAGER_NEURON_HBM_BYTES", "1048576", "hbm_bytes", 1 << 20),
    ("EAGER_NEURON_HBM_BYTES", "1_000", "hbm_bytes", 1000),
    ("EAGER_NEURON_CACHE_SIZE_MB", "0.5", "cache_size_mb", 0.5),
    ("EAGER_NEURON_CACHE_SIZE_MB", "2048", "cache_size_mb", 2048.0),
    ("EAGER_NEURON_CORES", "4", "cores", 4),
    ("EAGER_NEURON_CORES", " 3 ", "cores", 3),
    ("EAGER_NEURON_ADAPTIVE", "Yes", "adaptive", True),
    ("EAGER_NEURON_DISK_CACHE", "off", "disk_cache", False),
    ("TORCH_NEURONX_ENABLE_CONCATENATION", "1", "adaptive", True),
    ("EAGER_NEURON_LOG", "ops, Kernels", "log", {"ops", "kernels"}),
    ("EAGER_NEURON_DEVICE", "TRN3", "device", "trn3"),
    ("EAGER_NEURON_FALLBACK", "Error", "fallback", "error"),
    ("EAGER_NEURON_HBM_BYTES", "", "hbm_bytes", None),      # empty means unset
])
def test_accepted(name, value, attr, expected):
    assert getattr(Config({name: value}), attr) == expected


@pytest.mark.parametrize("name, value, allowed", [
    ("EAGER_NEURON_HBM_BYTES", "0", "whole number >= 1"),
    ("EAGER_NEURON_HBM_BYTES", "-5", "whole number >= 1"),
    ("EAGER_NEURON_HBM_BYTES", "1.5", "whole number >= 1"),
    ("EAGER_NEURON_HBM_BYTES", "1GB", "whole number >= 1"),
    ("EAGER_NEURON_HBM_BYTES", "inf", "whole number >= 1"),
    ("EAGER_NEURON_CACHE_SIZE_MB", "0", "number > 0"),
    ("EAGER_NEURON_CACHE_SIZE_MB", "-1", "number > 0"),
    ("EAGER_NEURON_CACHE_SIZE_MB", "nan", "number > 0"),
    ("EAGER_NEURON_CORES", "0", "whole number >= 1"),
    ("EAGER_NEURON_CORES", "2.5", "whole number >= 1"),
    ("EAGER_NEURON_CORES", "two", "whole number >= 1"),
    ("EAGER_NEURON_ADAPTIVE", "2", "true/yes/on"),
    ("NEURON_LAUNCH_BLOCKING", "maybe", "false/no/off"),
    ("EAGER_NEURON_LOG", "kernel", "ops, kernels, flush"),
    ("EAGER_NEURON_DEVICE", "trn9", "trn2"),
    ("EAGER_NEURON_FALLBACK", "gpu", "'cpu'"),
])
def test_refused_with_name_value_and_range(name, value, allowed):
    with pytest.raises(ValueError) as info:
        Config({name: value})
    msg = str(info.value)
    assert msg.startswith(f"{name}={value!r}: expected"), msg
    assert allowed in msg, msg


def test_unknown_name_warns():
    with pytest.warns(UserWarning, match="EAGER_NEURON_ADAPTVE: not an eager_neuron setting"):
        Config({"EAGER_NEURON_ADAPTVE": "1"})


def test_settings_are_documented():
    # every setting config.py validates appears in the README or a doc page
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "README.md")).read()
    for name in os.listdir(os.path.join(root, "docs")):
        text += open(os.path.join(root, "docs", name)).read()
    missing = [n for n in SETTINGS if n not in text]
    assert not missing, missing


def test_every_variable_the_sources_read_is_known():
    # a new EAGER_NEURON_* variable must be added to config.KNOWN, or users setting it get the
    # "not an eager_neuron setting" warning
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = set()
    for folder in ("eager_neuron", "kernels", "cache", "tools", "tests"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if f.endswith(".py") and f != "test_config.py":
                    found |= set(re.findall(r"EAGER_NEURON_[A-Z0-9_]*[A-Z0-9]",
                                            open(os.path.join(dirpath, f)).read()))
    assert not found - KNOWN, sorted(found - KNOWN)


def test_import_fails_with_the_variable_named():
    env = dict(os.environ, EAGER_NEURON_HBM_BYTES="-1")
    proc = subprocess.run([sys.executable, "-c", "import eager_neuron"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("ValueError: EAGER_NEURON_HBM_BYTES='-1': expected a whole number >= 1 "
                    "(each core's HBM capacity in bytes; unset for the device profile's)"), last


def test_float_sizes_reach_the_simulator_and_cache():
    env = dict(os.environ, EAGER_NEURON_HBM_BYTES="1e6", EAGER_NEURON_CACHE_SIZE_MB="0.5",
               EAGER_NEURON_DISK_CACHE="0")
    code = ("import eager_neuron; from eager_neuron.simulator import SIM; "
            "from eager_neuron.cache.disk import DiskTier; "
            "print(SIM.core(0).capacity, DiskTier('/nonexistent').size_limit)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000000", str(2 ** 19)]
