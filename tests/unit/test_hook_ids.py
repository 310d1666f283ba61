"""Inbound hook ids are their public URLs: at least 128 random bits, sorting with older ids."""

from __future__ import annotations

import time

from flowhook.ids import is_id, new_id, new_secret_id

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _value(text: str) -> int:
    n = 0
    for ch in text:
        n = n * 32 + _ALPHABET.index(ch)
    return n


def test_secret_ids_carry_130_random_bits() -> None:
    ids = [new_secret_id("hk") for _ in range(2000)]
    assert all(len(i) == 39 and is_id(i, "hk") and not is_id(i, "run") for i in ids)
    random_parts = [_value(i[13:]) for i in ids]  # after the prefix and the millisecond
    assert len(set(random_parts)) == len(ids)
    assert max(random_parts).bit_length() > 128  # 26 characters of random bits, not padding
    assert all(p < 2**130 for p in random_parts)
    every_bit = 0
    for p in random_parts:
        every_bit |= p
    assert every_bit == 2**130 - 1  # each of the 130 bits varies


def test_secret_ids_sort_by_time_among_older_ids() -> None:
    older = new_id("hk")
    time.sleep(0.002)
    newer = new_secret_id("hk")
    time.sleep(0.002)
    newest = new_id("hk")
    assert older < newer < newest
    assert is_id(older, "hk") and is_id(newest, "hk")


def test_is_id_refuses_other_shapes() -> None:
    good = new_secret_id("hk")
    for bad in (good + "\n", good[:-1], good + "a", good.upper(), "hk_" + "8" + good[4:]):
        assert not is_id(bad, "hk"), bad
