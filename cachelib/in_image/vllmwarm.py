"""The warm-up of a vLLM server: start it the way the pods do, with dummy weights, until it has answered once.

It runs inside the user's own image, like ``harness.py``, and needs nothing but the standard library and the
companions the warm-up Job copies beside it (:mod:`cachelib.in_image.compilekey`, :mod:`cachelib.in_image.compilestep`,
:mod:`cachelib.in_image.podcontract`, :mod:`cachelib.in_image.vllmargs` and its table
:mod:`cachelib.in_image.vllm_options`)::

    python3 vllmwarm.py --out /work/out --namespace ml --name qwen \\
        --invocation '{"command": ["vllm", "serve"], "model": "Qwen/Qwen3-8B", "args": ["--max-model-len", "8192"]}'

The server is started with the pod's command, model and arguments, the container's ``VLLM_*`` variables,
``VLLM_CACHE_ROOT=OUT/cachedir/vllm`` and ``TORCHINDUCTOR_CACHE_DIR=OUT/cachedir``, and these added last (the
last value of an option wins, and none of them enters vLLM's compile key): ``--load-format dummy`` (random
weights: nothing is downloaded but the model's configuration), ``--skip-tokenizer-init`` (no tokenizer),
``--host 127.0.0.1 --port <free port>``. Once ``/health`` answers, one completion of a few tokens goes through
its API; then the server is stopped (SIGINT, as Ctrl-C; SIGKILL to its process group after a grace period).

It writes the output directory ``compilecache publish`` packs:

- ``OUT/cachedir/vllm/`` -- what vLLM keeps under its cache root and reads again at start-up:
  ``torch_compile_cache/`` (the AOT artifact ``torch_aot_compile/<hash>/rank_<r>_<dp>/model`` and its
  ``inductor_cache/``), ``modelinfos/`` (its model inspection) and ``startup_plan/`` when
  ``VLLM_ENABLE_STARTUP_PLAN=1``; nothing else;
- ``OUT/cachedir/`` -- also Inductor's own cache, which vLLM uses when ``VLLM_USE_AOT_COMPILE=0``;
- ``OUT/cachedir/compilecache-vllm.json`` -- the manifest (:data:`MANIFEST_NAME`): vLLM's version, the
  start as the pods make it (:class:`cachelib.in_image.vllmargs.Invocation`), vLLM's hash directories and the
  digest of each artifact, the kernels compiled, the first answer's tokens and the seconds it took;
- ``OUT/megacache.bin`` (empty: vLLM compiled in its own process) and ``OUT/result.json`` (the key fields,
  with vLLM's version in the options digest, versions, device).

Exit status as the harness's: 0 done, 2 bad arguments, 4 vLLM failed (exited, never ready, refused the
request), 6 output cannot be written.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.vllmwarm
    from cachelib.in_image import compilekey, compilestep, podcontract, vllmargs
else:  # run as a script in the warm-up pod: the warm-up Job copies these modules beside this file
    import compilekey
    import compilestep
    import podcontract
    import vllmargs

PRODUCER = "compilecache-vllm-warmup/1"
MANIFEST_NAME = "compilecache-vllm.json"
MANIFEST_FORMAT = 1
ROOT_SUBDIR = podcontract.VLLM_ROOT_SUBDIR
"""``VLLM_CACHE_ROOT`` inside the cache directory (the pods get the same layout)."""
SHIPPED = ("torch_compile_cache", "modelinfos", "startup_plan")
"""What of vLLM's cache root a bundle carries: what it reads again at start-up."""
AOT_DIR = "torch_compile_cache/torch_aot_compile"
ADDED_ARGS = ("--load-format", "dummy", "--skip-tokenizer-init")
PROMPT = [1, 2, 3, 4]
"""The first request's prompt, as token ids (the server runs without a tokenizer)."""
MAX_TOKENS = 8
DEFAULT_READY_TIMEOUT = 3600.0
STOP_GRACE = 60.0
LOG_TAIL = 40
_INIT_TOOK = re.compile(r"init engine .* took ([0-9.]+) s")
_LOAD_FAILURE = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)$")
_LOADED = re.compile(r"Directly load AOT compilation from path (\S+)")


class WarmupError(compilestep.HarnessError):
    """The server could not be warmed; the message says what vLLM did, with the end of its log."""


@dataclass(frozen=True)
class Request:
    out: Path
    namespace: str
    name: str
    command: tuple[str, ...]
    model: str
    args: tuple[str, ...]
    ready_timeout: float = DEFAULT_READY_TIMEOUT

    @property
    def cache_dir(self) -> Path:
        return self.out / podcontract.CACHEDIR

    @property
    def root(self) -> Path:
        return self.cache_dir / ROOT_SUBDIR

    def argv(self) -> list[str]:
        """The pods' command line: the launcher, the model (``vllm serve MODEL``, else ``--model MODEL``), the
        arguments."""
        return vllmargs.command_line(self.command, self.model, self.args)

    def invocation(self, env: Mapping[str, str]) -> vllmargs.Invocation:
        found = vllmargs.parse(self.argv(), env)
        if found is None:
            raise compilestep.HarnessError(
                f"the command {list(self.command)} does not start vLLM's server (vllm serve, or python -m "
                f"{vllmargs.LAUNCH_MODULES[0]})", compilestep.EXIT_USAGE,
            )  # fmt: skip
        return found


# -- the server ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_environment(request: Request, job_id: str, base: Mapping[str, str]) -> dict[str, str]:
    """The container's environment with vLLM's cache root and Inductor's cache directory in the output."""
    env = {k: v for k, v in base.items() if k != "TRITON_CACHE_DIR"}  # Triton's cache inside Inductor's
    env.update({
        podcontract.VLLM_CACHE_ROOT_ENV: str(request.root), podcontract.CACHE_DIR_ENV: str(request.cache_dir),
        podcontract.JOB_ID_ENV: job_id, "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
    })  # fmt: skip
    return env


class Server:
    """vLLM's server as a child process in its own session, its output passed on and its tail kept."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int) -> None:
        self.argv = list(argv)
        self.port = port
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.init_seconds: float | None = None
        self.loaded: list[str] = []
        self.load_failures: list[str] = []
        try:
            self.process = subprocess.Popen(
                self.argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise compilestep.HarnessError(
                f"cannot start {self.argv[0]!r}: {exc.strerror or exc}", compilestep.EXIT_FAILED
            ) from exc
        assert self.process.stdout is not None
        self.reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            sys.stdout.write(line + "\n")
            self.tail.append(line)
            if (took := _INIT_TOOK.search(line)) is not None:
                self.init_seconds = float(took.group(1))
            if (failed := _LOAD_FAILURE.search(line)) is not None:
                self.load_failures.append(failed.group(2).strip())
            if (loaded := _LOADED.search(line)) is not None:
                self.loaded.append(loaded.group(1))
        sys.stdout.flush()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def failure(self, what: str) -> WarmupError:
        tail = "\n".join(list(self.tail)[-12:])
        return WarmupError(f"{what}; the end of vLLM's output:\n{tail}", compilestep.EXIT_FAILED)

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; raises when the server exits or the timeout passes first."""
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise self.failure(f"vLLM exited with status {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as answer:
                    if answer.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - started > timeout:
                raise self.failure(f"vLLM was not ready after {timeout:g} s")
            time.sleep(0.5)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(path), timeout=60) as answer:
            return json.loads(answer.read())

    def complete(self, model: str) -> dict[str, Any]:
        """One completion through the server's API: the tokens it answered and the seconds it took."""
        body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        request = urllib.request.Request(
            self.url("/v1/completions"), data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                reply = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise self.failure(f"vLLM refused the first request: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise self.failure(f"the first request to vLLM failed: {exc}") from exc
        choice = (reply.get("choices") or [{}])[0]
        return {"token_ids": choice.get("token_ids"), "seconds": round(time.monotonic() - started, 3)}

    def stop(self) -> int | None:
        """SIGINT (vLLM shuts its engine down as on Ctrl-C), then SIGKILL to the session after the grace period."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                print(f"vllmwarm: vLLM did not stop within {STOP_GRACE:g} s: killing it", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of its session is left (engine processes)
        self.process.wait()
        self.reader.join(10)
        return self.process.returncode


# -- what vLLM left -----------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def keep_shipped(root: Path) -> list[str]:
    """Remove from vLLM's cache root what it does not read again at start-up; what was removed."""
    import shutil

    removed = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name not in SHIPPED:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed.append(entry.name)
    return removed


def inductor_entries(directory: Path) -> list[str]:
    """The FX-graph and AOTAutograd entries of an Inductor cache directory, as ``kind/name``."""
    found = []
    for kind in ("fxgraph", "aotautograd"):
        base = directory / kind
        if base.is_dir():
            found += [f"{kind}/{p.relative_to(base).as_posix()}" for p in sorted(base.rglob("*")) if p.is_file()]
    return found


def describe_tree(cache_dir: Path) -> dict[str, Any]:
    """vLLM's hash directories, the digest of each compiled artifact and the kernels of each Inductor cache."""
    root = cache_dir / ROOT_SUBDIR
    aot = root / AOT_DIR
    hashes = sorted(p.name for p in aot.iterdir() if p.is_dir()) if aot.is_dir() else []
    artifacts = [
        {"path": p.relative_to(cache_dir).as_posix(), "sha256": sha256_file(p), "size": p.stat().st_size}
        for h in hashes for p in sorted((aot / h).glob("rank_*/model")) if p.is_file()
    ]  # fmt: skip
    compiled = root / "torch_compile_cache"
    other = sorted(p.name for p in compiled.iterdir() if p.is_dir() and p.name != "torch_aot_compile") if (
        compiled.is_dir()) else []  # fmt: skip
    inductor = {"": inductor_entries(cache_dir)}
    for h in hashes:
        inductor[f"{ROOT_SUBDIR}/{AOT_DIR}/{h}/inductor_cache"] = inductor_entries(aot / h / "inductor_cache")
    return {
        "aot_hashes": hashes, "hashes": other, "artifacts": artifacts,
        "inductor": {k: v for k, v in inductor.items() if v},
        "startup_plan": (root / "startup_plan").is_dir(), "modelinfos": (root / "modelinfos").is_dir(),
    }  # fmt: skip


def engine_versions(python: str, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """torch, Triton, CUDA and Python versions and the device, as vLLM's own interpreter sees them."""
    here = str(Path(__file__).absolute().parent)
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import compilestep; "
        "print(json.dumps([compilestep.detect_versions(), compilestep.detect_device()]))"
    )
    done = subprocess.run([python, "-c", code, here], env=dict(env), capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        raise compilestep.HarnessError(
            f"cannot read torch's version with {python}: {done.stderr.strip()[-500:]}", compilestep.EXIT_FAILED
        )
    versions, device = json.loads(lines[-1])
    return versions, device


def engine_python(argv: Sequence[str]) -> str:
    """The interpreter that runs vLLM: ``python -m ...``'s, the ``vllm`` script's (its ``#!`` line), else ours."""
    import shutil

    program = shutil.which(argv[0]) if argv else None
    if program and vllmargs.launcher_length(argv) in (3, 4):
        return program
    try:
        with open(program or "", "rb") as script:
            first = script.readline().decode(errors="replace")
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name == "env" and len(words) > 1:
            return shutil.which(words[1]) or sys.executable
        if words and Path(words[0]).is_file():
            return words[0]
    return sys.executable


def key_fields(
    request: Request, invocation: vllmargs.Invocation, version: str, device: Mapping[str, Any],
    versions: Mapping[str, str],
) -> dict[str, str]:
    """The cache key: the model string as the model digest; vLLM's version, the arguments and the hashed
    variables as the options digest; GPU and versions as for any warm-up."""
    model = compilekey.digest({"engine": "vllm", "model": request.model})
    options = compilekey.digest({
        "engine": "vllm", "version": version, "args": list(request.args), "env": dict(invocation.env),
    })  # fmt: skip
    return compilekey.key_fields(request.namespace, request.name, model, options, device, versions)


def warm_up(request: Request, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Start vLLM, wait until it answers once, stop it; write the output directory; the result."""
    environ = dict(os.environ if environ is None else environ)
    job_id = environ.get(podcontract.JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    invocation = request.invocation(environ)
    request.root.mkdir(parents=True, exist_ok=True)
    env = server_environment(request, job_id, environ)
    port = free_port()
    argv = [*request.argv(), *ADDED_ARGS, "--host", "127.0.0.1", "--port", str(port)]
    print(f"vllmwarm: starting {' '.join(argv)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    server = Server(argv, env, port)
    try:
        ready = server.wait_ready(request.ready_timeout)
        served = (server.get("/v1/models").get("data") or [{}])[0].get("id") or request.model
        version = str(server.get("/version").get("version") or "unknown")
        first = server.complete(served)
    finally:
        status = server.stop()
    total = time.monotonic() - started
    removed = keep_shipped(request.root)
    tree = describe_tree(request.cache_dir)
    versions, device = engine_versions(engine_python(argv), env)
    versions = {**versions, "vllm": version}
    fields = key_fields(request, invocation, version, device, versions)
    seconds = {"ready": round(ready, 3), "first_answer": first["seconds"], "total": round(total, 3),
               "engine_init": server.init_seconds}  # fmt: skip
    manifest = {
        "format": MANIFEST_FORMAT, "producer": PRODUCER, "vllm": version, "invocation": invocation.to_dict(),
        "table": vllmargs.VLLM_VERSION, "aot_loads": server.loaded, "aot_load_failures": server.load_failures,
        "first_tokens": first["token_ids"], "seconds": seconds, "removed": removed, **tree,
    }  # fmt: skip
    write_json(request.cache_dir / MANIFEST_NAME, manifest)
    compilestep.write_atomic(request.out / podcontract.MEGACACHE_FILE, b"")
    result = {
        "format": 1, "producer": PRODUCER, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "key": fields, "key_string": compilekey.key_string(fields), "job_id": job_id,
        "versions": versions, "device": device, "cache_dir": str(request.cache_dir),
        "compile_seconds": round(server.init_seconds if server.init_seconds is not None else ready, 4),
        "megacache": {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest(), "artifacts": {}},
        "engine": {
            "name": "vllm", "version": version, "command": list(request.command), "model": request.model,
            "args": list(request.args), "env": dict(invocation.env), "aot_hashes": tree["aot_hashes"],
            "artifacts": len(tree["artifacts"]), "seconds": seconds, "exit_status": status,
            "first_tokens": first["token_ids"],
        },
    }  # fmt: skip
    write_json(request.out / podcontract.RESULT_FILE, result)
    return result


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    compilestep.write_atomic(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())


# -- command line ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllmwarm.py",
        description="Start a vLLM server as the pods do, with dummy weights, until it answered once; write "
        "OUT/{result.json,megacache.bin,cachedir/} for `compilecache publish`.",
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory (created; must be empty)")
    parser.add_argument("--namespace", required=True, help="namespace of the CompileCache")
    parser.add_argument("--name", required=True, help="name of the CompileCache")
    parser.add_argument(
        "--invocation", required=True, help='JSON: {"command": [...], "model": "...", "args": [...]}'
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT,
        help="seconds to wait for /health (default: %(default)s)",
    )  # fmt: skip
    return parser


def request_from_args(args: argparse.Namespace) -> Request:
    try:
        given = json.loads(args.invocation)
    except json.JSONDecodeError as exc:
        raise compilestep.HarnessError(f"--invocation is not JSON: {exc}", compilestep.EXIT_USAGE) from exc
    command, model, rest = given.get("command"), given.get("model"), given.get("args", [])
    if not isinstance(command, list) or not command or not all(isinstance(w, str) for w in command):
        raise compilestep.HarnessError("--invocation: command must be a non-empty list of strings", 2)
    if not isinstance(model, str) or not model:
        raise compilestep.HarnessError("--invocation: model must be a non-empty string", 2)
    if not isinstance(rest, list) or not all(isinstance(w, str) for w in rest):
        raise compilestep.HarnessError("--invocation: args must be a list of strings", 2)
    out = args.out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise compilestep.HarnessError(f"--out {out}: exists and is not an empty directory", compilestep.EXIT_USAGE)
    return Request(out, args.namespace, args.name, tuple(command), model, tuple(rest), args.ready_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        request = request_from_args(args)
        request.invocation(os.environ)  # a command that starts no vLLM server is a usage error, before it runs
        result = warm_up(request)
    except compilestep.HarnessError as exc:
        print(f"vllmwarm: error: {exc}", file=sys.stderr)
        podcontract.write_termination_message({"result": "error", "stage": "compile", "reason": str(exc)})
        return exc.exit_code
    engine = result["engine"]
    print(json.dumps({
        "result": "compiled", "key": result["key_string"], "job_id": result["job_id"], "vllm": engine["version"],
        "aot_hashes": engine["aot_hashes"], "seconds": engine["seconds"],
    }, sort_keys=True))  # fmt: skip
    return compilestep.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
