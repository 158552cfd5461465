"""The commands that make and examine bundles: ``warmup``, ``pack``, ``publish``, ``inspect``, ``why``."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachelib.cli.arguments import CommandError, Terminated, sigterm_raises, store_url, trusted_keys_of
from cachelib.cli.output import leaving, log, masked, print_json
from cachelib.in_image.compilekey import options_from_args
from cachelib.in_image.masking import mask_command, mask_text
from cachelib.in_image.podcontract import CACHEDIR, MEGACACHE_FILE, RESULT_FILE
from cachelib.progress import stderr_bar

if TYPE_CHECKING:
    from cachelib.in_image.stagelog import Stages
    from cachelib.signing import PublicKey, Signature


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
    from cachelib.in_image.podcontract import write_termination_message
    from cachelib.publish import publish

    try:
        with sigterm_raises():  # a warm-up pod stopped mid-publish aborts its upload (cachelib.stores.s3store)
            published = publish(Path(args.source), store_url(args), level=args.level, watch=stderr_bar)
    except (Exception, Terminated) as exc:
        write_termination_message({"result": "error", "stage": "publish", "reason": f"{type(exc).__name__}: {exc}"})
        raise
    payload = published.to_dict()
    print_json(payload)
    write_termination_message(payload)
    return 0


def harness_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """The harness command line for ``compilecache warmup``'s options."""
    from cachelib.in_image import harness

    argv = [sys.executable, harness.__file__]
    argv += ["--target", args.target] if args.target else ["--command", args.command]
    argv += ["--out", str(out), "--namespace", args.namespace, "--name", args.name]
    argv += ["--require-precompile"] if getattr(args, "require_precompile", False) else []
    return argv + options_from_args(args).harness_args()


def cmd_warmup(args: argparse.Namespace) -> int:
    """Every argument and the store checked, then the harness, then the publish. What it leaves on the
    way is said when it fails or is interrupted: the compiled output is never thrown away unpublished."""
    from cachelib.in_image.stagelog import Stages
    from cachelib.publish import publish

    url = store_url(args)  # every argument is checked before anything compiles
    stages = Stages("compilecache warmup")
    given = Path(args.out).absolute() if args.out else None
    if given is not None:
        prepare_out(given, args.force)
    stages.stage(f"checking the store {mask_text(url)}")
    check_store(url)
    out = given or Path(tempfile.mkdtemp(prefix="compilecache-warmup-")) / "out"
    try:
        status = run_harness(args, out, stages)
    except BaseException:
        not_published(out, given)
        raise
    finally:
        stages.done()
    if status != 0:
        not_published(out, given)
        raise CommandError(f"the warm-up harness failed (exit status {status}); see its message above", status)
    leaving(f"the compiled output is kept in {out}; publish it with: {publish_command(out, url)}")
    stages.stage(f"packing, verifying and publishing to {mask_text(url)}")
    try:
        with sigterm_raises():
            published = publish(out, url, level=args.level, watch=stderr_bar)
    except Exception as exc:
        raise CommandError(
            f"publishing failed: {type(exc).__name__}: {exc}; the compiled output is kept in {out}: "
            f"publish it with: {publish_command(out, url)}"
        ) from exc
    finally:
        stages.done()
    if given is None:
        shutil.rmtree(out.parent, ignore_errors=True)
    leaving(None)
    print_json(published.to_dict())
    return 0


def run_harness(args: argparse.Namespace, out: Path, stages: Stages) -> int:
    """The harness in a subprocess (its progress and messages on this stderr); its exit status."""
    argv = harness_argv(args, out)
    log.info("running the harness: %s", " ".join(mask_command(argv)))
    stages.stage(f"running the warm-up harness into {out}")
    stages.done()  # the harness says its own stages from here
    leaving(f"nothing was published; the harness's incomplete output is in {out}")  # until it is removed
    return subprocess.run(argv, stdout=sys.stderr, check=False).returncode


def not_published(out: Path, given: Path | None) -> None:
    """A warm-up that stopped before its publish: a temporary output is removed, a given ``--out`` kept
    (``--force`` replaces it on the next run); what is left is said if SIGINT ended it."""
    if given is None:
        shutil.rmtree(out.parent, ignore_errors=True)
        leaving("nothing was published and nothing was left behind (the harness's output was temporary)")
    else:
        leaving(f"nothing was published; the harness's incomplete output is in {out} (--force replaces it)")


def publish_command(out: Path, url: str) -> str:
    """The one command that publishes a kept output directory (the store URL masked)."""
    return f"compilecache publish {shlex.quote(str(out))} --store {shlex.quote(mask_text(url))}"


def prepare_out(out: Path, force: bool) -> None:
    """``--out`` as the harness takes it: absent or empty. With ``--force`` a warm-up's earlier output
    there is removed first; a directory holding anything else is never removed (a mistyped ``--out``)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise CommandError(f"--out {out}: exists and is not a directory", 2)
    names = sorted(entry.name for entry in out.iterdir())
    if not names:
        return
    if not force:
        raise CommandError(f"--out {out}: exists and is not an empty directory (--force replaces it)", 2)
    from cachelib.in_image.precompileparts import (  # what the harness writes (and its partial files)
        LOG_FILE,
        PASS_SCRATCH,
    )

    ours = {RESULT_FILE, MEGACACHE_FILE, CACHEDIR, LOG_FILE, *PASS_SCRATCH}
    foreign = [n for n in names if n not in ours and not (n.startswith(".") and n.endswith(".partial"))]
    if foreign:
        raise CommandError(
            f"--out {out}: --force replaces a warm-up's output directory only, and this one also holds "
            f"{foreign[0]!r}: remove it yourself or give another --out",
            2,
        )
    shutil.rmtree(out)


def check_store(url: str) -> None:
    """The store can take the bundle, before anything compiles (a compile takes minutes on a GPU)."""
    from cachelib.publish import check_publishable
    from cachelib.stores import StoreError

    try:
        check_publishable(url)
    except StoreError as exc:
        raise CommandError(f"--store: {str(exc).rstrip('.')}; nothing was compiled") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from cachelib.bundlereader import BundleReader, bundle_digest_file
    from cachelib.publish import inspect_bundle
    from cachelib.signing import read_signature
    from cachelib.stores import open_store

    trusted = trusted_keys_of(args)
    if args.store:
        with open_store(store_url(args)) as store:
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
    if args.output == "yaml":
        from cachelib import yamltext

        print(yamltext.dump(masked(header)), end="", flush=True)
    else:
        print(json.dumps(masked(header), indent=2, sort_keys=True))
    if args.verify and trusted and not header["signature"]["verified"]:
        raise CommandError(f"{args.bundle}: {header['signature']['reason']}")
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    from cachelib import verdict
    from cachelib.in_image import factors

    path = Path(args.path)
    if _vllm_manifest(path) is not None:
        return _why_vllm(args, path)
    if args.vllm is not None:
        raise CommandError(f"{path}: --vllm needs a vLLM cache (no {_vllm_manifest_name()} here)")
    pod_verdict = None
    try:
        if path.is_dir():
            warmup = factors.read_document(path / factors.FACTORS_NAME)
            pod = path / verdict.WHY_NAME
            pod_verdict = json.loads(pod.read_text()) if pod.is_file() else None
            no_verdict = verdict.NO_VERDICT.format(name=verdict.WHY_NAME)
        elif path.is_file():
            warmup = verdict.read_bundle_document(path)
            no_verdict = verdict.BUNDLE_NO_VERDICT
        else:
            raise CommandError(f"{path}: neither a cache directory nor a bundle file")
    except (factors.FactorsError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    try:
        here = factors.process_factors()
    except ImportError as exc:
        raise CommandError(f"this process cannot import torch to compare with: {exc}") from exc
    return _print_report(verdict.explain(warmup, here, pod_verdict, no_verdict), args.output, verdict.explain_lines)


def _print_report(report: dict[str, Any], output: str, lines: Callable[[dict[str, Any]], list[str]]) -> int:
    """A ``why`` report as JSON, YAML or its lines of text (each masked)."""
    if output == "json":
        print_json(report)
    elif output == "yaml":
        from cachelib import yamltext

        print(yamltext.dump(masked(report)), end="", flush=True)
    else:
        for line in lines(report):
            print(mask_text(line))
    return 0


def _vllm_manifest_name() -> str:
    from cachelib.in_image.vllmwarm import MANIFEST_NAME

    return MANIFEST_NAME


def _vllm_manifest(path: Path) -> dict[str, Any] | None:
    """A vLLM warm-up's manifest in a cache directory or a bundle file's cachedir part (None: not a vLLM cache)."""
    from cachelib import verdict

    name = _vllm_manifest_name()
    try:
        raw = (path / name).read_bytes() if path.is_dir() else verdict.read_bundle_member(path, name)
    except (OSError, ValueError):
        return None
    try:
        found = json.loads(raw) if raw else None
    except ValueError as exc:
        raise CommandError(f"{path}: {name} is not JSON: {exc}") from exc
    return found if isinstance(found, dict) else None


def _why_vllm(args: argparse.Namespace, path: Path) -> int:
    """``why`` of a vLLM cache: its warm-up's start, a start given with --vllm against it, a pod's verdict."""
    import os
    import shlex

    from cachelib import vllmwatch
    from cachelib.in_image import vllmargs
    from cachelib.verdict import WHY_NAME

    manifest = _vllm_manifest(path) or {}
    pod_file = path / WHY_NAME if path.is_dir() else None
    pod_verdict = json.loads(pod_file.read_text()) if pod_file is not None and pod_file.is_file() else None
    here = None
    if args.vllm is not None:
        here = vllmargs.parse(shlex.split(args.vllm), os.environ)
        if here is None:
            raise CommandError(f"--vllm {args.vllm!r} does not start vLLM's server (vllm serve MODEL ...)", 2)
    return _print_report(vllmwatch.explain(manifest, pod_verdict, here), args.output, vllmwatch.explain_lines)


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
