"""What the command line's arguments mean: their checks, and the store, keys and versions they name."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cachelib.stores.base import MAX_SEGMENT_LENGTH
from cachelib.units import parse_size

if TYPE_CHECKING:
    from cachelib.signing import PublicKey



STORE_ENV = "COMPILECACHE_STORE"


class CommandError(Exception):
    """A failure to report as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(BaseException):
    """SIGTERM, raised in the main thread by :func:`sigterm_raises`: what is under way unwinds through its
    ``finally`` and ``except`` blocks (an S3 upload aborts itself) within the pod's grace period, instead of the
    process ending where it stood. A BaseException, as KeyboardInterrupt is, so that no ``except Exception``
    takes it for an error to retry."""

    exit_code = 128 + signal.SIGTERM


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated` in the main thread (elsewhere, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_size_arg(text: str) -> int:
    """``1073741824``, ``512M``, ``10Gi``, ``2GB`` -> bytes (binary units)."""
    try:
        return parse_size(text, what="--max-bytes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def store_url(args: argparse.Namespace) -> str:
    url: str | None = args.store or os.environ.get(STORE_ENV)
    if not url:
        raise CommandError(f"no store: give --store URL (or set {STORE_ENV})", 2)
    from cachelib.stores import StoreURLError, parse_store_url

    try:  # a URL that cannot name a store is a bad argument (exit 2), for every command alike
        parse_store_url(url)
    except StoreURLError as exc:
        raise CommandError(f"--store: {exc}", 2) from None
    return url


def trusted_keys_of(args: argparse.Namespace) -> tuple[PublicKey, ...]:
    """--trusted-key values, else $COMPILECACHE_TRUSTED_KEYS (comma-separated); empty: none."""
    from cachelib.signing import TRUSTED_KEYS_ENV, KeyFormatError, parse_public_keys

    texts = args.trusted_key or [os.environ.get(TRUSTED_KEYS_ENV, "")]
    try:
        return parse_public_keys(texts)
    except KeyFormatError as exc:
        raise CommandError(f"--trusted-key: {exc}", 2) from None


def versions_of(args: argparse.Namespace) -> dict[str, str | None]:
    return {"torch": args.torch, "triton": args.triton, "cuda": args.cuda, "py": args.py}


def parse_owner_arg(text: str) -> tuple[int, int]:
    from cachelib.unpack import parse_owner

    try:
        return parse_owner(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_cache_arg(text: str) -> str:
    """``NS/NAME`` as given; anything else is a bad argument (exit status 2)."""
    from cachelib.keyformat import InvalidKey, parse_cache_ref

    try:
        parse_cache_ref(text)
    except InvalidKey:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}") from None
    return text


def parse_namespace_arg(text: str) -> str:
    """A Kubernetes namespace name (a DNS label)."""
    from cachelib.keyformat import InvalidKey, check_cache_ref

    try:
        check_cache_ref(text, "x")
    except InvalidKey as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("namespace: ")) from None
    return text


def parse_name_arg(text: str) -> str:
    """A cache name: a Kubernetes object name that fits one segment of a store key."""
    from cachelib.keyformat import InvalidKey, check_cache_ref

    try:
        check_cache_ref("x", text)
    except InvalidKey as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("name: ")) from None
    if len(text) > MAX_SEGMENT_LENGTH:
        raise argparse.ArgumentTypeError(
            f"{len(text)} characters: a cache name is one segment of every store key, at most {MAX_SEGMENT_LENGTH}"
        )
    return text


def parse_level_arg(text: str) -> int:
    """A zstd compression level, 1 to 22."""
    try:
        level = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= level <= 22:
        raise argparse.ArgumentTypeError(f"{level} is not a zstd level from 1 to 22")
    return level


def parse_seconds(text: str) -> float:
    """A non-negative number of seconds (0: none)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds such as 30 (0: none), got {text!r}")
    return value


def parse_ratio(text: str) -> float:
    """A compression ratio of at least 1 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value == 0 or 1 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a ratio of at least 1 such as 200 (0: no limit), got {text!r}")
    return value
