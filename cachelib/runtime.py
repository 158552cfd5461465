"""What a workload calls: ``warm_start()`` before its first compile, and its Prometheus metrics.

::

    from cachelib import runtime
    runtime.warm_start()                 # apply the preloaded bundle's warm-start manifest
    runtime.start_http_server(9400)      # or runtime.register() with your own registry; runtime.metrics_text()
    runtime.why()                        # which factor made a graph compile afresh

The metrics (what they count, their labels) are described in :mod:`cachelib.metrics`; the verdict
of :func:`why` in :mod:`cachelib.verdict`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import start_http_server as _start_http_server

from cachelib import verdict
from cachelib.handoff import wait_for_preload
from cachelib.in_image import triton_modules, warmstart
from cachelib.metrics import TorchCompileCacheCollector

log = logging.getLogger(__name__)


def why() -> verdict.Diagnosis:
    """Which factor made this process compile afresh, per graph (see :mod:`cachelib.verdict`)."""
    return verdict.diagnose()


def warm_start(cache_dir: str | None = None, *, wait: bool = True) -> warmstart.Prepared:
    """Before the first ``torch.compile``: apply the preloaded bundle's warm-start manifest.

    With a bundle made with ``spec.model.precompile: Auto`` and the very torch and Triton
    installation of the warm-up, torch and Triton get the warm-up's source keys (no hashing of
    their sources) and Dynamo's caching precompile (no re-tracing); on any mismatch, nothing of it,
    and the reasons are in the answer's ``declined``. Torch's loader of precompiled entries is
    guarded: an entry that fails to load is a counted fallback (an ordinary compile, the FX-graph
    cache still hits), never an exception. See :mod:`cachelib.in_image.warmstart`.

    Dynamo looks its precompiled entry up when ``torch.compile`` is called, so a preload running
    beside the workload (Sidecar mode) must be done by then: with ``wait`` (the default) this
    first waits for it (:func:`cachelib.handoff.wait_for_preload`, at once where none runs).

    Triton's compiled C modules that the bundle carries (:mod:`cachelib.in_image.triton_modules`) are put where
    this process's Triton looks for them, so that it neither runs nor needs a C compiler.

    From here on, every graph compiled is compared with the warm-up's record of the same graph
    (:mod:`cachelib.verdict`): :func:`why` and the ``compilecache_runtime_graphs_total`` metric say
    which factor made a graph compile afresh."""
    if wait:
        wait_for_preload()
    prepared = warmstart.prepare(cache_dir)
    if prepared.cache_dir:
        install_triton_modules(Path(prepared.cache_dir), prepared)
    try:
        verdict.start_watching(prepared.cache_dir)
    except Exception:  # the diagnosis is optional; the workload is not
        log.warning("compilecache: the compile factors will not be recorded", exc_info=True)
    return prepared


def install_triton_modules(cache_dir: Path, done: warmstart.Prepared) -> None:
    """Install the bundle's Triton modules; the lever ``triton_modules`` when any is in place."""
    installed = triton_modules.install(cache_dir)
    if installed.placed or installed.present:
        done.applied.append("triton_modules")
    for problem in installed.problems[:3]:
        done.declined.append(f"triton_modules: {problem}")


_registered: dict[int, TorchCompileCacheCollector] = {}


def register(registry: CollectorRegistry = REGISTRY) -> TorchCompileCacheCollector:
    """Register the collector with ``registry`` once; later calls return the same collector."""
    if id(registry) not in _registered:
        collector = TorchCompileCacheCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return _registered[id(registry)]


def metrics_text(registry: CollectorRegistry | None = None) -> str:
    """The Prometheus text exposition of the runtime metrics (a private registry by default)."""
    if registry is None:
        registry = CollectorRegistry()
        registry.register(TorchCompileCacheCollector())
    return generate_latest(registry).decode()


def start_http_server(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> Any:
    """Register the collector and serve ``/metrics`` on ``addr:port`` from a daemon thread."""
    register(registry)
    return _start_http_server(port, addr=addr, registry=registry)
