"""``compilecache predict``: whether the pods of a manifest will start warm, told as the admission tells it
(:mod:`cachelib.prediction`), from files or ``kubectl get`` and without a write to any cluster."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cachelib import prediction
from cachelib.cli.arguments import CommandError
from cachelib.cli.output import print_json
from cachelib.in_image.masking import mask_text

COLD_EXIT = 3
"""The exit status when a pod is predicted to start cold (0: none is; 1: an error; 2: bad arguments)."""
KUBECTL_TIMEOUT = 60.0


def read_documents(path: str) -> list[dict[str, Any]]:
    """The objects in a JSON or YAML file (``-`` for stdin): one, several YAML documents, or a List's items."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path}: not UTF-8 text") from None
    return parse_documents(text, path)


def parse_documents(text: str, where: str) -> list[dict[str, Any]]:
    """The objects in JSON or YAML ``text`` (read from ``where``, for messages)."""
    try:
        loaded: list[Any] = [json.loads(text)]
    except ValueError:
        try:
            import yaml
        except ImportError:
            raise CommandError(f"{where}: not JSON, and reading YAML needs PyYAML (pip install pyyaml)") from None
        try:
            loaded = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise CommandError(f"{where}: neither JSON nor YAML: {' '.join(str(exc).split())}") from None
    documents = [d for d in loaded if d is not None]
    bad = [type(d).__name__ for d in documents if not isinstance(d, dict)]
    if bad:
        raise CommandError(f"{where}: expected Kubernetes objects (mappings), found a {bad[0]}")
    return [d for d in documents if isinstance(d, dict)]


def kubectl_cache(namespace: str, name: str, kubectl: str, context: str | None) -> dict[str, Any]:
    """The CompileCache as ``kubectl get compilecache -o json`` shows it (a read; nothing is written)."""
    binary = shutil.which(kubectl)
    if binary is None:
        raise CommandError(f"{kubectl}: not found on PATH (give the CompileCache as a file with --cache-file)")
    argv = [binary, *(["--context", context] if context else []), "get", "compilecache", name, "-n", namespace,
            "-o", "json"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise CommandError(f"kubectl get compilecache {name} -n {namespace}: no answer in {KUBECTL_TIMEOUT:.0f} s") \
            from None  # fmt: skip
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise CommandError(f"kubectl get compilecache {name} -n {namespace}: {mask_text(said)}")
    return parse_documents(done.stdout, "kubectl's answer")[0]


def pick_cache(documents: Sequence[Mapping[str, Any]], wanted: str | None, where: str) -> Mapping[str, Any]:
    """The CompileCache named ``wanted`` (``NS/NAME``) among ``documents``, or the only one when none is named."""
    caches = [d for c in documents for d in _items(c) if d.get("kind") == "CompileCache"]
    named = {f"{(c.get('metadata') or {}).get('namespace', '')}/{(c.get('metadata') or {}).get('name', '')}": c
             for c in caches}  # fmt: skip
    if not caches:
        raise CommandError(f"{where}: no CompileCache in it")
    if wanted is None:
        if len(caches) > 1:
            raise CommandError(f"{where}: {len(caches)} CompileCaches ({', '.join(sorted(named))}): name one with "
                               "--cache NS/NAME")  # fmt: skip
        return caches[0]
    if wanted not in named:
        raise CommandError(f"{where}: no CompileCache {wanted} (it has {', '.join(sorted(named))})")
    return named[wanted]


def _items(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A List's items (``kubectl get -o json`` of several objects), else the document."""
    if str(document.get("kind") or "").endswith("List"):
        return [i for i in document.get("items") or [] if isinstance(i, Mapping)]
    return [document]


def predict_documents(
    cache: Mapping[str, Any], documents: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One answer per pod the documents make: its prediction against ``cache``, or why the webhook leaves it
    alone (not opted in to this cache, or the cache is not Ready)."""
    meta = cache.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    known = prediction.cache_from_body(cache)
    answers: list[dict[str, Any]] = []
    for document in documents:
        if document.get("kind") == "CompileCache":
            continue
        try:
            pods = prediction.pods_of(document)
        except prediction.ManifestError as exc:
            raise CommandError(str(exc)) from None
        for what, pod in pods:
            answers.append({"object": what, **answer(pod, cache, known, namespace, name)})
    return answers


def answer(pod: Mapping[str, Any], body: Mapping[str, Any], known: prediction.Cache, namespace: str,
           name: str) -> dict[str, Any]:  # fmt: skip
    """One pod's answer (pure)."""
    label = prediction.opted_in_cache(pod)
    pod_namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    if label != name or (pod_namespace and pod_namespace != namespace):
        return {"prediction": "none", "detail": f"not opted in to CompileCache {namespace}/{name} (the pod's "
                f"{prediction.CACHE_LABEL} label is {label!r}, its namespace {pod_namespace or 'not set'!r})"}
    if not prediction.cache_ready(body):
        return {"prediction": prediction.COLD, "cause": "none",
                "detail": f"CompileCache {namespace}/{name} is not Ready: its pods start without a preload"}
    found = prediction.predict(pod, known, prediction.vllm_starts(body, pod))
    return found.to_dict()


def cmd_predict(args: argparse.Namespace) -> int:
    documents = [d for path in args.filename for d in read_documents(path)]
    if args.cache_file:
        cache = pick_cache(read_documents(args.cache_file), args.cache, args.cache_file)
    else:
        if args.cache is None:
            raise CommandError("name the CompileCache: --cache NS/NAME (read with kubectl), or --cache-file FILE")
        namespace, name = args.cache.split("/", 1)
        cache = kubectl_cache(namespace, name, args.kubectl, args.context)
    try:
        answers = predict_documents(cache, documents)
    except prediction.ManifestError as exc:
        raise CommandError(str(exc)) from None
    if not answers:
        raise CommandError(f"{', '.join(args.filename)}: no Pod, nor a workload with a pod template")
    if args.output == "json":
        print_json(answers)
    else:
        for found in answers:
            print(mask_text(f"{found['object']}: {found['prediction']}: {found['detail']}"))
    return COLD_EXIT if any(a["prediction"] == prediction.COLD for a in answers) else 0
