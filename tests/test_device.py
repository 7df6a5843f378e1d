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


# -- torch.Generator(device="neuron") --------------------------------------------------------------

_GEN_CASES = {
    "randn": lambda g, d: torch.randn(4, 3, generator=g, device=d),
    "rand": lambda g, d: torch.rand(7, generator=g, device=d),
    "randint": lambda g, d: torch.randint(-5, 50, (9,), generator=g, device=d),
    "randperm": lambda g, d: torch.randperm(13, generator=g, device=d),
    "normal_": lambda g, d: torch.empty(6, device=d).normal_(2.0, 3.0, generator=g),
    "uniform_": lambda g, d: torch.empty(6, device=d).uniform_(-1, 1, generator=g),
    "bernoulli_": lambda g, d: torch.empty(8, device=d).bernoulli_(0.3, generator=g),
    "normal": lambda g, d: torch.normal(torch.arange(5.0, device=d), 2.0, generator=g),
    "multinomial": lambda g, d: torch.multinomial(torch.arange(1.0, 7.0, device=d), 4,
                                                  generator=g),
    "exponential_": lambda g, d: torch.empty(5, device=d).exponential_(generator=g),
}


@pytest.mark.parametrize("name", sorted(_GEN_CASES))
def test_neuron_generator_gives_the_cpu_stream(name):
    fn = _GEN_CASES[name]
    g = torch.Generator(device="neuron").manual_seed(1234)
    c = torch.Generator().manual_seed(1234)
    got, want = fn(g, "neuron"), fn(c, "cpu")
    assert got.device.type == "neuron" and torch.equal(got.cpu(), want)
    # the generator advanced as the CPU's did: the next draw matches too
    assert torch.equal(fn(g, "neuron").cpu(), fn(c, "cpu"))
    # and it is independent of the global stream
    torch.manual_seed(0)
    a = torch.randn(3, device="neuron")
    torch.manual_seed(0)
    fn(torch.Generator(device="neuron").manual_seed(5), "neuron")
    assert torch.equal(torch.randn(3, device="neuron").cpu(), a.cpu())


def test_neuron_generator_object():
    import copy
    import pickle

    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0) and isinstance(g, torch.Generator)
    assert torch.Generator(device="neuron:1").device == torch.device("neuron", 1)
    assert isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator().device == torch.device("cpu")
    assert type(torch.Generator("cpu")) is torch._C.Generator
    g.manual_seed(99)
    state = g.get_state()
    a = torch.randn(5, generator=g, device="neuron")
    g.set_state(state)
    assert torch.equal(torch.randn(5, generator=g, device="neuron").cpu(), a.cpu())
    assert g.initial_seed() == 99
    for h in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert h.device == g.device and torch.equal(h.get_state(), g.get_state())
    with pytest.raises(RuntimeError, match="neuron:7 does not exist"):
        torch.Generator(device="neuron:7")


def test_neuron_rng_state_and_dropout_follow_the_cpu():
    torch.neuron.manual_seed(21)
    state = torch.neuron.get_rng_state()
    x = torch.ones(64, 8)
    a = F.dropout(x.to("neuron"), 0.4)
    torch.neuron.set_rng_state(state)
    b = F.dropout(x.to("neuron"), 0.4)
    torch.manual_seed(21)
    want = F.dropout(x, 0.4)
    assert torch.equal(a.cpu(), want) and torch.equal(b.cpu(), want)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(3, device="neuron")
    assert torch.equal(torch.neuron.get_rng_state(), torch.get_rng_state())
