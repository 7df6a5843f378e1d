"""Numba internals of the disk tier: serialise a compiled dispatcher, rebuild it on load.

An entry's payload is Numba's own cache payload (`CompileResult._reduce()`: object code, function
descriptor, environment, signature) pickled with the kernel's name, signature and the marshalled
code object of its source. A load execs the source (defining the dispatcher, compiling nothing),
rebuilds the compile result from the object code and adds it as the dispatcher's only overload:
no Numba typing, no LLVM optimisation. Everything that touches Numba's private API is here.

>>> from eager_neuron.cache.rebuild import undefined_symbols
>>> undefined_symbols(b"not an ELF object") is None
True
"""

from __future__ import annotations

import hashlib
import io
import json
import marshal
import pickle
import struct

from eager_neuron.cache import keys
from eager_neuron.cache.format import _Miss, pack


class _Pickler(pickle.Pickler):
    """Pickles a reduced CompileResult; the kernel's exec namespace and its Numba Environments
    (which hold that namespace and cannot be pickled) become persistent ids."""

    def __init__(self, f, namespace: dict) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._ns = namespace

    def persistent_id(self, obj):
        if obj is self._ns:
            return "namespace"
        if type(obj).__name__ == "Environment" and hasattr(obj, "env_name"):
            return ("env", obj.env_name, list(obj.consts))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, namespace: dict) -> None:
        super().__init__(f)
        self._ns = namespace

    def persistent_load(self, pid):
        if pid == "namespace":
            return self._ns
        from numba.core.environment import Environment

        _, env_name, consts = pid
        env = Environment._memo.get(env_name)
        if env is None:
            env = Environment(self._ns)
            env.consts[:] = consts
            env.env_name = env_name
            Environment._memo[env_name] = env
        return env


def undefined_symbols(obj: bytes) -> list | None:
    """Global undefined symbols of an ELF64 little-endian object; None for any other format.

    A load checks each against the JIT before handing the object to LLVM, because an unresolved
    symbol there aborts the whole process ("LLVM ERROR: Symbol not found") instead of raising.
    """
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, kind, _flags, _addr, off, size, link, _info, _align, _entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for j in range(size // 24):
            st_name, st_info, _other, st_shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", obj, off + j * 24)
            if st_shndx == 0 and st_name and st_info >> 4 == 1:  # undefined, STB_GLOBAL
                end = obj.index(b"\0", strtab + st_name)
                out.append(obj[strtab + st_name:end].decode())
    return out


def _referenced_envs(cres) -> list:
    """Every Numba Environment the object code points at (Numba's own list skips the dynamic
    ones, i.e. all of ours: their globals are an exec namespace)."""
    from numba.core.environment import lookup_environment

    envs = []
    for gv in cres.library._final_module.global_variables:
        if gv.name.startswith("_ZN08NumbaEnv"):
            env = lookup_environment(gv.name)
            if env is not None:
                envs.append(env)
    return envs


# -- the runtime a loaded kernel links against ---------------------------------------------------


def _define(kc, source: str, name: str, code: bytes | None = None):
    """exec the kernel's source and return its dispatcher, compiling nothing.

    Only `name` becomes a Numba dispatcher: the helpers next to it (`@njit(inline="always")`
    preludes) are already inside the stored machine code, and making dispatchers of them would
    be most of the exec's cost.
    """
    namespace = kc._namespace()
    njit = namespace["njit"]

    def njit_kernel_only(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:       # bare @njit
            return njit(args[0]) if args[0].__name__ == name else args[0]
        return lambda fn: njit(*args, **kwargs)(fn) if fn.__name__ == name else fn

    namespace["njit"] = njit_kernel_only
    # NOTE: compiling the source to bytecode is most of a load's Python time; the entry carries
    # the marshalled code object (same Python version: it is part of the toolchain key).
    code = marshal.loads(code) if code else compile(source, f"<eager_neuron kernel {name}>", "exec")
    exec(code, namespace)
    namespace["njit"] = njit
    return namespace[name]


_runtime = {"refreshed": False, "resolved": set()}


def _resolve(ctx, undefined: list | None, reload_init) -> None:
    """Make every symbol the object needs resolvable, cheaply when possible.

    Numba's own cache calls `target_context.refresh()` per load (~1 s the first time: it imports
    every typing registry). A kernel only needs the NRT (~30 ms, once) and, for parallel ones, the
    threading layer; the full refresh runs only when a symbol is still missing.
    """
    import llvmlite.binding as ll
    from numba.core.runtime import rtsys

    rtsys.initialize(ctx)
    for fn in reload_init or ():
        fn()
    engine = ctx.codegen()._engine
    resolved = _runtime["resolved"]

    def missing() -> list:
        out = [s for s in undefined if s not in resolved
               and not (engine.is_symbol_defined(s) or ll.address_of_symbol(s))]
        resolved.update(s for s in undefined if s not in out)
        return out

    if undefined is None or missing():
        if not _runtime["refreshed"]:
            ctx.refresh()
            _runtime["refreshed"] = True
        if undefined is not None and missing():
            raise _Miss("rebuild", f"unresolved symbols {missing()[:5]}")


_LAZY_LINK: dict = {}


def _unserialize(codegen, libdata, defined: list):
    """Numba's `CPUCodeLibrary._unserialize` for object code, minus two thirds of its cost.

    Numba parses the library's linking bitcode and walks it for defined symbols on every load;
    the entry carries those symbol names, and the bitcode is parsed only if some other function
    ever links this library (never, for a kernel whose dispatcher cannot compile).
    """
    import llvmlite.binding as ll

    name, _kind, (object_code, bitcode) = libdata
    lib = codegen.create_library(name)
    base = type(lib)
    lazy = _LAZY_LINK.get(base)
    if lazy is None:
        def _get_module_for_linking(self):
            if self._shared_module is None:
                self._shared_module = ll.parse_bitcode(self._eager_neuron_bitcode)
            return self._shared_module

        lazy = type(f"LazyLink{base.__name__}", (base,),
                    {"_get_module_for_linking": _get_module_for_linking})
        _LAZY_LINK[base] = lazy
    lib.__class__ = lazy
    lib._eager_neuron_bitcode = bitcode
    lib.enable_object_caching()
    lib._set_compiled_object(object_code)
    lib._finalize_final_module()
    codegen._engine._defined_symbols.update(defined)
    return lib


def _defined_symbols(cres) -> list:
    """What Numba's `_load_defined_symbols` would collect from the library's linking module."""
    mod = cres.library._get_module_for_linking()
    return sorted({gv.name for gsets in (mod.functions, mod.global_variables)
                   for gv in gsets if not gv.is_declaration})


# -- both directions ------------------------------------------------------------------------

def entry(key: tuple, kernel, source: str, name: str, seconds: float) -> tuple[bytes, str]:
    """Serialise the single overload of a freshly compiled dispatcher: (blob, tag)."""
    (cres,) = kernel.overloads.values()
    if cres.objectmode or cres.lifted or cres.library.has_dynamic_globals:
        raise _Miss("uncacheable")
    reduced = list(cres._reduce())
    reduced[8] = tuple(_referenced_envs(cres))
    record = {
        "name": name,
        "source": source,                 # for inspection (`ls --source`); checked by digest
        "sig": tuple(cres.signature.args),
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "undefined": undefined_symbols(reduced[0][2][0]),
        "defined": _defined_symbols(cres),
        "cres": tuple(reduced),
    }
    buf = io.BytesIO()
    code = compile(source, f"<eager_neuron kernel {name}>", "exec")
    pickle.dump(marshal.dumps(code), buf, protocol=pickle.HIGHEST_PROTOCOL)
    _Pickler(buf, kernel.py_func.__globals__).dump(record)
    payload = buf.getvalue()
    dkey = keys.disk_key(key, source)
    header = {"format": keys.FORMAT_VERSION, "toolchain": keys.toolchain_id(), "key": dkey,
              "name": name, "size": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    meta = {"family": str(key[1]) if len(key) > 1 else "?",
            "op": str(key[2]) if len(key) > 2 else "?", "name": name,
            "compile_s": round(seconds, 4), "toolchain": keys.toolchain_id()}
    return pack(header, payload), json.dumps(meta)


def rebuild(header: dict, payload: bytes, source: str | None, args: tuple,
            key: tuple | None = None):
    """The dispatcher for a verified entry, its only overload rebuilt from object code.

    `source` is what the caller rendered (the entry must hold exactly that kernel); None when
    the render index found the entry (tier.load_indexed): the entry's own source and code
    object stand, checked against the digest stored with them and, with the kernel `key`,
    against the entry's disk key (an index entry can only point at this kernel's entry)."""
    from eager_neuron.kernels import compile as kc

    nb = kc.numba()
    import torch
    from numba.core.compiler import CompileResult
    from numba.core.compiler_lock import global_compiler_lock

    # 1. define the dispatcher from the stored source: exec only, nothing compiles
    try:
        stream = io.BytesIO(payload)
        code = pickle.load(stream)
    except Exception as exc:
        raise _Miss("corrupt", f"unpickling failed ({type(exc).__name__}: {exc})") from None
    disp = _define(kc, source, header["name"], code)
    namespace = disp.py_func.__globals__
    try:
        stored = _Unpickler(stream, namespace).load()
    except Exception as exc:
        raise _Miss("corrupt", f"unpickling failed ({type(exc).__name__}: {exc})") from None
    if source is None:
        source = stored.get("source")
        if not isinstance(source, str):
            raise _Miss("corrupt", "entry holds no source")
        if key is not None and keys.disk_key(key, source) != header.get("key"):
            raise _Miss("corrupt", "the index points at another kernel's entry")
    if stored.get("source_sha256") != hashlib.sha256(source.encode()).hexdigest():
        raise _Miss("corrupt", "entry holds another kernel's source")
    # 2. the stored signature must be exactly what this call dispatches on
    if tuple(stored["sig"]) != tuple(nb.typeof(a) for a in args):
        raise _Miss("rebuild", "signature differs from the call's argument types")
    # 3. rebuild the compile result from object code; make it the only overload
    threads = torch.get_num_threads()
    try:
        with global_compiler_lock:
            ctx = disp.targetctx
            reduced = stored["cres"]
            _resolve(ctx, stored["undefined"], reduced[7])
            codegen = ctx.codegen()
            # NOTE: shadows the method for this one call, under Numba's compiler lock
            codegen.unserialize_library = lambda data: _unserialize(codegen, data,
                                                                    stored["defined"])
            try:
                cres = CompileResult._rebuild(ctx, *reduced)
            finally:
                del codegen.unserialize_library
            if not cres.objectmode:
                ctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
            disp.add_overload(cres)
    finally:
        # NOTE: starting Numba's threading layer resets torch's intra-op thread count.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    disp.disable_compile()
    return disp
