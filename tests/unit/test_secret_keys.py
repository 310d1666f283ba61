"""The keys that encrypt stored secrets: their format, sealing and opening under a key list,
and the key file a SQLite database gets when FLOWHOOK_SECRET_KEY is unset."""

from __future__ import annotations

import base64
import logging
import stat
from pathlib import Path

import pytest

from flowhook.errors import SecretKeyError
from flowhook.store.crypto import PREFIX, Keyring, SecretBox, generate_key, parse_keys


def test_a_generated_key_is_32_random_bytes_in_44_url_safe_characters() -> None:
    key = generate_key()
    assert len(key) == 44 and len(base64.urlsafe_b64decode(key)) == 32
    assert generate_key() != key
    assert parse_keys(f" {key} , {generate_key()} ")[0] == key


@pytest.mark.parametrize(
    "bad",
    ["short", "x" * 44, base64.urlsafe_b64encode(b"k" * 31).decode() + "==", ",", ""],
)
def test_a_malformed_key_is_refused_naming_the_setting_never_the_key(bad: str) -> None:
    with pytest.raises(SecretKeyError) as caught:
        parse_keys(bad)
    assert "FLOWHOOK_SECRET_KEY" in caught.value.message
    assert "generate-key" in caught.value.message
    if bad.strip(","):
        assert bad not in caught.value.message


def test_the_second_of_two_keys_is_named_by_position() -> None:
    with pytest.raises(SecretKeyError, match="key 2 of 2 in FLOWHOOK_SECRET_KEY"):
        parse_keys(generate_key() + ",not-a-key")


def test_sealed_under_the_newest_key_opened_under_any_listed() -> None:
    old, new = generate_key(), generate_key()
    sealed_old = SecretBox([old]).seal("whsec_abc")
    assert sealed_old.startswith(PREFIX) and "whsec_abc" not in sealed_old
    both = SecretBox([new, old])
    assert both.open(sealed_old) == "whsec_abc"
    assert not both.sealed_with_newest(sealed_old)
    sealed_new = both.seal("whsec_abc")
    assert both.sealed_with_newest(sealed_new) and sealed_new != both.seal("whsec_abc")
    assert SecretBox([new]).open(sealed_new) == "whsec_abc"
    assert both.open("whsec_plain") == "whsec_plain"  # written before encryption: as it is


def test_a_secret_under_a_key_not_listed_is_a_clear_error() -> None:
    key = generate_key()
    sealed = SecretBox([generate_key()]).seal("whsec_abc")
    with pytest.raises(SecretKeyError) as caught:
        SecretBox([key]).open(sealed)
    assert "FLOWHOOK_SECRET_KEY" in caught.value.message
    assert key not in caught.value.message and "whsec_abc" not in caught.value.message


def test_an_opened_secret_is_remembered_so_it_is_decrypted_once() -> None:
    box = SecretBox([generate_key()])
    sealed = box.seal("whsec_" + "a" * 40)
    assert box.open(sealed) is box.open(sealed)


def test_postgresql_without_a_key_says_how_to_make_one() -> None:
    with pytest.raises(SecretKeyError) as caught:
        Keyring(None, "postgresql://u@localhost/db").box()
    assert "FLOWHOOK_SECRET_KEY is not set" in caught.value.message
    assert "flowhook secrets generate-key" in caught.value.message


def test_sqlite_without_a_key_makes_a_0600_key_file_once_and_reuses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    key_file = tmp_path / "flowhook.db.key"
    with caplog.at_level(logging.INFO, logger="flowhook"):
        first = Keyring(None, url).box()
        second = Keyring(None, url).box()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(base64.urlsafe_b64decode(key)) == 32
    made = [r.getMessage() for r in caplog.records if "key file" in r.getMessage()]
    assert len(made) == 1 and str(key_file) in made[0] and key not in made[0]
    assert second.open(first.seal("whsec_x")) == "whsec_x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flowhook.db.key"]  # no leftovers


def test_a_set_key_wins_over_the_key_file_and_a_malformed_file_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    key = generate_key()
    Keyring(key, url).box()
    assert not (tmp_path / "flowhook.db.key").exists()
    (tmp_path / "flowhook.db.key").write_text("garbage\n")
    with pytest.raises(SecretKeyError, match=r"the key file .*flowhook\.db\.key"):
        Keyring(None, url).box()
