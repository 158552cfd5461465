"""Linters made for Kubernetes manifests, for the chart tests: kubeconform and kube-score (and helm-docs, which
writes the chart's README). promtool, which tests the chart's alerting rules, is Debian's (the ``prometheus``
package the end-to-end tests run anyway).

All are built from the Go module proxy with ``go install`` and cached outside the checkout, keyed by
version (a warm machine, and CI's fresh clone on it, builds nothing)::

    ${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/tools-kubeconform-<version>/bin/kubeconform
    ${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/tools-kube-score-<version>/bin/kube-score
    ${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/tools-helm-docs-<version>/bin/helm-docs

kubeconform validates against JSON schemas it normally downloads; here they are made offline, from
Go modules in the same module cache (``$COMPILECACHE_TEST_CACHE/go/mod``, shared with
testsupport/kube/build.sh):

- ``tools-schemas-kubernetes-<version>/``: every built-in kind, from ``api/openapi-spec/swagger.json``
  of ``k8s.io/kubernetes`` at the control plane's version and at the oldest supported one
  (``KUBE_VERSION`` and ``KUBE_OLDEST_VERSION`` of testsupport/kube/versions.env), made
  standalone (the definitions a kind uses are embedded) and strict (no unknown fields), named as
  kubeconform looks them up (``<kind>-<group>-<version>.json``).
- ``tools-schemas-prometheus-operator-<version>/`` and ``tools-schemas-cert-manager-<version>/``: the
  CRDs of the kinds the chart renders for them (ServiceMonitor, PodMonitor, PrometheusRule; Issuer,
  Certificate), converted by kubeconform's own ``scripts/openapi2jsonschema.py`` from its module.
- Our own CRD changes with the checkout, so its schema is made per test run (:func:`crd_schemas`).

kube-linter (``golang.stackrox.io/kube-linter``) was the first choice of linter; the module proxy
refuses it (403, under its vanity path and its GitHub path), so kube-score, which the proxy serves,
plays its part.

Shell entry (used by scripts/test.sh)::

    python -m tests.infra.linters           # build what is missing, print the tool paths
    python -m tests.infra.linters --check   # exit 1 when something is not built yet
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSIONS_ENV = REPO_ROOT / "testsupport" / "kube" / "versions.env"


@dataclass(frozen=True)
class GoTool:
    name: str
    module: str
    package: str
    version: str


KUBECONFORM = GoTool("kubeconform", "github.com/yannh/kubeconform", "github.com/yannh/kubeconform/cmd/kubeconform",
                     "0.8.0")
KUBE_SCORE = GoTool("kube-score", "github.com/zegl/kube-score", "github.com/zegl/kube-score/cmd/kube-score", "1.20.0")
HELM_DOCS = GoTool("helm-docs", "github.com/norwoodj/helm-docs", "github.com/norwoodj/helm-docs/cmd/helm-docs",
                   "1.14.2")
"""Writes the chart's README from its template and values.yaml's comments (tests/infra/chartdocs.py)."""
TOOLS = (KUBECONFORM, KUBE_SCORE, HELM_DOCS)
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "0.85.0",
                       "example/prometheus-operator-crd",
                       ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml",
                        "monitoring.coreos.com_prometheusrules.yaml"))
CERT_MANAGER = ("github.com/cert-manager/cert-manager", "1.21.2", "deploy/crds",
                ("cert-manager.io_issuers.yaml", "cert-manager.io_certificates.yaml"))
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


class LintersUnavailable(RuntimeError):
    """A linter or its schemas are not built, or could not be built."""


# -- where things live --------------------------------------------------------------------------------
def cache_root() -> Path:
    default = Path.home() / ".cache" / "compilecache-test"
    return Path(os.environ.get("COMPILECACHE_TEST_CACHE") or default)


def kube_version(name: str = "KUBE_VERSION") -> str:
    """The control plane's Kubernetes version (or the oldest supported: ``KUBE_OLDEST_VERSION``), from
    testsupport/kube/versions.env."""
    for line in KUBE_VERSIONS_ENV.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise LintersUnavailable(f"no {name} in {KUBE_VERSIONS_ENV}")


def tool_path(tool: GoTool, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"tools-{tool.name}-{tool.version}" / "bin" / tool.name


def crd_script(root: Path | None = None) -> Path:
    """kubeconform's scripts/openapi2jsonschema.py, kept beside the binary so that tests need no Go."""
    return tool_path(KUBECONFORM, root).parent.parent / "openapi2jsonschema.py"


def schema_dirs(root: Path | None = None) -> dict[str, Path]:
    """Source name -> the directory of its cached JSON schemas."""
    base = root or cache_root()
    return {
        "kubernetes": base / f"tools-schemas-kubernetes-{kube_version()}",
        "kubernetes-oldest": base / f"tools-schemas-kubernetes-{kube_version('KUBE_OLDEST_VERSION')}",
        "prometheus-operator": base / f"tools-schemas-prometheus-operator-{PROMETHEUS_OPERATOR[1]}",
        "cert-manager": base / f"tools-schemas-cert-manager-{CERT_MANAGER[1]}",
    }


def missing(root: Path | None = None) -> list[str]:
    """What is not built yet (empty when everything is)."""
    out = [str(tool_path(t, root)) for t in TOOLS if not os.access(tool_path(t, root), os.X_OK)]
    out += [] if crd_script(root).is_file() else [str(crd_script(root))]
    out += [str(d) for d in schema_dirs(root).values() if not (d / ".complete").is_file()]
    return out


# -- building -------------------------------------------------------------------------------------------
def go_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The build cache the other Go builds of the set-up use (tests/infra/builds.sh keeps it until all are done).
    env.update(GOMODCACHE=str(root / "go" / "mod"), GOCACHE=str(root / "go" / "build"),
               GOTOOLCHAIN=env.get("GOTOOLCHAIN", "auto"), CGO_ENABLED="0", GOFLAGS="")
    return env


def go(root: Path, *args: str, cwd: Path | None = None, timeout: float = 1800) -> str:
    if shutil.which("go") is None:
        raise LintersUnavailable("go not found on PATH: install Go >= 1.26")
    proc = subprocess.run(["go", *args], capture_output=True, text=True, env=go_env(root), cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        raise LintersUnavailable(f"go {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def module_dir(root: Path, module: str, version: str) -> Path:
    """Download ``module@v<version>`` into the module cache; returns its directory."""
    with tempfile.TemporaryDirectory() as scratch:  # outside any module, so no go.mod is consulted
        info = json.loads(go(root, "mod", "download", "-json", f"{module}@v{version}", cwd=Path(scratch)))
    if info.get("Error") or not info.get("Dir"):
        raise LintersUnavailable(f"go mod download {module}@v{version}: {info.get('Error')}")
    return Path(info["Dir"])


def build_tool(tool: GoTool, root: Path) -> Path:
    target = tool_path(tool, root)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".build-{tool.name}-") as tmp:
        staging = Path(tmp) / "bin"
        staging.mkdir()
        env = go_env(root) | {"GOBIN": str(staging)}
        proc = subprocess.run(["go", "install", "-trimpath", "-ldflags=-s -w", f"{tool.package}@v{tool.version}"],
                              capture_output=True, text=True, env=env, cwd=tmp, timeout=1800)
        if proc.returncode != 0:
            raise LintersUnavailable(f"go install {tool.package}@v{tool.version} failed: {proc.stderr.strip()[-1500:]}")
        target.parent.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target.parent, ignore_errors=True)
        staging.rename(target.parent)
    return target


def _strict(node: Any) -> Any:
    """kubectl's strictness as JSON schema: objects with properties take no other fields."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _referenced(name: str, definitions: Mapping[str, Any]) -> list[str]:
    """``name`` and every definition it reaches through ``$ref``, in a stable order."""
    seen: dict[str, None] = {}
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen[current] = None
        stack.extend(sorted(_refs(definitions[current]), reverse=True))
    return list(seen)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref.removeprefix("#/definitions/")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def kubernetes_schemas(swagger: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """File name -> standalone strict JSON schema, for every kind in a Kubernetes OpenAPI v2 document."""
    definitions = dict(swagger["definitions"])
    # What the API server accepts for these, not what their OpenAPI type says (numbers, too).
    definitions[QUANTITY] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
    definitions[INT_OR_STRING] = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    out: dict[str, dict[str, Any]] = {}
    for name, definition in sorted(definitions.items()):
        for gvk in definition.get("x-kubernetes-group-version-kind") or []:
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            if name.startswith("io.k8s.apimachinery.pkg.apis.meta."):
                continue  # DeleteOptions, WatchEvent, Status...: listed for every group, never manifests
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            used = _referenced(name, definitions)
            schema = {"$schema": "http://json-schema.org/draft-04/schema#", **_strict(definition),
                      "definitions": {n: _strict(definitions[n]) for n in used[1:]}}
            out.setdefault(f"{kind}{suffix}".lower() + ".json", schema)
    return out


def write_kubernetes_schemas(root: Path, target: Path) -> int:
    version = target.name.removeprefix("tools-schemas-kubernetes-")
    swagger_path = module_dir(root, "k8s.io/kubernetes", version) / "api" / "openapi-spec" / "swagger.json"
    schemas = kubernetes_schemas(json.loads(swagger_path.read_text()))
    with _staged(target) as staging:
        for file_name, schema in schemas.items():
            (staging / file_name).write_text(json.dumps(schema))
    return len(schemas)


def convert_crds(crd_files: list[Path], target: Path, root: Path | None = None) -> list[Path]:
    """JSON schemas of CRDs, made by kubeconform's scripts/openapi2jsonschema.py, named as kubeconform looks
    them up. ``metadata`` stays open: the API server checks ObjectMeta itself and a CRD may only narrow
    its name, so the script's strictness must not refuse labels or a namespace there."""
    script = crd_script(root)
    target.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, FILENAME_FORMAT="{kind}-{group}-{version}", DENY_ROOT_ADDITIONAL_PROPERTIES="1")
    proc = subprocess.run([sys.executable, str(script), *map(str, crd_files)], capture_output=True, text=True,
                          cwd=target, env=env, timeout=300)
    if proc.returncode != 0:
        raise LintersUnavailable(f"openapi2jsonschema.py failed: {proc.stdout[-800:]}{proc.stderr[-800:]}")
    written = [target / line.split(" written to ", 1)[1] for line in proc.stdout.splitlines() if " written to " in line]
    for path in written:
        schema = json.loads(path.read_text())
        metadata = schema.get("properties", {}).get("metadata")
        if isinstance(metadata, dict):
            metadata.pop("additionalProperties", None)
        path.write_text(json.dumps(schema))
    return written


def write_crd_schemas(root: Path, source: tuple[str, str, str, tuple[str, ...]], target: Path) -> int:
    module, version, folder, files = source
    crd_dir = module_dir(root, module, version) / folder
    with _staged(target) as staging:
        written = convert_crds([crd_dir / f for f in files], staging, root)
    return len(written)


class _staged:
    """A directory filled under a temporary name and renamed into place, marked complete."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=f".{self.target.name}-"))
        return self.tmp

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        (self.tmp / ".complete").write_text("")
        shutil.rmtree(self.target, ignore_errors=True)
        self.tmp.rename(self.target)


def ensure_linters(root: Path | None = None, log: Any = print) -> dict[str, Path]:
    """Build whatever is missing; returns the tools and schema directories by name. Takes the set-up's build lock
    (testsupport/kube/module.sh's, ``.go-build.lock``): another set-up's build may delete the shared build cache."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".go-build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another set-up's build in {root} to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_linters(root, log)


def _ensure_linters(root: Path, log: Any) -> dict[str, Path]:
    started = time.monotonic()
    for tool in TOOLS:
        if os.access(tool_path(tool, root), os.X_OK):
            log(f"reusing {tool_path(tool, root)}")
        else:
            t0 = time.monotonic()
            log(f"go install {tool.package}@v{tool.version}")
            build_tool(tool, root)
            log(f"built {tool.name} v{tool.version} in {time.monotonic() - t0:.0f}s")
    if not crd_script(root).is_file():
        source = module_dir(root, KUBECONFORM.module, KUBECONFORM.version) / "scripts" / "openapi2jsonschema.py"
        shutil.copyfile(source, crd_script(root))
        log(f"copied {source.name} from {KUBECONFORM.module}@v{KUBECONFORM.version}")
    dirs = schema_dirs(root)
    writers = {
        "kubernetes": lambda d: write_kubernetes_schemas(root, d),
        "kubernetes-oldest": lambda d: write_kubernetes_schemas(root, d),
        "prometheus-operator": lambda d: write_crd_schemas(root, PROMETHEUS_OPERATOR, d),
        "cert-manager": lambda d: write_crd_schemas(root, CERT_MANAGER, d),
    }
    for name, directory in dirs.items():
        if (directory / ".complete").is_file():
            log(f"reusing {directory}")
        else:
            t0 = time.monotonic()
            count = writers[name](directory)
            log(f"wrote {count} {name} schemas to {directory} in {time.monotonic() - t0:.0f}s")
    if os.environ.get("COMPILECACHE_KEEP_GOCACHE") != "1":
        shutil.rmtree(root / "go" / "build", ignore_errors=True)  # only speeds up a rebuild
    log(f"linters ready in {time.monotonic() - started:.0f}s")
    return {**{t.name: tool_path(t, root) for t in TOOLS}, **{f"schemas-{k}": v for k, v in dirs.items()}}


def built() -> dict[str, Path]:
    """The built linters and schema directories by name; LintersUnavailable names what is not built."""
    absent = missing()
    if absent:
        raise LintersUnavailable(
            f"manifest linters not built ({', '.join(absent)}); run `python -m tests.infra.linters`")
    root = cache_root()
    return {**{t.name: tool_path(t, root) for t in TOOLS}, **{f"schemas-{k}": v for k, v in schema_dirs().items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.linters", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether everything is built")
    args = parser.parse_args(argv)
    if args.check:
        absent = missing()
        for path in absent:
            print(f"missing: {path}")
        return 1 if absent else 0
    try:
        ensure_linters(log=lambda m: print(f"[linters] {m}", flush=True))
    except (LintersUnavailable, OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
