"""Migration 0023's own copy of the id codec makes the bytes ``flowhook.ids`` makes (and reads
them back), for every form: ids of every prefix, secret ids, and strings that are no id."""

from __future__ import annotations

from flowhook.ids import PACK_CODES, pack_id, unpack_id
from tests.integration.test_compact_ids import M, awkward_ids


def test_the_migration_s_codec_is_flowhook_ids_one() -> None:
    assert dict(zip(M._PREFIXES, range(1, 13), strict=True)) == PACK_CODES
    values = awkward_ids() * 3  # new ids each call, and flowhook.ids' cache on repeats
    for value in values:
        packed = pack_id(value)
        assert M.pack(value) == packed, value
        assert M.unpack(packed) == value == unpack_id(M.pack(value))
        assert M._pack_text(value) == packed and M._pack_text(packed) == packed
        assert M._unpack_blob(packed) == value and M._unpack_blob(value) == value
    assert M._pack_text(None) is None and M._unpack_blob(None) is None
