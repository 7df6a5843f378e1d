"""Errors raised by neuron kernels during backward reach the caller instead of killing it.

PyTorch runs a device's backward ops on the autograd engine's worker thread for that device. In
torch 2.13 an exception that a Python backend raises on that thread is not carried back: the
process dies ("terminate called without an active exception"). So dispatch catches errors of
ops run by the autograd engine, stashes the first one, returns placeholder outputs (NaN/zero
filled, exact shapes from meta) so the engine can finish, and the wrapped engine entry raises
the stashed error, with the op and the user's forward line, in the thread that called backward.
"""

from __future__ import annotations

import threading

import torch
import torch.autograd
import torch.autograd.graph

_lock = threading.Lock()
_pending: list = []


def in_backward() -> bool:
    """True while the autograd engine executes a node's backward on this thread."""
    return torch._C._current_autograd_node() is not None


def stash(exc: BaseException) -> None:
    with _lock:
        _pending.append(exc)


def _raise_pending() -> None:
    with _lock:
        if not _pending:
            return
        first = _pending[0]
        _pending.clear()
    raise first


def _wrap(run):
    def _engine_run_backward(*args, **kwargs):
        with _lock:
            _pending.clear()
        try:
            out = run(*args, **kwargs)
        finally:
            pass
        _raise_pending()
        return out

    _engine_run_backward.__wrapped__ = run
    return _engine_run_backward


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    # NOTE: torch.autograd.backward/grad look the name up in torch.autograd's globals at call time
    torch.autograd._engine_run_backward = _wrap(torch.autograd._engine_run_backward)
    torch.autograd.graph._engine_run_backward = _wrap(torch.autograd.graph._engine_run_backward)
