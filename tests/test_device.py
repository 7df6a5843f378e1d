"""Device registration: torch.neuron, torch.accelerator, moving tensors and modules, RNG parity."""

import io

import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401  (registers the device)
from eager_neuron.simulator import SIM
from eager_neuron.tensor import NeuronTensor


@pytest.fixture(autouse=True)
def _core_0():
    yield
    torch.neuron.set_device(0)


def test_torch_neuron_basics():
    assert torch.neuron.is_available() and torch.neuron.is_initialized()
    assert torch.neuron.device_count() == len(SIM.cores) >= 2
    assert torch.get_device_module("neuron") is torch.neuron
    torch.neuron.set_device(1)
    assert torch.neuron.current_device() == 1
    assert torch.empty(2, device="neuron").device == torch.device("neuron", 1)
    torch.neuron.set_device("neuron:0")
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    props = torch.neuron.get_device_properties(0)
    assert props.type == SIM.profile.name and props.total_memory == SIM.core(0).capacity
    assert "NeuronCore 1" in torch.neuron.get_device_name(1)
    with pytest.raises(RuntimeError, match="neuron:7 does not exist"):
        torch.neuron.set_device(7)


def test_accelerator_is_neuron():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1 == torch.neuron.current_device()


def test_to_cpu_and_neuron_methods():
    x = torch.arange(6.0).reshape(2, 3)
    for d in (x.to("neuron"), x.neuron(), x.to(torch.device("neuron", 0)),
              x.to("neuron", dtype=torch.float64)):
        assert isinstance(d, NeuronTensor) and d.is_neuron and d.device.type == "neuron"
        assert torch.equal(d.cpu().float(), x)
    d = x.to("neuron")
    assert d.to("neuron") is d
    assert torch.equal(d.t().cpu(), x.t())                        # strides survive the trip
    assert d.to(torch.int32).dtype == torch.int32 and d.to(torch.int32).is_neuron
    assert x.neuron(1).device == torch.device("neuron", 1)


def test_module_to_and_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    ref = [p.detach().clone() for p in model.parameters()]
    model.to("neuron")
    for p, r in zip(model.parameters(), ref):
        assert isinstance(p, torch.nn.Parameter) and p.device.type == "neuron"
        assert p.requires_grad and torch.equal(p.detach().cpu(), r)
    p = torch.nn.Parameter(torch.ones(3, device="neuron"))
    assert isinstance(p, torch.nn.Parameter) and p.device.type == "neuron" and p.requires_grad
    model.cpu()
    assert all(q.device.type == "cpu" for q in model.parameters())
    assert torch.nn.Linear(2, 2).neuron().weight.is_neuron


def test_state_dict_round_trip_through_torch_save():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2).to("neuron")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf)                                      # weights_only=True default
    assert {k: v.device.type for k, v in loaded.items()} == {"weight": "neuron", "bias": "neuron"}
    fresh = torch.nn.Linear(5, 2).to("neuron")
    fresh.load_state_dict(loaded)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k].cpu(), v.cpu())


def test_neuron_checkpoint_loads_on_cpu_with_map_location():
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(5, 2).to("neuron").state_dict(), buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu.values())


RNG = {
    "randn": lambda d: torch.randn(4, 5, device=d),
    "rand": lambda d: torch.rand(17, device=d),
    "randint": lambda d: torch.randint(0, 100, (9,), device=d),
    "randperm": lambda d: torch.randperm(13, device=d),
    "normal": lambda d: torch.normal(torch.zeros(6, device=d), torch.ones(6, device=d)),
    "normal_": lambda d: torch.empty(6, device=d).normal_(2.0, 3.0),
    "bernoulli": lambda d: torch.bernoulli(torch.full((8,), 0.5, device=d)),
    "dropout": lambda d: F.dropout(torch.ones(32, device=d), 0.5, training=True),
}


@pytest.mark.parametrize("name", list(RNG))
def test_rng_matches_cpu_for_the_same_seed(name):
    torch.manual_seed(1234)
    expected = RNG[name]("cpu")
    torch.manual_seed(1234)
    got = RNG[name]("neuron")
    assert got.device.type == "neuron"
    assert torch.equal(got.cpu(), expected)
