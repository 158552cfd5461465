"""A store that cannot be reached raises StoreUnavailable, quickly, naming the URL (password masked)."""

from __future__ import annotations

import io
import socket
from collections.abc import Callable

import pytest

from cachelib.stores import Store, StoreUnavailable, open_store
from testsupport.servers import free_port

OPERATIONS: dict[str, Callable[[Store], object]] = {
    "put": lambda store: store.put("k/v", io.BytesIO(b"data"), 4),
    "get": lambda store: store.get("k/v"),
    "head": lambda store: store.head("k/v"),
    "list": lambda store: list(store.list("k/")),
    "delete": lambda store: store.delete("k/v"),
}


def closed_port_urls() -> dict[str, str]:
    port = free_port()  # nothing listens there
    return {
        "redis": f"redis://:hunter2@127.0.0.1:{port}/0?timeout=2&retries=1",
        "s3": f"s3://bucket/prefix?endpoint=http://127.0.0.1:{port}&timeout=2&retries=1",
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["redis", "s3"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_unreachable_store_is_unavailable(kind: str, operation: str, s3_credentials: None) -> None:
    url = closed_port_urls()[kind]
    with open_store(url) as store, pytest.raises(StoreUnavailable) as caught:
        OPERATIONS[operation](store)
    message = str(caught.value)
    assert "127.0.0.1" in message
    assert "hunter2" not in message


@pytest.fixture
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials, so that the failure is the closed port and not a missing key."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_silent_server_times_out_as_unavailable(kind: str, s3_credentials: None) -> None:
    """A server that accepts connections and never answers: the short timeout turns it into an outage."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = {
            "redis": f"redis://127.0.0.1:{port}/0?timeout=0.5&retries=0",
            "s3": f"s3://bucket?endpoint=http://127.0.0.1:{port}&timeout=0.5&retries=0",
        }[kind]
        with open_store(url) as store, pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
            store.head("k/v")
