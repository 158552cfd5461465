"""The images built with podman and the podman runner of pods' containers.

Pure tests check the image inputs hash and the ``podman run`` argv a container spec turns into. The tests
marked ``slow`` build (or reuse) the real images with ``tests.infra.images.ensure_images()`` and run real
containers from them: as the users, groups, read-only root file systems and capabilities the specs ask
for, with emptyDir volumes made the kubelet's way, and against a real redis-server and the moto S3 server
on loopback. Where podman cannot run containers they skip with the reason, and fail with CI=true.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from cachelib.keyformat import CacheKey
from tests.cachelib.helpers import make_key, make_outdir, tree
from tests.infra import containers, images
from tests.infra.containers import ContainerConfigError, VolumeMount
from testsupport import unavailable
from testsupport.servers import fresh_store_url

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="changes file ownership: needs root")
PRELOADER_USER = "65532:65532"
RESTRICTED: dict[str, Any] = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def argv_for(container: dict[str, Any], pod_context: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
    kwargs.setdefault("name", "c1")
    kwargs.setdefault("image", "localhost/compilecache-preloader:test")
    kwargs.setdefault("image_user", PRELOADER_USER)
    return containers.podman_run_argv({"name": "c", **container}, pod_context, kwargs.pop("mounts", {}), **kwargs)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, item in enumerate(argv) if item == flag]


# -- image inputs (pure) ------------------------------------------------------------------------------------


def test_ignore_file_lets_paths_in_and_keeps_patterns_out() -> None:
    included, excluded = images.parse_ignore_file("# c\n*\n!pyproject.toml\n!cachelib/\n**/__pycache__\n")
    assert included == ["pyproject.toml", "cachelib"] and excluded == ["**/__pycache__"]
    assert images.is_excluded(PurePosixPath("cachelib/__pycache__/x.pyc"), excluded)
    assert not images.is_excluded(PurePosixPath("cachelib/cli.py"), excluded)
    with pytest.raises(ValueError, match="must start with `\\*`"):
        images.parse_ignore_file("!cachelib/\n")


def test_context_files_are_those_the_real_ignore_files_let_in() -> None:
    for name in images.IMAGE_NAMES:
        image = images.recipe(name)
        files = {str(f) for f in images.context_files(images.REPO_ROOT, image.ignore_file.read_text())}
        assert {"pyproject.toml", "README.md", "cachelib/cli/__init__.py", "images/slim.py"} <= files
        assert any(f.startswith("operator/compilecache_operator/") for f in files)
        assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc") or f.startswith((".venv", "tests/"))]


def fake_repo(root: Path) -> images.ImageRecipe:
    (root / "images" / "x").mkdir(parents=True)
    (root / "images" / "x" / "Dockerfile").write_text("FROM scratch\n")
    (root / "images" / "x" / "Dockerfile.dockerignore").write_text("*\n!pyproject.toml\n!pkg/\n**/__pycache__\n")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "unrelated.txt").write_text("x")
    return images.recipe("x", root)


def test_inputs_hash_follows_what_goes_into_the_image(tmp_path: Path) -> None:
    image = fake_repo(tmp_path)
    first = images.inputs_hash(tmp_path, image, "sha256:base1")
    assert first == images.inputs_hash(tmp_path, image, "sha256:base1")
    (tmp_path / "unrelated.txt").write_text("changed")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert images.inputs_hash(tmp_path, image, "sha256:base1") == first
    assert images.inputs_hash(tmp_path, image, "sha256:base2") != first
    changes: list[Callable[[], object]] = [
        lambda: (tmp_path / "pkg" / "a.py").write_text("A = 2\n"),
        lambda: (tmp_path / "pkg" / "b.py").write_text(""),
        lambda: (tmp_path / "pkg" / "b.py").chmod(0o755),
        lambda: (tmp_path / "images" / "x" / "Dockerfile").write_text("FROM scratch\nUSER 1\n"),
        lambda: (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n"),
    ]
    seen = {first}
    for change in changes:
        change()
        now = images.inputs_hash(tmp_path, image, "sha256:base1")
        assert now not in seen
        seen.add(now)
    (tmp_path / "pyproject.toml").unlink()
    with pytest.raises(ValueError, match=r"lets in 'pyproject.toml', which does not exist"):
        images.inputs_hash(tmp_path, image, "sha256:base1")


def test_build_command_uses_the_local_base_no_pull_and_the_host_ca_bundle(tmp_path: Path) -> None:
    image = images.recipe("preloader")
    command = images.build_command(image, "sha256:" + "a" * 64, "f" * 64, ca_bundle=Path("/host/ca.crt"))
    assert command[0] == "build" and command[-1] == str(images.REPO_ROOT)
    for flag in ("--pull=never", "--network=host", "--layers=false"):
        assert flag in command
    assert flag_values(command, "--build-arg") == ["PYTHON_IMAGE=localhost/compilecache-pybase",
                                                  "PYTHON_DIGEST=sha256:" + "a" * 64]  # fmt: skip
    assert flag_values(command, "--ignorefile") == [str(image.ignore_file)]
    assert flag_values(command, "--volume") == ["/host/ca.crt:/etc/ssl/certs/ca-certificates.crt:ro"]
    assert flag_values(command, "--tag") == ["localhost/compilecache-preloader:ffffffffffff",
                                            "localhost/compilecache-preloader:test"]  # fmt: skip
    assert images.mmdebstrap_command(tmp_path / "b.tar")[:3] == [
        "mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,python-is-python3,ca-certificates,netbase"]


def test_stale_images_are_older_builds_of_our_repositories_only() -> None:
    current, old = "c" * 64, "0" * 64
    listing = "\n".join([
        f"id1 localhost/compilecache-preloader:test {current}",
        f"id1 localhost/compilecache-preloader:{current[:12]} {current}",
        f"id2 localhost/compilecache-preloader:{old[:12]} {old}",
        f"id3 <none>:<none> {old}",
        "id4 localhost/compilecache-pybase:bookworm <no value>",
        f"id5 docker.io/library/other:1 {old}",
    ])  # fmt: skip
    tags, ids = images.stale_images(listing, ["localhost/compilecache-preloader"], {current})
    assert tags == [f"localhost/compilecache-preloader:{old[:12]}"]
    assert ids == ["id3"]  # untagged leftovers only; other repositories are left alone


def test_missing_tools_are_installed_with_apt_as_root_only() -> None:
    assert images.missing_tools(lambda tool: None if tool == "mmdebstrap" else "/usr/bin/" + tool) == ["mmdebstrap"]
    assert images.apt_install_command([], is_root=False, have_sudo=False) == []
    assert images.apt_install_command(["podman"], is_root=False, have_sudo=False) is None
    root = images.apt_install_command(["podman", "runc"], is_root=True, have_sudo=False)
    assert root is not None and root[0] == ["apt-get", "update", "-qq"] and root[1][-2:] == ["podman", "runc"]
    sudo = images.apt_install_command(["podman"], is_root=False, have_sudo=True)
    assert sudo is not None and all(command[0] == "sudo" for command in sudo)


def test_every_podman_call_reads_the_projects_containers_conf(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPILECACHE_TEST_CACHE", str(tmp_path / "cache"))
    env = images.podman_env({"PATH": "/bin"})
    storage = tmp_path / "cache" / "containers" / "storage.conf"
    assert env == {"PATH": "/bin", "CONTAINERS_CONF": str(images.CONTAINERS_CONF),
                   "CONTAINERS_STORAGE_CONF": str(storage)}
    text = images.CONTAINERS_CONF.read_text()
    assert 'runtime = "runc"' in text and "nofile=20000:20000" in text
    # The images live under the test cache: an empty cache is a machine without images.
    stored = tomllib.loads(storage.read_text())["storage"]
    assert stored["graphroot"] == str(tmp_path / "cache" / "containers" / "storage")
    other = tomllib.loads(images.storage_conf_text(tmp_path / "other"))["storage"]
    assert other["runroot"] != stored["runroot"] and stored["runroot"].startswith("/run/")


# -- the podman run argv (pure) ------------------------------------------------------------------------------


def test_a_restricted_container_gets_every_restriction() -> None:
    argv = argv_for({"securityContext": RESTRICTED, "command": ["compilecache"], "args": ["--help"]},
                    {"fsGroup": 2000, "supplementalGroups": [3000, 2000]}, network="none")  # fmt: skip
    assert argv[:4] == ["podman", "run", "--rm", "--pull=never"]
    for flag in ("--name=c1", "--network=none", "--tty=false", "--interactive=false", "--read-only",
                 "--read-only-tmpfs=false", "--cap-drop=all", "--security-opt=no-new-privileges"):  # fmt: skip
        assert flag in argv, flag
    assert flag_values(argv, "--group-add") == ["2000", "3000"]
    assert "--user" not in argv  # the image's USER applies
    assert not [a for a in argv if a.startswith(("--cap-add", "--security-opt=seccomp"))]
    assert argv[-3:] == ['["compilecache"]', "localhost/compilecache-preloader:test", "--help"]


def test_run_as_user_and_group_come_from_the_container_over_the_pod() -> None:
    assert flag_values(argv_for({}, {"runAsUser": 1000, "runAsGroup": 3000}), "--user") == ["1000:3000"]
    container = {"securityContext": {"runAsUser": 1001}}
    assert flag_values(argv_for(container, {"runAsUser": 1000, "runAsGroup": 3000}), "--user") == ["1001:3000"]
    assert flag_values(argv_for({}, {"runAsUser": 1000}), "--user") == ["1000"]
    assert flag_values(argv_for({}, {"runAsGroup": 5}), "--user") == ["65532:5"]  # keeps the image's user
    assert flag_values(argv_for({}, {"runAsGroup": 5}, image_user=""), "--user") == ["0:5"]


@pytest.mark.parametrize(
    ("pod_context", "image_user", "message"),
    [
        ({"runAsNonRoot": True, "runAsUser": 0}, PRELOADER_USER, "container's runAsUser breaks non-root policy"),
        ({"runAsNonRoot": True}, "", "container has runAsNonRoot and image will run as root"),
        ({"runAsNonRoot": True}, "0:0", "container has runAsNonRoot and image will run as root"),
        ({"runAsNonRoot": True}, "nobody", r"image has non-numeric user \(nobody\), cannot verify user is non-root"),
    ],
)
def test_run_as_non_root_is_refused_with_the_kubelets_messages(
    pod_context: dict[str, Any], image_user: str, message: str
) -> None:
    with pytest.raises(ContainerConfigError, match=message) as refused:
        argv_for({}, pod_context, image_user=image_user, pod="p_ns(u1)")
    assert '(pod: "p_ns(u1)", container: c)' in str(refused.value)
    assert refused.value.reason == "CreateContainerConfigError"


def test_run_as_non_root_allows_a_non_root_user() -> None:
    argv_for({}, {"runAsNonRoot": True})
    argv_for({"securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}, {}, image_user="")
    argv_for({"securityContext": {"runAsNonRoot": False}}, {"runAsNonRoot": True}, image_user="")


def test_capabilities_follow_containerd_for_root_and_stay_out_of_reach_for_other_users() -> None:
    root = {"runAsUser": 0}
    assert [a for a in argv_for({}, root) if a.startswith("--cap")] == [
        "--cap-drop=all", *(f"--cap-add={c}" for c in sorted(containers.CONTAINERD_DEFAULT_CAPABILITIES))]
    adds = argv_for({"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["CAP_CHOWN", "KILL"]}}}, root)
    assert [a for a in adds if a.startswith("--cap")] == ["--cap-drop=all", "--cap-add=CHOWN", "--cap-add=KILL"]
    drop_wins = {"capabilities": {"drop": ["ALL", "CHOWN"], "add": ["CHOWN"]}}
    assert [a for a in argv_for({"securityContext": drop_wins}, root) if a.startswith("--cap")] == ["--cap-drop=all"]
    # A non-root user never gets an --cap-add: podman would make it an ambient, effective capability.
    non_root = argv_for({"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}})
    kept = containers.PODMAN_DEFAULT_CAPABILITIES - {"NET_BIND_SERVICE"}
    assert [a for a in non_root if a.startswith("--cap")] == [f"--cap-drop={c}" for c in sorted(kept)]
    assert [a for a in argv_for({"securityContext": {"capabilities": {"drop": ["ALL"]}}}) if a.startswith("--cap")] \
        == ["--cap-drop=all"]  # fmt: skip
    with pytest.raises(ContainerConfigError, match=r"capabilities.add: 'NET BIND' is not a capability name"):
        argv_for({"securityContext": {"capabilities": {"add": ["NET BIND"]}}})


def test_profiles_follow_a_kubelet_without_seccomp_default() -> None:
    assert "--security-opt=seccomp=unconfined" in argv_for({})
    assert "--security-opt=seccomp=unconfined" not in argv_for({}, {"seccompProfile": {"type": "RuntimeDefault"}})
    container = {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}
    assert "--security-opt=seccomp=unconfined" in argv_for(container, {"seccompProfile": {"type": "RuntimeDefault"}})
    assert "--security-opt=apparmor=unconfined" in argv_for({}, {"appArmorProfile": {"type": "Unconfined"}})
    with pytest.raises(ContainerConfigError, match=r"seccompProfile.type 'Localhost' is not supported"):
        argv_for({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "x.json"}}})


@pytest.mark.parametrize(
    ("container", "pod_context", "message"),
    [
        ({"securityContext": {"runAsUserName": "x"}}, {}, r"securityContext.runAsUserName is not supported"),
        ({}, {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}, "sysctls is not supported"),
        ({"securityContext": {"seLinuxOptions": {"level": "s0"}}}, {}, "seLinuxOptions is not supported"),
        ({"securityContext": {"procMount": "Unmasked"}}, {}, "procMount 'Unmasked' is not supported"),
        ({}, {"supplementalGroupsPolicy": "Strict"}, "only Merge is supported"),
        ({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}, {},
         "env A: valueFrom needs the API server"),
        ({"envFrom": [{"configMapRef": {"name": "x"}}]}, {}, "envFrom needs the API server"),
        ({"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}, {}, r"volumeMounts\[0\] \(cache at /cache\)"),
    ],
)
def test_what_the_runner_cannot_honour_is_refused_by_name(
    container: dict[str, Any], pod_context: dict[str, Any], message: str
) -> None:
    with pytest.raises(ContainerConfigError, match=message):
        argv_for(container, pod_context)


def test_env_command_and_args_expand_like_a_kubelet() -> None:
    container = {
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(C)-$$(A)"}, {"name": "C", "value": "3"}],
        "command": ["sh", "-c", "echo $(B)"],
        "args": ["$(A)", "$(MISSING)"],
        "workingDir": "/work",
    }
    argv = argv_for(container)
    assert flag_values(argv, "--env") == ["A=1", "B=1-$(C)-$(A)", "C=3"]
    assert json.loads(flag_values(argv, "--entrypoint")[0]) == ["sh", "-c", "echo 1-$(C)-$(A)"]
    assert argv[-3:] == ["localhost/compilecache-preloader:test", "1", "$(MISSING)"]
    assert flag_values(argv, "--workdir") == ["/work"]
    resolved = argv_for({**container, "env": [{"name": "A", "valueFrom": {}}]}, env={"A": "from-api"})
    assert flag_values(resolved, "--env") == ["A=from-api"] and resolved[-2] == "from-api"
    assert "--entrypoint" not in argv_for({"args": ["x"]})


def test_mounts_and_the_termination_message_file(tmp_path: Path) -> None:
    container = {"volumeMounts": [{"name": "cache", "mountPath": "/cache"}, {"name": "s", "mountPath": "/s"}]}
    mounts = {"/cache": VolumeMount(tmp_path / "c"), "/s": VolumeMount(tmp_path / "s", read_only=True)}
    argv = argv_for(container, mounts=mounts, termination_file=tmp_path / "t")
    assert flag_values(argv, "--volume") == [f"{tmp_path}/c:/cache:rw", f"{tmp_path}/s:/s:ro",
                                             f"{tmp_path}/t:/dev/termination-log:rw"]  # fmt: skip
    custom = argv_for({"terminationMessagePath": "/tmp/msg"}, termination_file=tmp_path / "t")
    assert flag_values(custom, "--volume") == [f"{tmp_path}/t:/tmp/msg:rw"]
    with pytest.raises(ContainerConfigError, match="contains ':' or ','"):
        argv_for({}, mounts={"/x": VolumeMount(Path("/a:b"))})
    with pytest.raises(ContainerConfigError, match="is not absolute"):
        argv_for({}, mounts={"x": VolumeMount(tmp_path)})
    with pytest.raises(ContainerConfigError, match="container name"):
        argv_for({}, name="a b")


def test_container_names_are_valid_and_distinct() -> None:
    meta = {"name": "job-abc", "namespace": "team a", "uid": "0123456789abcdef"}
    name = containers.container_name(meta, "preload")
    assert name == "k8s_preload_job-abc_team-a_01234567_0"
    assert containers.container_name(meta, "preload", attempt=1) != name
    assert containers.name_of(argv_for({}, name=name)) == name
    assert containers.format_pod(meta) == "job-abc_team a(0123456789abcdef)"


# -- volumes on the host ------------------------------------------------------------------------------------


def test_ownership_mode_is_kubelets_set_volume_ownership() -> None:
    assert containers.ownership_mode(0o100644, is_dir=False) == 0o664
    assert containers.ownership_mode(0o600, is_dir=False, read_only=True) == 0o640
    assert containers.ownership_mode(0o40777, is_dir=True) == 0o2777
    assert containers.ownership_mode(0o700, is_dir=True) == 0o2770
    assert containers.ownership_mode(0o4755, is_dir=False) == 0o4775


@ROOT_ONLY
def test_empty_dir_with_fs_group_is_root_fs_group_2777_through_the_tree(tmp_path: Path) -> None:
    plain = containers.setup_empty_dir(tmp_path / "plain", None)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o777 and plain.stat().st_gid == 0
    volume = tmp_path / "volume"
    (volume / "sub").mkdir(parents=True)
    (volume / "sub" / "f").write_text("x")
    (volume / "link").symlink_to("sub/f")
    volume.chmod(0o700)
    containers.setup_empty_dir(volume, 2000)
    info = volume.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 2000, 0o2777)
    assert stat.S_IMODE((volume / "sub").stat().st_mode) & 0o2070 == 0o2070
    assert (volume / "sub" / "f").stat().st_gid == 2000
    assert stat.S_IMODE((volume / "sub" / "f").stat().st_mode) & 0o060 == 0o060
    assert (volume / "link").lstat().st_gid == 2000


def test_sub_path_takes_the_mode_of_the_volume_root(tmp_path: Path) -> None:
    volume = containers.setup_empty_dir(tmp_path / "vol", None)
    made = containers.setup_sub_path(volume, "inductor/deeper")
    for path in (made, made.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o777  # an app of any uid writes where kubelet made it
    (made / "keep").write_text("x")
    made.chmod(0o700)
    assert containers.setup_sub_path(volume, "/inductor/deeper/") == made  # an existing one stays as it is
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_host_path_directory_or_create_is_made_0755(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        made = containers.setup_host_path(tmp_path / "a" / "b", "DirectoryOrCreate")
    finally:
        os.umask(old)
    for path in (made, made.parent):
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o755 and info.st_uid == os.geteuid()
    assert containers.setup_host_path(made, "Directory") == made
    (tmp_path / "file").write_text("")
    with pytest.raises(ContainerConfigError, match=r"hostPath type check failed: .*file is not a directory"):
        containers.setup_host_path(tmp_path / "file", "DirectoryOrCreate")
    with pytest.raises(ContainerConfigError, match="is not a directory"):
        containers.setup_host_path(tmp_path / "missing", "Directory")
    with pytest.raises(ContainerConfigError, match="hostPath type 'Socket' is not supported"):
        containers.setup_host_path(tmp_path, "Socket")


def test_termination_file_is_writable_by_any_uid(tmp_path: Path) -> None:
    path = containers.prepare_termination_file(tmp_path / "t" / "preload")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 and path.read_bytes() == b""


# -- real images, real containers ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def built_images() -> dict[str, str]:
    """Both images, built once per content (minutes the first time on a machine, seconds after)."""
    reason = images.podman_usable()
    if reason:
        unavailable(f"podman cannot run containers here: {reason}")
    try:
        return images.ensure_images()
    except images.ImagesUnavailable as exc:
        if images.missing_tools():
            unavailable(f"the images cannot be built here: {exc}")
        raise


@pytest.fixture(scope="session")
def preloader(built_images: dict[str, str]) -> str:
    return built_images["preloader"]


@pytest.fixture
def pod_meta() -> dict[str, str]:
    return {"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": "tests", "uid": uuid.uuid4().hex}


@pytest.fixture
def volumes(tmp_path: Path) -> Path:
    return tmp_path


def run_spec(
    container: dict[str, Any],
    image: str,
    meta: dict[str, str],
    pod_context: dict[str, Any] | None = None,
    mounts: dict[str, VolumeMount] | None = None,
    termination: Path | None = None,
    **kwargs: Any,
) -> containers.ContainerResult:
    argv = containers.podman_run_argv(
        container, pod_context, mounts or {}, name=containers.container_name(meta, container["name"]), image=image,
        image_user=containers.image_user(image), termination_file=termination, pod=containers.format_pod(meta),
        **kwargs,
    )  # fmt: skip
    return containers.run_container(argv, termination_file=termination, timeout=300)


PROBE = """
import importlib.util, json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
writes = {}
for path in ("/tmp/x", "/var/tmp/x", "/run/x", "/etc/x", "/opt/x", "/cache/x"):
    try:
        open(path, "w").close()
        writes[path] = "ok"
    except OSError as exc:
        writes[path] = exc.strerror
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
                  "cap_eff": int(status["CapEff"], 16), "no_new_privs": status["NoNewPrivs"].strip(),
                  "seccomp": status["Seccomp"].strip(), "torch": bool(importlib.util.find_spec("torch")),
                  "writes": writes}))
"""


def probe(output: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return data


@pytest.mark.slow
def test_preloader_cli_runs_as_65532_without_network(preloader: str, pod_meta: dict[str, str]) -> None:
    result = run_spec({"name": "help", "command": ["compilecache", "--help"], "securityContext": RESTRICTED},
                      preloader, pod_meta, network="none")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "usage: compilecache" in result.output and "preload" in result.output
    seen = probe(run_spec({"name": "probe", "command": ["python", "-c", PROBE], "securityContext": RESTRICTED},
                          preloader, pod_meta, network="none").output)  # fmt: skip
    assert (seen["uid"], seen["gid"]) == (65532, 65532)
    assert seen["cap_eff"] == 0 and seen["no_new_privs"] == "1" and seen["seccomp"] == "2"
    assert seen["torch"] is False


@pytest.mark.slow
def test_both_images_carry_no_build_host_files_and_no_torch(built_images: dict[str, str]) -> None:
    for name, reference in built_images.items():
        assert containers.image_user(reference) == PRELOADER_USER
        assert images.image_label(reference, images.INPUTS_LABEL)[: images.HASH_LENGTH] == reference.rsplit(":")[-1]
        check = ("import importlib.util, os, sys; "
                 "sys.exit(bool(importlib.util.find_spec('torch')) or os.path.exists('/etc/pip.conf'))")  # fmt: skip
        result = run_spec({"name": "check", "command": ["python", "-c", check]}, reference,
                          {"name": name, "namespace": "tests", "uid": "x"}, network="none")  # fmt: skip
        assert result.exit_code == 0, (name, result.output)
    operator = run_spec({"name": "op", "args": ["--help"], "securityContext": RESTRICTED}, built_images["operator"],
                        {"name": "op", "namespace": "tests", "uid": "x"}, network="none")  # fmt: skip
    assert operator.exit_code == 0 and "usage: compilecache-operator" in operator.output, operator.output


@pytest.mark.slow
def test_an_image_is_built_once_per_content_and_older_builds_are_untagged(
    built_images: dict[str, str], tmp_path: Path
) -> None:
    image = fake_repo(tmp_path)
    image.dockerfile.write_text("ARG PYTHON_IMAGE\nARG PYTHON_DIGEST\nFROM ${PYTHON_IMAGE}@${PYTHON_DIGEST}\n"
                                "COPY pkg /pkg\nRUN test -f /pkg/a.py\n")  # fmt: skip
    digest = images.image_digest(images.base_reference())
    logged: list[str] = []
    try:
        first = images.ensure_image(image, digest, tmp_path, logged.append)
        assert first.startswith("localhost/compilecache-x:") and any("built in" in m for m in logged)
        logged.clear()
        assert images.ensure_image(image, digest, tmp_path, logged.append) == first and logged == []
        (tmp_path / "pkg" / "a.py").write_text("A = 2\n")
        second = images.ensure_image(image, digest, tmp_path, logged.append)
        assert second != first and any("built in" in m for m in logged)
        assert images.image_label(f"{image.repository}:test", images.INPUTS_LABEL)[:12] == second.rsplit(":")[-1]
        images.remove_stale_images({images.image_label(second, images.INPUTS_LABEL)}, [image.repository])
        assert not images.image_exists(first) and images.image_exists(second)
        assert images.image_exists(f"{image.repository}:test")
    finally:
        for tag in images.podman("images", "--format", "{{.Repository}}:{{.Tag}}", image.repository).stdout.split():
            images.podman("rmi", "--force", tag, check=False)


@pytest.mark.slow
def test_command_replaces_entrypoint_and_cmd_args_replace_cmd(preloader: str, pod_meta: dict[str, str]) -> None:
    only_command = run_spec({"name": "a", "command": ["echo", "only"]}, preloader, pod_meta, network="none")
    assert only_command.output == "only\n"  # the image's CMD (compilecache --help) is dropped
    only_args = run_spec({"name": "b", "args": ["echo", "args"]}, preloader, pod_meta, network="none")
    assert only_args.output == "args\n"


@pytest.mark.slow
@ROOT_ONLY
def test_container_writes_into_an_empty_dir_with_fs_group_semantics(
    preloader: str, pod_meta: dict[str, str], volumes: Path
) -> None:
    cache = containers.setup_empty_dir(volumes / "cache", 2000)
    write = "import os; os.makedirs('/cache/d/e'); open('/cache/d/e/f', 'w').write('x'); open('/cache/g', 'w')"
    container = {"name": "w", "command": ["python", "-c", write], "securityContext": RESTRICTED,
                 "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}  # fmt: skip
    result = run_spec(container, preloader, pod_meta, {"fsGroup": 2000}, {"/cache": VolumeMount(cache)},
                      network="none")  # fmt: skip
    assert result.exit_code == 0, result.output
    for relative in ("d", "d/e", "d/e/f", "g"):
        info = (cache / relative).stat()
        assert (info.st_uid, info.st_gid) == (65532, 2000), relative
        if stat.S_ISDIR(info.st_mode):
            assert info.st_mode & stat.S_ISGID, relative  # new directories inherit the setgid bit
    # Without an fsGroup the same files belong to the container's own group.
    plain = containers.setup_empty_dir(volumes / "plain", None)
    result = run_spec({**container, "name": "w2"}, preloader, pod_meta, {}, {"/cache": VolumeMount(plain)},
                      network="none")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (plain / "g").stat().st_gid == 65532


@pytest.mark.slow
def test_read_only_root_file_system_refuses_writes_outside_the_volumes(
    preloader: str, pod_meta: dict[str, str], volumes: Path
) -> None:
    cache = containers.setup_empty_dir(volumes / "cache", None)
    container: dict[str, Any] = {"name": "ro", "command": ["python", "-c", PROBE], "securityContext": RESTRICTED,
                 "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}  # fmt: skip
    seen = probe(run_spec(container, preloader, pod_meta, {}, {"/cache": VolumeMount(cache)}, network="none").output)
    assert seen["writes"] == {"/tmp/x": "Read-only file system", "/var/tmp/x": "Read-only file system",
                              "/run/x": "Read-only file system", "/etc/x": "Read-only file system",
                              "/opt/x": "Read-only file system", "/cache/x": "ok"}  # fmt: skip
    writable = {**container, "name": "rw", "securityContext": {**RESTRICTED, "readOnlyRootFilesystem": False}}
    seen = probe(run_spec(writable, preloader, pod_meta, {}, {"/cache": VolumeMount(cache)}, network="none").output)
    assert seen["writes"]["/tmp/x"] == "ok" and seen["writes"]["/etc/x"] == "Permission denied"


@pytest.mark.slow
def test_run_as_non_root_with_uid_zero_never_starts(
    built_images: dict[str, str], pod_meta: dict[str, str]
) -> None:
    base = images.base_reference()  # no USER: root
    with pytest.raises(ContainerConfigError, match="container has runAsNonRoot and image will run as root"):
        run_spec({"name": "root", "command": ["id"]}, base, pod_meta, {"runAsNonRoot": True})
    with pytest.raises(ContainerConfigError, match="container's runAsUser breaks non-root policy"):
        run_spec({"name": "zero", "command": ["id"]}, built_images["preloader"], pod_meta,
                 {"runAsNonRoot": True, "runAsUser": 0})  # fmt: skip
    listed = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=images.podman_env(),
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert pod_meta["name"] not in listed
    # The image's own non-root user passes the same check, and root without runAsNonRoot runs.
    assert run_spec({"name": "ok", "command": ["id", "-u"]}, built_images["preloader"], pod_meta,
                    {"runAsNonRoot": True}, network="none").output == "65532\n"  # fmt: skip
    assert run_spec({"name": "r", "command": ["id", "-u"]}, base, pod_meta, network="none").output == "0\n"


@pytest.mark.slow
def test_capabilities_added_for_a_non_root_user_are_not_effective(preloader: str, pod_meta: dict[str, str]) -> None:
    def cap_eff(context: dict[str, Any]) -> int:
        command = ["python", "-c", PROBE]
        return int(probe(run_spec({"name": "cap", "command": command, "securityContext": context}, preloader,
                                  pod_meta, network="none").output)["cap_eff"])  # fmt: skip

    assert cap_eff({"capabilities": {"add": ["DAC_OVERRIDE"]}}) == 0
    assert cap_eff({"runAsUser": 0, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}) == 1 << 0  # CAP_CHOWN


@pytest.mark.slow
def test_stop_and_kill_end_a_running_container(preloader: str, pod_meta: dict[str, str], tmp_path: Path) -> None:
    trap = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); "
            "print('up', flush=True); time.sleep(600)")
    for ending, expected in ((containers.stop_container, 7), (containers.kill_container, 137)):
        argv = containers.podman_run_argv({"name": "side", "command": ["python", "-c", trap]}, {}, {},
                                          name=containers.container_name(pod_meta, "side", attempt=expected),
                                          image=preloader, network="none")  # fmt: skip
        with open(tmp_path / f"out-{expected}", "wb") as out:
            process = containers.start_container(argv, output=out)
            deadline = time.monotonic() + 60
            log = tmp_path / f"out-{expected}"
            while b"up" not in log.read_bytes():
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            ending(containers.name_of(argv))
            assert process.wait(timeout=60) == expected
    result = containers.run_container(
        containers.podman_run_argv({"name": "slow", "command": ["sleep", "600"]}, {}, {}, image=preloader,
                                   name=containers.container_name(pod_meta, "slow"), network="none"),
        timeout=3,
    )  # fmt: skip
    assert result.exit_code == 137


# -- the preloader against real stores on loopback ----------------------------------------------------------


@pytest.fixture
def store(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """(store URL, environment for the containers) of a fresh store on loopback."""
    kind = str(request.param)
    url = fresh_store_url(kind, request)
    env = dict(request.getfixturevalue("s3_server").env) if kind == "s3" else {}
    return url, env


@pytest.mark.slow
@ROOT_ONLY
@pytest.mark.parametrize("store", ["redis", "s3"], indirect=True)
def test_preloader_container_publishes_lists_and_preloads_through_loopback(
    preloader: str, pod_meta: dict[str, str], store: tuple[str, dict[str, str]], volumes: Path
) -> None:
    url, store_env = store
    key: CacheKey = make_key(name=f"img{uuid.uuid4().hex[:6]}")
    out = make_outdir(volumes / "out", key)
    out.chmod(0o755)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    env = dict(store_env)  # added to the image's ENV, as a kubelet does
    # The root file system is read-only: packing needs a writable TMPDIR on a volume.
    scratch = containers.setup_empty_dir(volumes / "scratch", None)

    published_msg = containers.prepare_termination_file(volumes / "term-publish")
    volume_mounts = [{"name": "out", "mountPath": "/work/out"}, {"name": "scratch", "mountPath": "/scratch"}]
    publish = {"name": "publish", "command": ["compilecache", "publish", "/work/out", "--store", url],
               "securityContext": RESTRICTED, "volumeMounts": volume_mounts}  # fmt: skip
    mounts = {"/work/out": VolumeMount(out, read_only=True), "/scratch": VolumeMount(scratch)}
    result = run_spec(publish, preloader, pod_meta, {}, mounts, published_msg, env={**env, "TMPDIR": "/scratch"})
    assert result.exit_code == 0, result.output
    published = json.loads(result.termination_message)
    assert published["key"] == str(key), published

    listing = run_spec({"name": "ls", "command": ["compilecache", "ls", "--store", url, "--json"],
                        "securityContext": RESTRICTED}, preloader, pod_meta, env=env)  # fmt: skip
    assert listing.exit_code == 0, listing.output
    assert str(key) in listing.output

    cache = containers.setup_empty_dir(volumes / "cache", 2000)
    preload_msg = containers.prepare_termination_file(volumes / "term-preload")
    preload = {"name": "preload", "command": ["compilecache", "preload", "--store", url, "--key", str(key),
                                              "--target", "/cache/inductor"],
               "securityContext": RESTRICTED, "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}  # fmt: skip
    result = run_spec(preload, preloader, pod_meta, {"fsGroup": 2000}, {"/cache": VolumeMount(cache)}, preload_msg,
                      env={**env, "TMPDIR": "/cache"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.termination_message)["result"] == "hit", result.termination_message
    unpacked = tree(cache / "inductor")
    expected = {k: v for k, v in tree(out / "cachedir").items() if not k.startswith("locks/")}  # locks stay out
    assert {k: v for k, v in unpacked.items() if k in expected} == expected
    assert (cache / "inductor" / "fxgraph").stat().st_gid == 2000
