"""The disk entry format: a magic, a JSON header (format, toolchain, key, size, checksum), then
the payload. Nothing here knows Numba; `cache/rebuild.py` makes and reads the payload.

>>> from eager_neuron.cache import format as fmt
>>> blob = fmt.pack({"size": 2, "sha256": "x"}, b"ab")
>>> blob[:4]
b'ENKC'
"""

from __future__ import annotations

import hashlib
import json
import struct

from eager_neuron.cache import keys

DB_NAME = "cache.db"               # diskcache's index (entries over 32 KB live in *.val files)
DB_TIMEOUT_S = 30.0                # SQLite busy timeout, then a counted miss / write error
MAGIC = b"ENKC"                    # eager_neuron kernel cache entry
_PREFIX = struct.Struct("<4sI")    # magic, header length; then the JSON header, then the payload


class DiskCacheWarning(RuntimeWarning):
    """The disk tier had a problem; the op ran anyway (see stats()['disk_misses'])."""


class _Miss(Exception):
    """A named miss: the reason is what `STATS.disk_misses` counts."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail)
        self.reason = reason


def pack(header: dict, payload: bytes) -> bytes:
    """One entry's bytes: magic, header length, the header as sorted JSON, the payload."""
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
