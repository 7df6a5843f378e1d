"""Hugging Face `accelerate` and `transformers`, and Lightning, see the `neuron` device.

Both libraries already know a device called "neuron" (AWS's torch_neuronx): they pick it for
`Trainer`/`Accelerator` when `is_neuron_available()` / `is_torch_neuron_available()` say so, and
those only look for the torch_neuronx package. Their neuron paths call the `torch.neuron` API
this package provides (set_device, current_device, get_rng_state_all, ...), so we answer those
two checks with "yes" — through an import hook, since both libraries copy the function into
many modules when they are imported. `TrainingArguments(use_cpu=True)` still means the CPU.

>>> import eager_neuron, accelerate
>>> accelerate.PartialState().device.type
'neuron'

Lightning (`lightning`, `pytorch_lightning`, `lightning_fabric`) gets an accelerator named
"neuron", registered when its accelerators module loads: `Trainer(accelerator="neuron")` and
`Fabric(accelerator="neuron")` train on `neuron:0` (Lightning gave every accelerator it does not
know a CPU strategy, so a custom one trained on the CPU), and `precision="bf16-mixed"` /
`"16-mixed"` autocast on neuron (Lightning used "cuda" for it, so autocast was silently off).
`devices="auto"` is one core: the simulated cores are for explicit multi-core runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

import torch

# module -> the availability check in it that only looks for torch_neuronx
TARGETS = {
    "accelerate.utils.imports": "is_neuron_available",
    "transformers.utils.import_utils": "is_torch_neuron_available",
}


def _available(check_device: bool = False) -> bool:
    return hasattr(torch, "neuron") and torch.neuron.is_available()


def _patch(module) -> None:
    name = TARGETS.get(module.__name__)
    if name is not None and hasattr(module, name):
        setattr(module, name, _available)
    patch = LIGHTNING.get(module.__name__)
    if patch is not None:
        patch(module)


# -- Lightning --------------------------------------------------------------------------------
# The packages ship as `lightning.{fabric,pytorch}` and as `lightning_fabric` / `pytorch_lightning`.

def _neuron_accelerator(base, fabric_base=None):
    """A Lightning Accelerator class for neuron, subclassing `base` (fabric's or the trainer's)."""

    class NeuronAccelerator(base):
        """Lightning accelerator for eager_neuron's simulated `neuron` device."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != "neuron":
                raise ValueError(f"Device should be neuron, got {device} instead")
            torch.neuron.set_device(device.index or 0)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices):
            return _parse_neuron_devices(devices)

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("neuron", i) for i in _parse_neuron_devices(devices)]

        @staticmethod
        def auto_device_count() -> int:
            return 1

        @staticmethod
        def is_available() -> bool:
            return _available()

        @classmethod
        def name(cls) -> str:
            return "neuron"

        def get_device_stats(self, device) -> dict:
            return dict(torch.neuron.memory_stats(device))

        @classmethod
        def register_accelerators(cls, registry) -> None:
            registry.register("neuron", cls, description=cls.__name__)

    return NeuronAccelerator


def _parse_neuron_devices(devices) -> list[int]:
    """Lightning's `devices=` for neuron: a count, -1 (all cores), a list of core indices or a
    string of either ("2", "0,1"); as Lightning parses GPU ids."""
    count = torch.neuron.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("-1", "auto"):
            devices = -1 if text == "-1" else 1
        elif "," in text:
            devices = [int(x) for x in text.split(",") if x.strip()]
        else:
            devices = int(text)
    if isinstance(devices, int):
        if devices == -1:
            return list(range(count))
        if devices < 0 or devices > count:
            raise ValueError(f"devices={devices} for accelerator='neuron': {count} neuron cores "
                             "are available (EAGER_NEURON_CORES sets how many)")
        return list(range(devices))
    ids = [int(i) for i in devices]
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise ValueError(f"devices={list(devices)} for accelerator='neuron': core(s) {bad} do "
                         f"not exist ({count} neuron cores)")
    return ids


def _register(module) -> None:
    """`<pkg>.accelerators` loaded: register "neuron" in its registry."""
    registry = getattr(module, "ACCELERATOR_REGISTRY", None)   # fabric's
    if registry is None:
        registry = getattr(module, "AcceleratorRegistry", None)   # the trainer's
    base = getattr(module, "Accelerator", None)
    if registry is None or base is None or "neuron" in registry:
        return
    cls = _neuron_accelerator(base)
    module.NeuronAccelerator = cls
    cls.register_accelerators(registry)


def _is_neuron(flag) -> bool:
    return flag == "neuron" or (not isinstance(flag, str) and
                                type(flag).__name__ == "NeuronAccelerator")


def _patch_connector(module) -> None:
    """The trainer's / Fabric's connector: one neuron device takes a single-device strategy on
    that core (Lightning's choice was the CPU for an accelerator it does not list), and mixed
    precision autocasts on neuron (its choice was "cuda": autocast off on this machine)."""
    conn = getattr(module, "_AcceleratorConnector", None) or getattr(module, "_Connector", None)
    if conn is None or getattr(conn, "_neuron_patched", False):
        return
    choose, precision = conn._choose_strategy, conn._check_and_init_precision

    def _choose_strategy(self):
        devices = self._parallel_devices or []
        if _is_neuron(self._accelerator_flag) and self._num_nodes_flag <= 1 and len(devices) <= 1:
            single = module.SingleDeviceStrategy
            return single(device=devices[0] if devices else torch.device("neuron", 0))
        return choose(self)

    def _check_and_init_precision(self):
        # the trainer's connector names them _precision_plugin_flag / _precision_flag, Fabric's
        # _precision_instance / _precision_input
        plugin = getattr(self, "_precision_plugin_flag",
                         getattr(self, "_precision_instance", None))
        flag = getattr(self, "_precision_flag", getattr(self, "_precision_input", None))
        if (_is_neuron(self._accelerator_flag) and plugin is None
                and flag in ("16-mixed", "bf16-mixed")):
            mixed = getattr(module, "MixedPrecision", None)
            if mixed is not None and type(self.strategy).__name__ == "SingleDeviceStrategy":
                return mixed(flag, "neuron")
        return precision(self)

    conn._choose_strategy = _choose_strategy
    conn._check_and_init_precision = _check_and_init_precision
    conn._neuron_patched = True


LIGHTNING = {
    "lightning.fabric.accelerators": _register,
    "lightning.pytorch.accelerators": _register,
    "lightning_fabric.accelerators": _register,
    "pytorch_lightning.accelerators": _register,
    "lightning.fabric.connector": _patch_connector,
    "lightning_fabric.connector": _patch_connector,
    "lightning.pytorch.trainer.connectors.accelerator_connector": _patch_connector,
    "pytorch_lightning.trainer.connectors.accelerator_connector": _patch_connector,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _patch(module)        # before any other module of the library copies the name


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS and fullname not in LIGHTNING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch the checks now if the libraries are loaded, else when they are imported."""
    for mod_name, fn_name in TARGETS.items():
        if mod_name in sys.modules:
            prefix = mod_name.split(".")[0] + "."
            for name, module in list(sys.modules.items()):
                if name.startswith(prefix) and getattr(module, fn_name, None) is not None:
                    setattr(module, fn_name, _available)
    for mod_name, patch in LIGHTNING.items():
        if mod_name in sys.modules:
            patch(sys.modules[mod_name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
