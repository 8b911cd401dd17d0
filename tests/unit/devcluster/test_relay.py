"""The relay's rules: full-match addresses, file targets read afresh."""

from __future__ import annotations

import pathlib

import pytest

from devcluster import relay


def test_a_rule_forwards_a_listen_address_to_a_target() -> None:
    """`LISTEN=TARGET` with IPv4 host:port on both sides."""
    assert relay.Rule("198.18.1.1", 6443, "127.0.0.1:6443") == relay.parse_rule(
        "198.18.1.1:6443=127.0.0.1:6443"
    )


@pytest.mark.parametrize(
    "text",
    ["198.18.1.1:6443", "198.18.1.1:6443=", "host:1=127.0.0.1:2", "1.2.3.4:0=127.0.0.1:1",
     "1.2.3.4:1=127.0.0.1:70000", "1.2.3.4:1\n=127.0.0.1:2"],
    ids=["no target", "an empty target", "a name, not an address", "port zero",
         "a port past 65535", "a newline inside"],
)  # fmt: skip
def test_a_malformed_rule_is_refused(text: str) -> None:
    """Nothing but `a.b.c.d:port=a.b.c.d:port` or `…=@file` is a rule."""
    with pytest.raises(relay.RelayError):
        relay.parse_rule(text)


def test_a_file_target_is_read_for_each_connection(tmp_path: pathlib.Path) -> None:
    """The controller pod moves; the relay follows the file the renewer rewrites."""
    addr = tmp_path / "controller.addr"
    rule = relay.parse_rule(f"127.0.0.1:8080=@{addr}")
    addr.write_text("198.19.1.5:8080\n")
    assert relay.resolve(rule) == ("198.19.1.5", 8080)
    addr.write_text("198.19.1.9:8080\n")
    assert relay.resolve(rule) == ("198.19.1.9", 8080)


def test_an_unreadable_file_target_says_which_file(tmp_path: pathlib.Path) -> None:
    """A missing file is a RelayError naming it, not a crash of the relay."""
    rule = relay.parse_rule(f"127.0.0.1:8080=@{tmp_path / 'absent'}")
    with pytest.raises(relay.RelayError, match="absent"):
        relay.resolve(rule)
