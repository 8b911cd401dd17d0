"""A small TCP relay: the real node's way to the host's loopback services.

The API server and the dev controller listen on 127.0.0.1, which the node's namespace cannot
reach. The relay listens on the host end of the node's link and copies bytes both ways to the
loopback service (TLS passes through untouched: the API server's certificate covers the link
address). A target may also be `@FILE`: the file holds `host:port` and is read for each new
connection, so the relay follows a pod that moves (the dev controller's pod IP).

    python -m devcluster.relay 198.18.56.1:6643=127.0.0.1:6643 127.0.0.1:8280=@controller.addr
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import re
import signal
import sys
from collections.abc import Sequence

_ADDR = re.compile(r"\A(?P<host>[0-9.]+):(?P<port>[0-9]{1,5})\Z")


class RelayError(Exception):
    """A rule could not be parsed or its target resolved."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """Listen on one address; forward each connection to a fixed or file-named target."""

    listen_host: str
    listen_port: int
    target: str
    """`host:port`, or `@path` of a file holding `host:port`."""


def parse_address(text: str) -> tuple[str, int]:
    """Parse `a.b.c.d:port` (full match)."""
    m = _ADDR.fullmatch(text)
    if m is None or not 0 < int(m.group("port")) < 65536:
        msg = f"not an IPv4 host:port: {text!r}"
        raise RelayError(msg)
    return m.group("host"), int(m.group("port"))


def parse_rule(text: str) -> Rule:
    """Parse `LISTEN=TARGET`."""
    listen, sep, target = text.partition("=")
    if not sep or not target:
        msg = f"a rule is LISTEN=TARGET, not {text!r}"
        raise RelayError(msg)
    host, port = parse_address(listen)
    if not target.startswith("@"):
        parse_address(target)
    return Rule(host, port, target)


def resolve(rule: Rule) -> tuple[str, int]:
    """The target of a rule now (a file target is read afresh)."""
    if rule.target.startswith("@"):
        try:
            text = pathlib.Path(rule.target[1:]).read_text()
            return parse_address(text.removesuffix("\n"))
        except OSError as err:
            msg = f"target file {rule.target[1:]} unreadable: {err}"
            raise RelayError(msg) from err
    return parse_address(rule.target)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def _handle(rule: Rule, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        host, port = resolve(rule)
        async with asyncio.timeout(10):
            up_reader, up_writer = await asyncio.open_connection(host, port)
    except (RelayError, OSError, TimeoutError) as err:
        print(f"relay {rule.listen_host}:{rule.listen_port}: {err}", file=sys.stderr, flush=True)
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(rules: Sequence[Rule]) -> None:
    """Listen on every rule's address until SIGTERM or SIGINT."""
    servers = []
    for rule in rules:

        async def handler(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, rule: Rule = rule
        ) -> None:
            await _handle(rule, r, w)

        servers.append(await asyncio.start_server(handler, rule.listen_host, rule.listen_port))
        print(f"relay {rule.listen_host}:{rule.listen_port} -> {rule.target}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: Sequence[str]) -> int:
    """Run the relay for the rules given as arguments."""
    try:
        rules = [parse_rule(a) for a in argv]
    except RelayError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    asyncio.run(serve(rules))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
