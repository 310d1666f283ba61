"""The target guard against the outside truth in tests/data/ssrf-cases.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowhook.targets import TargetRefused, check_url, only_reachable, vet_address

CASES = json.loads((Path(__file__).parents[1] / "data" / "ssrf-cases.json").read_text())


@pytest.mark.parametrize("url", CASES["refuse"])
def test_refused(url: str) -> None:
    with pytest.raises(TargetRefused):
        check_url(url)


@pytest.mark.parametrize("url", CASES["allow"])
def test_allowed(url: str) -> None:
    assert check_url(url) == url


def test_private_targets_pass_only_when_allowed() -> None:
    assert check_url("http://127.0.0.1:8080/hook", allow_private=True)
    with pytest.raises(TargetRefused):
        check_url("ftp://127.0.0.1/", allow_private=True)
    with pytest.raises(TargetRefused):
        check_url("http://user:pw@127.0.0.1/", allow_private=True)


def test_live_mode_can_require_https() -> None:
    with pytest.raises(TargetRefused, match="https"):
        check_url("http://8.8.8.8/", require_https=True)
    assert check_url("https://8.8.8.8/", require_https=True)


@pytest.mark.parametrize("url", ["http://8.8.8.8/", "http://hooks.example.com/", "http://a.b/"])
def test_live_mode_needs_https_to_a_public_host_whatever_the_setting(url: str) -> None:
    """FLOWHOOK_ALLOW_PRIVATE_TARGETS lets a live endpoint on this machine or network use
    plain http; it never lets one on the internet do so (before: any http:// passed)."""
    for allow_private in (False, True):
        with pytest.raises(TargetRefused, match="live-mode targets must use https://"):
            check_url(url, require_https=True, allow_private=allow_private)
    local = ["http://127.0.0.1:8080/hook", "http://localhost:9000/", "http://10.1.2.3/"]
    for private in local:
        assert check_url(private, require_https=True, allow_private=True) == private
        with pytest.raises(TargetRefused):  # without the setting: refused as before
            check_url(private, require_https=True)


def test_a_refused_private_address_names_the_setting_that_allows_it() -> None:
    for url in ("http://127.0.0.1/", "http://localhost/", "http://10.0.0.1/"):
        with pytest.raises(TargetRefused, match="FLOWHOOK_ALLOW_PRIVATE_TARGETS=true"):
            check_url(url)


# Audit finding 1: hosts that are IP literals only after yarl's IDNA mapping, written with
# full-width digits, ideographic full stops or circled numbers, reached 127.0.0.1 and the
# metadata address. They are refused whatever the address, even where private targets are
# allowed: no one writes a real target that way.
UNICODE_IP_HOSTS = [
    "http://127。0。0。1:8080/",
    "http://１２７.0.0.1/",
    "http://①②⑦.0.0.1/",
    "http://⑯⑨.254.169.254/latest/meta-data/",
    "http://８.８.８.８/",
    "http://127．0．0．1/",
]


@pytest.mark.parametrize("url", UNICODE_IP_HOSTS)
@pytest.mark.parametrize("allow_private", [False, True])
def test_hosts_that_become_ip_literals_after_mapping_are_refused(
    url: str, allow_private: bool
) -> None:
    with pytest.raises(TargetRefused, match="only after Unicode mapping"):
        check_url(url, allow_private=allow_private)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::7f00:1]/",  # IPv4-compatible IPv6 of 127.0.0.1
        "http://[::a9fe:a9fe]/",  # ... of 169.254.169.254
        "http://[::8.8.8.8]/",  # deprecated form, not global unicast
        "http://[::ffff:0:7f00:1]/",  # IPv4-translated (SIIT)
        "http://[100::1]/",  # discard-only
        "http://[2001:db8::1]/",  # documentation
        "http://[64:ff9b:1:7f00:1::]/",  # local-use NAT64, IPv4 not in the low bits
        "http://[64:ff9b:1::808:808]/",  # ... refused whatever it embeds
    ],
)
def test_ipv6_forms_outside_global_unicast_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match="not a public address"):
        check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.215.14/\r\nX-Injected: 1",
        "http://93.184.215.14/a\x00b",
        "http://93.184.215.14\t/",
        "http://exam\x7fple.com/",
        "http://example.com/\x85",
    ],
)
def test_urls_with_control_characters_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match="control character"):
        check_url(url, allow_private=True)


@pytest.mark.parametrize("url", ["http://exa\u200bmple.com/", "http://exa\u00admple.com/"])
def test_hosts_with_invisible_characters_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match="invisible"):
        check_url(url)


@pytest.mark.parametrize(
    "url", ["https://bücher.de/hook", "https://例え.jp/", "https://api.example.com/a b?q=x y"]
)
def test_unicode_domain_names_and_spaces_in_paths_still_pass(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(
    "url", ["http://ｌｏｃａｌｈｏｓｔ:8080/", "http://LOCALHOST./", "http://a.localhost/"]
)
def test_localhost_is_refused_in_any_spelling(url: str) -> None:
    with pytest.raises(TargetRefused, match="local address"):
        check_url(url)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "fe80::1%eth0", "::ffff:10.0.0.1"],
)
def test_vet_address_refuses_what_may_not_be_reached(address: str) -> None:
    with pytest.raises(TargetRefused, match="is not a public address"):
        vet_address(address)


def test_vet_address_passes_public_addresses_and_refuses_non_addresses() -> None:
    vet_address("93.184.216.34")
    vet_address("2606:2800:220:1:248:1893:25c8:1946")
    with pytest.raises(TargetRefused, match="not an IP address"):
        vet_address("example.com")


def test_only_reachable_keeps_public_answers_in_order() -> None:
    found = [(2, "10.0.0.1"), (10, "2606:4700::1"), (2, "93.184.216.34"), (10, "fd00::1")]
    kept = only_reachable("mixed.example", found, lambda item: item[1])
    assert kept == [(10, "2606:4700::1"), (2, "93.184.216.34")]


def test_only_reachable_refuses_a_host_that_resolves_only_to_private_addresses() -> None:
    with pytest.raises(TargetRefused, match=r"rebind\.example resolves only to addresses"):
        only_reachable("rebind.example", ["127.0.0.1", "192.168.1.1"], str)
    assert only_reachable("nothing.example", [], str) == []  # no answer is the caller's error
