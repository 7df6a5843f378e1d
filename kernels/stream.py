"""Intrinsics for the throughput kernels: streaming stores, prefetch, a vectorizable max
(imported by kernel source only: it imports Numba). docs/THROUGHPUT.md says where they pay.

- `nt_store64(dst, i, src, j)`: copy the 64 bytes at `src[j]` to `dst[i]` with a non-temporal
  (cache-bypassing) store. `&dst[i]` must be 64-byte aligned (`nt_head` finds the first such
  element). A normal store first reads the line it writes (read-for-ownership): an `a + b` over
  16 MiB outputs moves 64 MiB instead of 48, and the output evicts what the caches held.
- `nt_fence()`: orders the non-temporal stores before anything the thread does next (they are
  weakly ordered: another thread reading the output must see them).
- `nt_head(dst)`: elements of the 1-d array `dst` before its first 64-byte aligned element, or
  -1 when no element is aligned (an address that is not a multiple of the item size).
- `nt_overlap(a, b)`: whether the 1-d arrays a and b can share a byte (their spans meet): an
  output that is also an operand (an in-place op) is in cache already and is not streamed.
- `prefetch(a, i)`: hint that `a[i]`'s cache line is read soon (never faults, any index).
- `maxnum_nn(a, b)`: max of two floats of one type as `llvm.maxnum` with no-NaN/no-signed-zero
  flags, which LLVM vectorizes as a max reduction (`vmaxps`; the compare-and-select spelling
  does not vectorize at all). Only where a NaN operand cannot matter: the result is then
  unspecified (softmax's row max: a NaN in the row makes the row's sum NaN anyway).

Only x86-64 has these instructions here: `STREAMING` says whether renderers may emit them.

>>> import numpy as np
>>> from numba import njit
>>> from eager_neuron.kernels.stream import nt_store64, nt_fence, nt_head, prefetch
>>> @njit
... def copy(dst, src):
...     h = nt_head(dst)
...     n = h + (dst.shape[0] - h) // 16 * 16
...     dst[:h] = src[:h]
...     for i in range(h, n, 16):
...         prefetch(src, i + 256)
...         nt_store64(dst, i, src, i)
...     nt_fence()
...     dst[n:] = src[n:]
>>> src = np.arange(40, dtype=np.float32); dst = np.zeros(40, np.float32)
>>> copy(dst, src)
>>> bool((dst == src).all())
True
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

STREAMING = platform.machine().lower() in ("x86_64", "amd64")

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _elem_ptr(context, builder, aryty, ary_val, idx):
    """&a[idx] of a 1-d array (idx taken as is: no bounds check, no negative wraparound)."""
    ary = context.make_array(aryty)(context, builder, ary_val)
    idx = builder.sext(idx, _I64) if idx.type.width < 64 else idx
    return cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)


def _is_1d(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1


@intrinsic
def nt_store64(typingctx, dst, i, src, j):
    if not (_is_1d(dst) and _is_1d(src) and isinstance(i, types.Integer)
            and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vec = ir.VectorType(_I32, 16)
        sp = _elem_ptr(context, builder, sig.args[2], args[2], args[3])
        dp = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        val = builder.load(builder.bitcast(sp, vec.as_pointer()), align=1)
        st = builder.store(val, builder.bitcast(dp, vec.as_pointer()), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([_I32(1)]))
        return context.get_dummy_value()

    return types.none(dst, i, src, j), codegen


@intrinsic
def nt_fence(typingctx):
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                            "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def nt_head(typingctx, dst):
    if not _is_1d(dst):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        size = context.get_abi_sizeof(context.get_data_type(aryty.dtype))
        addr = builder.ptrtoint(ary.data, _I64)
        gap = builder.and_(builder.sub(_I64(0), addr), _I64(63))   # bytes to the next boundary
        ok = builder.icmp_unsigned("==", builder.urem(addr, _I64(size)), _I64(0))
        return builder.select(ok, builder.udiv(gap, _I64(size)), _I64(-1))

    return types.int64(dst), codegen


@njit(inline="always")
def nt_overlap(a, b):
    la, lb = np.int64(a.ctypes.data), np.int64(b.ctypes.data)   # (uintp + intp: float64)
    sa, sb = a.strides[0], b.strides[0]
    na, nb = a.shape[0], b.shape[0]
    if na == 0 or nb == 0:
        return False
    # each span [lo, hi): the first and last element's addresses, whichever way the stride runs
    a0, a1 = (la, la + (na - 1) * sa) if sa >= 0 else (la + (na - 1) * sa, la)
    b0, b1 = (lb, lb + (nb - 1) * sb) if sb >= 0 else (lb + (nb - 1) * sb, lb)
    return a0 < b1 + b.itemsize and b0 < a1 + a.itemsize


@intrinsic
def prefetch(typingctx, a, i):
    if not (_is_1d(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), _I8P)
        fnty = ir.FunctionType(ir.VoidType(), [p.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, _I32(0), _I32(3), _I32(1)])   # read, keep in all levels, data
        return context.get_dummy_value()

    return types.none(a, i), codegen


@intrinsic
def maxnum_nn(typingctx, a, b):
    if not (a == b and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        bits = 32 if ty == ir.FloatType() else 64
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty]),
                                            f"llvm.maxnum.f{bits}")
        return builder.call(fn, list(args), fastmath=("nnan", "nsz"))

    return a(a, b), codegen
