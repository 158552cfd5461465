"""Who the containers we create or inject run as, and the security contexts that say it (pure).

Everything the operator adds to a cluster passes the "restricted" Pod Security Standard where the
pod can: the warm-up Job's pod (which the operator owns: pod-level settings) and the preload
container injected into a workload's pod (container-level settings only: the user's own
containers and pod fields stay as they are). The one exception is a node cache
(``spec.preload.nodeCache``): a hostPath volume is only allowed at the "privileged" level anyway,
and the directory the kubelet makes for it is root's, so that preload runs as uid 0 with only the
capabilities it needs to write and hand over the tree (see :func:`preload_identity`).

The preload leaves a cache the app's uid can write into (torch creates ``locks/`` and new
entries beside the preloaded ones). Which way depends on what the pod spec says about the app:

- the app's uid is stated (container ``securityContext`` over the pod's, nonzero, the same in
  every app container): the preload runs as that uid (and its gid where stated) and passes
  ``--share owner``: the app owns the tree;
- otherwise, the pod has an ``fsGroup``: the preload runs as 65532 with that group and passes
  ``--share group`` (directories setgid and group-writable, files group-writable); the kubelet
  gives every container of the pod the fsGroup as a supplementary group;
- otherwise: 65532, ``--share all`` (directories 0777, files 0666): the app's uid is unknown
  (it comes from its image), so only a tree everyone may write is sure to work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PRELOADER_UID = 65532
"""The user of the preloader image (images/preloader/Dockerfile)."""
ROOT = 0
SHARE_OWNER, SHARE_GROUP, SHARE_ALL = "owner", "group", "all"
NODE_CACHE_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER")
"""What a preload into a node cache keeps of root's powers: write into the kubelet's root-owned
hostPath directory (DAC_OVERRIDE), hand the tree to the app's uid (CHOWN) and set the modes of
files it does not own (FOWNER). Nothing else."""
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def restricted_container_context(
    *,
    run_as_user: int | None = None,
    run_as_group: int | None = None,
    read_only_root: bool = True,
) -> dict[str, Any]:
    """A container ``securityContext`` that passes the "restricted" standard on its own, whatever
    the pod level says: no privilege escalation, every capability dropped, a non-root user,
    the runtime's default seccomp profile, and a read-only root file system where the container
    writes only into its volumes."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }
    if run_as_user is not None:
        context["runAsUser"] = run_as_user
    if run_as_group is not None:
        context["runAsGroup"] = run_as_group
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def restricted_pod_context(*, run_as_user: int, run_as_group: int, fs_group: int) -> dict[str, Any]:
    """The pod ``securityContext`` of a pod the operator owns (the warm-up Job's)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_group,
        "fsGroup": fs_group,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }


# -- the app's identity -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """The uid and gid a container runs as, as far as the pod spec states them (None: from the image)."""

    uid: int | None = None
    gid: int | None = None


def stated_identity(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> Identity:
    """The container's ``runAsUser``/``runAsGroup``, else the pod's (Kubernetes' own precedence)."""
    pod_context = pod_spec.get("securityContext") or {}
    own = container.get("securityContext") or {}

    def pick(key: str) -> int | None:
        for context in (own, pod_context):
            value = context.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    return Identity(uid=pick("runAsUser"), gid=pick("runAsGroup"))


def app_identity(pod_spec: Mapping[str, Any], containers: Sequence[Mapping[str, Any]]) -> Identity | None:
    """The one non-root uid every app container states (with the gid they all state, if any);
    None when a container leaves its uid to its image, states root, or they differ."""
    if not containers:
        return None
    found = {stated_identity(pod_spec, c) for c in containers}
    uids = {i.uid for i in found}
    if len(uids) != 1:
        return None
    (uid,) = uids
    if uid is None or uid == ROOT:
        return None
    gids = {i.gid for i in found}
    gid = gids.pop() if len(gids) == 1 else None
    return Identity(uid=uid, gid=gid)


def pod_fs_group(pod_spec: Mapping[str, Any]) -> int | None:
    value = (pod_spec.get("securityContext") or {}).get("fsGroup")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the preload's identity ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PreloadIdentity:
    """Who the preload runs as, and how it leaves the tree for the app (``--share``/``--owner``)."""

    run_as_user: int
    run_as_group: int | None
    share: str
    owner: Identity | None = None
    """``--owner UID:GID``: hand the tree to this identity (a node cache only; needs CAP_CHOWN)."""
    node_cache: bool = False
    basis: str = ""
    """Why, in words (for the docs and the tests)."""

    def flags(self) -> list[str]:
        """The preload command line's ``--share`` and ``--owner`` flags."""
        out = ["--share", self.share]
        if self.owner is not None:
            out += ["--owner", f"{self.owner.uid}:{self.owner.gid}"]
        return out

    def security_context(self) -> dict[str, Any]:
        """The preload container's ``securityContext``: "restricted" except for a node cache."""
        if not self.node_cache:
            return restricted_container_context(run_as_user=self.run_as_user, run_as_group=self.run_as_group)
        return {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": list(NODE_CACHE_CAPABILITIES)},
            "runAsNonRoot": False,  # explicit: a pod-level runAsNonRoot would keep uid 0 from starting
            "runAsUser": ROOT,
            "runAsGroup": ROOT,
            "readOnlyRootFilesystem": True,
            "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
        }


def preload_identity(
    pod_spec: Mapping[str, Any], app_containers: Sequence[Mapping[str, Any]], *, node_cache: bool
) -> PreloadIdentity:
    """Decide who the preload runs as from what the pod spec says about its app containers."""
    app = app_identity(pod_spec, app_containers)
    fs_group = pod_fs_group(pod_spec)
    if node_cache:
        if app is not None:
            assert app.uid is not None
            gid = app.gid if app.gid is not None else fs_group if fs_group is not None else app.uid
            owner = Identity(app.uid, gid)
            basis = f"node cache: root with {', '.join(NODE_CACHE_CAPABILITIES)}, tree handed to the app's uid"
        else:
            gid = fs_group if fs_group is not None else PRELOADER_UID
            owner = Identity(PRELOADER_UID, gid)
            basis = f"node cache: root with {', '.join(NODE_CACHE_CAPABILITIES)}, the app's uid is not stated"
        return PreloadIdentity(ROOT, ROOT, SHARE_ALL, owner=owner, node_cache=True, basis=basis)
    if app is not None:
        assert app.uid is not None
        return PreloadIdentity(app.uid, app.gid, SHARE_OWNER, basis="the app's uid is stated: the app owns the tree")
    if fs_group is not None:
        return PreloadIdentity(PRELOADER_UID, fs_group, SHARE_GROUP, basis="the pod's fsGroup may write the tree")
    return PreloadIdentity(PRELOADER_UID, PRELOADER_UID, SHARE_ALL,
                           basis="neither the app's uid nor an fsGroup is stated: everyone may write the tree")
