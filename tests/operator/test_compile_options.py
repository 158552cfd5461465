"""One definition of the compile options: the CRD, ``compilecache warmup`` and the harness accept
the same options and agree on what they mean (the same CompileOptions, the same digest)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import yaml
from compilecache_operator.decisions.plan import plan_id, variant_id
from compilecache_operator.decisions.warmup_job import harness_command
from compilecache_operator.model.spec import InvalidSpec

from cachelib.cli.parser import build_parser
from cachelib.in_image import harness
from cachelib.in_image.compilekey import MODES, CompileOptions, options_from_args
from tests.operator.crdschema import CRD
from tests.operator.samples import parsed

COMPILE_SPECS: list[dict[str, Any]] = [
    {},
    {"mode": "max-autotune", "dynamic": "false", "fullgraph": True, "compiledAutograd": True},
    {"mode": "reduce-overhead", "dynamic": "true", "backend": "aot_eager"},
    {"inductorConfig": {"max_autotune_gemm": "true", "triton.cudagraphs": "false", "size_hints": "4",
                        "cpp.simdlen": "\"avx2\"", "search": "text"}},
]


def harness_options(argv: list[str]) -> CompileOptions:
    """The options the harness parses out of a command line (it writes nothing while parsing)."""
    return options_from_args(harness.build_parser().parse_args(argv))


def warmup_options(argv: list[str]) -> CompileOptions:
    return options_from_args(build_parser().parse_args(["warmup", *argv]))


@pytest.mark.parametrize("compile_spec", COMPILE_SPECS)
@pytest.mark.parametrize("backward", [False, True])
def test_crd_options_reach_the_harness_unchanged(compile_spec: dict[str, Any], backward: bool) -> None:
    spec = parsed(model={"target": "tiny_mlp", "compile": compile_spec, "backward": backward})
    command = harness_command("team-a", "mlp", spec)
    assert command[:2] == ["python", "/opt/compilecache-harness/harness.py"]
    assert harness_options(command[2:]) == spec.model.compile
    assert warmup_options(command[2:]) == spec.model.compile
    assert spec.model.compile.backward == (backward or bool(compile_spec.get("compiledAutograd")))


def test_inductor_config_values_read_as_the_command_lines_read_them() -> None:
    spec = parsed(model={"target": "tiny_mlp", "compile": COMPILE_SPECS[-1]})
    assert dict(spec.model.compile.inductor_config) == {
        "max_autotune_gemm": True, "triton.cudagraphs": False, "size_hints": 4, "cpp.simdlen": "avx2",
        "search": "text",
    }
    flags = ["--target", "tiny_mlp", "--out", "/o", "--namespace", "team-a", "--name", "mlp",
             "--inductor-config", "max_autotune_gemm=true", "--inductor-config", "triton.cudagraphs=false",
             "--inductor-config", "size_hints=4", "--inductor-config", 'cpp.simdlen="avx2"',
             "--inductor-config", "search=text"]  # fmt: skip
    assert harness_options(flags).digest() == spec.model.compile.digest()


def test_the_parsers_take_the_same_options() -> None:
    def compile_flags(parser: argparse.ArgumentParser) -> dict[str, Any]:
        return {
            a.option_strings[-1]: (a.choices, a.default, a.type)
            for a in parser._actions
            # check_precompile, precompile_pass: the harness's internal roles
            # (cachelib.in_image.precheck, its second pass)
            if a.option_strings and a.dest not in ("help", "out", "namespace", "name", "cache_dir", "check_precompile",
                                                   "precompile_pass")
        }

    warmup = build_parser()._subparsers._group_actions[0].choices["warmup"]  # type: ignore[union-attr]
    ours = compile_flags(warmup)
    for only_warmup in ("--store", "--out", "--force", "--level", "--log-format", "--verbose"):  # the last two: global
        ours.pop(only_warmup, None)
    assert ours == compile_flags(harness.build_parser())
    crd = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    crd_compile = crd["properties"]["spec"]["properties"]["model"]["properties"]["compile"]["properties"]
    assert tuple(crd_compile["mode"]["enum"]) == MODES == ours["--mode"][0]
    assert set(crd_compile) == {"mode", "dynamic", "fullgraph", "backend", "compiledAutograd", "inductorConfig"}


@pytest.mark.parametrize("argv", [["--mode", "fastest"], ["--inductor-config", "no-equals"],
                                  ["--inductor-config", "bad-name=1"], ["--dynamic", "maybe"]])
def test_warmup_refuses_what_the_harness_refuses(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--target", "tiny_mlp", "--name", "mlp"]
    for parse in (lambda: build_parser().parse_args(["warmup", *base, *argv]),
                  lambda: harness.build_parser().parse_args([*base, "--out", "/o", "--namespace", "n", *argv])):
        with pytest.raises(SystemExit) as caught:
            parse()
        assert caught.value.code == 2
    assert argv[-1] in capsys.readouterr().err


def test_bad_inductor_config_in_the_spec_is_named() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parsed(model={"target": "tiny_mlp", "compile": {"inductorConfig": {"no-such.1": "1", "ok": 3}}})
    assert {e.path for e in caught.value.errors} == {
        "spec.model.compile.inductorConfig.no-such.1", "spec.model.compile.inductorConfig.ok",
    }


def test_plan_ids_of_caches_without_inductor_config_are_unchanged() -> None:
    """Ids computed before the options moved into one module: existing caches are not warmed again."""
    cases = [
        ({"target": "tiny_mlp"}, "cc-07d30547fe949dda", "fe93d50d1d"),
        ({"command": "python serve.py", "compile": {"mode": "max-autotune", "dynamic": "false", "fullgraph": True,
                                                    "compiledAutograd": True}}, "cc-6bcce60631c99256", "8c8b9b254c"),
        ({"target": "m:f", "compile": {"dynamic": "true", "backend": "aot_eager"}, "backward": True},
         "cc-ec378fca4e0a96a6", "5db760b572"),
    ]
    for model, plan, variant in cases:
        spec = parsed(model=model)
        assert (plan_id("team-a", "mlp", spec), variant_id("team-a", "mlp", spec, "NVIDIA-H100-80GB-HBM3")) == (
            plan, variant)
    with_config = parsed(model={"target": "tiny_mlp", "compile": {"inductorConfig": {"max_autotune": "true"}}})
    assert plan_id("team-a", "mlp", with_config) != "cc-07d30547fe949dda"
