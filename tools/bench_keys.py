"""Per-call cost of building a kernel key and its render closure, before and after typed keys
(cache/families.py): the lowering keeps a tuple literal; its render() reads the key alone.

    .venv/bin/python tools/bench_keys.py
"""
import timeit

from eager_neuron.cache.families import MATMUL_BLAS, REDUCE
from eager_neuron.kernels import matmul as kmm
from eager_neuron.kernels import reduce as kr


def reduce_before(op, ko, kdim, acc_t, load_t, stores, scalars, mode, parallel, fastmath, init):
    key = ("reduce", op, ko, kdim, acc_t, load_t, stores, len(scalars), mode, parallel,
           fastmath, init)

    def render():
        return kr.render_reduce(op, ko, kdim, acc_t, load_t, stores, len(scalars), mode,
                                parallel, fastmath, init)
    return key, render


def reduce_after(op, ko, kdim, acc_t, load_t, stores, scalars, mode, parallel, fastmath, init):
    key = ("reduce", op, ko, kdim, acc_t, load_t, stores, len(scalars), mode, parallel,
           fastmath, init)

    def render():
        return REDUCE.render(key)
    return key, render


def mm_before(batch, modes, epilogue):
    key = ("matmul", "mm", 1, "blas", modes, epilogue)

    def render():
        return kmm.render_blas(batch, modes, epilogue)
    return key, render


def mm_after(batch, modes, epilogue):
    key = ("matmul", "mm", 1, "blas", modes, epilogue)

    def render():
        return MATMUL_BLAS.render(key)
    return key, render


args = ("sum", 1, 1, "np.float32", "np.float32", ("np.float32",), (), "row", False, False, "")
margs = ("none", ("n", "n"), "none")
assert reduce_before(*args)[1]() == reduce_after(*args)[1]()
assert mm_before(*margs)[1]() == mm_after(*margs)[1]()
n = 200_000
for name, f, a in (("reduce before", reduce_before, args), ("reduce after", reduce_after, args),
                   ("matmul before", mm_before, margs), ("matmul after", mm_after, margs)) * 2:
    t = min(timeit.repeat(lambda f=f, a=a: f(*a), number=n, repeat=15)) / n * 1e9
    print(f"{name:14s} {t:6.0f} ns per key + render closure (min of 15 x {n})")
