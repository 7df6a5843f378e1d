"""The disk tier: compiled machine code in a diskcache, so a later process compiles nothing.

An entry is Numba's own cache payload (`CompileResult._reduce()`: object code, function
descriptor, environment, signature) pickled with the kernel's name and signature, behind a header
that carries the format version, the toolchain, the key and a checksum. A load execs the stored
source (defining the dispatcher, compiling nothing), rebuilds the compile result from the object
code and adds it as the dispatcher's only overload: no Numba typing, no LLVM optimisation.

Never fatal: every failure is a named, counted miss (`STATS.disk_misses[reason]`) or a counted
write error (`STATS.disk_errors`), with at most one warning per process. Reasons:
  absent   no entry for this key (first use, or evicted, or another toolchain wrote it)
  corrupt  truncated or garbage bytes, bad checksum, wrong key in the header
  version  an entry written by another format version or toolchain
  io       the directory or database cannot be opened or read
  rebuild  a valid entry that Numba could not load here (e.g. an unresolved symbol)

>>> from eager_neuron.cache.disk import DiskTier
>>> tier = DiskTier("/tmp/eager_neuron_doctest_cache")
>>> tier.info()["directory"]
'/tmp/eager_neuron_doctest_cache'
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import marshal
import os
import pickle
import struct
import threading
import time
import warnings

from eager_neuron.cache import keys
from eager_neuron.config import config
from eager_neuron.stats import STATS

MAGIC = b"ENKC"                    # eager_neuron kernel cache entry
_PREFIX = struct.Struct("<4sI")    # magic, header length; then the JSON header, then the payload
N_LOCK_STRIPES = 256               # lock files: a key hashes to one (a collision only serialises)
LOCK_TIMEOUT_S = 60.0              # then compile anyway: a stuck peer must not hang this process
DB_TIMEOUT_S = 30.0                # SQLite busy timeout, then a counted miss / write error


class DiskCacheWarning(RuntimeWarning):
    """The disk tier had a problem; the op ran anyway (see stats()['disk_misses'])."""


class _Miss(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail)
        self.reason = reason


# -- entry format ---------------------------------------------------------------------------------

def pack(header: dict, payload: bytes) -> bytes:
    head = json.dumps(header, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, len(head)) + head + payload


def unpack(blob) -> tuple[dict, bytes]:
    """Split and verify an entry; raises _Miss('corrupt' | 'version')."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < _PREFIX.size:
        raise _Miss("corrupt", "entry too short")
    magic, n = _PREFIX.unpack_from(blob, 0)
    if magic != MAGIC or _PREFIX.size + n > len(blob):
        raise _Miss("corrupt", "bad magic or header length")
    try:
        header = json.loads(bytes(blob[_PREFIX.size:_PREFIX.size + n]))
        payload = bytes(blob[_PREFIX.size + n:])
        size, digest = header["size"], header["sha256"]
    except Exception as exc:
        raise _Miss("corrupt", f"unreadable header: {exc}") from None
    if (header.get("format") != keys.FORMAT_VERSION
            or header.get("toolchain") != keys.toolchain_id()):
        raise _Miss("version", f"format {header.get('format')} toolchain {header.get('toolchain')}")
    if size != len(payload) or hashlib.sha256(payload).hexdigest() != digest:
        raise _Miss("corrupt", "truncated payload or bad checksum")
    return header, payload


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


# -- the tier -------------------------------------------------------------------------------------

class DiskTier:
    """Kernels on disk, keyed by `keys.disk_key(key, source)`.

    `directory` and `size_mb` default to `config.cache_dir` / `config.cache_size_mb`, read at each
    open, so assigning the config before the first kernel moves the cache.
    """

    def __init__(self, directory: str | None = None, size_mb: int | None = None) -> None:
        self._directory = directory
        self._size_mb = size_mb
        self._cache = None
        self._cache_dir: str | None = None
        self._failed_dir: str | None = None
        self._warned = False
        self._open_lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(N_LOCK_STRIPES)]
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # NOTE: a lock held by another thread at fork() would stay held forever in the child.
        self._open_lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(N_LOCK_STRIPES)]

    @property
    def directory(self) -> str:
        return os.path.abspath(os.path.expanduser(self._directory or config.cache_dir))

    @property
    def size_limit(self) -> int:
        mb = self._size_mb if self._size_mb is not None else config.cache_size_mb
        return int(float(mb) * 2**20)

    def _warn(self, message: str) -> None:
        if self._warned:
            return
        self._warned = True
        with contextlib.suppress(Exception):   # even under -W error the op must run
            warnings.warn(f"eager_neuron kernel disk cache ({self.directory}): {message}; "
                          "kernels compile as if there were no cache (counted in "
                          "eager_neuron.stats()['disk_misses'] / ['disk_errors'])",
                          DiskCacheWarning, stacklevel=4)

    def _open(self):
        """The diskcache.Cache, or None when the directory is unusable (counted, warned once)."""
        directory = self.directory
        if self._cache is not None and self._cache_dir == directory:
            return self._cache
        if self._failed_dir == directory:
            return None
        with self._open_lock:
            if self._cache is not None and self._cache_dir == directory:
                return self._cache
            try:
                import diskcache

                os.makedirs(directory, exist_ok=True)
                cache = diskcache.Cache(directory, timeout=DB_TIMEOUT_S, statistics=True,
                                        size_limit=self.size_limit,
                                        eviction_policy="least-recently-used")
            except Exception as exc:
                self._failed_dir = directory
                STATS.disk_errors += 1
                self._warn(f"cannot open ({type(exc).__name__}: {exc})")
                return None
            if self._cache is not None:
                with contextlib.suppress(Exception):
                    self._cache.close()
            self._cache, self._cache_dir = cache, directory
            return cache

    # -- the launch hook ---------------------------------------------------------------------

    def load(self, key: tuple, args: tuple, source: str, count: bool = True):
        """The kernel for `key` built from disk, or None (a counted miss when `count`)."""
        if not config.disk_cache:
            return None
        try:
            cache = self._open()
            if cache is None:
                raise _Miss("io")
            dkey = keys.disk_key(key, source)
            try:
                # NOTE: the re-check under the lock asks `in` first: a get would count a second
                # lookup miss in the cache's persistent hit rate for the same request
                blob = cache.get(dkey) if count or dkey in cache else None
            except Exception as exc:
                raise _Miss("io", f"read failed ({type(exc).__name__}: {exc})") from None
            if blob is None:
                raise _Miss("absent")
            header, payload = unpack(blob)
            if header.get("key") != dkey:
                raise _Miss("corrupt", "entry stored under another key")
            return self._rebuild(header, payload, source, args)
        except _Miss as miss:
            if count:
                STATS.disk_misses[miss.reason] += 1
                if miss.reason != "absent" and str(miss):
                    self._warn(f"{miss.reason} entry for {key[1:3]}: {miss}")
            return None
        except Exception as exc:   # anything else is a bug here, never the user's problem
            if count:
                STATS.disk_misses["rebuild"] += 1
                self._warn(f"cannot load {key[1:3]} ({type(exc).__name__}: {exc})")
            return None

    def _rebuild(self, header: dict, payload: bytes, source: str, args: tuple):
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
            entry = _Unpickler(stream, namespace).load()
        except Exception as exc:
            raise _Miss("corrupt", f"unpickling failed ({type(exc).__name__}: {exc})") from None
        if entry.get("source_sha256") != hashlib.sha256(source.encode()).hexdigest():
            raise _Miss("corrupt", "entry holds another kernel's source")
        # 2. the stored signature must be exactly what this call dispatches on
        if tuple(entry["sig"]) != tuple(nb.typeof(a) for a in args):
            raise _Miss("rebuild", "signature differs from the call's argument types")
        # 3. rebuild the compile result from object code; make it the only overload
        threads = torch.get_num_threads()
        try:
            with global_compiler_lock:
                ctx = disp.targetctx
                reduced = entry["cres"]
                _resolve(ctx, entry["undefined"], reduced[7])
                codegen = ctx.codegen()
                # NOTE: shadows the method for this one call, under Numba's compiler lock
                codegen.unserialize_library = lambda data: _unserialize(codegen, data,
                                                                        entry["defined"])
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

    def store(self, key: tuple, kernel, source: str, name: str, seconds: float) -> None:
        """Write the kernel just compiled for `key`; failures are counted, never raised."""
        if not config.disk_cache:
            return
        cache = self._open()
        if cache is None:
            return
        try:
            blob, tag = _entry(key, kernel, source, name, seconds)
        except _Miss:
            return                   # not cacheable (object mode, dynamic globals): skip quietly
        except Exception as exc:
            STATS.disk_errors += 1
            self._warn(f"cannot serialise {key[1:3]} ({type(exc).__name__}: {exc})")
            return
        try:
            cache.set(keys.disk_key(key, source), blob, tag=tag)
        except Exception as exc:    # full disk, read-only directory, database busy
            STATS.disk_errors += 1
            self._warn(f"cannot write ({type(exc).__name__}: {exc})")

    @contextlib.contextmanager
    def lock(self, key: tuple, source: str):
        """Held while a missing kernel compiles, so concurrent requesters compile it once.

        A thread lock (this process) and an flock on a lock file (other processes); the kernel
        releases a dead holder's flock. Without a usable directory only the thread lock holds.
        """
        stripe = int(keys.disk_key(key, source)[:8], 16) % N_LOCK_STRIPES
        with self._stripes[stripe]:
            fd = self._flock(stripe) if config.disk_cache else None
            try:
                yield
            finally:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        import fcntl

                        fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)

    def _flock(self, stripe: int):
        try:
            import fcntl
        except ImportError:          # pragma: no cover - Windows: threads only
            return None
        if self._open() is None:
            return None
        try:
            directory = os.path.join(self.directory, "locks")
            os.makedirs(directory, exist_ok=True)
            fd = os.open(os.path.join(directory, f"{stripe:02x}.lock"), os.O_RDWR | os.O_CREAT,
                         0o666)
        except OSError:
            return None
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    STATS.disk_errors += 1
                    self._warn(f"waited {LOCK_TIMEOUT_S:.0f} s for another process to compile "
                               "a kernel; compiling it here too")
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
            except OSError:
                os.close(fd)
                return None

    # -- the cache tool ------------------------------------------------------------------------

    def info(self) -> dict:
        """Entries, bytes and lookup hit rate of the cache directory (nothing is created)."""
        out = {"directory": self.directory, "size_limit": self.size_limit,
               "enabled": bool(config.disk_cache), "entries": 0, "bytes": 0, "hits": 0,
               "misses": 0, "hit_rate": None, "toolchains": {}}
        if not os.path.exists(os.path.join(self.directory, "cache.db")):
            return out
        cache = self._open()
        if cache is None:
            out["error"] = "cannot open"
            return out
        hits, misses = cache.stats()
        out.update(entries=len(cache), bytes=cache.volume(), hits=hits, misses=misses,
                   hit_rate=hits / (hits + misses) if hits + misses else None)
        for row in self.entries():
            tc = row.get("toolchain", "?")
            out["toolchains"][tc] = out["toolchains"].get(tc, 0) + 1
        return out

    def entries(self) -> list[dict]:
        """One dict per entry: key, family, op, name, compile_s, bytes, stored, last_use.

        Read from the database directly (read-only): a `get` would count as a use.
        """
        import sqlite3

        path = os.path.join(self.directory, "cache.db")
        if not os.path.exists(path):
            return []
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=DB_TIMEOUT_S)
        try:
            rows = con.execute(
                "SELECT key, tag, size, length(value), store_time, access_time FROM Cache"
            ).fetchall()
        finally:
            con.close()
        out = []
        for key, tag, size, inline_len, stored, used in rows:
            try:
                meta = json.loads(tag) if tag else {}
            except (TypeError, ValueError):
                meta = {}
            out.append({"key": key, **meta, "bytes": size or inline_len or 0,
                        "stored": stored, "last_use": used})
        return out

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        cache = self._open()
        if cache is None:
            return 0
        return cache.clear(retry=True)

    def export(self, path: str) -> int:
        """Write every entry of the current toolchain to a .tar.gz; returns the count."""
        import tarfile

        cache = self._open()
        if cache is None:
            raise OSError(f"cannot open the kernel cache at {self.directory}")
        current = keys.toolchain_id()
        manifest = {"format": keys.FORMAT_VERSION, "toolchain": current,
                    "toolchain_detail": repr(keys.toolchain()), "entries": []}
        with tarfile.open(path, "w:gz") as tar:
            for row in self.entries():
                if row.get("toolchain") != current:
                    continue
                blob, tag = cache.get(row["key"], tag=True)
                if blob is None:     # evicted meanwhile
                    continue
                info = tarfile.TarInfo(f"entries/{row['key']}")
                info.size, info.mtime = len(blob), int(time.time())
                tar.addfile(info, io.BytesIO(blob))
                manifest["entries"].append({"key": row["key"], "tag": tag})
            data = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
        return len(manifest["entries"])

    def import_(self, path: str) -> dict:
        """Add the entries of an exported archive; each is verified (checksum, key, toolchain).

        Returns counts: added, present (already here), skipped (another toolchain), bad.
        """
        import tarfile

        cache = self._open()
        if cache is None:
            raise OSError(f"cannot open the kernel cache at {self.directory}")
        counts = {"added": 0, "present": 0, "skipped": 0, "bad": 0}
        with tarfile.open(path, "r:*") as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
            for item in manifest.get("entries", []):
                key = item.get("key", "")
                try:
                    blob = tar.extractfile(f"entries/{key}").read()
                    header, _ = unpack(blob)
                    if header.get("key") != key:
                        raise _Miss("corrupt")
                except _Miss as miss:
                    counts["skipped" if miss.reason == "version" else "bad"] += 1
                    continue
                except Exception:
                    counts["bad"] += 1
                    continue
                if key in cache:
                    counts["present"] += 1
                    continue
                cache.set(key, blob, tag=item.get("tag"))
                counts["added"] += 1
        return counts


def _entry(key: tuple, kernel, source: str, name: str, seconds: float) -> tuple[bytes, str]:
    """Serialise the single overload of a freshly compiled dispatcher: (blob, tag)."""
    (cres,) = kernel.overloads.values()
    if cres.objectmode or cres.lifted or cres.library.has_dynamic_globals:
        raise _Miss("uncacheable")
    reduced = list(cres._reduce())
    reduced[8] = tuple(_referenced_envs(cres))
    entry = {
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
    _Pickler(buf, kernel.py_func.__globals__).dump(entry)
    payload = buf.getvalue()
    dkey = keys.disk_key(key, source)
    header = {"format": keys.FORMAT_VERSION, "toolchain": keys.toolchain_id(), "key": dkey,
              "name": name, "size": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    meta = {"family": str(key[1]) if len(key) > 1 else "?",
            "op": str(key[2]) if len(key) > 2 else "?", "name": name,
            "compile_s": round(seconds, 4), "toolchain": keys.toolchain_id()}
    return pack(header, payload), json.dumps(meta)


# -- switching the tier on and off ----------------------------------------------------------------

TIER = DiskTier()


def install(tier: DiskTier | None = None) -> DiskTier:
    """Make `tier` (default: the configured one) the launch path's disk tier.

    >>> from eager_neuron.cache import disk
    >>> disk.install() is disk.TIER
    True
    """
    from eager_neuron import launch

    launch.DISK = tier or TIER
    return launch.DISK


def uninstall() -> None:
    """No disk tier: every memory miss compiles (as EAGER_NEURON_DISK_CACHE=0)."""
    from eager_neuron import launch

    launch.DISK = None
