"""A user's tensor subclass on neuron (eager_neuron/subclass.py): `as_subclass`, `.to("neuron")`
of a subclass instance, ops, autograd, in-place and metadata ops, printing, torch.save. Each
check runs the same program on the CPU and on neuron and compares (types named alike: a plain
neuron tensor stands where the CPU gives a plain torch.Tensor)."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401
from eager_neuron.tensor import NeuronTensor


class MyT(torch.Tensor):
    """The default __torch_function__: every op's result is a MyT again."""

    def hello(self):
        return f"MyT of {tuple(self.shape)}"


class Unwrapping(torch.Tensor):
    """torchvision's tv_tensors pattern: ops return plain tensors, clone keeps the class."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.clone:
            return out.as_subclass(cls)
        return out


class NoTorchFunction(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl


class Slotted(torch.Tensor):
    __slots__ = ("unit",)


def _name(t) -> str:
    k = type(t)
    return "Tensor" if k in (torch.Tensor, NeuronTensor) else k.__name__


def _program(dev: str) -> list:
    torch.manual_seed(0)
    out = []
    lin = torch.nn.Linear(4, 3).to(dev)
    x = torch.randn(2, 4).to(dev).as_subclass(MyT).requires_grad_()
    out += [_name(x), x.device.type == dev, x.hello(), x.is_leaf]
    y = lin(x)
    z = F.softmax(y * 2 + 1, dim=-1)
    out += [_name(y), _name(z), z.detach().cpu().as_subclass(torch.Tensor)]
    z.square().sum().backward()
    out += [_name(x.grad), x.grad.cpu(), lin.weight.grad.cpu()]
    u = torch.ones(3, device=dev).as_subclass(Unwrapping)
    out += [_name(u + 1), _name(u.clone()), (u.clone() * 3).sum().item()]
    n = torch.ones(2, device=dev).as_subclass(NoTorchFunction)
    out += [_name(n), _name(n + 1), _name(n.as_subclass(torch.Tensor))]
    p = torch.nn.Parameter(torch.ones(2, device=dev).as_subclass(MyT))
    out += [_name(p), isinstance(p, torch.nn.Parameter), p.requires_grad]
    s = torch.stack([x.detach(), x.detach()])
    out += [_name(s), tuple(s.shape), _name(x.detach() + torch.ones(4, device=dev))]
    v = torch.zeros(4, device=dev).as_subclass(MyT)
    w = v[1:3]
    w.add_(5)                       # through a view of the subclass: the base sees it
    v.unsqueeze_(0)                 # a metadata op on the subclass instance itself
    out += [_name(w), v.cpu().as_subclass(torch.Tensor), tuple(v.shape), _name(v)]
    c = x.detach().cpu()
    out += [_name(c), _name(x.to(torch.float64)), _name(c.to(dev)), c.to(dev).device.type == dev]
    return out


def _same(a, b) -> None:
    assert len(a) == len(b)
    for i, (p, q) in enumerate(zip(a, b)):
        if isinstance(p, torch.Tensor):
            assert isinstance(q, torch.Tensor), i
            # float32 on both sides: linear, softmax and their backward (dtype-derived bound)
            torch.testing.assert_close(q.double(), p.double(), rtol=1e-5, atol=1e-6)
        else:
            assert p == q, (i, p, q)


def test_subclass_program_matches_cpu():
    _same(_program("cpu"), _program("neuron"))


def test_as_subclass_aliases_and_records_autograd():
    x = torch.arange(4.0, device="neuron", requires_grad=True)
    y = x.as_subclass(MyT)
    assert isinstance(y, MyT) and isinstance(y, NeuronTensor)
    assert type(y).grad_fn.__get__(y).name() == "AliasBackward0"
    (y * 3).sum().backward()
    assert x.grad.cpu().tolist() == [3.0, 3.0, 3.0, 3.0]
    d = torch.zeros(3, device="neuron")
    e = d.as_subclass(MyT)
    e.fill_(2.0)                    # the alias writes the original's memory
    assert d.cpu().tolist() == [2.0, 2.0, 2.0]
    assert type(e.as_subclass(torch.Tensor)) is NeuronTensor
    # the op received a plain neuron tensor and the caller's object keeps its class after
    assert type(e) is type(y) and e.hello() == "MyT of (3,)"


def test_subclass_prints_and_saves_like_the_cpu():
    x = torch.tensor([1.0, 2.0]).as_subclass(MyT)
    x.unit = "m"
    t = x.to("neuron")
    t.unit = "m"
    assert repr(t) == repr(x)[:-1] + ", device='neuron:0')"
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert isinstance(back, MyT) and back.device.type == "neuron" and back.unit == "m"
    assert back.cpu().tolist() == [1.0, 2.0]
    buf.seek(0)
    cpu = torch.load(buf, weights_only=False, map_location="cpu")
    assert type(cpu) is MyT and cpu.unit == "m"
    c = copy.deepcopy(t)
    assert isinstance(c, MyT) and c.unit == "m" and c.cpu().tolist() == [1.0, 2.0]


def test_subclass_refusals_name_the_fix():
    x = torch.ones(2, device="neuron")
    with pytest.raises(TypeError, match="__slots__"):
        x.as_subclass(Slotted)

    class Wrapper(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

    with pytest.raises(TypeError, match="wrapper subclass"):
        x.as_subclass(Wrapper)
    with pytest.raises(TypeError):
        x.as_subclass(int)
