"""Ids as the store keeps them (flowhook.ids.pack_id, migration 0023): 17 bytes for an id of
``new_id``, 24 for a secret one, anything else kept as its text; the same order; no string
taken for another."""

from __future__ import annotations

import random

import pytest

from flowhook import ids
from flowhook.ids import PACK_CODES, new_id, new_secret_id, pack_id, unpack_id


def test_the_prefix_codes_are_fixed() -> None:
    # Stored in every database since migration 0023: never changed, never reused.
    assert PACK_CODES == {
        "att": 1, "dlv": 2, "ep": 3, "evt": 4, "hk": 5, "key": 6,
        "part": 7, "run": 8, "sch": 9, "sig": 10, "wf": 11, "ws": 12,
    }  # fmt: skip


@pytest.mark.parametrize("prefix", sorted(PACK_CODES))
def test_every_prefix_packs_to_17_bytes_and_back(prefix: str) -> None:
    for _ in range(200):
        made = new_id(prefix)
        packed = pack_id(made)
        assert len(packed) == 17 and packed[0] == PACK_CODES[prefix]
        assert unpack_id(packed) == made
        ids._UNPACKED.clear()  # and without the cache
        assert unpack_id(packed) == made


def test_a_secret_id_packs_to_24_bytes_and_back() -> None:
    for _ in range(200):
        made = new_secret_id("hk")
        assert len(made) == 39
        packed = pack_id(made)
        assert len(packed) == 24 and unpack_id(packed) == made


@pytest.mark.parametrize(
    "value",
    [
        "",
        "run_",
        "run",
        "garbage",
        "RUN_01M89ES1RZEMQRHVWN9ZYTAKKY",  # upper case: not what new_id makes
        "run_01M89ES1RZEMQRHVWN9ZYTAKKY",
        "run_81m89es1rzemqrhvwn9zytakky",  # above 128 bits
        "run_01m89es1rzemqrhvwn9zytakk",  # 25 digits
        "run_01m89es1rzemqrhvwn9zytakkyy",  # 27
        "run_01m89es1rzemqrhvwn9zytakki",  # i is not a Crockford digit
        "run_01m89es1rzemqrhvwn9zytak_y",
        "run_ 1m89es1rzemqrhvwn9zytakky",
        "nope_01m89es1rzemqrhvwn9zytakky",  # unknown prefix
        "run_01m89es1rzemqrhvwn9zytakky\n",
        "evt_ünïcode",
        "\x00run",
    ],
)
def test_anything_else_is_kept_as_its_text_after_a_zero_byte(value: str) -> None:
    packed = pack_id(value)
    assert packed == b"\x00" + value.encode()
    assert unpack_id(packed) == value


def test_no_two_strings_share_a_packed_form() -> None:
    seen: dict[bytes, str] = {}
    made = [new_id(p) for p in PACK_CODES for _ in range(50)] + [new_secret_id("hk")] * 3
    odd = ["run_" + "0" * 26, "run_" + "7" + "z" * 25, "hk_" + "z" * 36, "x", "", "run_x"]
    for value in made + odd + [v.upper() for v in made[:20]]:
        packed = pack_id(value)
        assert seen.setdefault(packed, value) == value
        assert unpack_id(packed) == value


def test_packed_ids_sort_as_their_text() -> None:
    rng = random.Random(7)
    made = [new_id(p) for p in PACK_CODES for _ in range(100)]
    digits = "0123456789abcdefghjkmnpqrstvwxyz"
    made += ["run_" + "".join(rng.choice(digits) for _ in range(26)) for _ in range(300)]
    made = [m for m in made if m[m.index("_") + 1] <= "7"]  # at most 128 bits
    assert sorted(made, key=pack_id) == sorted(made)
    assert len(pack_id("run_" + "0" * 26)) == 17  # the lowest floor packs too


def test_the_caches_stay_bounded() -> None:
    for _ in range(ids._CACHED + 10):
        unpack_id(pack_id(new_id("evt")))
    assert len(ids._PACKED) <= ids._CACHED and len(ids._UNPACKED) <= ids._CACHED
