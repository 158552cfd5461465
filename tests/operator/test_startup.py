"""The operator's runtime: built once from the command line, handed to every handler as its memo, and shared
by the per-object copies Kopf makes of it."""

from __future__ import annotations

import copy
import threading

import kopf
import pytest
from compilecache_operator.lifecycle import Admission, Election, Probes, Runtime, SigningSecret, runtime_of
from compilecache_operator.main import parse_args, runtime_from
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.reconcile_samples import cache, state_with

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(
    namespace=NAMES,
    secret=st.none() | NAMES,
    lease_namespace=st.none() | NAMES,
    lease=NAMES,
    port=st.integers(0, 65535),
    resync=st.floats(0.5, 3600),
    delay=st.floats(0, 60),
    trusted=st.lists(st.from_regex(r"[A-Za-z0-9+/]{8}=", fullmatch=True), max_size=3),
)
def test_the_runtime_holds_what_the_options_say(
    namespace: str, secret: str | None, lease_namespace: str | None, lease: str, port: int, resync: float,
    delay: float, trusted: list[str],
) -> None:
    argv = ["--webhook-config", "off", "--operator-namespace", namespace, "--health-address", "127.0.0.2",
            "--health-port", str(port), "--resync-seconds", str(resync), "--shutdown-delay", str(delay),
            "--leader-election-name", lease, "--trusted-public-keys", ",".join(trusted)]
    argv += ["--signing-key-secret", secret] if secret else []
    argv += ["--leader-election-namespace", lease_namespace] if lease_namespace else []
    options = parse_args(argv)
    state = state_with(cache())
    runtime = runtime_from(options, state, Admission())
    assert runtime.state is state and runtime.admission == Admission()
    assert runtime.intervals.resync_seconds == resync and runtime.shutdown_delay == delay
    assert runtime.probes == Probes(address="127.0.0.2", port=port)
    if secret:
        assert isinstance(runtime.signing_secret, SigningSecret)
        assert (runtime.signing_secret.namespace, runtime.signing_secret.name) == (namespace, secret)
        assert runtime.signing_secret.extra_trusted == tuple(trusted)
    else:
        assert runtime.signing_secret is None
    assert runtime.election == (Election(lease_namespace, lease) if lease_namespace else None)
    assert isinstance(runtime.stop_flag, threading.Event) and not runtime.stop_flag.is_set()


def test_the_copy_kopf_gives_each_object_shares_what_changes() -> None:
    """Kopf hands each object's handlers a shallow copy of the memo: the State, the counted pods and what
    was started are the same objects in every copy."""
    runtime = Runtime(state=state_with(cache()), stop_flag=None)
    one, other = copy.copy(runtime), copy.copy(runtime)
    assert runtime_of(one) is one and runtime_of(other).state is runtime.state
    assert one.counted.add("uid-1") and not other.counted.add("uid-1") and not runtime.counted.add("uid-1")
    assert one.running is other.running and one.cold_counted is other.cold_counted
    assert not runtime.state.cluster.ready
    one.mark_ready()
    assert runtime.state.cluster.ready and other.state.cluster.ready


def test_a_memo_that_is_not_the_runtime_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="the operator's memo must be its Runtime, got Memo"):
        runtime_of(kopf.Memo(state=state_with(cache())))

