"""The commands that bring bundles into a cache directory: ``preload`` (a pod's init container) and ``load``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cachelib.cli.arguments import CommandError, store_url, trusted_keys_of, versions_of
from cachelib.cli.output import leaving, log, print_json
from cachelib.in_image.podcontract import DONE_FILE_NAME
from cachelib.preload import Interrupted
from cachelib.progress import stderr_bar

if TYPE_CHECKING:
    from cachelib.preload import PreloadResult


def cmd_preload(args: argparse.Namespace) -> int:
    from cachelib.handoff import write_done

    if args.sidecar and args.strict:
        raise CommandError(
            "--strict cannot be combined with --sidecar: a sidecar runs beside the workload and cannot hold "
            "its start (preload as an init container for that)",
            2,
        )
    done = args.done_file or (str(Path(args.target) / DONE_FILE_NAME) if args.sidecar else None)
    try:
        result = _fetch_and_report("preload", args)
    except BaseException as exc:  # the workload waiting on the done file must not wait in vain
        if isinstance(exc, KeyboardInterrupt):
            leaving(exc.left() if isinstance(exc, Interrupted) else f"nothing partial was left in {args.target}")
        if done:
            write_done(done, {"result": "error", "reason": f"{type(exc).__name__}: {exc}"})
        raise
    if done:
        write_done(done, result.to_dict())
    if args.sidecar:
        hold_until_terminated()
        return 0
    return result.exit_code(args.strict)


def hold_until_terminated() -> None:
    """Stay running until SIGTERM or SIGINT: a Kubernetes native sidecar that exits is restarted,
    and at the pod's end it is sent SIGTERM (then it exits with status 0)."""
    import gc
    import signal

    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    gc.collect()
    log.info("preload done; waiting for the pod to end (SIGTERM)")
    signal.sigwait(stop)


def cmd_load(args: argparse.Namespace) -> int:
    try:
        return _fetch_and_report("load", args).exit_code(args.strict)
    except Interrupted as exc:
        leaving(exc.left())
        raise


def _fetch(mode: str, args: argparse.Namespace) -> PreloadResult:
    """Run ``preload`` or ``load`` with the command's arguments. Fails open: whatever goes wrong,
    even in this process's own code, ends as an ``error`` result naming the exception."""
    from cachelib.preload import ERROR, PRELOAD, PreloadRequest, PreloadResult, run

    trusted = trusted_keys_of(args)  # a malformed key is a bad argument (exit 2), not a result
    target = Path(args.target) if args.target else None
    try:
        request = PreloadRequest(
            store_url(args),
            args.key or (),
            target.absolute() if target and mode == PRELOAD else target,
            cache=args.cache,
            gpu=args.gpu,
            versions=versions_of(args),
            max_bytes=args.max_bytes,
            max_ratio=args.max_ratio or None,
            deadline=args.deadline or None,
            watch=stderr_bar,
            trusted_keys=trusted,
            **({"share": args.share, "owner": args.owner} if mode == PRELOAD else {}),
        )
        return run(mode, request)
    except Exception as exc:
        log.debug("%s failed", mode, exc_info=True)
        reason = str(exc) if isinstance(exc, CommandError) else f"unexpected {type(exc).__name__}: {exc}"
        return PreloadResult(ERROR, mode=mode, target=args.target, reason=reason)


def _fetch_and_report(mode: str, args: argparse.Namespace) -> PreloadResult:
    """Run ``preload`` or ``load``; print and record the one-line result."""
    from cachelib.in_image.podcontract import write_termination_message

    result = _fetch(mode, args)
    payload = result.to_dict()
    print_json(payload)
    write_termination_message(payload)
    if result.result != "hit":
        log.warning("%s %s: %s", mode, result.result, result.reason)
    return result


def cmd_vllm_watch(args: argparse.Namespace) -> int:
    import json

    from cachelib.vllmwatch import Watch, run

    try:
        prediction = json.loads(args.prediction)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--prediction is not JSON: {exc}", 2) from exc
    if not isinstance(prediction, list) or not all(isinstance(d, dict) and "factor" in d for d in prediction):
        raise CommandError("--prediction: expected a list of {factor, before, after, kind}", 2)
    return run(Watch(Path(args.cache_dir), args.port, prediction, deadline=args.deadline))
