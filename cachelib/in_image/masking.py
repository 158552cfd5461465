"""Credentials masked out of whatever is shown: the one function that decides, for URLs and command lines.

A credential can sit in any part of a URL, and a URL that does not parse may still hold one, so
the masking works on the text, not on a parse (``urlsplit("redis://:pa#PW@h")`` puts ``PW`` in the
fragment, ``redis://:pa/PW@h`` in the path):

- user info: everything between ``scheme://`` and the last ``@`` of the URL, a bare user name
  included (``redis://TOKEN@host`` names no password, but the token is one);
- query parameters whose name says secret (``password``, ``token``, ``secret``, ``key``,
  ``signature``, ``credential``, ``auth``, ...): their values;
- the fragment, whole.

:func:`mask_text` masks every URL in a message, ``user:password@host`` without a scheme, and the
values of ``password=...``-like words (a command line, an exception's text); :func:`mask_url` is
the same for one URL, and :func:`mask_command` for an argument vector (``--password X`` too).
What is masked reads ``***``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
SECRET_WORDS = ("pass", "pwd", "token", "secret", "key", "sig", "credential", "auth", "session", "cookie")
"""A query parameter, option or ``name=value`` word whose name contains one of these holds a secret."""
NOT_SECRET = frozenset({"ca", "prefix", "keep", "keys", "trusted-key", "trusted_key"})
"""Names that match :data:`SECRET_WORDS` but hold no secret (a CA path, a public key's path)."""

_URL = re.compile(r"(?P<scheme>[A-Za-z][-A-Za-z0-9+.]*)://(?P<rest>\S*)")
_TRAILER = re.compile(r"['\"`)>\],;]*$")
_SECRET_NAME = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][-A-Za-z0-9_.]*)(?P<eq>=)(?P<value>[^\s&;,'\"]+)")
_BARE_USERINFO = re.compile(r"(?<![\w/@:.%~+-])[\w.%~+-]+:[^\s/@'\"\[\]()]+@(?=[A-Za-z0-9\[])")
_OPTION = re.compile(r"^--?(?P<name>[A-Za-z][-A-Za-z0-9_]*)(?:=(?P<value>.*))?$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether a parameter, option or variable of this name holds a credential."""
    return name.lower() not in NOT_SECRET and bool(_SECRET_NAME.search(name))


def mask_url(url: str) -> str:
    """``url`` with its user info, its secret query values and its fragment replaced by ``***``."""
    return _URL.sub(_mask_match, url) if "://" in url else _mask_assignments(url)


def mask_text(text: str) -> str:
    """A message with every URL in it masked (:func:`mask_url`) and the values of words such as
    ``password=...`` or ``token: ...`` too."""
    if not isinstance(text, str):
        text = str(text)
    if "://" in text:
        text = _URL.sub(_mask_match, text)
    if "@" in text:
        text = _BARE_USERINFO.sub(f"{MASK}@", text)
    return _mask_assignments(text)


def mask_command(argv: Iterable[str]) -> list[str]:
    """An argument vector as it may be shown: URLs masked, and the value of ``--password X`` /
    ``--token=X`` options (any option whose name says secret)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        option = _OPTION.match(arg)
        if option and is_secret_name(option.group("name")):
            if option.group("value") is None:
                hide_next = True
                out.append(arg)
            else:
                out.append(f"{arg.split('=', 1)[0]}={MASK}")
            continue
        out.append(mask_text(arg))
    return out


def install_log_masking() -> None:
    """Mask every log record of this process as it is made (:func:`mask_text` on its message and
    its traceback), whoever logs it and wherever it goes (a handler, Kopf's events). Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "masks_credentials", False):
        return

    def masked(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: left for logging to report
            return record
        shown = mask_text(message)
        if shown != message:
            record.msg, record.args = shown, ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        return record

    masked.masks_credentials = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masked)


def _mask_match(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    trailer = _TRAILER.search(rest)
    closing = trailer.group(0) if trailer else ""  # the quote or bracket around the URL, kept
    rest = rest[: len(rest) - len(closing)]
    if "@" in rest:  # user info, wherever the parser would have put it: up to the last '@'
        rest = f"{MASK}@{rest.rsplit('@', 1)[1]}"
    fragment = ""
    if "#" in rest:
        rest, fragment = rest.split("#", 1)[0], f"#{MASK}"
    if "?" in rest:
        head, query = rest.split("?", 1)
        rest = f"{head}?{_mask_query(query)}"
    return f"{scheme}://{rest}{fragment}{closing}"


def _mask_query(query: str) -> str:
    parts = []
    for item in query.split("&"):
        name, eq, _value = item.partition("=")
        parts.append(f"{name}={MASK}" if eq and is_secret_name(name) else item)
    return "&".join(parts)


def _mask_assignments(text: str) -> str:
    if "=" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")) or match.group("value") == MASK:
            return match.group(0)
        return f"{match.group('name')}{match.group('eq')}{MASK}"

    return _ASSIGNMENT.sub(replace, text)


__all__ = ["MASK", "install_log_masking", "is_secret_name", "mask_command", "mask_text", "mask_url"]
