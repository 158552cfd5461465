"""Whether the webhook may run the preload as a Kubernetes native sidecar.

A native sidecar is an init container with ``restartPolicy: Always``: kubelet starts the app
containers as soon as it has started, and stops it when the pod ends. Kubernetes has them on by
default from 1.29 (behind the ``SidecarContainers`` gate in 1.28). An API server that does not
know the field drops it, and the preload would then run as an init container that never exits,
so the operator asks the API server's version once at start-up
(:func:`compilecache_operator.lifecycle.detect_native_sidecars`), and ``--native-sidecars on|off`` overrides
that answer where the version misleads. What the answer is, from the version, is pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NATIVE_SIDECARS_SINCE = (1, 29)
SWITCH_VALUES = ("auto", "on", "off")
_LEADING_NUMBER = re.compile(r"^\s*(\d+)")
_GIT_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class SidecarSupport:
    """The answer, and what it rests on (``the API server is v1.20.2``)."""

    available: bool
    basis: str

    @property
    def fallback_reason(self) -> str:
        """Why a pod whose cache asks for a sidecar gets an init container instead."""
        since = ".".join(str(n) for n in NATIVE_SIDECARS_SINCE)
        return f"Sidecar needs Kubernetes {since}+ native sidecars; {self.basis}"


NOT_DETECTED = SidecarSupport(False, "the API server's version has not been read")


def parse_server_version(info: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from the API server's ``/version``, or None when it says neither.

    Managed clusters report a minor like ``"29+"``; builds without the split fields still carry
    ``gitVersion`` (``v1.29.3-eks-1234``), which is read when ``major``/``minor`` are missing.
    """
    major = _LEADING_NUMBER.match(str(info.get("major") or ""))
    minor = _LEADING_NUMBER.match(str(info.get("minor") or ""))
    if major and minor:
        return int(major.group(1)), int(minor.group(1))
    git = _GIT_VERSION.match(str(info.get("gitVersion") or "").strip())
    if git:
        return int(git.group(1)), int(git.group(2))
    return None


def describe_version(info: Mapping[str, Any]) -> str:
    git = str(info.get("gitVersion") or "").strip()
    if git:
        return git
    return f"v{info.get('major', '?')}.{info.get('minor', '?')}"


def sidecar_support(switch: str, info: Mapping[str, Any] | None, error: str = "") -> SidecarSupport:
    """Decide from the ``--native-sidecars`` switch and the ``/version`` answer (None when it failed)."""
    if switch == "on":
        return SidecarSupport(True, "the operator runs with --native-sidecars on")
    if switch == "off":
        return SidecarSupport(False, "the operator runs with --native-sidecars off")
    if switch != "auto":
        raise ValueError(f"--native-sidecars: {switch!r} is not one of {', '.join(SWITCH_VALUES)}")
    if info is None:
        return SidecarSupport(False, f"the API server's version could not be read ({error or 'no answer'})")
    version = parse_server_version(info)
    if version is None:
        return SidecarSupport(False, f"the API server's version {describe_version(info)!r} is not major.minor")
    return SidecarSupport(version >= NATIVE_SIDECARS_SINCE, f"the API server is {describe_version(info)}")
