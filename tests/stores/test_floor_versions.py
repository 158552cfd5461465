"""The lowest versions pyproject.toml allows, for real: a lowest-direct-dependencies lane.

The preloader image installs ``compilecache[redis,s3]`` with whatever versions its builder
resolves, and pyproject.toml allows all of them down to the floors it names. This lane
installs exactly those floors (each direct requirement of the core and of the ``redis`` and
``s3`` extras at its lowest allowed version; pip resolves the rest) into a virtual environment
kept outside the checkout, under ``$COMPILECACHE_TEST_CACHE`` (default
``~/.cache/compilecache-test``), keyed by the pins and the Python version so that later runs
reuse it. Then this checkout's ``compilecache`` runs in that environment against a real
redis-server, a three-primary Redis Cluster and the S3 endpoint: publish, preload, a
node-cache hit, a listing across the cluster's primaries, a refused password, an unreachable
store.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from tests.cachelib.helpers import ROOT, last_json, make_key, make_outdir
from testsupport import unavailable
from testsupport.servers import RedisCluster, RedisServer, S3Server, free_port, start_redis

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("COMPILECACHE_TEST_CACHE") or "~/.cache/compilecache-test").expanduser()
EXTRAS = ("redis", "s3")
"""The extras the preloader image installs."""
_REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(\[[A-Za-z0-9_,.-]+\])?\s*>=\s*([0-9][A-Za-z0-9.]*)$")
KEY = make_key()


def floors(pyproject: dict[str, object]) -> dict[str, str]:
    """``name[extras]`` -> the floor version of every requirement of the core and :data:`EXTRAS`.

    Every one must name a floor (``>=``): an unbounded requirement has no lowest version to test.
    """
    project = pyproject["project"]
    assert isinstance(project, dict)
    requirements = list(project["dependencies"])
    for extra in EXTRAS:
        requirements += project["optional-dependencies"][extra]
    found = {}
    for requirement in requirements:
        if requirement.startswith("compilecache"):
            continue
        match = _REQUIREMENT.match(requirement.replace(" ", ""))
        assert match, f"pyproject.toml: requirement {requirement!r} names no floor (NAME>=VERSION)"
        found[match.group(1) + (match.group(2) or "")] = match.group(3)
    return found


def project_floors() -> dict[str, str]:
    return floors(tomllib.loads((ROOT / "pyproject.toml").read_text()))


def test_every_store_requirement_names_a_floor() -> None:
    found = project_floors()
    assert {"zstandard", "redis[hiredis]", "boto3", "botocore"} <= set(found)


@pytest.fixture(scope="module")
def floor_python() -> Path:
    """The interpreter of the floor environment, created on first use and reused afterwards."""
    pins = sorted(f"{name}=={version}" for name, version in project_floors().items())
    tag = hashlib.sha256(json.dumps([pins, sys.version_info[:2]]).encode()).hexdigest()[:12]
    venv = CACHE / f"floor-{tag}"
    python = venv / "bin" / "python"
    done = venv / "installed.json"
    if not done.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
        proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *pins],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if proc.returncode != 0:
            unavailable(f"cannot install the floor versions {pins} (offline?):\n{proc.stderr[-2000:]}")
        done.write_text(json.dumps(pins) + "\n")
    return python


def run_floor(python: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``compilecache ARGS`` from this checkout, on the floor environment's packages."""
    return subprocess.run(
        [str(python), "-m", "cachelib.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
        check=False, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
    )  # fmt: skip


def test_the_lane_runs_the_floor_versions(floor_python: Path) -> None:
    wanted = project_floors()
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    names = [name.split("[")[0] for name in wanted]
    proc = subprocess.run([str(floor_python), "-c", code, *names], capture_output=True, text=True, check=True)
    have = json.loads(proc.stdout)
    assert {n: Version(have[n.split("[")[0]]) for n in wanted} == {n: Version(v) for n, v in wanted.items()}


def test_redis_store_at_the_floor(floor_python: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.store_url(chunk="64K")
    out = make_outdir(tmp_path / "out", KEY)
    published = run_floor(floor_python, "publish", str(out), "--store", url)
    assert published.returncode == 0, published.stderr
    target = tmp_path / "cache"
    first = run_floor(floor_python, "preload", "--store", url, "--cache", f"{KEY.namespace}/{KEY.name}",
                      "--target", str(target))  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert last_json(first.stdout)["result"] == "hit" and last_json(first.stdout)["source"] == "store"
    again = run_floor(floor_python, "preload", "--store", url, "--key", str(KEY), "--target", str(target))
    assert last_json(again.stdout)["source"] == "node-cache"
    assert (target / "fxgraph/ab/fabc/entry").read_bytes() == b"graph" * 100


def test_redis_cluster_store_at_the_floor(floor_python: Path, redis_cluster: RedisCluster, tmp_path: Path) -> None:
    url = redis_cluster.store_url(chunk="64K")
    keys = [make_key(torch=f"2.{minor}.0") for minor in range(10, 14)]
    for index, key in enumerate(keys):
        published = run_floor(floor_python, "publish", str(make_outdir(tmp_path / f"out{index}", key)), "--store", url)
        assert published.returncode == 0, published.stderr
    listed = run_floor(floor_python, "ls", "--store", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(line)["key"] for line in listed.stdout.splitlines()) == sorted(map(str, keys))
    target = tmp_path / "cache"
    proc = run_floor(floor_python, "preload", "--store", url, "--key", str(keys[-1]), "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["result"] == "hit" and last_json(proc.stdout)["source"] == "store"
    assert (target / "fxgraph/ab/fabc/entry").read_bytes() == b"graph" * 100
    pruned = run_floor(floor_python, "gc", "--store", url, "--keep", "1")
    assert pruned.returncode == 0, pruned.stderr
    listed = run_floor(floor_python, "ls", "--store", url, "--json")
    assert [json.loads(line)["key"] for line in listed.stdout.splitlines()] == [str(keys[-1])]


def test_redis_failures_at_the_floor_are_results(floor_python: Path, tmp_path: Path) -> None:
    """A refused password and a closed port: a ``miss`` with its reason, never a crash."""
    with start_redis(tmp_path / "redis", password="right-pw") as server:
        refused = run_floor(floor_python, "preload", "--store", f"redis://:wrong@{server.host}:{server.port}/0",
                            "--key", str(KEY), "--target", str(tmp_path / "a"))  # fmt: skip
    closed = run_floor(floor_python, "preload", "--store", f"redis://127.0.0.1:{free_port()}/0?retries=0",
                       "--key", str(KEY), "--target", str(tmp_path / "b"))  # fmt: skip
    for proc in (refused, closed):
        assert proc.returncode == 0, proc.stderr
        payload = last_json(proc.stdout)
        assert payload["result"] == "miss" and payload["reason"].startswith("store unavailable"), payload
    assert "invalid username-password" in last_json(refused.stdout)["reason"]


def test_s3_store_at_the_floor(floor_python: Path, s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.new_bucket(part="5M")
    files = {"big/object.so": os.urandom(11 * 1024 * 1024), "fxgraph/entry": b"graph"}  # a multipart upload
    published = run_floor(floor_python, "publish", str(make_outdir(tmp_path / "out", KEY, files=files)),
                          "--store", url, env=s3_server.env)  # fmt: skip
    assert published.returncode == 0, published.stderr
    target = tmp_path / "cache"
    proc = run_floor(floor_python, "preload", "--store", url, "--key", str(KEY), "--target", str(target),
                     env=s3_server.env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["result"] == "hit"
    assert (target / "big/object.so").read_bytes() == files["big/object.so"]
    again = run_floor(floor_python, "preload", "--store", url, "--key", str(KEY), "--target", str(target),
                      env=s3_server.env)  # fmt: skip
    assert last_json(again.stdout)["source"] == "node-cache"
