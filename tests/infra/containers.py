"""Pods' containers as real containers under podman, with what a kubelet enforces.

Pure builders turn a Kubernetes container spec, its pod's ``securityContext`` and the container's volume
mounts (container path → host directory, read-only flag) into a ``podman run`` argv; thin I/O functions
run, stop and kill it. The images come from ``tests/infra/images.py`` (``ensure_images()``); every podman
call uses its ``podman_env()``.

What the argv enforces, as a kubelet with containerd would:

- User: ``runAsUser`` / ``runAsGroup``, the container's over the pod's (``--user UID[:GID]``); without
  them the image's ``USER``. ``runAsGroup`` alone keeps the image's user.
- ``runAsNonRoot``: refused before anything starts, with the kubelet's messages, raised as
  ``ContainerConfigError`` (a kubelet reports it as ``CreateContainerConfigError``):
  ``container's runAsUser breaks non-root policy (...)`` for an explicit ``runAsUser: 0``,
  ``container has runAsNonRoot and image will run as root (...)`` when the image's user is root (or
  unset), ``container has runAsNonRoot and image has non-numeric user (NAME), cannot verify user is
  non-root (...)`` for a user name.
- Supplementary groups: the pod's ``fsGroup`` then ``supplementalGroups`` (``--group-add``); the image's
  ``/etc/group`` memberships are added by the runtime as usual.
- ``readOnlyRootFilesystem``: ``--read-only --read-only-tmpfs=false``: /tmp, /var/tmp and /run are NOT
  quietly writable, only the volumes are.
- Capabilities: containerd's default set, minus ``drop`` (``ALL`` clears it), plus ``add``; a drop wins
  over an add of the same capability. A root process gets exactly that set. A non-root process gets no
  effective capabilities (Kubernetes sets no ambient capabilities), which podman would break: it turns
  every ``--cap-add`` of a non-root container into an ambient, effective capability. For non-root users
  only ``--cap-drop`` flags are given, so the bounding set is podman's default set cut to the wanted one.
- ``allowPrivilegeEscalation: false`` → ``--security-opt=no-new-privileges``; ``privileged`` →
  ``--privileged``.
- ``seccompProfile`` (the container's over the pod's): ``RuntimeDefault`` → podman's default profile;
  unset or ``Unconfined`` → ``seccomp=unconfined`` (a kubelet without ``seccompDefault`` runs unconfined).
  ``appArmorProfile``: ``RuntimeDefault``/unset → the runtime default; ``Unconfined`` → unconfined.
  ``Localhost`` profiles, ``seLinuxOptions``, ``sysctls``, ``procMount: Unmasked``,
  ``supplementalGroupsPolicy: Strict`` and unknown securityContext fields are refused with
  ``ContainerConfigError`` naming the field (never silently ignored).
- ``env`` (literal values with ``$(VAR)`` expansion, in order) or, when the caller already resolved
  ``valueFrom``/``envFrom``, the complete environment passed as ``env=``;
  ``workingDir`` → ``--workdir``; ``command`` replaces the image's ENTRYPOINT (and drops its CMD), ``args``
  replace its CMD; both get ``$(VAR)`` expansion from the container's environment.
- Volume mounts: each ``volumeMounts`` entry of the spec must have a host directory in ``mounts``
  (``-v HOST:PATH:ro|rw``); the termination message file, when given, is mounted read-write at
  ``terminationMessagePath`` (default ``/dev/termination-log``), created 0666 like the kubelet's.
- ``--network=host`` by default (the pods reach redis, S3 and the API server on loopback),
  ``--pull=never``, ``--rm``, a ``--name``, no TTY, no stdin.

Volumes are prepared on the host like a kubelet does (``setup_empty_dir``, ``set_volume_ownership``,
``setup_host_path``): an emptyDir is created 0777; with a pod ``fsGroup`` the kubelet's
``SetVolumeOwnership`` gives the tree that group, group read/write (read-only volumes: group read), and
directories the setgid bit and group search, so a new emptyDir is ``root:fsGroup`` mode 2777 and files
the containers create inside inherit the group. A hostPath of type ``DirectoryOrCreate`` that does not
exist is created ``root:root`` 0755 (no fsGroup handling for hostPath); ``Directory`` must exist.

API::

    argv = podman_run_argv(container, pod_security_context, {"/cache": VolumeMount(host_dir, False)},
                           name=container_name(pod, "preload"), image="localhost/compilecache-preloader:...",
                           image_user=image_user(image), env=resolved_env, termination_file=path)
    result = run_container(argv, termination_file=path, timeout=120)   # ContainerResult(exit_code, output, ...)
    process = start_container(argv)            # a native sidecar: Popen of `podman run`, output in a file
    stop_container(name, grace_seconds=30)     # SIGTERM, SIGKILL after the grace period, then removed
    kill_container(name)                       # SIGKILL now, then removed
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from tests.infra.images import podman_env

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
# containerd's default capabilities (pkg/oci DefaultCapabilities), the set a kubelet's containers start from.
CONTAINERD_DEFAULT_CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP", "SETPCAP",
    "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
})  # fmt: skip
# podman's default capabilities (containers.conf default_capabilities).
PODMAN_DEFAULT_CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP",
    "SETUID", "SYS_CHROOT",
})  # fmt: skip

# securityContext fields this runner honours; any other field is refused.
_CONTAINER_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "capabilities",
                     "allowPrivilegeEscalation", "privileged", "seccompProfile", "appArmorProfile", "procMount",
                     "windowsOptions", "seLinuxOptions"}  # fmt: skip
_POD_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "fsGroupChangePolicy", "supplementalGroups",
               "supplementalGroupsPolicy", "seccompProfile", "appArmorProfile", "windowsOptions", "seLinuxOptions",
               "seLinuxChangePolicy", "sysctls"}  # fmt: skip
_CAPABILITY = re.compile(r"[A-Z][A-Z0-9_]*")
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables are replaced, unknown ones kept, $$ escapes $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VARIABLE.sub(replace, value)


class ContainerConfigError(ValueError):
    """The kubelet would refuse to create this container (or this runner cannot honour a field of it)."""

    reason = "CreateContainerConfigError"


class VolumeMount(NamedTuple):
    """A host directory (or file) mounted into a container."""

    host_path: Path
    read_only: bool = False


@dataclass(frozen=True)
class ContainerResult:
    exit_code: int
    """The container's exit code (137 when killed); 125 means podman itself failed (see output)."""
    output: str
    """stdout and stderr, interleaved as written."""
    termination_message: str = ""
    """The first 4096 bytes of the termination message file, when one was mounted."""


# -- pure: the podman run argv ----------------------------------------------------------------------------


def format_pod(metadata: Mapping[str, Any]) -> str:
    """A pod as the kubelet names it in messages: ``name_namespace(uid)``."""
    return f"{metadata.get('name', '')}_{metadata.get('namespace', '')}({metadata.get('uid', '')})"


def container_name(metadata: Mapping[str, Any], container: str, attempt: int = 0) -> str:
    """A podman container name unique per pod, container and attempt: ``k8s_CONTAINER_POD_NS_UID_ATTEMPT``."""
    parts = ["k8s", container, metadata.get("name", ""), metadata.get("namespace", ""),
             str(metadata.get("uid", ""))[:8], str(attempt)]  # fmt: skip
    return _NAME_UNSAFE.sub("-", "_".join(str(p) for p in parts))


def _check_fields(context: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(context) - allowed)
    if unknown:
        raise ContainerConfigError(f"{where}.{unknown[0]} is not supported by the podman runner")


def _effective(container_context: Mapping[str, Any], pod_context: Mapping[str, Any], key: str) -> Any:
    own = container_context.get(key)
    return own if own is not None else pod_context.get(key)


def parse_image_user(image_user: str) -> tuple[int | None, str]:
    """(uid, user name) of an image's USER (``65532:65532``, ``nobody``, ``""``), the way the kubelet reads
    it: the part before ``:``; numeric → uid; a name → name; empty → uid 0 (root)."""
    user = image_user.split(":", 1)[0].strip()
    if not user:
        return 0, ""
    if user.isdigit():
        return int(user), ""
    return None, user


def check_run_as_non_root(
    run_as_non_root: bool | None, run_as_user: int | None, image_user: str, pod: str, container: str
) -> None:
    """The kubelet's verifyRunAsNonRoot, with its messages."""
    if not run_as_non_root:
        return
    where = f'(pod: "{pod}", container: {container})'
    if run_as_user is not None:
        if run_as_user == 0:
            raise ContainerConfigError(f"container's runAsUser breaks non-root policy {where}")
        return
    uid, name = parse_image_user(image_user)
    if uid == 0:
        raise ContainerConfigError(f"container has runAsNonRoot and image will run as root {where}")
    if uid is None:
        raise ContainerConfigError(
            f"container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root "
            f"{where}"
        )


def user_flag(run_as_user: int | None, run_as_group: int | None, image_user: str) -> list[str]:
    """``--user`` for runAsUser/runAsGroup; nothing when neither is set (the image's USER applies)."""
    if run_as_user is None and run_as_group is None:
        return []
    user = str(run_as_user) if run_as_user is not None else (image_user.split(":", 1)[0].strip() or "0")
    return ["--user", user if run_as_group is None else f"{user}:{run_as_group}"]


def supplementary_groups(pod_context: Mapping[str, Any]) -> list[int]:
    """The pod's fsGroup and supplementalGroups, each once, fsGroup first."""
    groups: list[int] = []
    if pod_context.get("fsGroup") is not None:
        groups.append(int(pod_context["fsGroup"]))
    groups += [int(g) for g in pod_context.get("supplementalGroups") or []]
    return list(dict.fromkeys(groups))


def group_flags(pod_context: Mapping[str, Any]) -> list[str]:
    """``--group-add`` for the pod's fsGroup and supplementalGroups (each once, fsGroup first)."""
    return [flag for g in supplementary_groups(pod_context) for flag in ("--group-add", str(g))]


def process_identity(
    pod: Mapping[str, Any], container: Mapping[str, Any], image_user: tuple[int, int] = (0, 0)
) -> tuple[int, int, tuple[int, ...]]:
    """(uid, gid, supplementary groups) of a container run as a local process rather than under podman:
    runAsUser / runAsGroup (the container's over the pod's), else the image's USER; the pod's groups.
    Raises ContainerConfigError as the kubelet refuses what runAsNonRoot forbids."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    run_as_user, run_as_group = _effective(own, pod_context, "runAsUser"), _effective(own, pod_context, "runAsGroup")
    check_run_as_non_root(_effective(own, pod_context, "runAsNonRoot"), run_as_user,
                          f"{image_user[0]}:{image_user[1]}", format_pod(pod.get("metadata") or {}),
                          str(container.get("name", "")))  # fmt: skip
    uid = image_user[0] if run_as_user is None else int(run_as_user)
    gid = image_user[1] if run_as_group is None else int(run_as_group)
    return uid, gid, tuple(g for g in supplementary_groups(pod_context) if g != gid)


def _capability_names(values: Sequence[Any], where: str) -> list[str]:
    names = []
    for value in values:
        name = str(value).upper().removeprefix("CAP_")
        if not _CAPABILITY.fullmatch(name):
            raise ContainerConfigError(f"{where}: {value!r} is not a capability name")
        names.append(name)
    return names


def wanted_capabilities(capabilities: Mapping[str, Any]) -> frozenset[str]:
    """containerd's default set, with ``drop: [ALL]`` clearing it, then ``add``, then ``drop`` (a drop wins)."""
    drop = _capability_names(capabilities.get("drop") or [], "securityContext.capabilities.drop")
    add = _capability_names(capabilities.get("add") or [], "securityContext.capabilities.add")
    if "ALL" in add:
        raise ContainerConfigError("securityContext.capabilities.add: ALL is not supported by the podman runner")
    wanted = set() if "ALL" in drop else set(CONTAINERD_DEFAULT_CAPABILITIES)
    wanted |= set(add)
    wanted -= set(drop)
    return frozenset(wanted)


def capability_flags(wanted: frozenset[str], root: bool) -> list[str]:
    """Flags giving a root process exactly ``wanted``; for a non-root process only drops (see module doc)."""
    if root:
        return ["--cap-drop=all", *(f"--cap-add={c}" for c in sorted(wanted))]
    keep = PODMAN_DEFAULT_CAPABILITIES & wanted
    if not keep:
        return ["--cap-drop=all"]
    return [f"--cap-drop={c}" for c in sorted(PODMAN_DEFAULT_CAPABILITIES - keep)]


def _profile_flags(kind: str, profile: Mapping[str, Any] | None, unset: str | None, where: str) -> list[str]:
    """seccomp / apparmor: RuntimeDefault → the runtime's profile; Unconfined → none; unset → ``unset``."""
    profile_type = (profile or {}).get("type")
    if profile_type is None:
        return [] if unset is None else [f"--security-opt={kind}={unset}"]
    if profile_type == "RuntimeDefault":
        return []
    if profile_type == "Unconfined":
        return [f"--security-opt={kind}=unconfined"]
    raise ContainerConfigError(f"{where}.type {profile_type!r} is not supported by the podman runner")


def security_flags(
    container: Mapping[str, Any], pod_context: Mapping[str, Any], image_user: str, pod: str
) -> list[str]:
    """Every flag that comes from the securityContexts (user, groups, root fs, capabilities, profiles)."""
    own: Mapping[str, Any] = container.get("securityContext") or {}
    _check_fields(own, _CONTAINER_FIELDS, "securityContext")
    _check_fields(pod_context, _POD_FIELDS, "pod securityContext")
    for context, where in ((own, "securityContext"), (pod_context, "pod securityContext")):
        if context.get("seLinuxOptions"):
            raise ContainerConfigError(f"{where}.seLinuxOptions is not supported by the podman runner")
    if pod_context.get("sysctls"):
        raise ContainerConfigError("pod securityContext.sysctls is not supported by the podman runner")
    if own.get("procMount") not in (None, "Default"):
        raise ContainerConfigError(f"securityContext.procMount {own['procMount']!r} is not supported")
    if pod_context.get("supplementalGroupsPolicy") not in (None, "Merge"):
        raise ContainerConfigError("pod securityContext.supplementalGroupsPolicy: only Merge is supported")

    run_as_user = _effective(own, pod_context, "runAsUser")
    run_as_group = _effective(own, pod_context, "runAsGroup")
    check_run_as_non_root(_effective(own, pod_context, "runAsNonRoot"), run_as_user, image_user, pod,
                          str(container.get("name", "")))  # fmt: skip
    flags = user_flag(run_as_user, run_as_group, image_user) + group_flags(pod_context)
    if own.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if own.get("privileged"):
        flags.append("--privileged")
    else:
        uid, name = parse_image_user(image_user)
        root = run_as_user == 0 if run_as_user is not None else (uid == 0 or name == "root")
        flags += capability_flags(wanted_capabilities(own.get("capabilities") or {}), root)
    if own.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    flags += _profile_flags("seccomp", _effective(own, pod_context, "seccompProfile"), "unconfined",
                            "securityContext.seccompProfile")  # fmt: skip
    flags += _profile_flags("apparmor", _effective(own, pod_context, "appArmorProfile"), None,
                            "securityContext.appArmorProfile")  # fmt: skip
    return flags


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The environment from literal ``env`` values, each expanded with the ones before it (kubelet order).
    ``valueFrom`` and ``envFrom`` need the API server: resolve them and pass ``env=`` instead."""
    if container.get("envFrom"):
        raise ContainerConfigError("envFrom needs the API server: resolve it and pass env=")
    env: dict[str, str] = {}
    for index, variable in enumerate(container.get("env") or []):
        name = variable.get("name")
        if not name:
            raise ContainerConfigError(f"env[{index}] has no name")
        if "valueFrom" in variable:
            raise ContainerConfigError(f"env {name}: valueFrom needs the API server: resolve it and pass env=")
        env[name] = expand(str(variable.get("value", "")), env)
    return env


def _bind(host: Path | str, target: str, read_only: bool, what: str) -> list[str]:
    host_text = str(host)
    for path in (host_text, target):
        if ":" in path or "," in path:
            raise ContainerConfigError(f"{what}: {path!r} contains ':' or ',', which podman -v cannot mount")
    if not target.startswith("/"):
        raise ContainerConfigError(f"{what}: mount path {target!r} is not absolute")
    return ["--volume", f"{host_text}:{target}:{'ro' if read_only else 'rw'}"]


def mount_flags(
    container: Mapping[str, Any], mounts: Mapping[str, VolumeMount], termination_file: Path | None
) -> list[str]:
    """``--volume`` for every mount (each of the spec's volumeMounts must be among them) and the
    termination message file."""
    for index, mount in enumerate(container.get("volumeMounts") or []):
        if mount.get("mountPath") not in mounts:
            raise ContainerConfigError(
                f"volumeMounts[{index}] ({mount.get('name')} at {mount.get('mountPath')}): no host directory given"
            )
    flags: list[str] = []
    for target, (host, read_only) in sorted(mounts.items()):
        flags += _bind(host, target, read_only, f"volume at {target}")
    if termination_file is not None:
        path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        flags += _bind(termination_file, path, False, "terminationMessagePath")
    return flags


def podman_run_argv(
    container: Mapping[str, Any],
    pod_security_context: Mapping[str, Any] | None,
    mounts: Mapping[str, VolumeMount],
    *,
    name: str,
    image: str | None = None,
    image_user: str = "",
    env: Mapping[str, str] | None = None,
    termination_file: Path | None = None,
    network: str = "host",
    pod: str = "",
) -> list[str]:
    """The full ``podman run`` argv for one container of a pod.

    ``image`` replaces ``container["image"]`` (a local reference from ``ensure_images()``); ``image_user``
    is that image's USER (``image_user(image)``), needed for runAsNonRoot; ``env`` is the complete,
    resolved environment (default: the spec's literal ``env``); ``pod`` names the pod in refusal messages
    (``format_pod(metadata)``). Raises ContainerConfigError for what a kubelet would refuse.
    """
    if not name or _NAME_UNSAFE.search(name):
        raise ContainerConfigError(f"container name {name!r}: use letters, digits, '_', '.', '-' (container_name())")
    reference = image or container.get("image")
    if not reference:
        raise ContainerConfigError(f"container {container.get('name')!r} has no image")
    environment = dict(env) if env is not None else container_env(container)
    argv = ["podman", "run", "--rm", "--pull=never", f"--name={name}", f"--network={network}",
            "--tty=false", "--interactive=false"]  # fmt: skip
    argv += security_flags(container, pod_security_context or {}, image_user, pod)
    argv += mount_flags(container, mounts, termination_file)
    for key, value in environment.items():
        argv += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        argv += ["--workdir", str(container["workingDir"])]
    command = [expand(str(c), environment) for c in container.get("command") or []]
    args = [expand(str(a), environment) for a in container.get("args") or []]
    if command:
        argv += ["--entrypoint", json.dumps(command)]
    return [*argv, str(reference), *args]


def name_of(argv: Sequence[str]) -> str:
    """The ``--name=`` of an argv made by podman_run_argv."""
    for item in argv:
        if item.startswith("--name="):
            return item.split("=", 1)[1]
    raise ValueError("the argv has no --name=")


# -- volumes on the host, as the kubelet prepares them -------------------------------------------------------

_RW_MASK = 0o660
_RO_MASK = 0o440
_EXEC_MASK = 0o110
EMPTY_DIR_MODE = 0o777
HOST_PATH_CREATE_MODE = 0o755


def ownership_mode(mode: int, is_dir: bool, read_only: bool = False) -> int:
    """The permission bits SetVolumeOwnership gives one entry: group read/write (read-only: read), and for
    directories setgid and group search, added to what it had."""
    mask = _RO_MASK if read_only else _RW_MASK
    if is_dir:
        mask |= 0o2000 | _EXEC_MASK
    return (mode & 0o7777) | mask


def set_volume_ownership(root: Path, fs_group: int, read_only: bool = False) -> None:
    """The kubelet's SetVolumeOwnership: every entry under ``root`` gets group ``fs_group`` (owner kept) and
    ``ownership_mode``; symbolic links get the group but no chmod."""
    for directory, dirnames, filenames in os.walk(root):
        entries = [Path(directory)] if Path(directory) == root else []
        entries += [Path(directory) / n for n in (*dirnames, *filenames)]
        for entry in entries:
            os.lchown(entry, -1, fs_group)
            info = entry.lstat()
            if entry.is_symlink():
                continue
            entry.chmod(ownership_mode(info.st_mode, entry.is_dir(), read_only))


def setup_empty_dir(path: Path, fs_group: int | None) -> Path:
    """A new emptyDir: created 0777 (whatever the umask), then with a pod fsGroup the kubelet's ownership
    management (root:fsGroup, 2777)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(EMPTY_DIR_MODE)
    if fs_group is not None:
        set_volume_ownership(path, fs_group)
    return path


def setup_sub_path(volume: Path, sub_path: str) -> Path:
    """A volumeMount's ``subPath`` inside a volume: a missing one is created (with parents) with the mode of
    the volume's root, owned by the kubelet's user (root), as the kubelet does before the container starts
    (so inside an emptyDir it is 0777, or 2777 with an fsGroup)."""
    path = volume / sub_path.strip("/")
    if not path.exists():
        mode = volume.stat().st_mode & 0o7777
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir()
            directory.chmod(mode)
    return path


def setup_host_path(path: Path, host_path_type: str = "") -> Path:
    """A hostPath volume's host side, checked like the kubelet checks its type: ``DirectoryOrCreate`` makes a
    missing directory (and parents) 0755, owned by the kubelet's user (root); ``Directory`` must exist;
    ``""`` checks nothing. No fsGroup ownership is applied to hostPath volumes."""
    if host_path_type == "":
        return path
    if host_path_type not in ("Directory", "DirectoryOrCreate"):
        raise ContainerConfigError(f"hostPath type {host_path_type!r} is not supported by the podman runner")
    if not path.exists():
        if host_path_type == "Directory":
            raise ContainerConfigError(f"hostPath type check failed: {path} is not a directory")
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir()
            directory.chmod(HOST_PATH_CREATE_MODE)
        return path
    if not path.is_dir():
        raise ContainerConfigError(f"hostPath type check failed: {path} is not a directory")
    return path


def prepare_termination_file(path: Path) -> Path:
    """An empty termination message file, mode 0666 (the kubelet's chmod), so any uid can write it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    path.chmod(0o666)
    return path


# -- podman I/O ---------------------------------------------------------------------------------------------


def image_user(image: str) -> str:
    """The image's USER (``Config.User``), e.g. ``65532:65532``; ``""`` for none (root)."""
    proc = subprocess.run(["podman", "image", "inspect", "--format", "{{.Config.User}}", image],
                          env=podman_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    if proc.returncode != 0:
        raise ContainerConfigError(f"image {image} is not in podman's storage: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def _read_message(termination_file: Path | None) -> str:
    if termination_file is None or not termination_file.exists():
        return ""
    with open(termination_file, "rb") as handle:
        return handle.read(TERMINATION_MESSAGE_LIMIT).decode("utf-8", "replace")


def run_container(
    argv: Sequence[str], *, termination_file: Path | None = None, timeout: float = 600
) -> ContainerResult:
    """Run the container to its end; past ``timeout`` seconds it is killed (exit code 137)."""
    with tempfile.TemporaryFile() as output:
        process = start_container(argv, output=output)
        try:
            exit_code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_container(name_of(argv))
            process.wait()
            exit_code = 137
        output.seek(0)
        text = output.read().decode("utf-8", "replace")
    return ContainerResult(exit_code, text, _read_message(termination_file))


def start_container(argv: Sequence[str], output: IO[bytes] | int | None = None) -> subprocess.Popen[bytes]:
    """Start ``podman run`` without waiting (a sidecar); stdout and stderr go to ``output`` (a file)."""
    return subprocess.Popen(list(argv), env=podman_env(), stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def stop_container(name: str, grace_seconds: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``grace_seconds``; the container is removed. Unknown names are ignored."""
    subprocess.run(["podman", "stop", "--ignore", f"--time={max(0, int(grace_seconds))}", name],
                   env=podman_env(), capture_output=True, timeout=grace_seconds + 60)  # fmt: skip
    _remove(name)


def kill_container(name: str) -> None:
    """SIGKILL now; the container is removed. Unknown names are ignored."""
    subprocess.run(["podman", "kill", "--signal=KILL", name], env=podman_env(), capture_output=True, timeout=60)
    _remove(name)


def _remove(name: str) -> None:
    subprocess.run(["podman", "rm", "--force", "--ignore", "--time=0", name], env=podman_env(),
                   capture_output=True, timeout=60)  # fmt: skip
