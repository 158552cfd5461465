"""TCP relays of the test infrastructure: bytes piped both ways between an accepted connection and an upstream.

``TcpRelay`` makes a server on one address reachable at another (the API server, on loopback, for the real
node's pods at the bridge's gateway); TLS passes through untouched, so the upstream's certificate must name
the address the clients dial. ``splice`` is the piping itself, shared with the e2e tests' own balancers.
``PartitionRelay`` can be cut off mid-request and restored: a server frozen, then back.
"""

from __future__ import annotations

import contextlib
import socket
import threading


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _shut(source, sink)


def _shut(*ends: socket.socket) -> None:
    for end in ends:
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Pipe both ways until either end closes, in two daemon threads. A connection stays up however long it
    is idle (as kube-proxy's conntrack keeps an established connection): no timeout is left on either end."""
    for end in (client, upstream):
        end.settimeout(None)
    for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


class TcpRelay:
    """Accepts on ``listen`` (port 0: a free one, see ``port``) and relays each connection to ``upstream``, or
    to what ``pick()`` (for a subclass: a balancer) names; a connection with nowhere to go is closed."""

    connect_timeout = 5.0

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(listen, backlog=512)
        self.host, self.port = self.listener.getsockname()[:2]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def pick(self) -> tuple[str, int] | None:
        return self.upstream

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            target = self.pick()
            try:
                if target is None:
                    raise ConnectionRefusedError
                upstream = socket.create_connection(target, timeout=self.connect_timeout)
            except OSError:
                client.close()
                continue
            self.relay(client, upstream)

    def relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Pipe one accepted connection to its upstream (a subclass may hold or cut it)."""
        splice(client, upstream)  # the timeout was for connecting: an idle kept-alive connection stays

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class PartitionRelay(TcpRelay):
    """A relay that can be cut off, as a network partition (or a server stopped with SIGSTOP) looks to its clients:
    while ``frozen``, connections are accepted and bytes taken, but nothing is passed on and no answer comes; each
    connection caught in it is closed at ``thaw()`` without passing on what it held (it is gone, as the client gave
    up on it), and connections made afterwards work again. ``freeze_after`` freezes it by itself once that many
    bytes have gone upstream: mid-request, at a point a test chooses. With ``answers_only``, the requests still reach
    the server while frozen and only its answers are held: the server acts on every request, the client hears of
    none (a server that answers too late)."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], freeze_after: int | None = None,
                 answers_only: bool = False) -> None:
        self.freeze_after = freeze_after
        self.answers_only = answers_only
        self.sent = 0
        self.frozen = threading.Event()
        """Set while cut off (a test waits on it to act mid-request)."""
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        super().__init__(listen, upstream)

    def freeze(self) -> None:
        self._open.clear()
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()
        self._open.set()

    def relay(self, client: socket.socket, upstream: socket.socket) -> None:
        for end in (client, upstream):
            end.settimeout(None)
        threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        try:
            while data := source.recv(65536):
                if outbound:
                    with self._lock:
                        self.sent += len(data)
                        if self.freeze_after is not None and self.sent >= self.freeze_after:
                            self.freeze_after = None
                            self.freeze()
                if not self._open.is_set() and not (outbound and self.answers_only):
                    self._open.wait()
                    break  # caught in the partition: cut, what it held is lost
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shut(source, sink)
