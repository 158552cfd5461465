"""The webhook server's TLS context, reloaded in place when its certificate changes (no restart).

The webhook server listens with one :class:`ssl.SSLContext` for its whole life; a new certificate is
loaded into that same context, so the next TLS handshake presents it while the listening socket and
the connections already open stay as they are. A renewed certificate comes from the operator's own
Secret (:mod:`compilecache_operator.edge.servingcert`), from cert-manager's Secret or a user's mounted as
files (checked every few seconds: the kubelet updates a mounted Secret by swapping a link, not by an
event anyone can wait on). A certificate and key that do not load together are refused and the one
served stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable

from compilecache_operator.edge import certs

log = logging.getLogger(__name__)


def server_context() -> ssl.SSLContext:
    return ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)


class Reloader:
    """The live server context and the files it was loaded from."""

    def __init__(self, files: certs.CertFiles, on_load: Callable[[bytes], None] = lambda _: None) -> None:
        self.files = files
        self.context = server_context()
        self.on_load = on_load
        """Called with the certificate (PEM) each time one is loaded, e.g. to export its expiry."""
        self._digest = ""
        if not self.check():
            raise certs.CertError(f"{files.cert} and {files.key} do not load as a certificate and its key")

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            return self.files.cert.read_bytes(), self.files.key.read_bytes()
        except OSError:
            return None

    def check(self) -> bool:
        """Load the files into the context if they changed; False when they are unusable (the context keeps
        what it had)."""
        read = self._read()
        if read is None:
            return False
        digest = hashlib.sha256(read[0] + b"\0" + read[1]).hexdigest()
        if digest == self._digest:
            return True
        try:  # a trial context first: a failed load_cert_chain may leave a context half-changed
            server_context().load_cert_chain(self.files.cert, self.files.key)
            self.context.load_cert_chain(self.files.cert, self.files.key)
        except (ssl.SSLError, OSError) as exc:
            log.warning("webhook certificate %s not loaded: %s; still serving the previous one", self.files.cert, exc)
            return False
        if self._digest:
            log.info("webhook certificate reloaded from %s (expires %s)", self.files.cert,
                     certs.not_after(read[0]).isoformat())
        self._digest = digest
        self.on_load(read[0])
        return True

    async def watch(self, interval: float) -> None:
        """Check the files every ``interval`` seconds, forever."""
        while True:
            await asyncio.sleep(interval)
            self.check()
