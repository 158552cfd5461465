"""How the command line writes: JSON and tables on stdout, log lines on stderr, credentials masked."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from cachelib.in_image.masking import install_log_masking, mask_text

log = logging.getLogger("compilecache")


def print_json(payload: Any) -> None:
    print(json.dumps(masked(payload), sort_keys=True, separators=(",", ":")), flush=True)


def masked(payload: Any) -> Any:
    """``payload`` with credentials masked in every string (:func:`cachelib.in_image.masking.mask_text`)."""
    if isinstance(payload, str):
        return mask_text(payload)
    if isinstance(payload, dict):
        return {key: masked(value) for key, value in payload.items()}
    if isinstance(payload, list | tuple):
        return [masked(value) for value in payload]
    return payload


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, sort_keys=True)


def setup_logging(log_format: str, verbose: int) -> None:
    install_log_masking()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING)


def print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


_left: list[str] = []


def leaving(note: str | None) -> None:
    """What the command would leave behind if it were interrupted now (None: nothing worth saying);
    said in one line when SIGINT ends it (:func:`interrupted_line`)."""
    _left[:] = [note] if note else []


def interrupted_line(command: str) -> str:
    """The one line an interrupted command ends with: what it left where (masked)."""
    note = _left[0] if _left else "nothing was left behind"
    return mask_text(f"compilecache {command}: interrupted: {note}")
