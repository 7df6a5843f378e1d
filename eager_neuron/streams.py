"""torch.neuron.Stream / Event on the simulated timeline, and the current-stream API.

A Stream is a `torch.Stream` (so generic code that type-checks it accepts it) backed by a
simulator Queue; an Event is a `torch.Event` holding the simulated time it was recorded at.
Times are simulated: `elapsed_time` reports what the device would take, not host wall time.

The current stream is per core and process-wide, not per thread: PyTorch's Python device guard
cannot carry a stream into autograd's backward worker thread, and a per-thread stream would send
every backward kernel to the default stream.

>>> import torch, eager_neuron
>>> start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
>>> start.record(); y = torch.ones(1000, device="neuron") * 2; end.record(); end.synchronize()
>>> start.elapsed_time(end) > 0
True
"""

from __future__ import annotations

import torch

from .simulator import SIM, Queue

_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)


def _index(device) -> int:
    """The core a device argument names; None or a bare "neuron" means the current device.

    NOTE: the current device is read through torch's device-module registry, not by importing
    eager_neuron.device: device.py imports this module (torch.neuron.Stream), not the reverse.
    """
    if isinstance(device, int):
        return device
    if device is not None:
        device = torch.device(device)
        if device.index is not None:
            return device.index
    return torch.get_device_module("neuron").current_device()


def _flush(reason: str) -> None:
    # adaptive eager holds launches back; anything that reads the clock must see them first
    from .dispatch import flush

    flush(reason)


class Stream(torch.Stream):
    """An in-order queue of work on one simulated core.

    >>> s = torch.neuron.Stream()
    >>> with torch.neuron.stream(s):
    ...     y = torch.ones(4, device="neuron") + 1
    >>> s.synchronize(); s.query()
    True
    """

    def __new__(cls, device=None, priority: int = 0, *, _queue: Queue | None = None):
        if _queue is None:
            _queue = SIM.new_queue(_index(device), priority)
        self = super().__new__(cls, stream_id=_queue.id, device_index=_queue.core,
                               device_type=_DEVICE_TYPE)
        self._queue = _queue
        self._prev: list = []
        _queue.handle = self
        return self

    def __init__(self, device=None, priority: int = 0, **_kw) -> None:
        pass

    @property
    def priority(self) -> int:
        return self._queue.priority

    def query(self) -> bool:
        """True if all work enqueued on this stream has completed (as the host sees it)."""
        _flush("stream query")
        return SIM.done(self._queue.tail_us)

    def synchronize(self) -> None:
        """The host waits until this stream's work completes."""
        _flush("stream synchronize")
        SIM.host_wait(self._queue.tail_us)

    def wait_event(self, event) -> None:
        """Work enqueued on this stream later starts after `event` completes."""
        event.wait(self)

    def wait_stream(self, stream) -> None:
        """Work enqueued on this stream later starts after what `stream` holds now."""
        self.wait_event(_as_stream(stream).record_event())

    def record_event(self, event=None):
        """Record `event` (a new one if None) at the current end of this stream."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __enter__(self):
        self._prev.append(SIM.core(self._queue.core).queue)
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        SIM.core(self._queue.core).queue = self._prev.pop()

    def __repr__(self) -> str:
        return (f"torch.neuron.Stream(device=neuron:{self._queue.core}, "
                f"stream_id={self._queue.id}, priority={self._queue.priority})")


class Event(torch.Event):
    """A marker on a stream's simulated timeline; elapsed_time is in simulated milliseconds.

    >>> e = torch.neuron.Event(); e.query()   # never recorded: nothing to wait for
    True
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, *, device=None):
        self = super().__new__(cls, device="neuron", enable_timing=enable_timing)
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: float | None = None
        self._core: int | None = None
        return self

    def __init__(self, *_a, **_kw) -> None:
        pass

    @property
    def device(self):
        return torch.device("neuron", self._core) if self._core is not None else None

    def record(self, stream=None) -> None:
        """Mark the current end of `stream` (the current stream if None)."""
        _flush("event record")
        q = _as_stream(stream)._queue
        self._time = SIM.record(q)
        self._core = q.core

    def wait(self, stream=None) -> None:
        """Make `stream` (the current stream if None) wait for this event; the host goes on."""
        if self._time is None:   # as CUDA: waiting on an unrecorded event is a no-op
            return
        SIM.wait(_as_stream(stream)._queue, self._time)

    def query(self) -> bool:
        """True if the work captured by this event has completed (or it was never recorded)."""
        if self._time is None:
            return True
        _flush("event query")
        return SIM.done(self._time)

    def synchronize(self) -> None:
        """The host waits until the work captured by this event completes."""
        if self._time is None:
            return
        _flush("event synchronize")
        SIM.host_wait(self._time)

    def elapsed_time(self, end_event) -> float:
        """Simulated milliseconds between this event and `end_event` (both recorded, timing on).

        Like CUDA, the end event must have completed: synchronize first.
        """
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise RuntimeError(
                "elapsed_time: both events must be created with enable_timing=True, e.g. "
                "torch.neuron.Event(enable_timing=True)")
        if self._time is None or getattr(end_event, "_time", None) is None:
            raise RuntimeError(
                "elapsed_time: both events must be recorded first (event.record())")
        if not SIM.done(end_event._time):
            raise RuntimeError(
                "elapsed_time: the end event has not completed yet; call end_event.synchronize() "
                "or torch.neuron.synchronize() first (as on CUDA)")
        return (end_event._time - self._time) / 1000.0

    def __repr__(self) -> str:
        where = f"neuron:{self._core} at {self._time:.3f} us" if self._time is not None else \
            "not recorded"
        return f"torch.neuron.Event({where}, enable_timing={self.enable_timing})"


def _wrap(q: Queue) -> Stream:
    return q.handle if q.handle is not None else Stream(_queue=q)


def _as_stream(stream) -> Stream:
    """Our Stream for `stream`: None means the current one; a plain torch.Stream maps by id."""
    if stream is None:
        return current_stream()
    if isinstance(stream, Stream):
        return stream
    if isinstance(stream, torch.Stream) and stream.device_type == _DEVICE_TYPE:
        # PyTorch's Python device guard hands out only the default stream (id 0)
        core = SIM.core(stream.device_index if stream.device_index >= 0 else _index(None))
        if stream.stream_id == 0:
            return _wrap(core.default_queue)
        if core.queue.id == stream.stream_id:
            return _wrap(core.queue)
    raise TypeError(f"expected a torch.neuron.Stream, got {stream!r}")


def current_stream(device=None) -> Stream:
    """The stream that launches on core `device` (the current core if None) go to.

    >>> torch.neuron.current_stream() == torch.neuron.default_stream()
    True
    """
    return _wrap(SIM.core(_index(device)).queue)


def default_stream(device=None) -> Stream:
    """Core `device`'s default stream (stream_id 0)."""
    return _wrap(SIM.core(_index(device)).default_queue)


def set_stream(stream) -> None:
    """Make `stream` the current stream of its core (prefer the `stream(s)` context manager)."""
    if stream is None:
        return
    s = _as_stream(stream)
    SIM.core(s._queue.core).queue = s._queue


class StreamContext:
    """torch.neuron.stream(s): launches on s's core go to s inside the block; None is a no-op."""

    def __init__(self, stream) -> None:
        self.stream = _as_stream(stream) if stream is not None else None

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


def stream(stream) -> StreamContext:
    return StreamContext(stream)
