"""The serving certificate, kept current: reloaded when its files change on disk.

cert-manager renews the controller's certificate well before it expires and the kubelet
swaps the mounted Secret's files in place. A context loaded once at start would serve the old
certificate until it expired; `Reloader` loads the new pair into the same `ssl.SSLContext`,
so every handshake after it presents the new certificate and no connection is dropped.
"""

from __future__ import annotations

import asyncio
import pathlib
import ssl
import tempfile

import structlog

log = structlog.get_logger()

Stamp = tuple[tuple[int, int], ...]


class Reloader:
    """Reload a server context's certificate chain when its files change."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str = "") -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file or None
        self.files = [pathlib.Path(f) for f in (cert_file, key_file) if f]
        self._loaded = self._stamp()

    def _stamp(self) -> Stamp | None:
        try:
            return tuple((f.stat().st_mtime_ns, f.stat().st_size) for f in self.files)
        except OSError:
            return None  # being replaced: look again next time

    def check(self) -> bool:
        """Load the pair again if it changed since it was last loaded; return whether it was.
        A pair that does not load (the key written before the certificate, say) is kept out
        and tried again on the next check: the old certificate stays in service meanwhile."""
        stamp = self._stamp()
        if stamp is None or stamp == self._loaded:
            return False
        try:
            self._load()
        except (ssl.SSLError, OSError) as err:
            log.warning("new serving certificate does not load yet", error=repr(err))
            return False
        self._loaded = stamp
        log.info("serving certificate reloaded", file=self.cert_file)
        return True

    def _load(self) -> None:
        """Load one snapshot of the files: first into a scratch context, then into the live
        one. A failed `load_cert_chain` leaves a context half-changed (the new certificate
        with the old key: every handshake fails), so the live context only ever gets a pair
        that has just loaded, from private copies that cannot change in between."""
        with tempfile.TemporaryDirectory(prefix="taugrid-tls-") as tmp:
            cert = pathlib.Path(tmp) / "tls.crt"
            cert.write_bytes(pathlib.Path(self.cert_file).read_bytes())
            key = None
            if self.key_file:
                key = pathlib.Path(tmp) / "tls.key"
                key.touch(mode=0o600)
                key.write_bytes(pathlib.Path(self.key_file).read_bytes())
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
            self.context.load_cert_chain(cert, key)

    async def run(self, interval_s: float) -> None:
        """Check every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.check()
