"""Profiler, step 1: record. A dispatch hook (dispatch.OP_HOOKS) around each op and a launch
hook (launch.HOOKS) per kernel append raw records to one process-wide list; each thread keeps its
own stack of open ops, so autograd's device thread records safely beside the main one. Sessions
(`_start`/`_stop`) install the hooks while at least one profile is open.

>>> from eager_neuron.profiler.recording import _kernel_name
>>> _kernel_name(("elementwise", "aten::add"))
'elementwise:aten::add'
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns

import torch

from .. import dispatch as _dispatch
from .. import launch as _launch
from ..errors import _SKIP
from ..simulator import SIM

_Tensor = torch.Tensor
_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr
_torch_prof = torch.autograd.profiler   # `_is_profiler_enabled` is read per launch, not cached


# -- the recorder: process-wide, shared by nested sessions --------------------------------------
_LOCK = threading.Lock()
_TLS = threading.local()      # per thread: stack of open ops, thread label, last autograd seq nr
_RECORDS: list = []           # _Op / _Kernel / _Flush in start order (list.append is atomic)
_SEQ_LOC: dict = {}           # autograd sequence nr -> forward location of the op that made it
_PENDING: list = []           # kernel ops that launched nothing (recorded by adaptive eager)
_SESSIONS = [0]
_SKIP_CODE: dict = {}         # code object -> True if it lives in torch / eager_neuron / stdlib
# NOTE: errors._SKIP plus kernels/ and cache/, which sit beside eager_neuron/ in the repository
_SKIP_PREFIXES = (*_SKIP, *(os.path.dirname(sys.modules[m].__file__)
                            for m in ("eager_neuron.kernels", "eager_neuron.cache")),
                  "<eager_neuron")


class _Op:
    __slots__ = ("clk0", "clk1", "flush_reason", "group", "inputs", "kind", "label", "launches",
                 "loc", "name", "parent", "t0", "t1", "thread")

    def __init__(self, name, kind, inputs, parent, thread, loc, clk0):
        self.name = name
        self.kind = kind
        self.inputs = inputs          # [(torch.Size, dtype)], never the tensors themselves
        self.parent = parent
        self.thread = thread
        self.loc = loc
        self.clk0 = clk0              # per-core simulated clock at entry / exit
        self.clk1 = None
        self.t1 = 0
        self.launches = 0
        self.group = None
        self.flush_reason = None
        self.label = parent.label if parent is not None else _open_label()


class _Label:
    """A `torch.profiler.record_function` block: ops and kernels inside it carry it."""

    __slots__ = ("loc", "name", "parent", "t0", "t1", "thread")

    def __init__(self, name, parent, thread, loc, t0):
        self.name, self.parent, self.thread, self.loc, self.t0 = name, parent, thread, loc, t0
        self.t1 = None


_OPEN_LABELS: list = []   # every thread's open labels, innermost last


def _open_label():
    """The label an op belongs to: its thread's innermost open record_function block; on
    autograd's device thread (no Python frames of its own) the newest one of any thread, which
    is the block around `loss.backward()`."""
    labels = getattr(_TLS, "labels", None)
    while labels and labels[-1].t1 is not None:   # left open when a session ended inside it
        labels.pop()
    if labels:
        return labels[-1]
    if _OPEN_LABELS and _current_node() is not None:
        return _OPEN_LABELS[-1]
    return None


class _Kernel:
    __slots__ = ("clock", "core", "event", "group", "label", "loc", "marked", "op", "t",
                 "thread")

    def __init__(self, event, op, t, core, clock, thread, loc, group):
        self.event, self.op, self.t, self.core = event, op, t, core
        self.clock, self.thread, self.loc, self.group = clock, thread, loc, group
        self.marked = False       # a neuron::<kernel> range went to torch.profiler (kineto.py)
        self.label = op.label if op is not None else _open_label()


class _Flush:
    __slots__ = ("group", "loc", "n_ops", "op", "reason", "t", "thread")

    def __init__(self, reason, n_ops, group, op, t, thread, loc):
        self.reason, self.n_ops, self.group, self.op = reason, n_ops, group, op
        self.t, self.thread, self.loc = t, thread, loc


def _thread_state():
    tls = _TLS
    try:
        return tls.stack, tls.thread
    except AttributeError:
        tls.stack = []
        tls.thread = threading.current_thread().name
        tls.last_seq = -1
        return tls.stack, tls.thread


def _user_frame():
    """(code, instruction offset, None) of the first frame outside torch, eager_neuron and the
    stdlib. NOTE: the line number is resolved when the profile ends (f_lineno costs ~1 us)."""
    f = sys._getframe(2)
    skip = _SKIP_CODE
    while f is not None:
        code = f.f_code
        s = skip.get(code)
        if s is None:
            fn = code.co_filename
            s = skip[code] = fn.startswith(_SKIP_PREFIXES)
        if not s:
            return (code, f.f_lasti, None)
        f = f.f_back
    return None


def _locate():
    """Location of a top-level op: (code, offset, grad_fn or None) or None.

    NOTE: autograd runs a neuron tensor's backward on its own device thread, where no user frame
    exists; the node being run carries the forward op's sequence number instead.
    """
    node = _current_node()
    if node is not None:
        fwd = _SEQ_LOC.get(node._sequence_nr())
        name = node.name()
        return (fwd[0], fwd[1], name) if fwd else (None, None, name)
    loc = _user_frame()
    # the op's autograd node (if it has one) was made just before dispatch: its number is seq-1
    seq = _sequence_nr()
    if seq != _TLS.last_seq:
        _TLS.last_seq = seq
        if loc is not None:
            _SEQ_LOC[seq - 1] = loc
    return loc


def _inputs(args, kwargs) -> list:
    out = []
    for a in (args if not kwargs else (*args, *kwargs.values())):
        if isinstance(a, _Tensor):
            out.append((a.shape, a.dtype))
        elif type(a) in (list, tuple) and a and isinstance(a[0], _Tensor):
            out.extend((t.shape, t.dtype) for t in a if isinstance(t, _Tensor))
    return out


class _Exit:
    """The context OP_HOOKS returns: one shared object, the state is on the thread's stack."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        t = perf_counter_ns()
        op = _TLS.stack.pop()
        op.t1 = t
        op.clk1 = [c.clock_us for c in SIM.cores]
        # adaptive eager recorded this op instead of launching it: record_flush names its group
        if op.kind == "kernel" and not op.launches and op.clk1 == op.clk0:
            _PENDING.append(op)
        return False


_EXIT = _Exit()


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _Null()
_ERRORS = [0]   # records the profiler failed to take (it never fails the user's op)


def _op_hook(plan, args, kwargs):
    try:
        stack, thread = _TLS.stack, _TLS.thread
    except AttributeError:
        stack, thread = _thread_state()
    try:
        parent = stack[-1] if stack else None
        loc = parent.loc if parent is not None else _locate()
        op = _Op(plan.name, plan.kind, _inputs(args, kwargs), parent, thread, loc,
                 [c.clock_us for c in SIM.cores])
    except Exception:  # noqa: BLE001 - a profiler bug must not fail the user's op
        _ERRORS[0] += 1
        return _NULL
    stack.append(op)
    _RECORDS.append(op)
    op.t0 = perf_counter_ns()
    return _EXIT


def _launch_hook(event: dict) -> None:
    t = perf_counter_ns()
    try:
        core = _launch.current_core()
        stack, thread = _thread_state()
        op = stack[-1] if stack else None
        if op is not None:
            op.launches += 1
            loc = op.loc
        else:
            loc = _user_frame()
        group = event.get("group")
        if group is None and event.get("group_ops") is not None:
            # a fused group launched without record_flush: all recorded ops are its members
            group = _implicit_flush(event, op, thread, loc)
        elif _PENDING and group is None:
            _PENDING.clear()  # a plain launch: whatever launched nothing before was no recording
        k = _Kernel(event, op, t, core, SIM.cores[core].clock_us, thread, loc, group)
        _RECORDS.append(k)
        if _torch_prof._is_profiler_enabled:
            _annotate_torch_profiler(event, core)
            k.marked = True
    except Exception:  # noqa: BLE001 - a profiler bug must not fail the user's kernel
        _ERRORS[0] += 1


def _annotate_torch_profiler(event: dict, core: int) -> None:
    """A `neuron::<family>:<op>` marker in torch.profiler's CPU timeline, right after the kernel.

    NOTE: a Python backend cannot add device-side activity to Kineto (that needs a C++ profiler
    plugin), and launch.HOOKS fire after the kernel ran, so Kineto records a marker; kineto.py
    matches it to this launch, widens it to the kernel's host run and adds the device event.
    """
    key = event["key"]
    with torch._C._profiler._RecordFunctionFast(
            "neuron::" + _kernel_name(key),
            keyword_values={"outcome": event["outcome"], "device_us": float(event["device_us"]),
                            "host_us": float(event["host_us"]), "core": core,
                            "engine": str(event["engine"])}):
        pass


_GROUP_IDS = [0]


def _implicit_flush(event: dict, op, thread, loc) -> str:
    """adaptive.py launches one pending group per flush with extra={"group_ops": n,
    "flush_reason": r}: every op recorded since the last launch belongs to it."""
    with _LOCK:
        members = _PENDING[:]
        _PENDING.clear()
        _GROUP_IDS[0] += 1
        group = f"g{_GROUP_IDS[0]}"
    reason = event.get("flush_reason")
    for m in members:
        m.group, m.flush_reason = group, reason
    _RECORDS.append(_Flush(reason, event["group_ops"], group, op, perf_counter_ns(), thread, loc))
    return group


def record_flush(reason: str, n_ops: int, group_id=None) -> None:
    """Adaptive eager calls this once per fused group, in launch order, when it flushes.

    The oldest `n_ops` kernel ops that launched nothing since the last call become members of
    `group_id` with this flush reason; the flush itself is an event at the current user line.
    Cheap no-op when no profiler is running.

    >>> from eager_neuron.profiler import record_flush
    >>> record_flush("host read", 3, 7)    # outside a profile: nothing happens
    """
    if not _SESSIONS[0]:
        return
    with _LOCK:
        members = _PENDING[:n_ops]
        del _PENDING[:n_ops]
    for op in members:
        op.group = group_id
        op.flush_reason = reason
    stack, thread = _thread_state()
    op = stack[-1] if stack else None
    loc = op.loc if op is not None else _user_frame()
    _RECORDS.append(_Flush(reason, n_ops, group_id, op, perf_counter_ns(), thread, loc))


# -- record_function blocks ----------------------------------------------------------------------
_RF = _torch_prof.record_function
_RF_ENTER, _RF_EXIT = _RF.__enter__, _RF.__exit__


def _rf_enter(self):
    out = _RF_ENTER(self)
    try:
        labels = getattr(_TLS, "labels", None)
        if labels is None:
            _thread_state()
            labels = _TLS.labels = []
        lab = _Label(self.name, labels[-1] if labels else None, _TLS.thread, _user_frame(),
                     perf_counter_ns())
        labels.append(lab)
        _OPEN_LABELS.append(lab)
        _RECORDS.append(lab)
    except Exception:  # noqa: BLE001 - a profiler bug must not fail the user's block
        _ERRORS[0] += 1
    return out


def _rf_exit(self, *exc):
    try:
        labels = getattr(_TLS, "labels", None)
        if labels and labels[-1].name == self.name:
            lab = labels.pop()
            lab.t1 = perf_counter_ns()
            if lab in _OPEN_LABELS:
                _OPEN_LABELS.remove(lab)
    except Exception:  # noqa: BLE001
        _ERRORS[0] += 1
    return _RF_EXIT(self, *exc)


# -- sessions ------------------------------------------------------------------------------------

def _start() -> int:
    with _LOCK:
        if _SESSIONS[0] == 0:
            _RECORDS.clear()
            _SEQ_LOC.clear()
            _PENDING.clear()
            _dispatch.OP_HOOKS.insert(0, _op_hook)
            _launch.HOOKS.append(_launch_hook)
            _RF.__enter__, _RF.__exit__ = _rf_enter, _rf_exit
        _SESSIONS[0] += 1
        return len(_RECORDS)


def _stop(first: int) -> list:
    with _LOCK:
        raw = _RECORDS[first:]
        _SESSIONS[0] -= 1
        if _SESSIONS[0] == 0:
            _dispatch.OP_HOOKS.remove(_op_hook)
            _launch.HOOKS.remove(_launch_hook)
            _RF.__enter__, _RF.__exit__ = _RF_ENTER, _RF_EXIT
            t = perf_counter_ns()
            for lab in _OPEN_LABELS:
                lab.t1 = lab.t1 or t
            _OPEN_LABELS.clear()
            _RECORDS.clear()
            _SEQ_LOC.clear()
            _PENDING.clear()
    return raw


def _kernel_name(key) -> str:
    if isinstance(key, tuple) and len(key) >= 2:
        return f"{key[0]}:{key[1]}" if isinstance(key[1], str) else str(key[0])
    return str(key)
