"""Any uid can use the preloaded cache: the preload runs as one user, the workload as another.

As in a pod: the preloader image's uid (65532) fills the cache directory on a volume, then a
real torch.compile on the CPU runs in a fresh process as the app's uid (1000), sharing nothing
with the preloader but the pod's fsGroup (``--share group``), or nothing at all (``--share
all``, a pod without fsGroup). ``--share owner`` (owner-only write, directories 0755) makes the
same workload fail on its first compile: the test the other two are measured against. Tests
run as root and drop to those users with ``setpriv``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachelib.in_image import harness
from tests.cachelib.conftest import WARM_NAME, WARM_NAMESPACE, WARM_TARGET, Warmed
from tests.cachelib.helpers import ROOT, last_json, run_cli

pytestmark = pytest.mark.slow

PRELOADER = (65532, 65532)
APP = (1000, 1000)
FS_GROUP = 4242


def as_user(uid: int, gid: int, groups: tuple[int, ...]) -> list[str]:
    """``setpriv`` that runs the rest of the command line as uid:gid with exactly these groups."""
    extra = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return ["setpriv", "--reuid", str(uid), "--regid", str(gid), *extra]


def user_env(home: Path, name: str) -> dict[str, str]:
    """The environment of a process of another user: its own HOME and name (torch derives a few
    paths from the user name), no bytecode written into the checkout."""
    return {**os.environ, "HOME": str(home), "USER": name, "LOGNAME": name, "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def store(warmed: Warmed) -> Iterator[str]:
    """The warm-up's bundle in a file store every uid can read (removed afterwards)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run processes as other users")
    root = Path(tempfile.mkdtemp(prefix="compilecache-shared-"))
    try:
        url = f"file://{root / 'store'}"
        proc = run_cli("publish", str(warmed.out), "--store", url)
        assert proc.returncode == 0, proc.stderr
        for directory, _, _ in os.walk(root):
            os.chmod(directory, 0o755)
        yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


def preload_as_preloader(store: str, target: Path, share: str, groups: tuple[int, ...]) -> dict[str, object]:
    proc = subprocess.run(
        [*as_user(*PRELOADER, groups), sys.executable, "-m", "cachelib.cli", "preload", "--store", store,
         "--cache", f"{WARM_NAMESPACE}/{WARM_NAME}", "--target", str(target), "--share", share],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
        env=user_env(target.parent, "preloader"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def app_python() -> tuple[str, dict[str, str]]:
    """An interpreter the app's uid can run again from inside itself (torch starts ``sys.executable``
    to probe the CPU), with the environment that finds torch and cachelib: this one when its path
    is open to every uid, else the system's Python of the same version with this one's packages."""
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', '0'], check=True)"
    here = subprocess.run([*as_user(*APP, ()), sys.executable, "-c", probe], capture_output=True, check=False)
    if here.returncode == 0:
        return sys.executable, {}
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system):
        pytest.skip(f"{sys.executable} cannot be run by other uids and there is no {system}")
    paths = [p for p in sys.path if p.endswith("site-packages")]
    return system, {"PYTHONPATH": os.pathsep.join([str(ROOT), *paths])}


def compile_as_app(
    python: tuple[str, dict[str, str]], cache_dir: Path, work: Path, groups: tuple[int, ...]
) -> subprocess.CompletedProcess[str]:
    """The harness's compile of the warmed target (a tiny MLP), as the app's uid, into ``cache_dir``."""
    home = work / "home"
    home.mkdir(mode=0o777)
    out = work / "out"
    executable, extra = python
    return subprocess.run(
        [*as_user(*APP, groups), executable, harness.__file__, "--target", WARM_TARGET, "--out", str(out),
         "--namespace", WARM_NAMESPACE, "--name", WARM_NAME, "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, cwd=work, timeout=600, check=False,
        env={**user_env(home, "app"), **extra},
    )  # fmt: skip


def volume(open_dir: Path, fs_group: int | None) -> Path:
    """A pod volume as the kubelet leaves it: with an fsGroup, owned by that group, setgid and
    closed to others (only the group in common); without one, open to every uid."""
    vol = open_dir / "vol"
    vol.mkdir()
    if fs_group is None:
        vol.chmod(0o777)
    else:
        os.chown(vol, 0, fs_group)
        vol.chmod(0o2770)
    work = open_dir / "app"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    return vol


CASES = {
    # name: (share, fsGroup of the pod)
    "group": ("group", FS_GROUP),
    "all": ("all", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_app_of_another_uid_compiles_warm_from_the_preloaded_cache(
    store: str, app_python: tuple[str, dict[str, str]], open_dir: Path, case: str
) -> None:
    share, fs_group = CASES[case]
    groups = (fs_group,) if fs_group is not None else ()
    target = volume(open_dir, fs_group) / "inductor"
    result = preload_as_preloader(store, target, share, groups)
    assert result["result"] == "hit" and result["share"] == share
    proc = compile_as_app(app_python, target, open_dir / "app", groups)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cache = json.loads((open_dir / "app" / "out" / "result.json").read_text())["cache"]
    assert cache["fxgraph_hit"] > 0 and cache["fxgraph_miss"] == 0, cache
    assert any((target / "locks").iterdir()), "the app took no lock in the preloaded locks/"
    assert {p.stat().st_uid for p in (target / "locks").iterdir()} == {APP[0]}


def test_owner_only_write_fails_the_app_of_another_uid(
    store: str, app_python: tuple[str, dict[str, str]], open_dir: Path
) -> None:
    """Owner-only write: the app, in the pod's group but not the preloader's uid, cannot create its
    lock files, and its first compile fails although the preload said hit."""
    target = volume(open_dir, FS_GROUP) / "inductor"
    result = preload_as_preloader(store, target, "owner", (FS_GROUP,))
    assert result["result"] == "hit"
    proc = compile_as_app(app_python, target, open_dir / "app", (FS_GROUP,))
    assert proc.returncode != 0
    assert "PermissionError" in proc.stderr and f"{target}/" in proc.stderr, proc.stderr[-3000:]
