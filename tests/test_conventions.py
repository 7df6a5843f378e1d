"""PyTorch device conventions used as a user would: checkpoints, storages, `.data =`, pinned
memory, DataLoader workers, activation checkpointing, autocast, GradScaler, the device API.

The crashes these fixed (segfaults, aborts) are checked in a subprocess that must exit cleanly.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.placement import check_placement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each step prints "ok <name>"; a segfault or abort shows as a signal return code and the last
# step that finished.
CRASH_SCRIPT = textwrap.dedent(r"""
    import io, sys
    import torch, eager_neuron
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    def ok(name):
        print("ok", name, flush=True)

    class NeuronItems(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return torch.full((3,), float(i), device="neuron")

    if __name__ == "__main__":
        s = torch.UntypedStorage(8, device="neuron")
        assert s.device.type == "neuron" and s.nbytes() == 8 and s.data_ptr() != 0
        repr(s)
        ok("UntypedStorage(8, device='neuron')")
        x = torch.arange(6.0, device="neuron")
        buf = io.BytesIO(); torch.save({"a": x, "b": x[2:5]}, buf)
        for where in ("neuron", torch.device("neuron:0"), {"neuron:0": "neuron:0"},
                      lambda storage, loc: None):
            buf.seek(0)
            y = torch.load(buf, map_location=where)
            assert y["a"].device.type == "neuron" and y["b"].tolist() == [2.0, 3.0, 4.0]
        ok("torch.load(map_location=neuron)")
        st = x._typed_storage()._new_shared(3, device=x.device)
        assert st.device.type == "neuron" and st.size() == 3
        ok("_new_shared on neuron")
        torch.accelerator.empty_host_cache()
        torch.accelerator.memory.empty_host_cache()
        assert torch.accelerator.memory.memory_allocated() == torch.neuron.memory_allocated()
        ok("empty_host_cache")
        from torch.utils.checkpoint import checkpoint
        lin = torch.nn.Linear(4, 4).to("neuron")
        for reentrant in (False, True):
            inp = torch.randn(2, 4, device="neuron", requires_grad=True)
            checkpoint(lambda t: lin(t).relu(), inp, use_reentrant=reentrant).sum().backward()
            assert inp.grad is not None
            ok(f"checkpoint use_reentrant={reentrant}")
        p = torch.ones(3).pin_memory()
        e = torch.empty(3, pin_memory=True).fill_(2)
        assert p.is_pinned() and e.is_pinned()
        assert e.to("neuron", non_blocking=True).tolist() == [2.0, 2.0, 2.0]
        ok("pin_memory")
        got = sorted(b.sum().item() for b in DataLoader(NeuronItems(), batch_size=4,
                                                        num_workers=2))
        assert got == [18.0, 66.0], got
        ok("DataLoader workers returning neuron tensors")
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
        model = torch.nn.Linear(4, 1).to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        first = last = None
        for epoch in range(3):
            for xb, yb in DataLoader(data, batch_size=8, num_workers=2, pin_memory=True):
                assert xb.is_pinned()
                xb, yb = xb.to("neuron", non_blocking=True), yb.to("neuron", non_blocking=True)
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad(); loss.backward(); opt.step()
                first = loss.item() if first is None else first
                last = loss.item()
        assert last < first, (first, last)
        ok("DataLoader(pin_memory=True, num_workers=2) training loop")
""")

STEPS = ["UntypedStorage(8, device='neuron')", "torch.load(map_location=neuron)",
         "_new_shared on neuron", "empty_host_cache", "checkpoint use_reentrant=False",
         "checkpoint use_reentrant=True", "pin_memory",
         "DataLoader workers returning neuron tensors",
         "DataLoader(pin_memory=True, num_workers=2) training loop"]


def test_former_crashes_exit_cleanly(tmp_path):
    script = tmp_path / "crashes.py"
    script.write_text(CRASH_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    done = [line[3:] for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert proc.returncode == 0, (
        f"exit {proc.returncode} after steps {done}\n{proc.stderr[-3000:]}")
    assert done == STEPS


# -- checkpoints and storages ------------------------------------------------------------------
def _round_trip(obj, **kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **kw)


@pytest.mark.parametrize("where", [None, "neuron", torch.device("neuron"), {"cpu": "neuron"},
                                   "callable"])
def test_load_map_location_keeps_views(where):
    base = torch.arange(6.0, device="neuron")
    kw = {} if where is None else {"map_location": (lambda s, loc: None) if where == "callable"
                                   else where}
    got = _round_trip({"a": base, "b": base[2:5]}, **kw)
    assert got["a"].device.type == "neuron" and got["b"].device.type == "neuron"
    got["b"].add_(100)                                   # a view still: writes show in "a"
    assert got["a"].tolist() == [0.0, 1.0, 102.0, 103.0, 104.0, 5.0]
    assert base.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("how", ["pickle", "legacy torch.save"])
def test_plain_pickle_and_legacy_save_round_trip_neuron_tensors(how):
    # both serialize a neuron storage through PyTorch's C++ storage writer, which copies it to
    # the CPU through a plain tensor on the device (was: endless recursion in _to_copy/copy_)
    x = torch.randn(4, 3)
    xn = x.to("neuron:1")
    obj = {"a": xn, "v": xn[1:, 1:], "p": torch.nn.Parameter(x.to("neuron")),
           "h": x.to("neuron", torch.bfloat16)}
    if how == "pickle":
        got = pickle.loads(pickle.dumps(obj))
    else:
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=False)
        buf.seek(0)
        got = torch.load(buf)
    assert got["a"].device == torch.device("neuron:1") and torch.equal(got["a"].cpu(), x)
    assert torch.equal(got["v"].cpu(), x[1:, 1:]) and got["v"].stride() == (3, 1)
    assert got["p"].requires_grad and torch.equal(got["p"].detach().cpu(), x)
    assert got["h"].dtype == torch.bfloat16 and torch.equal(got["h"].cpu(), x.bfloat16())
    if how != "pickle":   # (plain pickle does not keep views shared, on the CPU neither)
        got["v"].add_(1)   # a view of "a" still
        assert torch.equal(got["a"][1:, 1:].cpu(), x[1:, 1:] + 1)


def test_cpu_checkpoint_loads_onto_neuron():
    w = torch.randn(3, 4)
    got = _round_trip({"w": w, "row": w[1]}, map_location="neuron")
    assert got["w"].device.type == "neuron" and torch.equal(got["w"].cpu(), w)
    assert torch.equal(got["row"].cpu(), w[1])


def test_data_ptr_and_untyped_storage_are_real():
    a = torch.zeros(16, device="neuron")
    b = torch.zeros(16, device="neuron")
    assert a.data_ptr() != b.data_ptr() and a.data_ptr() != 0
    assert a[3:].data_ptr() == a.data_ptr() + 3 * a.element_size()
    assert a[3:].untyped_storage().data_ptr() == a.untyped_storage().data_ptr() != 0
    assert a.untyped_storage().device == a.device
    text = repr(a.untyped_storage())
    assert "UntypedStorage(device=neuron:0)" in text


def test_safetensors_round_trip_exact(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    tensors = {"w": torch.randn(4, 5).to("neuron"),
               "h": torch.randn(7).to(torch.bfloat16).to("neuron"),
               "i": torch.arange(6, device="neuron")}
    path = str(tmp_path / "m.safetensors")
    safetensors_torch.save_file(tensors, path)
    # NOTE: safetensors' Rust side accepts only the device names it knows (cuda, mps, npu, ...),
    # so load_file(path, device="neuron") is refused by safetensors itself: load, then move
    back = {k: v.to("neuron") for k, v in safetensors_torch.load_file(path).items()}
    for k, v in tensors.items():
        assert back[k].device.type == "neuron" and back[k].dtype == v.dtype
        assert torch.equal(back[k].cpu(), v.cpu())


def test_hf_save_pretrained_from_pretrained_device_map(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to("neuron").eval()
    model.save_pretrained(tmp_path)
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="neuron")
    assert {p.device.type for p in back.parameters()} == {"neuron"}
    ids = torch.tensor([[1, 2, 3]], device="neuron")
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k].cpu(), v.cpu()), k
    assert torch.equal(back(ids).logits.cpu(), model(ids).logits.cpu())


# -- .data = ------------------------------------------------------------------------------------
@pytest.mark.parametrize("adaptive", [False, True])
def test_set_data_changes_what_forward_reads(adaptive):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).to("neuron")
    x = torch.ones(1, 3, device="neuron")
    w0 = lin.weight.detach().cpu()
    with eager_neuron.adaptive(adaptive):
        w = lin.weight
        w.data = w.data * 0.5
        half = lin.weight.detach().cpu()
        lin.weight.data = torch.zeros(2, 3, device="neuron")
        out = lin(x)
    assert torch.equal(half, w0 * 0.5)
    assert torch.equal(out.detach().cpu(), lin.bias.detach().cpu().reshape(1, 2))
    assert lin.weight.requires_grad and isinstance(lin.weight, torch.nn.Parameter)
    lin.weight.data = torch.ones(4, 3, device="neuron")    # shape changes too, as on CUDA
    assert lin.weight.shape == (4, 3) and lin.weight.cpu().sum().item() == 12.0


def test_set_data_from_cpu_raises():
    p = torch.nn.Parameter(torch.ones(3, device="neuron"))
    with pytest.raises(RuntimeError, match="must be a neuron tensor"):
        p.data = torch.zeros(3)
    assert p.tolist() == [1.0, 1.0, 1.0]


# -- activation checkpointing -------------------------------------------------------------------
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_gradients_equal_uncheckpointed(reentrant):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6))
    block.to("neuron")
    x = torch.randn(3, 6, device="neuron", requires_grad=True)
    block(x).pow(2).sum().backward()
    want = [p.grad.cpu().clone() for p in block.parameters()] + [x.grad.cpu().clone()]
    block.zero_grad()
    x.grad = None
    checkpoint(block, x, use_reentrant=reentrant).pow(2).sum().backward()
    got = [p.grad.cpu() for p in block.parameters()] + [x.grad.cpu()]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


# -- pinned memory ------------------------------------------------------------------------------
def test_pin_memory_round_trip():
    t = torch.arange(10.0)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned() and torch.equal(p, t)
    z = torch.zeros(2, 3, pin_memory=True)
    assert z.is_pinned() and z.shape == (2, 3)
    d = p.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert d.device.type == "neuron" and torch.equal(d.cpu(), t)


_T = torch.arange(6.0).reshape(2, 3)
PIN_FACTORIES = {   # every factory taking pin_memory, as CUDA users call them
    "empty_strided": lambda **k: torch.empty_strided((2, 3), (1, 2), **k).fill_(1),
    "empty_permuted": lambda **k: torch.empty_permuted((2, 3), (1, 0), **k).fill_(1),
    "empty_like": lambda **k: torch.empty_like(_T, **k).fill_(1),
    "zeros_like": lambda **k: torch.zeros_like(_T, **k),
    "ones_like": lambda **k: torch.ones_like(_T, **k),
    "full_like": lambda **k: torch.full_like(_T, 7, **k),
    "rand_like": lambda **k: torch.rand_like(_T, **k),
    "randn_like": lambda **k: torch.randn_like(_T, **k),
    "randint_like": lambda **k: torch.randint_like(_T, 9, **k),
    "tensor": lambda **k: torch.tensor([[1.5, 2.0]], **k),
    "scalar_tensor": lambda **k: torch.scalar_tensor(3.0, **k),
    "rand": lambda **k: torch.rand(2, 3, **k),
    "randn": lambda **k: torch.randn(2, 3, **k),
    "randint": lambda **k: torch.randint(0, 9, (5,), **k),
    "randperm": lambda **k: torch.randperm(6, **k),
    "normal": lambda **k: torch.normal(1.0, 2.0, (4,), **k),
    "arange": lambda **k: torch.arange(5, **k),
    "linspace": lambda **k: torch.linspace(0, 1, 5, **k),
    "logspace": lambda **k: torch.logspace(0, 1, 5, **k),
    "eye": lambda **k: torch.eye(3, **k),
    "tril_indices": lambda **k: torch.tril_indices(3, 3, **k),
    "hann_window": lambda **k: torch.hann_window(8, **k),
    "fftfreq": lambda **k: torch.fft.fftfreq(6, **k),
    "new_zeros": lambda **k: _T.new_zeros((2, 2), **k),
    "new_full": lambda **k: _T.new_full((2,), 4.0, **k),
    "empty": lambda **k: torch.empty(3, **k).fill_(2),
}


@pytest.mark.parametrize("name", sorted(PIN_FACTORIES))
def test_pin_memory_on_every_factory(name):
    make = PIN_FACTORIES[name]
    torch.manual_seed(4)
    want = make()
    torch.manual_seed(4)
    got = make(pin_memory=True)
    assert got.is_pinned() and not want.is_pinned()
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    d = got.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert d.device.type == "neuron" and torch.equal(d.cpu(), want)


def test_device_context_still_places_the_wrapped_factories():
    # torch.device(...) as a context matches factories by identity: the pinning wrappers must not
    # hide them (transformers builds models under torch.device("meta"), then loads weights)
    for dev in ("meta", "neuron"):
        with torch.device(dev):
            made = [torch.zeros(2), torch.ones(2), torch.empty(2), torch.full((2,), 1.0),
                    torch.arange(3), torch.tensor([1, 2]), torch.randn(2), torch.eye(2),
                    torch.empty_strided((2,), (1,)), torch.linspace(0, 1, 3)]
        assert all(t.device.type == dev for t in made), (dev, [t.device for t in made])


def test_pin_memory_on_a_device_factory_raises_as_on_cuda():
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(3, device="neuron", pin_memory=True)
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.randn(3, device="neuron", pin_memory=True)


def test_dataloader_pin_memory_device_neuron():
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch 2.13: pin_memory_device is deprecated
        loader = DataLoader(data, batch_size=4, pin_memory=True, pin_memory_device="neuron")
        batches = list(loader)
    assert len(batches) == 3
    for i, (xb, yb) in enumerate(batches):
        assert xb.is_pinned() and yb.is_pinned()
        want = data.tensors[0][4 * i:4 * i + 4]
        assert torch.equal(xb.to("neuron", non_blocking=True).cpu(), want)


# -- Lazy modules -------------------------------------------------------------------------------
def test_lazy_modules_materialize_on_neuron():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.LazyLinear(5), torch.nn.ReLU(), torch.nn.LazyLinear(2))
    dev = torch.nn.Sequential(torch.nn.LazyLinear(5), torch.nn.ReLU(), torch.nn.LazyLinear(2))
    dev = dev.to("neuron")
    assert dev[0].has_uninitialized_params()          # still lazy, as on CUDA
    x = torch.randn(3, 4)
    torch.manual_seed(1)
    want = ref(x)
    torch.manual_seed(1)
    got = dev(x.to("neuron"))                          # materialized on the device
    assert all(p.device.type == "neuron" and isinstance(p, torch.nn.Parameter)
               for p in dev.parameters())
    assert [p.shape for p in dev.parameters()] == [p.shape for p in ref.parameters()]
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(dev.parameters(), lr=0.1)
    got.sum().backward()
    opt.step()
    assert all(p.grad is not None for p in dev.parameters())
    back = torch.nn.LazyLinear(3).to("neuron").cpu()   # moved back before materializing
    back(torch.ones(2, 2))
    assert back.weight.device.type == "cpu"
    bn = torch.nn.LazyBatchNorm1d().to("neuron")       # buffers too
    bn(torch.randn(4, 6, device="neuron"))
    assert bn.running_mean.device.type == "neuron" and bn.running_mean.shape == (6,)


# -- autocast and GradScaler --------------------------------------------------------------------
def _amp_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                               torch.nn.Linear(32, 8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_matches_cpu_autocast(dtype):
    model = _amp_model()
    dev = copy.deepcopy(model).to("neuron")
    x = torch.randn(5, 16)
    with torch.autocast("cpu", dtype=dtype):
        want = model(x)
    with torch.autocast("neuron", dtype=dtype):
        assert torch.is_autocast_enabled("neuron") and torch.neuron.is_autocast_enabled()
        got = dev(x.to("neuron"))
        assert (dev[0].weight @ dev[0].weight.t()).dtype == dtype       # lower-precision list
        assert torch.exp(got).dtype == torch.float32                    # float32 list
        assert torch.cat([got.float(), got]).dtype == torch.float32     # promote list
    assert got.dtype == want.dtype == dtype
    # both round the matmuls' inputs and outputs to `dtype`: a few units in its last place
    tol = 8 * torch.finfo(dtype).eps * want.float().abs().max().item()
    assert (got.cpu().float() - want.float()).abs().max().item() <= tol
    assert not torch.is_autocast_enabled("neuron")


def test_autocast_backward_gives_float32_grads():
    dev = _amp_model().to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss = dev(torch.randn(4, 16, device="neuron")).float().pow(2).mean()
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in dev.parameters())


@pytest.mark.parametrize("grads", [[[1.0, 2.0], [4.0]], [[1.0, float("inf")], [4.0]],
                                   [[float("nan"), 0.5]]])
@pytest.mark.parametrize("tracker", [0, 1])
def test_gradscaler_ops_match_cpu_on_device(grads, tracker, stats_delta):
    def run(dev):
        g = [torch.tensor(v, device=dev) for v in grads]
        found = torch.zeros(1, device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_(g, found,
                                                         torch.full((1,), 0.25, device=dev))
        scale = torch.full((1,), 8.0, device=dev)
        track = torch.full((1,), tracker, dtype=torch.int32, device=dev)
        torch._amp_update_scale_(scale, track, found, 2.0, 0.5, 2)
        return [x.cpu() for x in g], found.item(), scale.item(), track.item()

    want, got = run("cpu"), run("neuron")
    for a, b in zip(want[0], got[0]):
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
    assert want[1:] == got[1:]
    assert stats_delta()["fallbacks"] == {}


def test_gradscaler_training_steps():
    dev = _amp_model().to("neuron")
    opt = torch.optim.SGD(dev.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("neuron", init_scale=2.0 ** 4, growth_interval=1)
    x = torch.randn(8, 16, device="neuron")
    scales = []
    for _ in range(3):
        with torch.neuron.amp.autocast(dtype=torch.float16):
            loss = dev(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert all(torch.isfinite(p).all().item() for p in dev.parameters())
    assert scales == [2.0 ** 5, 2.0 ** 6, 2.0 ** 7]     # finite grads: grows every step
    # a scale that overflows float16 gradients: the step is skipped and the scale backs off
    before = [p.detach().cpu().clone() for p in dev.parameters()]
    scaler.update(2.0 ** 40)
    with torch.neuron.amp.autocast(dtype=torch.float16):
        loss = dev(x).float().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 39
    assert all(torch.equal(p.detach().cpu(), b) for p, b in zip(dev.parameters(), before))


# -- device API ---------------------------------------------------------------------------------
def test_device_api_fields():
    assert torch.neuron.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()
    major, minor = torch.neuron.get_device_capability()
    props = torch.neuron.get_device_properties(0)
    assert (props.major, props.minor) == (major, minor) and props.total_memory > 0
    assert props.name and props.multi_processor_count >= 1
    assert torch.neuron.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.float32 in torch.accelerator.get_device_capability()["supported_dtypes"]


def test_memory_api_and_history():
    keep = torch.ones(1 << 16, device="neuron")
    assert torch.accelerator.memory.memory_allocated() == torch.neuron.memory_allocated() > 0
    assert torch.accelerator.memory.memory_stats() == torch.neuron.memory_stats()
    free, total = torch.accelerator.memory.get_memory_info()
    assert 0 <= free <= total
    torch.neuron.memory._record_memory_history(max_entries=100)
    try:
        y = torch.empty(12345, dtype=torch.uint8, device="neuron")
        snap = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    assert any(e["size"] == 12345 and e["action"] == "alloc" for e in snap["device_traces"][0])
    assert snap["segments"][0]["allocated_size"] >= keep.numel() * 4 + y.numel()


# -- placement (the check dispatch calls; see docs/CONVENTIONS.md) ------------------------------
def test_check_placement():
    x = torch.ones(4, 4, device="neuron")
    add, mm = torch.ops.aten.add.Tensor, torch.ops.aten.mm.default
    check_placement(add, (x, torch.tensor(2.0)), {}, 0)           # 0-d CPU: a scalar, allowed
    check_placement(add, (x, x), {}, 0)
    check_placement(add, (torch.ones(4), torch.ones(4)), {}, None)  # no neuron tensor
    check_placement(torch.ops.aten.copy_.default, (x, torch.ones(4, 4)), {}, 0)
    check_placement(torch.ops.aten.index.Tensor, (x, [torch.tensor([0, 1])]), {}, 0)
    with pytest.raises(RuntimeError, match=r"same device.*neuron:0 and cpu.*argument mat2"):
        check_placement(mm, (x, torch.ones(4, 4)), {}, 0)
    with pytest.raises(RuntimeError, match="argument tensors"):
        check_placement(torch.ops.aten.cat.default, ([x, torch.ones(4, 4)],), {}, 0)


def test_channels_last_survives_to_neuron():
    conv = torch.nn.Conv2d(3, 4, 3).to("neuron", memory_format=torch.channels_last)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 6, 6)
    xd = x.to("neuron", memory_format=torch.channels_last)
    assert xd.is_contiguous(memory_format=torch.channels_last) and torch.equal(xd.cpu(), x)
    want = torch.nn.functional.conv2d(x, conv.weight.detach().cpu(), conv.bias.detach().cpu())
    torch.testing.assert_close(conv(xd).detach().cpu(), want, rtol=1e-5, atol=1e-5)


def test_module_moves_while_a_cpu_graph_is_alive():
    # `ref = model(x); model.to("neuron")`: the convolution's graph saved conv.weight, which
    # made torch's swap refuse it half way (CUDA moves it with `.data =`). The whole model
    # moves, each Parameter keeps its identity (tied weights stay tied), and the old graph's
    # backward raises instead of sending gradients to a tensor no module holds.
    torch.manual_seed(0)
    emb = torch.nn.Embedding(5, 4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(64, 5))
    model[3].weight = torch.nn.Parameter(torch.randn(5, 64))
    x = torch.randn(2, 3, 6, 6)
    ref = model(x)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    model.to("neuron")
    assert all(p.device.type == "neuron" for p in model.parameters())
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert all(torch.equal(p.detach().cpu(), b) for p, b in zip(params, before))
    got = model(x.to("neuron"))
    torch.testing.assert_close(got.detach().cpu().double(), ref.detach().double(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="before its module moved to neuron|poisoned by swap"):
        ref.sum().backward()
    got.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "neuron"
               for p in model.parameters())
    # a weight the old graph saved (use count 3: torch's own poisoning does not cover it)
    conv = torch.nn.Conv2d(3, 4, 3, bias=False)
    ref = conv(x)
    conv.to("neuron")
    with pytest.raises(RuntimeError, match="graph recorded before its module moved to neuron"):
        ref.sum().backward()
    # tied weights (one Parameter in two modules) stay one after the move
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    both = torch.nn.ModuleList([emb, head])
    _ = head(emb(torch.tensor([1, 2])))
    both.to("neuron")
    assert both[0].weight is both[1].weight and both[1].weight.device.type == "neuron"
    # a dtype change on the device, a neuron graph alive
    conv = torch.nn.Conv2d(3, 4, 3).to("neuron")
    out = conv(x.to("neuron"))
    conv.double()
    assert conv.weight.dtype == torch.float64 and conv.weight.device.type == "neuron"
    assert out.dtype == torch.float32



def test_tied_weights_stay_tied_when_the_module_leaves_neuron():
    # from neuron to the CPU, Module._apply made one new Parameter per slot: a weight two
    # modules shared became two, and CPU training afterwards updated them apart (CUDA keeps
    # them one). Both directions, with gradients, and a CPU step afterwards equal to one taken
    # by a model that never left the CPU.
    torch.manual_seed(0)

    def tied():
        emb = torch.nn.Embedding(5, 4)
        head = torch.nn.Linear(4, 5, bias=False)
        head.weight = emb.weight
        return torch.nn.ModuleList([emb, head])

    ids = torch.tensor([1, 2, 4])
    ref, m = tied(), tied()
    m.load_state_dict(ref.state_dict())
    m.to("neuron")
    for model, x in ((ref, ids), (m, ids.to("neuron"))):
        model[1](model[0](x)).square().sum().backward()
    m.to("cpu")
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "cpu"
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, rtol=1e-5, atol=1e-6)
    for model in (ref, m):
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.testing.assert_close(m[1].weight, ref[1].weight, rtol=1e-5, atol=1e-6)
    m.to("neuron")
    assert m[0].weight is m[1].weight and m[1].weight.device.type == "neuron"

def test_swap_keeps_torch_refusals():
    # what torch's swap refuses for other reasons (a weak reference) is still refused
    import weakref

    p = torch.nn.Parameter(torch.ones(2))
    _ = weakref.ref(p)
    with pytest.raises(RuntimeError, match="weakref"):
        torch.utils.swap_tensors(p, torch.nn.Parameter(torch.ones(2, device="neuron")))
    # a CPU-to-CPU swap with an extra reference is torch's refusal, unchanged
    lin = torch.nn.Conv2d(1, 1, 1)
    _ = lin(torch.ones(1, 1, 2, 2))
    with pytest.raises(RuntimeError, match="use_count"):
        torch.utils.swap_tensors(lin.weight, torch.nn.Parameter(torch.zeros(1, 1, 1, 1)))


LAYOUT_CASES = {
    "rfftn": lambda x: torch.fft.rfftn(x),
    "fftn": lambda x: torch.fft.fftn(x.to(torch.complex64), dim=(0, 2)),
    "irfftn": lambda x: torch.fft.irfftn(torch.fft.rfftn(x)),
    "hfft": lambda x: torch.fft.hfft(x.to(torch.complex64)),
    "eig vectors": lambda x: torch.linalg.eig(x[0, :4, :4] @ x[0, :4, :4].T + torch.eye(4,
                                                                                  device=x.device))[1],
    "svd_lowrank": lambda x: torch.svd_lowrank(x[0], q=2)[0],
    "max_pool2d channels_last": lambda x: torch.nn.functional.max_pool2d(
        x.unsqueeze(0).contiguous(memory_format=torch.channels_last), 2),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_CASES))
def test_output_strides_are_the_cpus(name):
    # torch's meta functions call a meta tensor "cuda"; a neuron op's outputs are laid out as
    # the CPU lays them out (a later .view() works or fails on both)
    torch.manual_seed(0)
    x = torch.randn(5, 6, 4)
    want = LAYOUT_CASES[name](x)
    torch.manual_seed(0)
    got = LAYOUT_CASES[name](x.to("neuron"))
    assert got.shape == want.shape and got.stride() == want.stride(), (got.stride(),
                                                                       want.stride())


def test_accelerate_and_trainer_use_neuron(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    assert accelerate.PartialState().device.type == "neuron"
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    before = model.lm_head.weight.detach().clone()

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = (torch.arange(8) + i) % 32
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, use_cpu=False,
        report_to=[], save_strategy="no", learning_rate=1e-2, disable_tqdm=True)
    assert args.device.type == "neuron"
    result = transformers.Trainer(model=model, args=args, train_dataset=Data()).train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    assert model.lm_head.weight.device.type == "neuron"
    assert not torch.equal(model.lm_head.weight.detach().cpu(), before)   # it trained


@torch.jit.script
def _scripted_factories(n: int):
    return torch.zeros(n) + torch.empty(n).fill_(1.0) + torch.full([n], 2.0) + torch.ones(n)


def test_pinning_factories_still_script():
    # the pin_memory wrappers stand for the aten builtins in TorchScript (torch.distributed.optim
    # scripts its functional optimizers at import)
    assert _scripted_factories(3).tolist() == [4.0, 4.0, 4.0]


def test_wrapped_factories_pickle_by_their_torch_name():
    # pin_memory's factory wrappers stand where torch's factories stood: pickling one (a
    # functools.partial(torch.zeros, ...) sent to a DataLoader worker) must find it there
    import functools
    import pickle

    for fn in (torch.zeros, torch.full_like, torch.randn, torch.fft.fftfreq,
               torch.Tensor.new_zeros):
        assert hasattr(fn, "__wrapped__")   # the wrapper, not torch's builtin
        assert pickle.loads(pickle.dumps(fn)) is fn
    part = pickle.loads(pickle.dumps(functools.partial(torch.zeros, 2, pin_memory=True)))
    assert part().is_pinned() and part().shape == (2,)


@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_padding_mask_in_eval(batch_first):
    # eval + no_grad + a padding mask: the stock encoder (enable_nested_tensor=True) takes its
    # nested-tensor path for PrivateUse1 as for CUDA; neuron holds no nested tensors, so it
    # failed. Now: the CPU's numbers (zeros at padded positions, the final norm after them)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
    enc = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(8)).eval()
    dev = copy.deepcopy(enc).to("neuron")
    x = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    masks = {"bool": torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4]),
             "not left-aligned": torch.tensor([[False, True, False, False, False]] * 3)}
    masks["float"] = torch.zeros(3, 5).masked_fill(masks["bool"], float("-inf"))
    for name, m in masks.items():
        with torch.no_grad():
            want = enc(x, src_key_padding_mask=m)
            got = dev(x.to("neuron"), src_key_padding_mask=m.to("neuron"))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(eager_neuron.errors.UnsupportedTensorError):
        torch._nested_tensor_from_mask(torch.zeros(3, 5, 8, device="neuron"),
                                       masks["bool"].logical_not().to("neuron"))


def test_transformer_encoder_compiles_fullgraph_on_neuron():
    # nested.py's forward wraps torch's: dynamo traces it (it defers to torch's own while
    # compiling), so a fullgraph compile of an encoder with a padding mask still works
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 1).to("neuron")
    x = torch.randn(2, 3, 8, device="neuron")
    pad = torch.tensor([[False, False, True]] * 2, device="neuron")
    got = torch.compile(enc, backend="neuron", fullgraph=True)(x, src_key_padding_mask=pad)
    torch.testing.assert_close(got.detach().cpu(), enc(x, src_key_padding_mask=pad).detach().cpu(),
                               rtol=1e-4, atol=1e-5)


def _caught(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return got


def test_out_resize_warns_once_at_the_callers_line():
    # ATen warns once per call (TORCH_WARN) at the Python line that called the op; the meta run
    # through torch's reference used to add a second warning, both at our/torch's files
    out = torch.empty(2, device="neuron")
    line = sys._getframe().f_lineno + 1
    got = _caught(lambda: torch.add(torch.arange(4.0, device="neuron"), 1, out=out))
    resized = [w for w in got if "was resized" in str(w.message)]
    assert [(w.filename, w.lineno) for w in resized] == [(__file__, line)]
    assert out.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    cpu_out = torch.empty(2)   # NeuronMode: CPU tensors in and out, the same one warning
    with eager_neuron.NeuronMode():
        line = sys._getframe().f_lineno + 1
        got = _caught(lambda: torch.add(torch.arange(4.0), 1, out=cpu_out))
    resized = [w for w in got if "was resized" in str(w.message)]
    assert [(w.filename, w.lineno) for w in resized] == [(__file__, line)]
    assert cpu_out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_complex_to_real_cast_warns_once_per_process_at_the_callers_line():
    # TORCH_WARN_ONCE on the CPU: one warning per process whatever the filters say
    from eager_neuron import errors

    msg = "Casting complex values to real discards the imaginary part"
    errors._ONCE.discard(msg)
    z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
    line = sys._getframe().f_lineno + 1
    got = _caught(lambda: (z.float(), z.real.float(), z.float(), z.to(torch.float8_e4m3fn)))
    cast = [w for w in got if msg in str(w.message)]
    assert [(w.filename, w.lineno) for w in cast] == [(__file__, line)]
    assert z.float().cpu().tolist() == [1.0, 3.0]
    # torch.set_warn_always(True) makes TORCH_WARN_ONCE warn every time (PyTorch's own tests)
    prev = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        got = _caught(lambda: (z.float(), z.float()))
        assert len([w for w in got if msg in str(w.message)]) == 2
    finally:
        torch.set_warn_always(prev)


_MAKERS = {
    "empty_like": lambda x, **kw: torch.empty_like(x, **kw),
    "zeros_like": lambda x, **kw: torch.zeros_like(x, **kw),
    "ones_like": lambda x, **kw: torch.ones_like(x, **kw),
    "full_like": lambda x, **kw: torch.full_like(x, 2.5, **kw),
    "rand_like": lambda x, **kw: torch.rand_like(x, **kw),
    "randn_like": lambda x, **kw: torch.randn_like(x, **kw),
    "randint_like": lambda x, **kw: torch.randint_like(x, 7, **kw),
    "new_empty": lambda x, **kw: x.new_empty((2, 3), **kw),
    "new_empty_strided": lambda x, **kw: x.new_empty_strided((2, 3), (1, 2), **kw),
    "new_zeros": lambda x, **kw: x.new_zeros((2, 3), **kw),
    "new_ones": lambda x, **kw: x.new_ones((2, 3), **kw),
    "new_full": lambda x, **kw: x.new_full((2, 3), -1.0, **kw),
}


@pytest.mark.parametrize("name", sorted(_MAKERS))
@pytest.mark.parametrize("where", ["cpu", "meta", "neuron:1"])
def test_device_argument_decides_where_a_like_result_lives(name, where):
    """zeros_like(x, device="cpu"), x.new_ones(2, device="neuron:1"): ATen makes the result on
    the device the argument names, whatever the operand's; these ops landed on the operand's
    core. The same call on a CPU operand is the reference (values, RNG stream included)."""
    make = _MAKERS[name]
    x = torch.randn(3, 2).t()   # strided: *_like keeps its strides (preserve_format)
    torch.manual_seed(3)
    want = make(x, device=where)
    torch.manual_seed(3)
    got = make(x.to("neuron"), device=where)
    assert got.device == torch.device(where)
    assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
    if where != "meta" and "empty" not in name:
        assert torch.equal(got.cpu(), want.cpu())
    # and a dtype or no device argument keeps the operand's core
    assert make(x.to("neuron:1"), dtype=torch.float64).device == torch.device("neuron:1")


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_core_to_core_copy_keeps_a_dense_tensors_strides(dtype):
    # _to_copy's preserve_format, as CPU -> neuron and CUDA's device -> device copies do
    x = torch.randn(3, 2).t()
    got = x.to("neuron").to("neuron:1", dtype=dtype)
    assert got.stride() == x.to(dtype=dtype).stride() == (1, 2)
    assert torch.equal(got.cpu(), x.to(dtype=dtype))
    cl = torch.randn(1, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    assert cl.to("neuron").to("neuron:1").stride() == cl.stride()


def test_format_spec_on_a_0d_tensor_formats_its_value():
    # f"{loss:.4f}" in every training loop's log line; CPU and CUDA format the item
    for v in (torch.tensor(1.23456), torch.tensor(7), torch.tensor(True)):
        n = v.to("neuron")
        for spec in ("", ".2f", ">8", "e") if v.dtype.is_floating_point else ("", ">4"):
            assert f"{n:{spec}}" == f"{v:{spec}}"
    m = torch.ones(2, device="neuron")
    assert f"{m}" == str(m)
    with pytest.raises(TypeError):
        f"{m:.2f}"


def test_linspace_on_neuron_ends_made_on_the_cpu_when_asked():
    s, e = torch.tensor(0.0, device="neuron"), torch.tensor(1.0, device="neuron")
    got = torch.linspace(s, e, 5, device="cpu")
    assert got.device == torch.device("cpu")
    assert torch.equal(got, torch.linspace(0.0, 1.0, 5))


@pytest.mark.parametrize("mode", ["plain", "adaptive"])
def test_torch_tensor_of_a_list_holding_neuron_scalars(mode):
    """torch.tensor([neuron 0-d tensor, 2.0]) reads each element's value with the Python key
    excluded (_local_scalar_dense on the PrivateUse1 kernel): it raised torch's INTERNAL ASSERT
    (python_dispatch.cpp, boxed fallback); CUDA gives the CPU tensor of the values."""
    for dev in ("cpu", "neuron"):
        a = torch.tensor(1.5, device=dev)
        with eager_neuron.adaptive() if mode == "adaptive" else contextlib.nullcontext():
            got = [torch.tensor([a * 2, 2.0]), torch.tensor([[a, torch.tensor(3, device=dev)]]),
                   torch.tensor([a], device="neuron"), torch.as_tensor([a, a], dtype=torch.float64)]
        if dev == "cpu":
            want = got
        else:
            for g, w in zip(got, want):
                assert g.device == w.device and g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu())
    v = torch.ones(2, device="neuron")
    with pytest.raises(ValueError, match="only one element tensors"):
        torch.tensor([v, v])


def test_dlpack_refuses_neuron_tensors_and_foreign_device_tensors_fail_clearly():
    """DLPack has no device type for neuron: PyTorch's C++ exported a neuron tensor as kDLExtDev,
    and from_dlpack of that capsule made a plain torch.Tensor on neuron:0 whose every op recursed
    until RecursionError (a print of it spun for minutes). The exports refuse with the protocol's
    exception types; such a tensor, made anyway through torch's C++, fails with a clear error."""
    np = pytest.importorskip("numpy")
    x = torch.arange(3.0, device="neuron")
    with pytest.raises(RuntimeError, match="(?s)DLPack.*t.cpu"):
        torch.utils.dlpack.to_dlpack(x)
    with pytest.raises(RuntimeError, match="DLPack"):
        torch.to_dlpack(x)
    with pytest.raises(ValueError, match="DLPack"):
        torch.from_dlpack(x)
    with pytest.raises(BufferError, match="DLPack"):
        x.__dlpack__()
    with pytest.raises((BufferError, ValueError), match="DLPack"):
        np.from_dlpack(x)
    assert torch.equal(torch.from_dlpack(torch.utils.dlpack.to_dlpack(x.cpu())),
                       torch.arange(3.0))
    foreign = torch.from_dlpack(torch._C._to_dlpack(x))   # torch's own C++, unguarded
    assert type(foreign) is torch.Tensor and foreign.device.type == "neuron"
    for op in (lambda: foreign + 1, lambda: foreign.sum(), lambda: foreign.cpu(),
               lambda: repr(foreign), lambda: torch.empty(3).copy_(foreign)):
        with pytest.raises(RuntimeError, match="eager_neuron did not make"):
            op()


@pytest.mark.parametrize("make", [
    lambda: torch.empty_strided((2,), (-1,), device="neuron"),
    lambda: torch.empty_strided(size=(2, 3), stride=(1, -2), device="neuron"),
    lambda: torch.ones(2, device="neuron").new_empty_strided((2, 3), (3, -1)),
])
def test_strided_factories_refuse_negative_strides_as_the_cpu(make):
    """torch's meta empty_strided makes a tensor of negative strides contiguous; the CPU
    refuses them. Before, neuron returned the contiguous tensor (other strides than asked)."""
    with pytest.raises(RuntimeError, match="Storage size calculation overflowed"):
        make()
    assert torch.empty_strided((0, 2), (-1, 1), device="neuron").shape == (0, 2)   # as the CPU
    assert torch.empty_strided((1, 3), (-1, 1), device="neuron").shape == (1, 3)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_takes_cpu_length_tensors_as_cuda_does(reduction):
    """nn.CTCLoss with the lengths as CPU tensors (the usual form): ATen's composite path for a
    tensor subclass divided the neuron loss by the CPU target_lengths (a device mix error)."""
    g = torch.Generator().manual_seed(0)
    lp0 = torch.randn(10, 2, 5, generator=g).log_softmax(-1).double()
    tg = torch.tensor([[1, 2], [3, 4]])
    il, tl = torch.tensor([10, 9]), torch.tensor([2, 1])
    got = {}
    for dev in ("cpu", "neuron"):
        lp = lp0.to(dev, copy=True).detach().requires_grad_()
        loss = torch.nn.CTCLoss(reduction=reduction)(lp, tg.to(dev), il, tl)
        loss.sum().backward()
        got[dev] = (loss.detach().cpu(), lp.grad.cpu())
    for a, b in zip(got["cpu"], got["neuron"]):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def test_strided_nested_tensors_refuse_with_the_jagged_fix_and_jagged_ones_run():
    """torch makes a strided nested tensor on neuron (its CPU form moved over) but has no
    neuron kernels for it: every op said "Could not run ... 'NestedTensorneuron' backend";
    now NotImplementedError names the layout that works. Jagged nested tensors run."""
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], device="neuron")
    for op in (lambda: nt + 1, lambda: nt.unbind(), lambda: nt.cpu()):
        with pytest.raises(NotImplementedError, match="layout=torch.jagged"):
            op()
    jt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged,
                                    device="neuron")
    assert [t.sum().item() for t in (jt * 2).unbind()] == [12.0, 24.0]


def _jagged_attention(dev, dtype, q_lens, kv_lens, grad, **kw):
    """F.scaled_dot_product_attention on jagged (B, H, j, E) operands: (outputs per component,
    then the gradients of q and k per component when `grad`)."""
    g = torch.Generator().manual_seed(0)

    def make(lens):
        return torch.nested.nested_tensor(
            [torch.randn(n, 2, 4, generator=g).to(dtype) for n in lens],
            layout=torch.jagged, device=dev, requires_grad=grad)

    q0, k0, v0 = make(q_lens), make(kv_lens), make(kv_lens)
    torch.manual_seed(0)
    out = F.scaled_dot_product_attention(q0.transpose(1, 2), k0.transpose(1, 2),
                                         v0.transpose(1, 2), **kw)
    assert out._ragged_idx == 2 and out.shape[:2] == (len(q_lens), 2)
    got = list(out.transpose(1, 2).unbind())
    if grad:
        sum((t * t).sum() for t in out.unbind()).backward()
        got += list(q0.grad.unbind()) + list(k0.grad.unbind())
    return [t.detach().cpu() for t in got]


@pytest.mark.parametrize("kw", [{}, {"scale": 0.3}], ids=["default", "scale"])
def test_jagged_attention_runs_on_neuron_as_the_cpu_math_path(kw):
    """Off CUDA, torch's jagged attention converts q, k, v to strided nested tensors, which a
    neuron device does not hold: it raised. It is one dense attention per sequence, run here
    (eager_neuron/nested.py): self- and cross-attention of ragged lengths, forward and
    backward, against the CPU's float64 math path."""
    for q_lens, kv_lens in (((3, 5), (3, 5)), ((3, 5), (4, 2))):
        want = _jagged_attention("cpu", torch.float64, q_lens, kv_lens, True, **kw)
        got = _jagged_attention("neuron", torch.float32, q_lens, kv_lens, True, **kw)
        assert len(got) == len(want) == 6
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_jagged_attention_dropout_draws_and_refusals_are_the_cpus():
    """Same seed, same dropout mask as the CPU's math path (a different mask would differ by
    O(1)); a mask or is_causal is refused with the CPU's own exception."""
    want = _jagged_attention("cpu", torch.float32, (3, 5), (4, 2), False, dropout_p=0.5)
    got = _jagged_attention("neuron", torch.float32, (3, 5), (4, 2), False, dropout_p=0.5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for kw, exc in (({"is_causal": True}, RuntimeError),
                    ({"attn_mask": torch.ones(2, 2, 3, 3, dtype=torch.bool)}, ValueError)):
        for dev in ("cpu", "neuron"):
            if "attn_mask" in kw:
                kw = {"attn_mask": kw["attn_mask"].to(dev)}
            with pytest.raises(exc):
                _jagged_attention(dev, torch.float32, (3, 5), (3, 5), False, **kw)


def test_a_neuron_storage_resize_says_what_to_do():
    """UntypedStorage.resize_ on a neuron storage raised PyTorch's note about registering
    PrivateUse1HooksInterface (Python cannot): it now names the op, the user's line and the fix;
    resizing to its own size does nothing, as on the CPU; CPU storages resize as before."""
    x = torch.arange(6.0, device="neuron")
    s = x.untyped_storage()
    assert s.resize_(24) is s and x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    for resize in (lambda: s.resize_(0), lambda: x.untyped_storage().resize_(48)):
        with pytest.raises(NotImplementedError, match=r"(?s)resize_.*test_conventions.py.*fix:"):
            resize()
    assert x.untyped_storage().nbytes() == 24 and x.tolist()[5] == 5.0
    c = torch.arange(6.0).untyped_storage()
    c.resize_(0)
    assert c.nbytes() == 0
