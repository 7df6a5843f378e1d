"""What `python -m eager_neuron.tools.cache` does to a tier: info, entries, clear, export, import.

Every verb survives a damaged database: it is moved aside (one warning naming the path) and the
verb works on the fresh, empty cache, so `clear` always leaves a working cache behind.

>>> import tempfile
>>> from eager_neuron.cache.tier import DiskTier
>>> from eager_neuron.cache import admin
>>> tier = DiskTier(tempfile.mkdtemp())
>>> admin.clear(tier), admin.info(tier)["entries"]
(0, 0)
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time

from eager_neuron.cache import keys
from eager_neuron.cache.format import DB_NAME, DB_TIMEOUT_S, _Miss, unpack
from eager_neuron.config import config


def info(tier) -> dict:
    """Entries, bytes and lookup hit rate of the cache directory (nothing is created)."""
    out = {"directory": tier.directory, "size_limit": tier.size_limit,
           "enabled": bool(config.disk_cache), "entries": 0, "bytes": 0, "hits": 0,
           "misses": 0, "hit_rate": None, "toolchains": {}}
    if not os.path.exists(os.path.join(tier.directory, DB_NAME)):
        return out
    cache = tier._open()
    if cache is None:
        out["error"] = "cannot open"
        return out
    hits, misses = cache.stats()
    out.update(entries=len(cache), bytes=cache.volume(), hits=hits, misses=misses,
               hit_rate=hits / (hits + misses) if hits + misses else None)
    for row in entries(tier):
        tc = row.get("toolchain", "?")
        out["toolchains"][tc] = out["toolchains"].get(tc, 0) + 1
    return out


def entries(tier) -> list[dict]:
    """One dict per entry: key, family, op, name, compile_s, bytes, stored, last_use.

    Read from the database directly (read-only): a `get` would count as a use.
    """
    import sqlite3

    path = os.path.join(tier.directory, DB_NAME)
    if not os.path.exists(path) or tier._open() is None:   # _open repairs a damaged database
        return []
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=DB_TIMEOUT_S)
        try:
            rows = con.execute(
                "SELECT key, tag, size, length(value), store_time, access_time FROM Cache"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if tier.recover(exc):        # damaged below the header: moved aside, the cache is empty
            return []
        raise OSError(f"cannot read the kernel cache at {tier.directory} "
                      f"({type(exc).__name__}: {exc})") from None
    out = []
    for key, tag, size, inline_len, stored, used in rows:
        try:
            meta = json.loads(tag) if tag else {}
        except (TypeError, ValueError):
            meta = {}
        out.append({"key": key, **meta, "bytes": size or inline_len or 0,
                    "stored": stored, "last_use": used})
    return out


def clear(tier) -> int:
    """Delete every entry and every orphaned value file; returns how many entries there were.

    Afterwards the cache opens and answers, whatever state it was in: a damaged database is
    moved aside first, and value files that no entry refers to (left by a deleted or damaged
    database) are removed. Lock files stay: another process may hold one.
    """
    cache = tier._open()
    if cache is None:
        raise OSError(f"cannot open the kernel cache at {tier.directory}")
    try:
        n = cache.clear(retry=True)
        referenced = {row[0] for row in cache._sql(
            "SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}
    except Exception as exc:
        if not tier.recover(exc):
            raise
        n, cache = 0, tier._open()
        if cache is None:
            raise OSError(f"cannot open the kernel cache at {tier.directory}") from None
        referenced = set()
    for root, _dirs, files in os.walk(tier.directory):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".val") and os.path.relpath(path, tier.directory) not in referenced:
                os.remove(path)
    try:                             # the render index: pointers only, nothing left to point at
        index = tier._open_index()
        if index is not None:
            index.clear(retry=True)
    except Exception:    # noqa: BLE001 - an accelerator: a stale pointer is only a miss
        pass
    len(cache)                       # the proof that it works: raises if the database does not
    return n


def export(tier, path: str) -> int:
    """Write every entry of the current toolchain to a .tar.gz; returns the count."""
    cache = tier._open()
    if cache is None:
        raise OSError(f"cannot open the kernel cache at {tier.directory}")
    current = keys.toolchain_id()
    manifest = {"format": keys.FORMAT_VERSION, "toolchain": current,
                "toolchain_detail": repr(keys.toolchain()), "entries": []}
    with tarfile.open(path, "w:gz") as tar:
        for row in entries(tier):
            if row.get("toolchain") != current:
                continue
            blob, tag = cache.get(row["key"], tag=True)
            if blob is None:     # evicted meanwhile
                continue
            item = tarfile.TarInfo(f"entries/{row['key']}")
            item.size, item.mtime = len(blob), int(time.time())
            tar.addfile(item, io.BytesIO(blob))
            manifest["entries"].append({"key": row["key"], "tag": tag})
        data = json.dumps(manifest, indent=1).encode()
        item = tarfile.TarInfo("manifest.json")
        item.size, item.mtime = len(data), int(time.time())
        tar.addfile(item, io.BytesIO(data))
    return len(manifest["entries"])


def import_(tier, path: str) -> dict:
    """Add the entries of an exported archive; each is verified (checksum, key, toolchain).

    Returns counts: added, present (already here), skipped (another toolchain), bad.
    """
    cache = tier._open()
    if cache is None:
        raise OSError(f"cannot open the kernel cache at {tier.directory}")
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

