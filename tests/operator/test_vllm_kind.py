"""vLLM as a workload kind (pure): ``spec.model.vllm`` parsed and refused with the field named, the warm-up Job
that runs vLLM as the pods do, the pod patch (``VLLM_CACHE_ROOT`` on the bundle, a root the container sets kept,
the watch sidecar), the admission's prediction with its warning and metric, and the sidecar's verdict read from
the pod's status into status.coldStarts' words."""

from __future__ import annotations

import json
from typing import Any

import pytest
from compilecache_operator.admission import webhook
from compilecache_operator.decisions import coldstarts, podpatch
from compilecache_operator.decisions.plan import plan_variants
from compilecache_operator.decisions.prediction import predict_vllm
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.names import (
    CACHE_VOLUME,
    INDUCTOR_DIR,
    PREDICTED_ANNOTATION,
    PREDICTED_DETAIL_ANNOTATION,
    SKIPPED_ANNOTATION,
    VLLM_WATCH_CONTAINER,
)
from compilecache_operator.model.sidecars import SidecarSupport
from compilecache_operator.model.spec import InvalidSpec
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.cli.parser import build_parser
from tests.operator.samples import env_of, inject, job_for, parsed, pod, view

MODEL = "Qwen/Qwen3-8B"
VLLM = {"model": MODEL, "args": ["--max-model-len", "8192"], "env": [{"name": "VLLM_USE_AOT_COMPILE", "value": "0"}]}
POD_ENV = [{"name": "VLLM_USE_AOT_COMPILE", "value": "0"}]
NO_SIDECARS = SidecarSupport(False, "the API server is v1.28.3")


def vllm_pod(*args: str, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    container = {"name": "vllm", "image": "registry.example/workload:1", "args": [MODEL, *args],
                 "env": POD_ENV if env is None else env}  # fmt: skip
    return pod(containers=[container])


def vllm_view(**vllm: Any) -> Any:
    return view(model={"vllm": {**VLLM, **vllm}})


# -- the spec --------------------------------------------------------------------------------------------------
def test_a_vllm_spec_reads_into_its_start() -> None:
    spec = parsed(model={"vllm": VLLM}).model.vllm
    assert spec is not None and spec.argv() == ["vllm", "serve", MODEL, "--max-model-len", "8192"]
    assert spec.env == (("VLLM_USE_AOT_COMPILE", "0"),)
    launcher = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    served = parsed(model={"vllm": {"model": MODEL, "command": launcher}})
    assert served.model.vllm is not None and served.model.vllm.argv()[-2:] == ["--model", MODEL]


@pytest.mark.parametrize(
    ("model", "extra", "path", "fragment"),
    [
        ({"vllm": {"args": []}}, {}, "spec.model.vllm.model", "required"),
        ({"vllm": {"model": MODEL, "command": ["python", "serve.py"]}}, {}, "spec.model.vllm.command",
         "does not start vLLM's server"),
        ({"vllm": {"model": MODEL, "args": ["--model", "other"]}}, {}, "spec.model.vllm.args", "--model is"),
        ({"vllm": {"model": MODEL, "args": ["second"]}}, {}, "spec.model.vllm.args", "second positional"),
        ({"vllm": {"model": MODEL, "env": [{"name": "HF_TOKEN", "value": "x"}]}}, {}, "spec.model.vllm.env[0].name",
         "not a VLLM_* variable"),
        ({"vllm": {"model": MODEL, "env": [{"name": "VLLM_CACHE_ROOT", "value": "/c"}]}}, {},
         "spec.model.vllm.env[0].name", "compilecache puts the bundle"),
        ({"vllm": {"model": MODEL, "env": [{"name": "VLLM_X", "value": "1"}, {"name": "VLLM_X", "value": "2"}]}}, {},
         "spec.model.vllm.env[1].name", "set twice"),
        ({"vllm": {"model": MODEL}, "target": "tiny_mlp"}, {}, "spec.model", "not target and vllm"),
        ({"vllm": {"model": MODEL}, "precompile": "Auto"}, {}, "spec.model", "do not apply to vLLM"),
        ({"vllm": {"model": MODEL}}, {"warmup": {"env": [{"name": "VLLM_USE_AOT_COMPILE", "value": "0"}]}},
         "spec.warmup.env[0].name", "belongs in spec.model.vllm.env"),
        ({"vllm": {"model": MODEL}}, {"preload": {"mode": "Sidecar"}}, "spec.preload.mode", "waits for no preload"),
    ],
)  # fmt: skip
def test_bad_vllm_specs_name_the_field(model: dict[str, Any], extra: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        parsed(model=model, **extra)
    errors = {e.path: e.message for e in raised.value.errors}
    assert path in errors and fragment in errors[path], errors


UNSEEN = st.characters(categories=["Cc", "Cf", "Co", "Zl", "Zp"])
"""Characters nobody sees in a manifest: controls (NUL, escape, bell, DEL, C1), format (zero-width space,
right-to-left override, byte-order mark), private use, line and paragraph separators."""


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(field=st.sampled_from(["model", "args", "command", "env"]), hidden=UNSEEN,
       text=st.text(st.characters(categories=["L", "N"]) | st.sampled_from("/-_.:"), min_size=1, max_size=20),
       at=st.integers(0, 20))
def test_a_hidden_character_in_any_vllm_string_is_refused_with_its_field(field: str, hidden: str, text: str,
                                                                         at: int) -> None:
    """The model string is refused as every other vLLM string is: a control or invisible character anywhere in it
    names the field and the character's code point (engine arguments and variables' values may keep a tab or a
    line end, which JSON and YAML blocks carry)."""
    value = text[:at] + hidden + text[at:]
    vllm: dict[str, Any] = {"model": MODEL}
    path = {"model": "spec.model.vllm.model", "args": "spec.model.vllm.args[1]",
            "command": "spec.model.vllm.command[1]", "env": "spec.model.vllm.env[0].value"}[field]
    if field == "model":
        vllm["model"] = value
    elif field == "args":
        vllm["args"] = ["--served-model-name", value]
    elif field == "command":
        vllm["command"] = ["vllm", value]
    else:
        vllm["env"] = [{"name": "VLLM_X", "value": value}]
    if field in ("args", "env") and hidden in "\t\n\r":
        parsed(model={"vllm": vllm})
        return
    with pytest.raises(InvalidSpec) as raised:
        parsed(model={"vllm": vllm})
    errors = {e.path: e.message for e in raised.value.errors}
    assert list(errors) == [path], errors
    assert f"U+{ord(hidden):04X}" in errors[path] and "control and invisible characters" in errors[path]


def test_each_part_of_the_start_is_part_of_the_variant() -> None:
    ids = {
        plan_variants("team-a", "mlp", parsed(model={"vllm": vllm}))[0].id
        for vllm in (VLLM, {**VLLM, "model": "other"}, {**VLLM, "args": ["--max-model-len", "4096"]},
                     {**VLLM, "env": []}, {**VLLM, "command": ["python", "-m", "vllm.entrypoints.openai.api_server"]})
    }  # fmt: skip
    assert len(ids) == 5


# -- the warm-up Job ---------------------------------------------------------------------------------------------
def test_the_warm_up_starts_vllm_as_the_pods_do() -> None:
    job = job_for(model={"vllm": VLLM})
    compile_container = job["spec"]["template"]["spec"]["initContainers"][1]
    command = compile_container["command"]
    assert command[:2] == ["python3", "/opt/compilecache-harness/vllmwarm.py"]
    invocation = json.loads(command[command.index("--invocation") + 1])
    assert invocation == {"command": ["vllm", "serve"], "model": MODEL, "args": ["--max-model-len", "8192"]}
    assert env_of(compile_container)["VLLM_USE_AOT_COMPILE"] == "0"


# -- the pod patch ----------------------------------------------------------------------------------------------------
def test_a_vllm_pod_gets_its_cache_root_on_the_bundle_and_the_watch_sidecar() -> None:
    patch = inject(vllm_pod("--max-model-len", "8192"), vllm_view(),)
    app = patch.containers[0]  # type: ignore[index]
    assert env_of(app)["VLLM_CACHE_ROOT"] == f"{INDUCTOR_DIR}/vllm"
    assert env_of(app)["TORCHINDUCTOR_CACHE_DIR"] == INDUCTOR_DIR
    names = [c["name"] for c in patch.init_containers or []]
    assert names == ["compilecache-preload", VLLM_WATCH_CONTAINER]
    watch = patch.init_containers[1]  # type: ignore[index]
    assert watch["restartPolicy"] == "Always"
    assert watch["securityContext"] == patch.init_containers[0]["securityContext"]  # type: ignore[index]
    args = build_parser().parse_args(watch["command"][1:])
    assert (args.cache_dir, args.port, json.loads(args.prediction)) == (INDUCTOR_DIR, 8000, [])
    assert patch.annotations[PREDICTED_ANNOTATION] == "warm" and patch.warnings == ()


def test_a_pod_that_differs_is_warned_before_it_starts_and_still_injected() -> None:
    patch = inject(vllm_pod("--max-model-len", "4096", "--port", "9000"), vllm_view())
    assert patch.warnings == ("compilecache: this pod will compile: --max-model-len 8192 → 4096",)
    assert patch.annotations[PREDICTED_ANNOTATION] == "cold"
    assert patch.annotations[PREDICTED_DETAIL_ANNOTATION] == "--max-model-len 8192 → 4096"
    watch = build_parser().parse_args(patch.init_containers[1]["command"][1:])  # type: ignore[index]
    assert watch.port == 9000
    assert json.loads(watch.prediction) == [
        {"factor": "--max-model-len", "before": "8192", "after": "4096", "kind": "argument"},
    ]  # fmt: skip


def test_variables_from_elsewhere_are_said_not_guessed() -> None:
    env = [{"name": "VLLM_USE_AOT_COMPILE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    patch = inject(vllm_pod("--max-model-len", "8192", env=env), vllm_view())
    assert patch.warnings == ("compilecache: this pod will compile: env VLLM_USE_AOT_COMPILE: 0 → unset "
                              "(not compared: VLLM_USE_AOT_COMPILE from valueFrom)",)  # fmt: skip


def test_a_variable_left_at_vllms_default_is_no_difference() -> None:
    default_spec = {**VLLM, "env": [{"name": "VLLM_USE_AOT_COMPILE", "value": "1"}]}
    assert inject(vllm_pod("--max-model-len", "8192", env=[]), vllm_view(**default_spec)).warnings == ()


def test_a_cache_root_the_container_sets_is_where_the_bundle_is_mounted() -> None:
    env = [*POD_ENV, {"name": "VLLM_CACHE_ROOT", "value": "/data/vllm-cache/"}]
    app = inject(vllm_pod("--max-model-len", "8192", env=env), vllm_view()).containers[0]  # type: ignore[index]
    assert env_of(app)["VLLM_CACHE_ROOT"] == "/data/vllm-cache/"
    assert {"name": CACHE_VOLUME, "mountPath": "/data/vllm-cache", "subPath": "inductor/vllm"} in app["volumeMounts"]


def test_the_cache_root_follows_the_containers_own_inductor_directory() -> None:
    env = [*POD_ENV, {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/cache/inductor"}]
    app = inject(vllm_pod("--max-model-len", "8192", env=env), vllm_view()).containers[0]  # type: ignore[index]
    assert env_of(app)["VLLM_CACHE_ROOT"] == "/cache/inductor/vllm"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"name": "VLLM_CACHE_ROOT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
         "cache-dir-value-from"),
        ({"name": "VLLM_CACHE_ROOT", "value": "relative"}, "cache-dir-not-absolute"),
    ],
)  # fmt: skip
def test_a_cache_root_that_cannot_be_wired_leaves_the_pod_alone(entry: dict[str, Any], reason: str) -> None:
    patch = inject(vllm_pod(env=[entry]), vllm_view())
    assert patch.skipped == reason and patch.annotations[SKIPPED_ANNOTATION] == reason


def test_without_native_sidecars_the_prediction_stays_and_no_watcher_comes() -> None:
    patch = inject(vllm_pod("--max-model-len", "4096"), vllm_view(), sidecars=NO_SIDECARS)
    assert [c["name"] for c in patch.init_containers or []] == ["compilecache-preload"]
    assert patch.warnings and patch.annotations[PREDICTED_ANNOTATION] == "cold"


def test_a_container_that_runs_the_images_entrypoint_is_read_with_the_caches_command() -> None:
    ran = predict_vllm([{"name": "a", "args": [MODEL, "--max-model-len", "8192"], "env": POD_ENV},
                        {"name": "b", "command": ["python", "sidecar.py"]}], parsed(model={"vllm": VLLM}).model.vllm)  # type: ignore[arg-type]  # fmt: skip
    assert [(p.container, p.outcome) for p in ran] == [("a", "warm")]


def test_a_pod_whose_start_cannot_be_read_is_told_so_and_still_gets_the_bundle() -> None:
    patch = inject(pod(containers=[{"name": "app", "image": "registry.example/workload:1",
                                    "command": ["/entrypoint.sh"], "env": POD_ENV}]), vllm_view())  # fmt: skip
    assert patch.annotations[PREDICTED_ANNOTATION] == "unknown"
    assert [c["name"] for c in patch.init_containers or []] == ["compilecache-preload"]
    assert env_of(patch.containers[0])["VLLM_CACHE_ROOT"] == f"{INDUCTOR_DIR}/vllm"  # type: ignore[index]
    (warning,) = patch.warnings
    assert warning.startswith("compilecache: no container of this pod starts vLLM's server as CompileCache mlp")


def test_a_torch_cache_gets_no_vllm_wiring() -> None:
    patch = inject(pod(), view())
    assert "VLLM_CACHE_ROOT" not in env_of(patch.containers[0])  # type: ignore[index]
    assert patch.predictions == () and patch.annotations[PREDICTED_ANNOTATION] == "warm"


# -- the webhook's count ------------------------------------------------------------------------------------------
class _State:
    def __init__(self, metrics: Metrics, cache_view: Any) -> None:
        self.metrics = metrics
        self.view = cache_view


def test_the_webhook_counts_each_prediction_once_and_never_a_dry_run() -> None:
    metrics = Metrics()
    patch = inject(vllm_pod("--max-model-len", "4096"), vllm_view())
    webhook.count_predictions(_State(metrics, None), vllm_pod(), patch)  # type: ignore[arg-type]
    sample = metrics.registry.get_sample_value(
        "compilecache_admission_predictions_total",
        {"namespace": "team-a", "cache": "mlp", "prediction": "cold", "cause": "engine_argument"},
    )
    assert sample == 1.0


# -- the verdict in the pod's status ----------------------------------------------------------------------------------
def test_the_watchers_verdict_is_read_from_its_last_run() -> None:
    said = {"result": "miss", "cause": "engine_argument", "reason": "vLLM compiled afresh: --max-model-len 8192 → 4096"}
    message = json.dumps({"compilecache_why": said})
    body = {"status": {
        "containerStatuses": [{"name": "vllm", "state": {"running": {}}}],
        "initContainerStatuses": [
            {"name": "compilecache-preload", "state": {"terminated": {"exitCode": 0, "message": '{"result": "hit"}'}}},
            {"name": VLLM_WATCH_CONTAINER, "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 0, "message": message}}},
        ],
    }}  # fmt: skip
    verdict = coldstarts.pod_verdict(body)
    assert verdict is not None and (verdict.result, verdict.cause) == ("miss", "engine_argument")
    assert "--max-model-len 8192 → 4096" in verdict.reason


def test_a_pod_patch_of_a_vllm_cache_is_idempotent() -> None:
    first = podpatch.patched_pod(vllm_pod("--max-model-len", "8192"),
                                 inject(vllm_pod("--max-model-len", "8192"), vllm_view()))  # fmt: skip
    assert inject(first, vllm_view()).skipped == "already-injected"
