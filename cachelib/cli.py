"""The ``compilecache`` command line: warm up, publish, preload, inspect and tidy cache bundles."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cachelib import __version__
from cachelib.compilekey import BUILTIN_TARGETS, add_compile_arguments, add_model_arguments, options_from_args
from cachelib.masking import install_log_masking, mask_command, mask_text
from cachelib.podcontract import DONE_FILE_NAME
from cachelib.preload import DEFAULT_DEADLINE, DEFAULT_MAX_BYTES, DEFAULT_MAX_RATIO, DEFAULT_SHARE
from cachelib.progress import stderr_bar
from cachelib.stores.base import MAX_SEGMENT_LENGTH
from cachelib.units import human_bytes, parse_size
from cachelib.unpack import SHARE_MODES

if TYPE_CHECKING:
    from cachelib.preload import PreloadResult
    from cachelib.signing import PublicKey, Signature
    from cachelib.stores import Store

STORE_ENV = "COMPILECACHE_STORE"
log = logging.getLogger("compilecache")



class CommandError(Exception):
    """A failure to report as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- helpers ----------------------------------------------------------------------------------------
def parse_size_arg(text: str) -> int:
    """``1073741824``, ``512M``, ``10Gi``, ``2GB`` -> bytes (binary units)."""
    try:
        return parse_size(text, what="--max-bytes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def print_json(payload: Any) -> None:
    print(json.dumps(masked(payload), sort_keys=True, separators=(",", ":")), flush=True)


def masked(payload: Any) -> Any:
    """``payload`` with credentials masked in every string (:func:`cachelib.masking.mask_text`)."""
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


def store_url(args: argparse.Namespace) -> str:
    url: str | None = args.store or os.environ.get(STORE_ENV)
    if not url:
        raise CommandError(f"no store: give --store URL (or set {STORE_ENV})", 2)
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


# -- subcommands -----------------------------------------------------------------------------------
def cmd_pack(args: argparse.Namespace) -> int:
    from cachelib.publish import pack

    written = pack(Path(args.outdir), Path(args.bundle), level=args.level)
    print_json(
        {
            "key": str(written.header.key),
            "bundle": str(args.bundle),
            "bytes": written.bytes,
            "sha256": written.sha256,
            "parts": {p.name: {"size": p.size, "stored_size": p.stored_size} for p in written.header.parts},
        }
    )
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from cachelib.podcontract import write_termination_message
    from cachelib.publish import publish

    try:
        published = publish(Path(args.source), store_url(args), level=args.level, watch=stderr_bar)
    except Exception as exc:
        write_termination_message({"result": "error", "stage": "publish", "reason": f"{type(exc).__name__}: {exc}"})
        raise
    payload = published.to_dict()
    print_json(payload)
    write_termination_message(payload)
    return 0


def harness_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """The harness command line for ``compilecache warmup``'s options."""
    from cachelib import harness

    argv = [sys.executable, harness.__file__]
    argv += ["--target", args.target] if args.target else ["--command", args.command]
    argv += ["--out", str(out), "--namespace", args.namespace, "--name", args.name]
    return argv + options_from_args(args).harness_args()


def cmd_warmup(args: argparse.Namespace) -> int:
    from cachelib.publish import publish
    from cachelib.stores import StoreURLError, parse_store_url

    url = store_url(args)
    try:  # every argument is checked before anything compiles
        parse_store_url(url)
    except StoreURLError as exc:
        raise CommandError(f"--store: {exc}", 2) from None
    with tempfile.TemporaryDirectory(prefix="compilecache-warmup-") as scratch:
        out = Path(args.out) if args.out else Path(scratch) / "out"
        argv = harness_argv(args, out)
        log.info("running the harness: %s", " ".join(mask_command(argv)))
        status = subprocess.run(argv, stdout=sys.stderr, check=False).returncode
        if status != 0:
            raise CommandError(f"the warm-up harness failed (exit status {status}); see its message above", status)
        published = publish(out, url, level=args.level, watch=stderr_bar)
    print_json(published.to_dict())
    return 0


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
    return _fetch_and_report("load", args).exit_code(args.strict)


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
    from cachelib.podcontract import write_termination_message

    result = _fetch(mode, args)
    payload = result.to_dict()
    print_json(payload)
    write_termination_message(payload)
    if result.result != "hit":
        log.warning("%s %s: %s", mode, result.result, result.reason)
    return result


def parse_owner_arg(text: str) -> tuple[int, int]:
    from cachelib.unpack import parse_owner

    try:
        return parse_owner(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_cache_arg(text: str) -> str:
    """``NS/NAME`` as given; anything else is a bad argument (exit status 2)."""
    from cachelib.keyformat import InvalidKey
    from cachelib.preload import parse_cache_ref

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


def cmd_inspect(args: argparse.Namespace) -> int:
    from cachelib.bundle import BundleReader, bundle_digest_file
    from cachelib.publish import inspect_bundle
    from cachelib.signing import read_signature
    from cachelib.stores import open_store

    trusted = trusted_keys_of(args)
    if args.store:
        with open_store(args.store) as store:
            with store.get(args.bundle) as stream:
                reader = BundleReader(stream)
                if args.verify:
                    reader.verify_all()
            header, digest = reader.header.to_dict(), reader.digest
            if args.verify:
                header["signature"] = signature_report(lambda: read_signature(store, args.bundle), digest, trusted)
    else:
        path = Path(args.bundle)
        if not path.is_file():
            raise CommandError(
                f"{path}: no such bundle file (to inspect a stored bundle, give --store URL and its key)"
            )
        header, digest = inspect_bundle(path, verify=args.verify), bundle_digest_file(path)
        if args.verify:
            header["signature"] = signature_report(lambda: _signature_file(path, header["key"]), digest, trusted)
    header["digest"] = digest
    if args.verify:
        header["verified"] = True
    print(json.dumps(header, indent=2, sort_keys=True))
    if args.verify and trusted and not header["signature"]["verified"]:
        raise CommandError(f"{args.bundle}: {header['signature']['reason']}")
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    from cachelib import factors

    path = Path(args.path)
    verdict = None
    try:
        if path.is_dir():
            warmup = factors.read_document(path / factors.FACTORS_NAME)
            pod = path / factors.WHY_NAME
            verdict = json.loads(pod.read_text()) if pod.is_file() else None
        elif path.is_file():
            warmup = factors.read_bundle_document(path)
        else:
            raise CommandError(f"{path}: neither a cache directory nor a bundle file")
    except (factors.FactorsError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    try:
        here = factors.process_factors()
    except ImportError as exc:
        raise CommandError(f"this process cannot import torch to compare with: {exc}") from exc
    report = factors.explain(warmup, here, verdict)
    if args.output == "json":
        print_json(report)
    else:
        for line in factors.explain_lines(report):
            print(mask_text(line))
    return 0


def _signature_file(path: Path, key: str) -> Signature:
    from cachelib.signing import SIGNATURE_SUFFIX, Signature, SignatureError

    where = Path(f"{path}{SIGNATURE_SUFFIX}")
    if not where.is_file():
        raise SignatureError(f"bundle {key} is not signed (no {where})")
    return Signature.from_json(where.read_bytes(), str(where))


def signature_report(
    read: Callable[[], Signature], digest: str, trusted: Sequence[PublicKey]
) -> dict[str, Any]:
    """Who signed the bundle (key id), and whether that verifies with the trusted keys (None: no
    --trusted-key given, so only the claimed signer is shown)."""
    from cachelib.signing import SignatureError, verify

    try:
        signature = read()
    except SignatureError as exc:
        return {"key_id": None, "verified": False if trusted else None, "reason": str(exc)}
    if not trusted:
        return {"key_id": signature.key_id, "verified": None, "reason": "not checked: no --trusted-key given"}
    try:
        return {"key_id": verify(signature, signature.key, digest, trusted), "verified": True, "reason": None}
    except SignatureError as exc:
        return {"key_id": signature.key_id, "verified": False, "reason": str(exc)}


def _prefix(args: argparse.Namespace) -> str:
    from cachelib.keyformat import cache_prefix
    from cachelib.preload import parse_cache_ref

    if args.cache:
        return cache_prefix(*parse_cache_ref(args.cache))
    return str(args.prefix or "")


def open_listed_store(args: argparse.Namespace) -> Store:
    """The store ``ls`` and ``gc`` read. A file store whose directory does not exist is an
    error there (a typo would otherwise list nothing), though a preload counts it as a miss."""
    from cachelib.stores import open_store
    from cachelib.stores.filestore import FileStore

    url = store_url(args)
    store = open_store(url)
    if isinstance(store, FileStore) and not os.path.isdir(store.root):
        raise CommandError(f"{url}: no such store (directory {store.root} does not exist)")
    return store


LS_COLUMNS = ("CACHE", "MODEL", "OPTIONS", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE", "AGE")
LS_WIDE_COLUMNS = ("CACHE", "TARGET", "MODE", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE", "AGE", "KEY")


def cmd_ls(args: argparse.Namespace) -> int:
    from cachelib.inventory import describe, format_age, list_bundles, options_label, target_label

    output = "json" if args.json else args.output
    now = time.time()
    with open_listed_store(args) as store:
        found = list_bundles(store, _prefix(args))
        described = [describe(store, e) if output in ("wide", "json", "yaml") else {} for e in found]
    if output == "json":
        for entry, description in zip(found, described, strict=True):
            print_json({**entry.to_dict(now), **description})
        return 0
    if output == "yaml":  # one document: the list of what -o json prints line by line
        from cachelib import yamltext

        entries = [{**e.to_dict(now), **d} for e, d in zip(found, described, strict=True)]
        print(yamltext.dump(masked(entries)), end="", flush=True)
        return 0
    rows: list[tuple[str, ...]] = [LS_WIDE_COLUMNS if output == "wide" else LS_COLUMNS]
    for e, description in zip(found, described, strict=True):
        k = e.key
        versions = (k.gpu, k.capability, k.torch, k.triton, k.cuda, k.py, human_bytes(e.size), format_age(e.age(now)))
        row: tuple[str, ...]
        if output == "wide":
            row = (f"{k.namespace}/{k.name}", target_label(description), options_label(description), *versions, str(k))
        else:
            row = (f"{k.namespace}/{k.name}", k.model, k.options, *versions)
        rows.append(row)
    print_table(rows)
    print(f"{len(found)} bundle(s), {human_bytes(sum(e.size for e in found))}", file=sys.stderr)
    return 0


def print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def cmd_gc(args: argparse.Namespace) -> int:
    from cachelib.inventory import list_bundles, parse_duration, plan_gc
    from cachelib.signing import delete_signed

    try:
        older_than = parse_duration(args.older_than) if args.older_than else None
        if args.keep == 0 and older_than is None and not args.yes:
            raise ValueError("--keep 0 without --older-than deletes every bundle: refusing without --yes")
        now = time.time()
        with open_listed_store(args) as store:
            doomed = plan_gc(list_bundles(store, _prefix(args)), now, older_than=older_than, keep=args.keep)
            deleted = 0
            for entry in doomed:
                if not args.dry_run and delete_signed(store, str(entry.key)):
                    deleted += 1
                print_json(
                    {
                        "key": str(entry.key),
                        "size": entry.size,
                        "age_seconds": round(entry.age(now), 1),
                        "action": "would delete" if args.dry_run else "deleted",
                    }
                )
    except ValueError as exc:
        raise CommandError(str(exc), 2) from None
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{verb} {len(doomed) if args.dry_run else deleted} bundle(s), {sum(e.size for e in doomed)} bytes",
        file=sys.stderr,
    )
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from cachelib.completion import script

    print(script(args.shell, build_parser()), end="")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cachelib.demo import run_demo

    return run_demo(store=args.store, target=args.target, keep=args.keep)


# -- parser ----------------------------------------------------------------------------------------
def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _add(
    sub: Any, name: str, handler: Callable[[argparse.Namespace], int], summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + examples,
        formatter_class=_formatter,
        parents=[_global_flags(after_command=True)],
    )
    parser.set_defaults(handler=handler)
    return parser


def _global_flags(*, after_command: bool) -> argparse.ArgumentParser:
    """--log-format and -v, accepted before the command and after it (as kubectl's are). After it
    they have no defaults of their own, so that ``-v ls`` keeps the -v given before."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=argparse.SUPPRESS if after_command else "text",
        help="log lines on stderr",
    )
    flags.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if after_command else 0,
        help="more logs; tracebacks on errors",
    )
    return flags


def _store_arg(parser: argparse.ArgumentParser, required_hint: str = "") -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        help="file:///path, redis://host:6379/0, rediss://..., redis-cluster://host:port, s3://bucket/prefix "
        f"(default: ${STORE_ENV}){required_hint}",
    )


def _selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", action="append", metavar="KEY", help="a bundle key (repeat for several)")
    parser.add_argument(
        "--cache", type=parse_cache_arg, metavar="NS/NAME", help="every bundle of this cache (instead of --key)"
    )
    parser.add_argument(
        "--gpu",
        metavar="SLUG",
        help="only this GPU's bundles, e.g. NVIDIA-H100-80GB-HBM3 or cpu "
        "(default: $COMPILECACHE_GPU, else every variant)",
    )
    for field, what in (
        ("torch", "this torch version (2.13.0 also matches 2.13.0+cu128)"),
        ("triton", "this triton version"),
        ("cuda", "this CUDA version ('none': CPU builds)"),
        ("py", "this Python version (major.minor, e.g. 3.11)"),
    ):
        parser.add_argument(f"--{field}", metavar="V", help=f"only bundles built with {what}")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every bundle was a hit")
    parser.add_argument(
        "--max-bytes",
        type=parse_size_arg,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help=f"refuse to unpack more than N bytes in all (default {human_bytes(DEFAULT_MAX_BYTES)})",
    )
    parser.add_argument(
        "--max-ratio",
        type=parse_ratio,
        default=DEFAULT_MAX_RATIO,
        metavar="R",
        help="refuse a bundle part that inflates more than R times its stored size, from its header on "
        "and while it streams (default %(default)g; 0: no limit)",
    )
    _trusted_key_arg(parser)


def _trusted_key_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-key",
        action="append",
        metavar="PUBKEY",
        help="an Ed25519 public key (base64 of its 32 bytes, or PEM) whose signature a bundle must carry; "
        "repeat during a key rotation (default: $COMPILECACHE_TRUSTED_KEYS, comma-separated; none: "
        "signatures are not checked)",
    )


def _deadline_arg(parser: argparse.ArgumentParser, default: float, covers: str) -> None:
    parser.add_argument(
        "--deadline",
        type=parse_seconds,
        default=default,
        metavar="SECONDS",
        help=f"end as an error result after this many seconds in all ({covers}), leaving nothing partial "
        "(default %(default)g; 0: none)",
    )


def _compile_args(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--namespace", type=parse_namespace_arg, default="default",
                        help="namespace of the cache, a Kubernetes namespace name (default: %(default)s)")
    parser.add_argument("--name", type=parse_name_arg, required=True,
                        help=f"name of the cache, a Kubernetes object name of at most {MAX_SEGMENT_LENGTH} characters")
    add_compile_arguments(parser)


class MaskingParser(argparse.ArgumentParser):
    """argparse, with credentials masked in its error lines (they repeat the arguments given)."""

    def error(self, message: str) -> NoReturn:
        super().error(mask_text(message))


def _credential_variables() -> str:
    from cachelib.stores import CREDENTIALS, REDIS_PASSWORD_ENV, S3_ENDPOINT_ENVS

    s3 = ", ".join(c.env for c in CREDENTIALS["s3"])
    return (f"  {REDIS_PASSWORD_ENV}  Redis password (redis://, rediss://, *-cluster://)\n"
            f"  {s3}  S3 credentials (else boto3's chain: profile, web identity, instance role)\n"
            f"  {', '.join(S3_ENDPOINT_ENVS)}  S3-compatible endpoint\n")


HELP_EXIT_AND_ENV = (
    "exit statuses:\n"
    "  0  done (preload and load: also a miss or a bad bundle, unless --strict)\n"
    "  1  failed: the store, the bundle or the command's work (one line on stderr says why)\n"
    "  2  bad arguments, before anything runs\n"
    "  130  interrupted; 141  the reader of stdout went away (as SIGPIPE)\n\n"
    "credentials (environment only, never printed):\n" + _credential_variables() +
    "  COMPILECACHE_STORE  default --store; COMPILECACHE_TRUSTED_KEYS  default --trusted-key"
)


def build_parser() -> argparse.ArgumentParser:
    parser = MaskingParser(
        prog="compilecache",
        description="Warm starts for torch.compile. Compile a model once (warmup), publish the compiled\n"
        "caches as a bundle to a store (a directory, Redis or S3), and preload that bundle before a\n"
        "process starts, so that its torch.compile finds everything cached instead of compiling again.",
        epilog="Start with `compilecache demo`: it does all of that on this machine's CPU in about a minute.\n\n"
        "examples:\n"
        "  compilecache demo\n"
        "  compilecache warmup --target tiny_mlp --name demo --store file:///tmp/store\n"
        "  compilecache ls --store file:///tmp/store\n"
        "  compilecache preload --store file:///tmp/store --cache default/demo --target /tmp/inductor\n"
        "  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor python train.py\n\n" + HELP_EXIT_AND_ENV,
        formatter_class=_formatter,
        parents=[_global_flags(after_command=False)],
    )
    parser.add_argument("--version", action="version", version=f"compilecache {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    p = _add(
        sub,
        "warmup",
        cmd_warmup,
        "compile a model with the harness, then pack and publish the bundle",
        "Run the warm-up harness (cachelib/harness.py) with this Python in a subprocess: it compiles the\n"
        "target into a fresh inductor cache directory. Then pack that directory into a bundle, verify\n"
        "it and publish it under its cache key. Prints the publish result as JSON.",
        "  compilecache warmup --target tiny_mlp --name demo --store file:///tmp/store\n"
        "  compilecache warmup --target mypkg.models:warm --namespace ml --name llama --backward \\\n"
        "      --mode max-autotune --store s3://bucket/compilecache",
    )
    _compile_args(p)
    _store_arg(p)
    p.add_argument("--out", help="keep the harness output directory here (default: a temporary one)")
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level (default: %(default)s)")

    p = _add(
        sub,
        "pack",
        cmd_pack,
        "turn a harness output directory into a bundle file",
        "Pack OUTDIR (result.json, megacache.bin, cachedir/ written by the harness) into one bundle\n"
        "file: header JSON plus zstd-compressed parts. Prints the key, size and sha256 as JSON.",
        "  compilecache pack /tmp/out /tmp/demo.ccb",
    )
    p.add_argument("outdir", help="the harness output directory")
    p.add_argument("bundle", help="the bundle file to write")
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level (default: %(default)s)")

    p = _add(
        sub,
        "publish",
        cmd_publish,
        "pack (if needed), verify and put a bundle into a store",
        "Pack OUTDIR (or take a bundle file), read it back to verify every part, then put it into the\n"
        "store under its cache key; readers never see a partial bundle. Prints key, sha256 and bytes as\n"
        "JSON and writes the same to the termination log ($COMPILECACHE_TERMINATION_LOG, default\n"
        "/dev/termination-log) when there is one.",
        "  compilecache publish /out --store redis://cache:6379/0\n"
        "  compilecache publish /tmp/demo.ccb --store file:///tmp/store",
    )
    p.add_argument("source", help="harness output directory or bundle file")
    _store_arg(p)
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level when packing (default: %(default)s)")

    p = _add(
        sub,
        "preload",
        cmd_preload,
        "fetch, verify and unpack bundles into a cache directory (no torch)",
        "Resolve the bundle keys (--key, or --cache NS/NAME listed from the store and filtered by GPU and\n"
        "versions), fetch each, verify its sha256, and unpack its cache directory into --target\n"
        "atomically. Prints one JSON line: result hit|miss|error, keys, bytes, seconds, reason; also\n"
        "written to the termination log when there is one. A missing bundle or an unreachable store\n"
        "is a miss, a bad bundle an error: either way exit status 0 (the pod starts, compiling as\n"
        "usual) unless --strict (then 1). A --deadline that passes (default 30 s), a bundle that\n"
        "inflates beyond --max-ratio and any failure nobody foresaw are errors too. Point TORCHINDUCTOR_CACHE_DIR at\n"
        "--target; --share decides which users may write it (default: the directory's group, e.g. the\n"
        "pod's fsGroup). A bundle the target already holds complete (a node cache) is a hit without a\n"
        "download. With --sidecar it runs beside the workload instead of before it: the workload waits\n"
        "for the done file just before its first compiled call (cachelib.handoff.wait_for_preload).",
        "  compilecache preload --store file:///tmp/store --cache default/demo --target /tmp/inductor\n"
        "  compilecache preload --store s3://bucket/cc --key cc1/ml/llama/... --target /cache --strict\n"
        "  compilecache preload --store redis://cache:6379/0 --cache ml/llama --gpu NVIDIA-H100-80GB-HBM3 \\\n"
        "      --torch 2.13.0 --target /cache\n"
        "  compilecache preload --store redis://cache:6379/0 --cache ml/llama --target /cache --sidecar\n"
        "  compilecache preload --store s3://bucket/cc --cache ml/llama --target /node-cache/inductor \\\n"
        "      --share all --owner 1000:1000 --deadline 20",
    )
    _store_arg(p)
    _selection_args(p)
    _deadline_arg(p, DEFAULT_DEADLINE, "connecting, fetching and unpacking")
    p.add_argument("--target", required=True, help="the cache directory to fill (TORCHINDUCTOR_CACHE_DIR)")
    p.add_argument(
        "--share",
        choices=SHARE_MODES,
        default=DEFAULT_SHARE,
        help="who may write the unpacked cache: owner (only the preload's uid), group (directories 2775 "
        "setgid, files 664: any uid of the directory's group, e.g. the pod's fsGroup), all (777/666: any "
        "uid) (default: %(default)s)",
    )
    p.add_argument(
        "--owner",
        type=parse_owner_arg,
        metavar="UID:GID",
        help="hand the unpacked tree to this uid and gid (needs CAP_CHOWN, e.g. a preload running as root)",
    )
    p.add_argument(
        "--done-file",
        metavar="PATH",
        help="when finished, write the JSON result here (atomically) for a workload waiting in "
        f"cachelib.handoff.wait_for_preload() (default with --sidecar: TARGET/{DONE_FILE_NAME})",
    )
    p.add_argument(
        "--sidecar",
        action="store_true",
        help="run as a Kubernetes native sidecar beside the workload: write the done file, then stay "
        "running until SIGTERM (exit status 0 whatever the result)",
    )

    p = _add(
        sub,
        "load",
        cmd_load,
        "feed bundles' Mega-Cache part to torch.compiler.load_cache_artifacts()",
        "Like preload, but loads the portable Mega-Cache part through torch (which must be installed)\n"
        "into the inductor cache directory: --target, else $TORCHINDUCTOR_CACHE_DIR, else torch's default.\n"
        "On a CPU the Mega-Cache lacks the compiled C++ objects; preload carries them.",
        "  compilecache load --store file:///tmp/store --cache default/demo --target /tmp/inductor",
    )
    _store_arg(p)
    _selection_args(p)
    _deadline_arg(p, 120.0, "connecting, fetching, importing torch and loading")
    p.add_argument("--target", help="inductor cache directory to load into")

    p = _add(
        sub,
        "inspect",
        cmd_inspect,
        "print a bundle's header",
        "Print the header of a bundle file (or, with --store, of a stored bundle given by its key) as\n"
        "JSON: key, versions, job id, producer, compile result, parts with sizes and sha256.",
        "  compilecache inspect /tmp/demo.ccb\n"
        "  compilecache inspect /tmp/demo.ccb --verify\n"
        "  compilecache inspect --store file:///tmp/store cc1/default/demo/...",
    )
    p.add_argument("bundle", help="bundle file, or a key with --store")
    p.add_argument("--store", metavar="URL", help="read the bundle from this store")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every part and check its sha256, and show who signed the bundle (key id; checked "
        "against --trusted-key when given, exit 1 when it does not verify)",
    )
    _trusted_key_arg(p)

    p = _add(
        sub,
        "why",
        cmd_why,
        "say which factor of torch's cache keys differs from the warm-up",
        "Compare what the warm-up recorded (compilecache-factors.json in a cache directory or a bundle's\n"
        "cachedir part: versions, installation, device, environment, and per graph the configs, inputs and\n"
        "source lines) with this process's versions, installation, device and environment; for a cache\n"
        "directory a pod used, also print the pod's verdict per graph (compilecache-why.json): hit, or the\n"
        "factor that differed with both values.",
        "  compilecache why $TORCHINDUCTOR_CACHE_DIR\n  compilecache why /tmp/demo.ccb -o json",
    )
    p.add_argument("path", help="a cache directory, or a bundle file")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")

    p = _add(
        sub,
        "ls",
        cmd_ls,
        "list the bundles in a store",
        "List the bundles in a store with their key fields, size and age. -o wide also reads each bundle's\n"
        "header for the target it was compiled from and its compile mode, and shows the whole key; -o json\n"
        "prints one JSON object per line with all of that (--json is the same).",
        "  compilecache ls --store file:///tmp/store\n"
        "  compilecache ls --store file:///tmp/store -o wide\n"
        "  compilecache ls --store s3://bucket/cc --cache ml/llama -o json",
    )
    _store_arg(p)
    p.add_argument("--cache", type=parse_cache_arg, metavar="NS/NAME", help="only this cache's bundles")
    p.add_argument("--prefix", help="only keys starting with this prefix")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "yaml"),
        default="table",
        help="table (default), wide (adds target, mode and key from each bundle's header), json (JSON lines) or "
        "yaml (one list)",
    )
    p.add_argument("--json", action="store_true", help="the same as -o json")

    p = _add(
        sub,
        "gc",
        cmd_gc,
        "delete old bundles",
        "Delete bundles by age and/or keep the N newest per group. A group is one cache, model, option set\n"
        "and GPU; its bundles differ by software versions. A bundle is deleted when it is older than\n"
        "--older-than (if given) and not among the --keep newest of its group (if given).",
        "  compilecache gc --store file:///tmp/store --older-than 7d --dry-run\n"
        "  compilecache gc --store s3://bucket/cc --keep 2\n"
        "  compilecache gc --store redis://cache:6379/0 --cache ml/llama --older-than 30d --keep 1",
    )
    _store_arg(p)
    p.add_argument("--cache", type=parse_cache_arg, metavar="NS/NAME", help="only this cache's bundles")
    p.add_argument("--prefix", help="only keys starting with this prefix")
    p.add_argument("--older-than", metavar="AGE", help="e.g. 7d, 12h, 30m")
    p.add_argument("--keep", type=int, metavar="N", help="keep the N most recently published per group")
    p.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    p.add_argument("--yes", action="store_true", help="confirm --keep 0 without --older-than (deletes every bundle)")

    p = _add(
        sub,
        "demo",
        cmd_demo,
        "warm a model on the CPU, then start warm in a fresh process (no cluster)",
        "Compile a built-in model on the CPU with the harness and publish it to a file store (a temporary\n"
        "one unless --store), then do what a pod does: preload the bundle into an empty cache directory\n"
        "in a fresh process and compile the same model there. Prints cold vs warm first-call times,\n"
        "torch's cache hit counters and the Prometheus metrics of the warm process.",
        "  compilecache demo\n  compilecache demo --target transformer_block --store file:///tmp/store",
    )
    _store_arg(p)
    p.add_argument(
        "--target",
        default="tiny_mlp",
        choices=BUILTIN_TARGETS,
        help="built-in model (default: %(default)s)",
    )
    p.add_argument("--keep", action="store_true", help="keep the demo's working directory")

    p = _add(
        sub,
        "completion",
        cmd_completion,
        "print the shell completion script (bash or zsh)",
        "Print a completion script for SHELL: the commands, their flags and the values of flags with a fixed\n"
        "set (-o, --log-format, ...).",
        '  eval "$(compilecache completion bash)"    # in ~/.bashrc\n'
        '  eval "$(compilecache completion zsh)"     # in ~/.zshrc',
    )
    from cachelib.completion import SHELLS

    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help=" or ".join(SHELLS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.verbose)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except CommandError as exc:
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
    preload = sys.modules.get("cachelib.preload")
    if preload is not None and preload.abandoned_work():
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


if __name__ == "__main__":
    sys.exit(main())
