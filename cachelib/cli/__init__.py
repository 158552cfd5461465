"""The ``compilecache`` command line: warm up, publish, preload, inspect and tidy cache bundles.

This module is the entry point (:func:`main`) and its error handling; the commands live in
:mod:`cachelib.cli.bundles`, :mod:`cachelib.cli.preloading` and :mod:`cachelib.cli.listing`, their
command line in :mod:`cachelib.cli.parser`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from cachelib.cli.arguments import CommandError, Terminated
from cachelib.cli.output import interrupted_line, log, setup_logging
from cachelib.cli.parser import build_parser
from cachelib.in_image.masking import mask_text


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.verbose)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
    except KeyboardInterrupt:
        print(interrupted_line(args.subcommand), file=sys.stderr, flush=True)
        _leave_now_if_abandoned(130)
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except (CommandError, Terminated) as exc:  # Terminated: SIGTERM, where a command turns it into an exception
        return _fail(args, str(exc), exc.exit_code)
    except Exception as exc:
        return _fail(args, f"{type(exc).__name__}: {exc}" if not _is_expected(exc) else str(exc), 1)
    _leave_now_if_abandoned(code)
    return code


def _reader_gone() -> int:
    """Stdout's reader has gone (``compilecache inspect … | head``): end quietly, as a command
    killed by SIGPIPE does (exit status 128 + 13), printing nothing more. Stdout is pointed at
    /dev/null so that the interpreter's last flush at exit has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13


def _leave_now_if_abandoned(code: int) -> None:
    """After a preload called off by its deadline, exit at once: its worker may still be blocked
    on a frozen server, and the interpreter would wait for that worker's threads at exit."""
    deadline = sys.modules.get("cachelib.deadline")
    if deadline is not None and deadline.abandoned_work():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _is_expected(exc: Exception) -> bool:
    from cachelib.bundle import BundleError
    from cachelib.keyformat import InvalidKey
    from cachelib.publish import PackError
    from cachelib.stores import StoreError
    from cachelib.unpack import UnpackError

    return isinstance(exc, BundleError | PackError | StoreError | UnpackError | InvalidKey)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """The error line on stderr, under the subcommand's own name (``--command`` is the model's), masked."""
    message = mask_text(message)
    if args.verbose:
        print(mask_text(traceback.format_exc()), file=sys.stderr, end="")
    if args.log_format == "json":
        log.error(message)
    else:
        print(f"compilecache {args.subcommand}: error: {message}", file=sys.stderr)
    return code
