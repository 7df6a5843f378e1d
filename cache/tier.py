"""The disk tier: compiled machine code in a diskcache, so a later process compiles nothing.

Never fatal: every failure is a named, counted miss (`STATS.disk_misses[reason]`) or a counted
write error (`STATS.disk_errors`), with at most one warning per process. Reasons:
  absent   no entry for this key (first use, or evicted, or another toolchain wrote it)
  corrupt  truncated or garbage bytes, bad checksum, wrong key in the header
  version  an entry written by another format version or toolchain
  io       the directory or database cannot be opened or read
  rebuild  a valid entry that Numba could not load here (e.g. an unresolved symbol)

Repaired, not given up on: a damaged database (`cache.db` that SQLite cannot read) is moved aside
to `cache.db.damaged-<time>` with one warning naming both paths and an empty cache replaces it; a
cache directory deleted while the process runs is recreated at the next store.

One count per request: an `absent` miss is counted when the kernel is compiled and stored, so a
kernel that another thread or process compiled while this one waited for the lock counts as one
hit, not a miss and a hit.

The render index (`DIR/index`, a diskcache of its own: the entries' database holds entries only)
maps `keys.index_key(kernel key)` -- the toolchain, the key and a hash of eager_neuron's sources --
to the entry's disk key, so a process whose code is the one that stored a kernel loads it without
rendering its source (`load_indexed`: the entry carries its source and code object). It is an
accelerator only: a missing, stale or unreadable index entry falls through to the render path,
uncounted, and the render path counts what it finds.

>>> from eager_neuron.cache.tier import DiskTier
>>> tier = DiskTier("/tmp/eager_neuron_doctest_cache")
>>> tier.info()["directory"]
'/tmp/eager_neuron_doctest_cache'
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import warnings

from eager_neuron.cache import keys, rebuild
from eager_neuron.cache.format import DB_NAME, DB_TIMEOUT_S, DiskCacheWarning, _Miss, unpack
from eager_neuron.config import config
from eager_neuron.stats import STATS

N_LOCK_STRIPES = 256               # lock files: a key hashes to one (a collision only serialises)
LOCK_TIMEOUT_S = 60.0              # then compile anyway: a stuck peer must not hang this process


def damaged(exc: BaseException) -> bool:
    """True for SQLite's "not a database" / "disk image is malformed", not for busy or full."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


class DiskTier:
    """Kernels on disk, keyed by `keys.disk_key(key, source)`.

    `directory` and `size_mb` default to `config.cache_dir` / `config.cache_size_mb`, read at each
    open, so assigning the config before the first kernel moves the cache.
    """

    def __init__(self, directory: str | None = None, size_mb: float | None = None) -> None:
        self._directory = directory
        self._size_mb = size_mb
        self._cache = None
        self._cache_dir: str | None = None
        self._db_ino = None              # (st_dev, st_ino) of cache.db when it was opened
        self._failed_dir: str | None = None
        self._warned = False
        self._pending: set = set()       # disk keys whose `absent` miss waits for store()
        self._index = None               # the render index (a diskcache in DIR/index), its dir
        self._index_dir: str | None = None
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

    # -- opening, and repairing what can be repaired -------------------------------------------

    def _db_id(self, directory: str):
        try:
            st = os.stat(os.path.join(directory, DB_NAME))
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _open(self):
        """The diskcache.Cache, or None when the directory is unusable (counted, warned once)."""
        directory = self.directory
        cache = self._cache
        if cache is not None and self._cache_dir == directory:
            # NOTE: one stat per memory miss: a deleted directory (or cache.db) would otherwise
            # swallow every later entry into an unlinked file, silently
            if self._db_id(directory) == self._db_ino:
                return cache
            with self._open_lock:
                if self._cache is cache:
                    self._close()
                    self._warn_once_more(f"{os.path.join(directory, DB_NAME)} disappeared while "
                                         "this process ran; started a new cache there")
        if self._failed_dir == directory:
            return None
        with self._open_lock:
            if self._cache is not None and self._cache_dir == directory:
                return self._cache
            try:
                cache = self._connect(directory)
            except Exception as exc:
                if not damaged(exc):
                    self._failed_dir = directory
                    STATS.disk_errors += 1
                    self._warn(f"cannot open ({type(exc).__name__}: {exc})")
                    return None
                try:
                    self._move_aside(directory, exc)
                    cache = self._connect(directory)
                except Exception as exc2:
                    self._failed_dir = directory
                    STATS.disk_errors += 1
                    self._warn(f"cannot open ({type(exc2).__name__}: {exc2})")
                    return None
            self._close()
            self._cache, self._cache_dir = cache, directory
            self._db_ino = self._db_id(directory)
            return cache

    def _connect(self, directory: str):
        import diskcache

        os.makedirs(directory, exist_ok=True)
        return diskcache.Cache(directory, timeout=DB_TIMEOUT_S, statistics=True,
                               size_limit=self.size_limit,
                               eviction_policy="least-recently-used")

    def _close(self) -> None:
        if self._cache is not None:
            with contextlib.suppress(Exception):
                self._cache.close()
        self._cache = self._cache_dir = self._db_ino = None
        if self._index is not None:    # (a recreated directory: a new index beside it)
            with contextlib.suppress(Exception):
                self._index.close()
        self._index = self._index_dir = None

    def _move_aside(self, directory: str, exc: BaseException) -> str:
        """Rename a database SQLite cannot read (and its WAL files) out of the way; warn once."""
        db = os.path.join(directory, DB_NAME)
        aside = f"{db}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        os.replace(db, aside)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.replace(db + suffix, aside + suffix)
        self._warn_once_more(f"{db} is damaged ({type(exc).__name__}: {exc}); moved it to "
                             f"{aside} and started an empty cache (kernels compile once again)")
        return aside

    def _warn_once_more(self, message: str) -> None:
        """A repair: its own warning (naming the path), independent of the miss warning."""
        with contextlib.suppress(Exception):
            warnings.warn(f"eager_neuron kernel disk cache: {message}", DiskCacheWarning,
                          stacklevel=5)

    def recover(self, exc: BaseException) -> bool:
        """After a failed read or write: move a damaged database aside; True if it was one."""
        if not damaged(exc):
            return False
        with self._open_lock:
            directory = self._cache_dir or self.directory
            self._close()
            with contextlib.suppress(OSError):
                self._move_aside(directory, exc)
        return True

    # -- the render index ----------------------------------------------------------------------

    def _open_index(self):
        """The render index's diskcache (created beside the entries), or None. Never counted as
        a disk error: without it kernels render, as before it existed."""
        directory = os.path.join(self.directory, "index")
        index = self._index
        if index is not None and self._index_dir == directory:
            return index
        if self._index_dir == directory:           # failed before in this process
            return None
        with self._open_lock:
            if self._index is not None and self._index_dir == directory:
                return self._index
            try:
                index = self._connect_index(directory)
            except Exception as exc:    # noqa: BLE001 - unusable: no index this process
                index = None
                if damaged(exc):         # only an accelerator: start it afresh
                    with contextlib.suppress(Exception):
                        for name in os.listdir(directory):
                            if name.startswith(DB_NAME):
                                os.remove(os.path.join(directory, name))
                        index = self._connect_index(directory)
            if self._index is not None:
                with contextlib.suppress(Exception):
                    self._index.close()
            self._index, self._index_dir = index, directory
            return index

    @staticmethod
    def _connect_index(directory: str):
        import diskcache

        return diskcache.Cache(directory, timeout=DB_TIMEOUT_S, statistics=False,
                               size_limit=64 * 2**20, eviction_policy="least-recently-used")

    def load_indexed(self, key: tuple, args: tuple, render=None):
        """The kernel for `key` found through the render index (its source never rendered), or
        None: then the caller renders and takes the counted path (`load`). `render` (the
        launch's) says whose code renders it (keys.renderer_origin)."""
        if not config.disk_cache:
            return None
        try:
            origin = keys.renderer_origin(render) if render is not None else ""
            if origin is None:
                return None
            cache = self._open()
            if cache is None:
                return None
            index = self._open_index()
            if index is None:
                return None
            dkey = index.get(keys.index_key(key, origin))
            if not isinstance(dkey, str):
                return None
            blob = cache.get(dkey)
            if blob is None:                      # evicted: the render path counts the miss
                return None
            header, payload = unpack(blob)
            if header.get("key") != dkey:
                return None
            return rebuild.rebuild(header, payload, None, args, key)
        except Exception:    # noqa: BLE001 - any doubt: the render path decides and counts
            return None

    def _remember(self, key: tuple, dkey: str, render=None) -> None:
        """Index the entry `dkey` (loaded or stored under `key` in this process)."""
        with contextlib.suppress(Exception):
            origin = keys.renderer_origin(render) if render is not None else ""
            index = self._open_index() if origin is not None else None
            if index is not None:
                index.set(keys.index_key(key, origin), dkey)

    # -- the launch hooks ----------------------------------------------------------------------

    def load(self, key: tuple, args: tuple, source: str, count: bool = True, render=None):
        """The kernel for `key` built from disk, or None (a counted miss when `count`); found,
        it is indexed under `render`'s origin (load_indexed)."""
        if not config.disk_cache:
            return None
        dkey = None
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
                self.recover(exc)
                raise _Miss("io", f"read failed ({type(exc).__name__}: {exc})") from None
            if blob is None:
                raise _Miss("absent")
            header, payload = unpack(blob)
            if header.get("key") != dkey:
                raise _Miss("corrupt", "entry stored under another key")
            kernel = rebuild.rebuild(header, payload, source, args)
            self._pending.discard(dkey)
            self._remember(key, dkey, render)
            return kernel
        except _Miss as miss:
            if count:
                if miss.reason == "absent":
                    self._pending.add(dkey)      # counted by store(): this process compiles it
                else:
                    STATS.disk_misses[miss.reason] += 1
                if miss.reason != "absent" and str(miss):
                    self._warn(f"{miss.reason} entry for {key[1:3]}: {miss}")
            return None
        except Exception as exc:   # anything else is a bug here, never the user's problem
            if count:
                STATS.disk_misses["rebuild"] += 1
                self._warn(f"cannot load {key[1:3]} ({type(exc).__name__}: {exc})")
            return None

    def store(self, key: tuple, kernel, source: str, name: str, seconds: float,
              render=None) -> None:
        """Write the kernel just compiled for `key`; failures are counted, never raised."""
        if not config.disk_cache:
            return
        dkey = keys.disk_key(key, source)
        if dkey in self._pending:
            self._pending.discard(dkey)
            STATS.disk_misses["absent"] += 1
        cache = self._open()
        if cache is None:
            return
        try:
            blob, tag = rebuild.entry(key, kernel, source, name, seconds)
        except _Miss:
            return                   # not cacheable (object mode, dynamic globals): skip quietly
        except Exception as exc:
            STATS.disk_errors += 1
            self._warn(f"cannot serialise {key[1:3]} ({type(exc).__name__}: {exc})")
            return
        try:
            cache.set(dkey, blob, tag=tag)
        except Exception as exc:    # full disk, read-only directory, database busy or damaged
            if self.recover(exc):
                return
            STATS.disk_errors += 1
            self._warn(f"cannot write ({type(exc).__name__}: {exc})")
            return
        self._remember(key, dkey, render)

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

    # -- the cache tool (cache/admin.py) -------------------------------------------------------

    def info(self) -> dict:
        """Entries, bytes and lookup hit rate of the cache directory (nothing is created)."""
        from eager_neuron.cache import admin

        return admin.info(self)

    def entries(self) -> list[dict]:
        """One dict per entry: key, family, op, name, compile_s, bytes, stored, last_use."""
        from eager_neuron.cache import admin

        return admin.entries(self)

    def clear(self) -> int:
        """Delete every entry and orphaned file; leaves a working cache. Returns the count."""
        from eager_neuron.cache import admin

        return admin.clear(self)

    def export(self, path: str) -> int:
        """Write every entry of the current toolchain to a .tar.gz; returns the count."""
        from eager_neuron.cache import admin

        return admin.export(self, path)

    def import_(self, path: str) -> dict:
        """Add the entries of an exported archive; counts: added, present, skipped, bad."""
        from eager_neuron.cache import admin

        return admin.import_(self, path)
