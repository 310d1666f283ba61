"""Identifiers: a prefix plus a time-ordered suffix.

The suffix is a UUIDv7 written in lower-case Crockford base32 (26 characters), as TypeID
does, so ids sort by creation time and serve as pagination cursors.

An id that is also a credential (an inbound hook's id is its public URL) comes from
:func:`new_secret_id`: the same 10 leading characters (the millisecond, so it sorts among the
others) followed by 130 random bits, 36 characters in all.
"""

from __future__ import annotations

import os
import re
import threading
import time

__all__ = [
    "new_id",
    "new_secret_id",
    "is_id",
    "id_floor",
    "id_millis",
    "pack_id",
    "unpack_id",
    "PREFIXES",
    "PACK_CODES",
]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PREFIXES = frozenset(
    {"wf", "run", "part", "evt", "ep", "dlv", "hk", "key", "ws", "att", "sig", "sch"}
)

_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)
"""The two digits of each 10-bit value."""

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def _uuid7_int() -> int:
    """A UUIDv7 as an int, monotonic within this process (12-bit counter per millisecond)."""
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _seq = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return (ms << 80) | (0x7 << 76) | (_seq << 64) | (0b10 << 62) | rand_b


def _base32(value: int, length: int = 26) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def _base32_128(value: int) -> str:
    """:func:`_base32` of a 128-bit ``value`` (26 digits), ten bits at a time: a quarter of
    the time of the loop (ids are made several times per run)."""
    p, v = _PAIRS, value
    return (
        p[v >> 120] + p[(v >> 110) & 1023] + p[(v >> 100) & 1023] + p[(v >> 90) & 1023]
        + p[(v >> 80) & 1023] + p[(v >> 70) & 1023] + p[(v >> 60) & 1023]
        + p[(v >> 50) & 1023] + p[(v >> 40) & 1023] + p[(v >> 30) & 1023]
        + p[(v >> 20) & 1023] + p[(v >> 10) & 1023] + p[v & 1023]
    )  # fmt: skip


def new_id(prefix: str) -> str:
    """A new id such as ``run_01jd7w2k3m4n5p6q7r8s9t0v1x``."""
    return f"{prefix}_{_base32_128(_uuid7_int())}"


def id_floor(prefix: str, ms: int) -> str:
    """The lowest id :func:`new_id` could make at Unix millisecond ``ms``: every id made at
    that millisecond or later sorts after it (a cursor "from this time on")."""
    return f"{prefix}_{_base32(max(0, ms) << 80)}"


def id_millis(value: str) -> int:
    """The Unix millisecond an id of :func:`new_id` was made at (its first 10 characters)."""
    ms = 0
    for ch in value.partition("_")[2][:10]:
        ms = (ms << 5) | _ALPHABET.index(ch)
    return ms  # 10 characters are the top 50 bits of 130: the 48-bit millisecond


def new_secret_id(prefix: str) -> str:
    """A new id that cannot be guessed (130 random bits), such as ``hk_01jd7w2k3m…`` (36
    characters after the prefix); it sorts by creation time with :func:`new_id`'s ids."""
    ms = time.time_ns() // 1_000_000
    return f"{prefix}_{_base32(ms, 10)}{_base32(int.from_bytes(os.urandom(17), 'big') >> 6)}"


_ID_RE = re.compile(r"^([a-z]+)_([0-7][0-9a-hjkmnp-tv-z]{25}(?:[0-9a-hjkmnp-tv-z]{10})?)$")


def is_id(value: str, prefix: str) -> bool:
    """Whether ``value`` has the shape of an id this service made with ``prefix`` (either
    function's)."""
    m = _ID_RE.fullmatch(value)
    return m is not None and m.group(1) == prefix


# -- Stored form ---------------------------------------------------------------------------

PACK_CODES: dict[str, int] = {
    p: code for code, p in enumerate(sorted(PREFIXES), start=1)
}  # fmt: skip
"""Each prefix's first byte in :func:`pack_id`'s form: 1… in alphabetical order of the
prefixes (``att`` 1 … ``ws`` 12), so packed ids of different prefixes sort as their text
does. Stored in every database: a code is never changed or reused; a new prefix takes the
next free code (and sorts after the others)."""
_PREFIX_OF = {code: p for p, code in PACK_CODES.items()}
_TAIL = re.compile(r"[0-7][0-9a-hjkmnp-tv-z]{25}|[0-9a-hjkmnp-tv-z]{36}")
_TO_PY32 = str.maketrans(_ALPHABET, "0123456789abcdefghijklmnopqrstuv")

_CACHED = 4096
_PACKED: dict[str, bytes] = {}
_UNPACKED: dict[bytes, str] = {}
"""The last few thousand ids converted each way (cleared when full): a run's ids are
converted several times each (a workspace's, a flow's and an endpoint's all the time), and a
lookup costs a twentieth of a conversion."""


def pack_id(value: str) -> bytes:
    """``value`` as the store keeps it: an id of :func:`new_id` in 17 bytes (its prefix's
    code of :data:`PACK_CODES`, then the UUIDv7's 16), one of :func:`new_secret_id` in 24
    (the code, then the 180 bits of its 36 digits), 13 to 19 fewer than its text. Any other
    string (a malformed id from a request, an unknown prefix) is byte 0 then its UTF-8, so
    it round-trips, equals only itself, and matches no id. Packed ids of one prefix sort as
    their text does (big-endian numbers of the same base-32 digits)."""
    packed = _PACKED.get(value)
    if packed is not None:
        return packed
    prefix, _, tail = value.partition("_")
    code = PACK_CODES.get(prefix)
    if code is not None and _TAIL.fullmatch(tail) is not None:
        number = int(tail.translate(_TO_PY32), 32)
        packed = code.to_bytes() + number.to_bytes(16 if len(tail) == 26 else 23)
    else:
        packed = b"\x00" + value.encode()
    if len(_PACKED) >= _CACHED:
        _PACKED.clear()
    _PACKED[value] = packed
    return packed


def unpack_id(stored: bytes) -> str:
    """The id :func:`pack_id` stored as ``stored``."""
    value = _UNPACKED.get(stored)
    if value is not None:
        return value
    code = stored[0]
    if code == 0:
        value = stored[1:].decode()
    elif len(stored) == 17:
        value = f"{_PREFIX_OF[code]}_{_base32_128(int.from_bytes(stored[1:]))}"
    else:
        value = f"{_PREFIX_OF[code]}_{_base32(int.from_bytes(stored[1:]), 36)}"
    if len(_UNPACKED) >= _CACHED:
        _UNPACKED.clear()
    _UNPACKED[stored] = value
    return value
