"""Ops that cross the host/device boundary: transfers, scalar reads, RNG and host factories.

Random numbers come from the CPU generator (so a seed gives bit-identical tensors on cpu and
neuron); the bytes then travel to the device and are charged as a DMA transfer.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..adaptive import MODULE as _adaptive
from ..adaptive import flush
from ..buffers import alloc, to_host
from ..kernels import elementwise as _kew
from ..launch import launch as _launch
from ..operands import _original, unwrap_args
from ..simulator import SIM
from ..storage import host_alias
from ..tensor import NeuronTensor
from . import cast  # the cast family's lowerings (not via ops: ops imports this module)
from .cast import _dense

aten = torch.ops.aten

# -- the funnel's kernel path, handed down ------------------------------------------------------
# A same-core _to_copy/copy_ (or one under NeuronMode) is a device kernel: it runs through
# dispatch's kernel path (placement, meta, allocation, adaptive recording, the fast path's
# learning, error context) with a kernel Plan of the cast family. dispatch sits above this module
# in the import graph (dispatch -> plan -> ops -> lower/host), so it is handed down once at
# import, as tensor.py is handed the funnel: eager_neuron/__init__.py calls set_kernel_path().
_RUN_KERNEL = None     # dispatch.dispatch(func, args, kwargs, mode, plan): the kernel path
_PLAN = None           # plan.Plan, the class of the Plans below
_PLANS: dict = {}      # plan._PLANS: func -> its Plan (host_compute reads its op's written args)


def set_kernel_path(run_kernel, plan_class, plans: dict) -> None:
    """Hand this module dispatch's kernel path (called once, by eager_neuron/__init__.py)."""
    global _RUN_KERNEL, _PLAN, _PLANS
    _RUN_KERNEL, _PLAN, _PLANS = run_kernel, plan_class, plans


def _target_index(device) -> int | None:
    """neuron core index for a device argument, or None for the CPU."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "neuron":
        return None
    return device.index if device.index is not None else torch.neuron.current_device()


def _charge(index: int, t: torch.Tensor) -> None:
    SIM.cores[index].transfer(t.numel() * t.element_size())


def to_device(host: torch.Tensor, index: int) -> NeuronTensor:
    """Copy a CPU tensor into a fresh device buffer on core `index` (keeps its strides)."""
    # dense layouts (channels_last, x.t()) keep their strides: .to("neuron",
    # memory_format=torch.channels_last) and module.to(...) keep the format, as on CUDA
    if not host.is_contiguous() and not _dense(host):
        host = host.contiguous()
    data, block = alloc(index, host.shape, host.stride(), host.dtype)
    data.copy_(host)
    _charge(index, host)
    return NeuronTensor(data, block, index)


def to_copy(func, args, kwargs, mode):
    """aten::_to_copy: cast on device, or move between host and device / between cores."""
    src = args[0]
    kw = dict(kwargs)
    device = kw.get("device")
    if _plain_neuron(src):
        flush("storage copy")
        kw["device"] = torch.device("cpu")
        host = aten._to_copy.default(host_alias(src), **kw)
        target = _target_index(device)
        return host if target is None else to_device(host, target)
    if isinstance(src, NeuronTensor):
        target = _target_index(device) if device is not None else src.device.index
        if target is None and torch.device(device).type != "cpu":
            # device -> meta: no data moves (ATen's ZeroTensor kernels size their result this
            # way, `self.to(meta) * other.to(meta)`, under torch.func.jvp/jacfwd); device ->
            # another accelerator: torch's own copy from the host decides (CUDA on a CPU-only
            # build raises as from the CPU). Both were CPU copies.
            stand_in = torch.empty_strided(src.shape, src.stride(), dtype=src.dtype,
                                           device="meta")
            if torch.device(device).type != "meta":
                stand_in = to_host(src, reason="copy to another device")
            return aten._to_copy.default(stand_in, **kw)
        if target is None:  # device -> host
            host = to_host(src, reason="copy to cpu")
            kw.pop("non_blocking", None)
            if kw.get("dtype") in (None, src.dtype) and not kw.get("pin_memory") and \
                    kw.get("memory_format") in (None, torch.preserve_format):
                return host   # to_host's copy is already the answer: do not copy it twice
            kw["device"] = torch.device("cpu")
            return aten._to_copy.default(host, **kw)
        if target == src.device.index:
            kw.pop("device", None)
            out = _RUN_KERNEL(func, (src,), kw, None, _kernel_plan(func))
            if "device" in kwargs and mode is None:
                # x.to(device=x.device, dtype=...) (Hugging Face's masks): the cast's runner
                # serves this call too (else it took this path, ~0.4 ms, every time)
                from ..fastpath import share_runner

                share_runner(func, (src,), kw, args, kwargs)
            return out
        # core -> core: a device copy through HBM
        flush("cross-core copy")
        kw["device"] = torch.device("cpu")
        # (its strides are _to_copy's: preserve_format keeps a dense tensor's, as on CUDA)
        moved = aten._to_copy.default(src._data, **kw)
        data, block = alloc(target, moved.shape, moved.stride(), moved.dtype)
        data.copy_(moved)
        SIM.copy_between(src.device.index, target, moved.numel() * moved.element_size())
        return NeuronTensor(data, block, target)
    # host -> device (a CPU tensor with device="neuron"), or plain CPU under the mode
    target = _target_index(device)
    if mode is not None and target is None and isinstance(src, torch.Tensor):
        # NeuronMode: a cast of a CPU tensor is a kernel too (CPU in, CPU out)
        kw.pop("device", None)
        kw.pop("non_blocking", None)
        return _RUN_KERNEL(func, (src,), kw, mode, _kernel_plan(func))
    if target is not None and isinstance(src, torch.Tensor) and src.is_contiguous() and \
            kw.keys() <= _PLAIN_TO_KW and kw.get("dtype") in (None, src.dtype) and \
            kw.get("layout") in (None, torch.strided) and not kw.get("pin_memory") and \
            kw.get("memory_format") in (None, torch.preserve_format) and \
            not src.is_conj() and not src.is_neg() and src.layout == torch.strided:
        # a plain move (the batch a training step sends): the device buffer is the copy, as
        # _to_copy's own would be (same sizes and strides: preserve_format keeps a dense
        # tensor's); no CPU copy first
        return to_device(src, target)
    kw["device"] = torch.device("cpu")
    host = aten._to_copy.default(src, **kw)
    if target is None:
        return host
    return to_device(host, target)


_PLAIN_TO_KW = frozenset({"dtype", "layout", "device", "pin_memory", "non_blocking",
                          "memory_format"})


_KPLANS: dict = {}


def _kernel_plan(func):
    plan = _KPLANS.get(func)
    if plan is None:
        plan = _PLAN("kernel", lower=cast.LOWERINGS["aten::_to_copy"],
                             name="aten::_to_copy", ret_alias=(None,))
        _KPLANS[func] = plan
    return plan


def _copy_plan():
    plan = _KPLANS.get("copy_")
    if plan is None:
        plan = _KPLANS["copy_"] = _PLAN(
            "kernel", lower=cast.LOWERINGS["aten::copy_"], name="aten::copy_",
            ret_alias=("self",), mutates=("self",))
    return plan


def _plain_neuron(x) -> bool:
    """A plain tensor PyTorch's C++ made on the neuron device over a neuron storage (legacy
    serialization wraps a storage in one to copy it to or from the CPU; a NeuronTensor is the
    only other kind of neuron tensor)."""
    return type(x) is not NeuronTensor and isinstance(x, torch.Tensor) and \
        x.device.type == "neuron"


def copy_(func, args, kwargs, mode):
    """aten::copy_(self, src): device<-host, host<-device, or on-device (cast + broadcast)."""
    dst, src = args[0], args[1]
    if _plain_neuron(dst) or _plain_neuron(src):
        # a storage copied by C++: its memory is host memory, copied through CPU aliases
        flush("storage copy")
        d = host_alias(dst) if _plain_neuron(dst) else getattr(dst, "_data", dst)
        d.copy_(host_alias(src) if _plain_neuron(src) else getattr(src, "_data", src))
        return dst
    if isinstance(dst, NeuronTensor) and isinstance(src, NeuronTensor):
        if dst.device == src.device:
            return _RUN_KERNEL(func, args, kwargs, None, _copy_plan())
        flush("cross-core copy")
        dst._data.copy_(src._data)
        SIM.copy_between(src.device.index, dst.device.index, src.numel() * src.element_size())
        return dst
    if isinstance(dst, NeuronTensor):  # host -> device
        flush("copy to device")
        dst._data.copy_(src)
        _charge(dst.device.index, dst._data)
        return dst
    if isinstance(src, NeuronTensor):  # device -> host
        flush("copy to cpu")
        dst.copy_(src._data)
        _charge(src.device.index, src._data)
        return dst
    if mode is not None and isinstance(src, torch.Tensor):
        # NeuronMode: a CPU-to-CPU copy_ is a kernel too
        return _RUN_KERNEL(func, args, kwargs, mode, _copy_plan())
    return func(*args, **kwargs)


def local_scalar_dense(func, args, kwargs, mode):
    x = args[0]
    if isinstance(x, NeuronTensor):
        flush("item")
        _charge(x.device.index, x._data)
        return x._data.item()
    return func(*args, **kwargs)


def rng_inplace(func, args, kwargs, mode):
    """normal_, uniform_, bernoulli_, ...: the CPU generator writes straight into device memory."""
    uargs, ukw, index = unwrap_args(args, kwargs)
    flush("rng")
    func(*uargs, **ukw)
    if index is not None:
        _charge(index, uargs[0])
    return args[0]


def host_compute(func, args, kwargs, mode):
    """Factories and functional RNG: computed by the host, then copied to the device."""
    uargs, ukw, index = unwrap_args(args, kwargs)
    if index is not None:
        # the host reads (or writes) device tensors: adaptive eager's pending stores land first
        # (torch.linspace(start_t, end_t) read a recorded, unwritten start: garbage)
        flush("host compute")
    dev_index = _target_index(ukw.get("device"))
    if "device" in ukw and ukw["device"] is not None:
        ukw["device"] = torch.device("cpu")
    if index is None:
        index = dev_index
    plan = _PLANS.get(func)
    written = [n for n in (plan.mutates if plan else ())]
    out = func(*uargs, **ukw)
    if index is None:
        return out
    # 1. written arguments (out= factories, rrelu_with_noise's noise) already hold the result in
    #    device memory: charge the transfer, hand back the caller's own tensor
    for name in written:
        _charge(index, _original(func, args, kwargs, name))
    # 2. fresh results travel to the device
    leaves, spec = tree_flatten(out)
    aliases = plan.ret_alias if plan is not None else ()
    moved = []
    for i, v in enumerate(leaves):
        target = aliases[i] if i < len(aliases) else None
        if target is not None:
            moved.append(_original(func, args, kwargs, target))
        elif isinstance(v, torch.Tensor):
            moved.append(to_device(v, index))
        else:
            moved.append(v)
    return tree_unflatten(moved, spec)


def efficient_zeros(func, args, kwargs, mode):
    """aten::_efficientzerotensor (autograd's zero grads, e.g. sgn's backward): the device has no
    ZeroTensor, so plain zeros, made as aten::zeros makes them (same schema)."""
    return host_compute(torch.ops.aten.zeros.default, args, kwargs, mode)


_NEW_EMPTY = aten.new_empty.default
_FILL = aten.fill_.Scalar
_NEW_FILL = {"aten::new_zeros": 0, "aten::new_ones": 1}


def new_filled(func, args, kwargs, mode):
    """new_zeros / new_ones / new_full: new_empty, then fill_, each through the funnel with
    its own fast path (torch's decomposition went through aten::full, a host factory computed
    by the CPU and copied over: 30-70 us a call; Mamba's, Whisper's and Mixtral's backward
    make a few a step). Same checks: fill_ refuses a value the dtype cannot hold."""
    name = func._schema.name
    value = _NEW_FILL.get(name)
    rest = dict(kwargs)
    if value is None:   # new_full(self, size, fill_value, *, dtype, layout, device, pin_memory)
        value = args[2] if len(args) > 2 else rest.pop("fill_value")
    out = rest.pop("out", None)   # the .out overloads: resized to `size` by dispatch already
    if out is None:
        out = _NEW_EMPTY(args[0], args[1] if len(args) > 1 else rest.pop("size"), **rest)
    _FILL(out, value)
    return out


def native_dropout(func, args, kwargs, mode):
    """Same random stream and arithmetic as the CPU's dropout: bernoulli_(1-p), /(1-p), mul."""
    x = args[0]
    p = args[1] if len(args) > 1 else kwargs["p"]
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is None:   # Tensor? train=None means training (ATen: !train.has_value() || *train)
        train = True
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return x * 0, torch.zeros_like(x, dtype=torch.bool)
    if type(x) is NeuronTensor:
        if x.dtype in _DROPOUT_T and not _adaptive.STATE.enabled and not _adaptive.PENDING \
                and x.is_contiguous() and x.numel():
            return _dropout_kernel(x, p)
        # the mask is drawn and scaled on the host (the CPU's generator and arithmetic, in the
        # layout empty_like gives x) and sent as one transfer: two device ops fewer than
        # drawing into a device tensor (bernoulli_ is a host op anyway). Adaptive eager takes
        # this route: the two ops join the pending group
        host = torch.empty_like(x._data).bernoulli_(1 - p)
        host.div_(1 - p)
        noise = to_device(host, x._index)
    else:
        noise = torch.empty_like(x).bernoulli_(1 - p)
        noise.div_(1 - p)
    return x * noise, noise != 0


_contiguous_strides = torch._prims_common.make_contiguous_strides_for
_DROPOUT_T = {torch.float32: ("float32", np.float32), torch.float64: ("float64", float)}


def _dropout_kernel(x: NeuronTensor, p: float) -> tuple:
    """Plain eager's dropout of a contiguous float32/float64 tensor: the CPU's draw on the host
    (`empty_like(x).bernoulli_(1 - p)`, the generator's stream as ATen's CPU kernel uses it),
    sent as one transfer, then one kernel making both outputs as ATen computes them,
    `x.mul(mask).mul_(scale)` with scale = 1 / (1 - p) rounded to x's dtype, and `mask != 0`
    (was the transfer, a scaling on the host and two device ops: 46 -> 40 us a call for 4096
    floats, ~19 us of it the draw)."""
    T, scalar = _DROPOUT_T[x.dtype]
    index = x._index
    host = torch.empty_like(x._data).bernoulli_(1 - p)   # refuses a p outside [0, 1] first
    shape = tuple(x.shape)
    stride = _contiguous_strides(shape)
    data, block = alloc(index, shape, stride, x.dtype)
    kdata, kblock = alloc(index, shape, stride, torch.bool)
    _charge(index, host)   # the mask's transfer
    n = x.numel()
    arrays = (data.numpy().reshape(-1), kdata.numpy().reshape(-1),
              x._data.numpy().reshape(-1), host.numpy().reshape(-1), scalar(1.0 / (1.0 - p)))
    _launch(("elementwise", "aten::native_dropout", T), lambda: _kew.render_dropout(T), arrays,
            2.0 * n, float(n * (3 * x.element_size() + 1)), "vector", core=index)
    return NeuronTensor(data, block, index), NeuronTensor(kdata, kblock, index)


def equal(func, args, kwargs, mode):
    a, b = args[0], args[1]
    if a.shape != b.shape:
        return False
    return bool((a == b).all().item())


def allclose(func, args, kwargs, mode):
    """aten::allclose: isclose(...).all() on the device; only the verdict comes back."""
    from .common import bind

    a = bind(func, args, kwargs)
    close = torch.isclose(a["self"], a["other"], rtol=a["rtol"], atol=a["atol"],
                          equal_nan=a["equal_nan"])
    return bool(close.all().item())


def tensor_info(func, args, kwargs, mode):
    """is_pinned and friends: facts about a tensor, no data touched."""
    if isinstance(args[0], NeuronTensor):
        return False
    return func(*args, **kwargs)


def same_storage_numel(func, args, kwargs, mode):
    """aten::_has_same_storage_numel (forward-mode AD asks it when a tangent is set on a view,
    torch.func.jvp/jacfwd/hessian): whether the two storages hold as many elements, as ATen
    computes it (storage bytes over element size); no data touched."""
    from .common import bind

    a = bind(func, args, kwargs)
    x, y = a["self"], a["other"]
    return (x.untyped_storage().nbytes() // x.element_size() ==
            y.untyped_storage().nbytes() // y.element_size())


def new_zeros_same_feature_meta(func, args, kwargs, mode):
    """aten::_new_zeros_with_same_feature_meta (forward-mode AD: a tangent whose layout differs
    from its primal's is copied into zeros laid out as the primal, over the primal's whole
    storage): zeros on `other`'s device, its sizes and strides at its storage offset, with
    `self`'s leading batch dimensions laid out outermost (one storage-sized slice each).
    ATen's kernel reads the wrapper's C++ storage, which is not the device buffer's size."""
    from .common import bind

    a = bind(func, args, kwargs)
    x, other, nb = a["self"], a["other"], a["self_num_batch_dims"]
    numel = other.untyped_storage().nbytes() // other.element_size()
    sizes = list(x.shape[:nb]) + list(other.shape)
    strides = [0] * nb + list(other.stride())
    total = numel
    for i in range(nb - 1, -1, -1):
        strides[i] = total
        total *= x.shape[i]
    flat = torch.zeros(total, dtype=other.dtype, device=other.device)
    return flat.as_strided(sizes, strides, other.storage_offset())


def noop_self(func, args, kwargs, mode):
    return args[0] if args else None


def record_stream(func, args, kwargs, mode):
    return None


RNG_INPLACE = [
    "aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::random_",
    "aten::exponential_", "aten::geometric_", "aten::log_normal_", "aten::cauchy_",
]
HOST_COMPUTE = [
    "aten::bernoulli", "aten::normal", "aten::multinomial", "aten::randperm", "aten::randint",
    "aten::rand", "aten::randn", "aten::arange", "aten::linspace", "aten::logspace",
    "aten::eye", "aten::scalar_tensor", "aten::poisson", "aten::_standard_gamma",
    "aten::randint_like", "aten::rand_like", "aten::randn_like", "aten::normal_functional",
    "aten::tensor", "aten::full", "aten::zeros", "aten::ones",
    "aten::rrelu_with_noise",   # draws into `noise` (a device buffer) and returns the output
    # the CPU's generator too (torch.distributions' Binomial and Dirichlet, F.rrelu_ in
    # training, functional random): these ran as CPU fallbacks, warned and counted
    "aten::binomial", "aten::_sample_dirichlet", "aten::random", "aten::rrelu_with_noise_",
    "aten::rrelu_with_noise_functional",
]

# -- sparse and quantized tensors: refused with the fix, before any half-built device tensor ------
# A sparse CPU tensor's .to("neuron") moves its dense parts (indices, values) to the device, then
# builds the sparse tensor with one of these constructors (COO failed in a copy_, CSR made a
# tensor that could not be printed or moved back); a quantized one asks the QuantizedPrivateUse1
# backend for empty_quantized, which does not exist. Both get the README's UnsupportedTensorError.

def _refuse_layout(layout, what: str):
    from .. import errors

    name = {torch.sparse_coo: "sparse COO", torch.sparse_csr: "sparse CSR",
            torch.sparse_csc: "sparse CSC", torch.sparse_bsr: "sparse BSR",
            torch.sparse_bsc: "sparse BSC"}.get(layout, str(layout))
    return errors.UnsupportedTensorError(
        f"{name} tensors are not supported on neuron ({what})\n{errors.where()}\n"
        "  fix: densify first: x.to_dense().to('neuron'), or keep the sparse tensor on the CPU")


def sparse_constructor(func, args, kwargs, mode):
    """aten::_sparse_coo_tensor_unsafe & co. with a neuron device: UnsupportedTensorError."""
    layout = kwargs.get("layout")
    if layout is None:
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        layout = torch.sparse_coo if "coo" in name else torch.sparse_csr
    raise _refuse_layout(layout, f"{func} with a neuron device")


def refuse_quantized(*args, **kwargs):
    """aten::empty_quantized on the QuantizedPrivateUse1 key (x_quantized.to('neuron'))."""
    from .. import errors

    raise errors.UnsupportedTensorError(
        "quantized tensors are not supported on neuron (quantized .to('neuron'))\n"
        f"{errors.where()}\n"
        "  fix: x.dequantize().to('neuron'), or keep the quantized tensor on the CPU")


_SPARSE_CONSTRUCTORS = (
    "aten::_sparse_coo_tensor_unsafe", "aten::_sparse_coo_tensor_with_dims_and_tensors",
    "aten::_sparse_coo_tensor_with_dims", "aten::sparse_coo_tensor",
    "aten::_sparse_compressed_tensor_unsafe", "aten::sparse_compressed_tensor",
    "aten::_sparse_compressed_tensor_with_dims", "aten::_sparse_csr_tensor_unsafe",
    "aten::_sparse_csc_tensor_unsafe", "aten::_sparse_bsr_tensor_unsafe",
    "aten::_sparse_bsc_tensor_unsafe", "aten::sparse_csr_tensor", "aten::sparse_csc_tensor",
    "aten::sparse_bsr_tensor", "aten::sparse_bsc_tensor")

_QLIB = torch.library.Library("aten", "IMPL")
for _name in ("empty_quantized", "_empty_affine_quantized",
              "_empty_per_channel_affine_quantized"):
    try:
        _QLIB.impl(_name, refuse_quantized, "QuantizedPrivateUse1")
    except Exception:   # noqa: BLE001 - an op this torch build lacks: nothing to refuse
        pass


# -- torch.arange(..., device="neuron"): one host factory ----------------------------------------
# arange's CompositeExplicitAutograd kernel makes an empty device tensor, then runs arange.out
# into it: two trips through the funnel, the second resizing the out= tensor as an in-place view
# op (meta, a regrown block): ~100 us. A PrivateUse1 kernel sends the call to the funnel as
# itself (one host factory: computed by the CPU, copied to the device, charged as a transfer).

def _factory_impl(op):
    def impl(*args, **kwargs):
        return _RUN_KERNEL(op, args, kwargs)
    return impl


_FLIB = torch.library.Library("aten", "IMPL")
for _ov in ("default", "start", "start_step"):
    _FLIB.impl(f"arange.{_ov}" if _ov != "default" else "arange",
               _factory_impl(getattr(aten.arange, _ov)), "PrivateUse1")


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def composite(func, args, kwargs, mode):
    """Ops whose CompositeExplicitAutograd kernel CUDA runs too, and whose results are not all
    device tensors: `_pack_padded_sequence` builds `batch_sizes` on its lengths' device (the
    CPU; PackedSequence refuses any other). The kernel runs on the neuron tensors themselves,
    its slices and cat dispatched here op by op (the CPU fallback moved every result to the
    device)."""
    return func.redispatch(_COMPOSITE, *args, **kwargs)


# host ops that touch device memory only through ops they send down the funnel (each gated and
# fast-pathed on its own) or through buffers they allocate: a repeat of a signature may call the
# lowering directly (fastpath.learn_composite), and adaptive eager may run it with a group
# pending, as a view (new_zeros 29 -> 23 us plain, 42 -> 28 us adaptive, 8 a Mixtral step;
# native_dropout: the slow path's entry, ~3 us of its ~40 plain)
COMPOSITES = frozenset({"aten::new_zeros", "aten::new_ones", "aten::new_full",
                        "aten::native_dropout"})


HOST = {
    "aten::_pack_padded_sequence": composite,
    "aten::_to_copy": to_copy,
    "aten::copy_": copy_,
    "aten::_local_scalar_dense": local_scalar_dense,
    "aten::native_dropout": native_dropout,
    "aten::equal": equal,
    "aten::allclose": allclose,
    "aten::is_pinned": tensor_info,
    "aten::_has_same_storage_numel": same_storage_numel,
    "aten::_new_zeros_with_same_feature_meta": new_zeros_same_feature_meta,
    "aten::record_stream": record_stream,
    "aten::_efficientzerotensor": efficient_zeros,
    "aten::new_zeros": new_filled,
    "aten::new_ones": new_filled,
    "aten::new_full": new_filled,
    **{name: rng_inplace for name in RNG_INPLACE},
    **{name: host_compute for name in HOST_COMPUTE},
    **{name: sparse_constructor for name in _SPARSE_CONSTRUCTORS},
}
