"""`xgemm`: MKL's gemm called from a Numba kernel (imported by rendered matmul kernels only).

The float matmul kernels (kernels/matmul.py GEMM_MKL) run their products in the BLAS that torch's
own CPU mm uses: MKL's Fortran `sgemm_64_`/`dgemm_64_` (ILP64), exported by libtorch_cpu.so.
Importing this module registers them with LLVM under our own names (`eager_neuron_sgemm`,
`eager_neuron_dgemm`, and `MKL_Set_Num_Threads_Local` as `eager_neuron_mkl_threads`), so a
kernel's machine code holds no process-specific address: a disk-cache load execs the kernel's
source, which imports this module and registers the names again, before linking the stored code.
`xgemm` is an intrinsic (the layout checks, stack slots and call emitted straight into the
kernel as IR): a Numba-level gemm function measured ~1 s more compile time per kernel.

>>> import numpy as np
>>> from numba import njit
>>> from eager_neuron.kernels.blas import xgemm
>>> @njit
... def k(a, b, c):
...     return xgemm(a, b, c, 0.0)
>>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
>>> c = np.zeros((2, 2), np.float32)
>>> k(a, a.T, c), c.tolist()
(True, [[5.0, 14.0], [14.0, 50.0]])
>>> k(a[:, ::2], a[:, ::2].T, c)    # strided columns: not addressable, nothing computed
False
"""

from __future__ import annotations

import llvmlite.binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .matmul import mkl_symbols

# flops of one product below which MKL runs it on one thread (lower/matmul.py BLAS_THREADED_MIN
# for OpenBLAS): MKL's threads spin-wait for each other, and on a loaded 2-core host a 128^3
# product took 26 ms on two threads against 34 us on one (torch's own mm alike)
THREADED_MIN = 1 << 26


def _register() -> bool:
    addrs = mkl_symbols()
    for ours, addr in addrs.items():
        ll.add_symbol(ours, addr)
    return bool(addrs)


MKL = _register()


def _blas_view(builder, r, c, s0, s1):
    """BLAS's view of a row-major (r, c) array with element strides (s0, s1), as IR values:
    (rows unit-stride, so BLAS 'N' reads it column-major as its transpose; ld for 'N'; columns
    unit-stride: 'T'; ld for 'T'). Size-1 extents and empty arrays take any stride; ld >= 1."""
    i64 = ir.IntType(64)
    one = ir.Constant(i64, 1)

    def imax(x, y):
        return builder.select(builder.icmp_signed(">", x, y), x, y)

    def le1(x):
        return builder.icmp_signed("<=", x, one)

    # an empty array (k == 0) is read nowhere: any strides, 'N' with ld = max(c, 1)
    empty = builder.icmp_signed("==", builder.mul(r, c), ir.Constant(i64, 0))
    ld_n = builder.select(builder.or_(le1(r), empty), c, s0)
    ok_n = builder.and_(builder.or_(le1(c), builder.icmp_signed("==", s1, one)),
                        builder.icmp_signed(">=", ld_n, imax(c, one)))
    ok_n = builder.or_(ok_n, empty)
    ld_t = builder.select(le1(c), r, s1)
    ok_t = builder.and_(builder.or_(le1(r), builder.icmp_signed("==", s0, one)),
                        builder.icmp_signed(">=", ld_t, imax(r, one)))
    return ok_n, imax(ld_n, one), ok_t, imax(ld_t, one)


@intrinsic
def xgemm(typingctx, a, b, c, beta):
    """c = a @ b + beta * c for 2-D float arrays, c row-major (beta 0 ignores c, NaN included),
    through ?gemm_64_ on column-major c.T = b.T a.T, reading a and b in place: returns False
    (and computes nothing) when BLAS cannot address an operand (neither rows nor columns
    unit-stride with a leading dimension covering the other extent) or c is not row-major.
    Products under THREADED_MIN flops run on one MKL thread. c's dtype picks sgemm or dgemm."""
    if not all(isinstance(t, types.Array) and t.ndim == 2 and t.dtype == c.dtype
               for t in (a, b, c)) or c.dtype not in (types.float32, types.float64):
        return None
    sym = {types.float32: "eager_neuron_sgemm", types.float64: "eager_neuron_dgemm"}[c.dtype]
    sig = types.boolean(a, b, c, beta)

    def codegen(context, builder, signature, args):
        a_, b_, c_, beta_ = args
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        ptr = i8.as_pointer()
        fty = context.get_value_type(c.dtype)
        itemsize = ir.Constant(i64, context.get_abi_sizeof(fty))

        def view(aty, value):
            arr = context.make_array(aty)(context, builder, value)
            r, cc = cgutils.unpack_tuple(builder, arr.shape, 2)
            s0, s1 = (builder.sdiv(s, itemsize)
                      for s in cgutils.unpack_tuple(builder, arr.strides, 2))
            return (r, cc), _blas_view(builder, r, cc, s0, s1), builder.bitcast(arr.data, ptr)

        def slot(value):
            return builder.bitcast(cgutils.alloca_once_value(builder, value), ptr)

        def trans(ok_n):
            return slot(builder.select(ok_n, ir.Constant(i8, 78), ir.Constant(i8, 84)))   # N/T

        (m, k), (an, lda_n, at, lda_t), pa = view(a, a_)
        _, (bn, ldb_n, bt, ldb_t), pb = view(b, b_)
        (_, n), (cn, ldc, _ct, _ldct), pc = view(c, c_)
        ok = builder.and_(builder.and_(builder.or_(an, at), builder.or_(bn, bt)), cn)
        ok = builder.and_(ok, builder.icmp_signed(">", builder.mul(m, n), ir.Constant(i64, 0)))
        mod = builder.module
        gemm = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [ptr] * 13),
                                              sym)
        nthreads = cgutils.get_or_insert_function(mod, ir.FunctionType(i32, [i32]),
                                                  "eager_neuron_mkl_threads")
        with builder.if_then(ok):
            flops = builder.mul(builder.mul(m, n), builder.mul(k, ir.Constant(i64, 2)))
            small = builder.icmp_signed("<", flops, ir.Constant(i64, THREADED_MIN))
            prev = cgutils.alloca_once_value(builder, ir.Constant(i32, 0))
            with builder.if_then(small):
                builder.store(builder.call(nthreads, [ir.Constant(i32, 1)]), prev)
            # column-major c.T (n x m) = op(b) (n x k) op(a) (k x m)
            builder.call(gemm, [trans(bn), trans(an), slot(n), slot(m), slot(k),
                                slot(ir.Constant(fty, 1.0)), pb,
                                slot(builder.select(bn, ldb_n, ldb_t)), pa,
                                slot(builder.select(an, lda_n, lda_t)),
                                slot(context.cast(builder, beta_, beta, c.dtype)), pc,
                                slot(ldc)])
            with builder.if_then(small):
                builder.call(nthreads, [builder.load(prev)])
        # m or n == 0: nothing to compute, still a success
        empty = builder.icmp_signed("==", builder.mul(m, n), ir.Constant(i64, 0))
        return builder.or_(ok, empty)

    return sig, codegen
