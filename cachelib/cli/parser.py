"""The command line's grammar: every command, its flags, help and examples (and ``completion``, ``demo``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from cachelib import __version__
from cachelib.cli.arguments import (
    STORE_ENV,
    parse_cache_arg,
    parse_level_arg,
    parse_name_arg,
    parse_namespace_arg,
    parse_owner_arg,
    parse_ratio,
    parse_seconds,
    parse_size_arg,
    store_url,
)
from cachelib.cli.bundles import check_store, cmd_inspect, cmd_pack, cmd_publish, cmd_warmup, cmd_why
from cachelib.cli.listing import cmd_gc, cmd_ls
from cachelib.cli.predicting import COLD_EXIT, cmd_predict
from cachelib.cli.preloading import cmd_load, cmd_preload, cmd_vllm_watch
from cachelib.in_image.compilekey import BUILTIN_TARGETS, add_compile_arguments, add_model_arguments
from cachelib.in_image.masking import mask_text
from cachelib.in_image.podcontract import DONE_FILE_NAME
from cachelib.preload import DEFAULT_DEADLINE, DEFAULT_MAX_BYTES, DEFAULT_MAX_RATIO, DEFAULT_SHARE
from cachelib.stores.base import MAX_SEGMENT_LENGTH
from cachelib.units import human_bytes
from cachelib.unpack import SHARE_MODES


def cmd_completion(args: argparse.Namespace) -> int:
    from cachelib.completion import script

    print(script(args.shell, build_parser()), end="")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cachelib.demo import run_demo

    store = store_url(args) if args.store else None  # a URL that names no store: exit 2 before the compile
    if store is not None:
        check_store(store)  # and one that does not answer: exit 1, before the compile too
    return run_demo(store=store, target=args.target, keep=args.keep)


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _add(
    sub: Any, name: str, handler: Callable[[argparse.Namespace], int], summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + examples,
        formatter_class=_formatter,
        parents=[_global_flags(after_command=True)],
    )
    parser.set_defaults(handler=handler)
    return parser


def _global_flags(*, after_command: bool) -> argparse.ArgumentParser:
    """--log-format and -v, accepted before the command and after it (as kubectl's are). After it
    they have no defaults of their own, so that ``-v ls`` keeps the -v given before."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=argparse.SUPPRESS if after_command else "text",
        help="log lines on stderr",
    )
    flags.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if after_command else 0,
        help="more logs; tracebacks on errors",
    )
    return flags


def _store_arg(parser: argparse.ArgumentParser, required_hint: str = "") -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        help="file:///path, redis://host:6379/0, rediss://..., redis-cluster://host:port, s3://bucket/prefix "
        f"(default: ${STORE_ENV}){required_hint}",
    )


def _selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", action="append", metavar="KEY", help="a bundle key (repeat for several)")
    parser.add_argument(
        "--cache", type=parse_cache_arg, metavar="NS/NAME", help="every bundle of this cache (instead of --key)"
    )
    parser.add_argument(
        "--gpu",
        metavar="SLUG",
        help="only this GPU's bundles, e.g. NVIDIA-H100-80GB-HBM3 or cpu "
        "(default: $COMPILECACHE_GPU, else every variant)",
    )
    for field, what in (
        ("torch", "this torch version (2.13.0 also matches 2.13.0+cu128)"),
        ("triton", "this triton version"),
        ("cuda", "this CUDA version ('none': CPU builds)"),
        ("py", "this Python version (major.minor, e.g. 3.11)"),
    ):
        parser.add_argument(f"--{field}", metavar="V", help=f"only bundles built with {what}")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every bundle was a hit")
    parser.add_argument(
        "--max-bytes",
        type=parse_size_arg,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help=f"refuse to unpack more than N bytes in all (default {human_bytes(DEFAULT_MAX_BYTES)})",
    )
    parser.add_argument(
        "--max-ratio",
        type=parse_ratio,
        default=DEFAULT_MAX_RATIO,
        metavar="R",
        help="refuse a bundle part that inflates more than R times its stored size, from its header on "
        "and while it streams (default %(default)g; 0: no limit)",
    )
    _trusted_key_arg(parser)


def _trusted_key_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-key",
        action="append",
        metavar="PUBKEY",
        help="an Ed25519 public key (base64 of its 32 bytes, or PEM) whose signature a bundle must carry; "
        "repeat during a key rotation (default: $COMPILECACHE_TRUSTED_KEYS, comma-separated; none: "
        "signatures are not checked)",
    )


def _deadline_arg(parser: argparse.ArgumentParser, default: float, covers: str) -> None:
    parser.add_argument(
        "--deadline",
        type=parse_seconds,
        default=default,
        metavar="SECONDS",
        help=f"end as an error result after this many seconds in all ({covers}), leaving nothing partial "
        "(default %(default)g; 0: none)",
    )


def _compile_args(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--namespace", type=parse_namespace_arg, default="default",
                        help="namespace of the cache, a Kubernetes namespace name (default: %(default)s)")
    parser.add_argument("--name", type=parse_name_arg, required=True,
                        help=f"name of the cache, a Kubernetes object name of at most {MAX_SEGMENT_LENGTH} characters")
    add_compile_arguments(parser)


class MaskingParser(argparse.ArgumentParser):
    """argparse, with credentials masked in its error lines (they repeat the arguments given)."""

    def error(self, message: str) -> NoReturn:
        super().error(mask_text(message))


def _credential_variables() -> str:
    from cachelib.stores import CREDENTIALS, REDIS_PASSWORD_ENV, S3_ENDPOINT_ENVS

    s3 = ", ".join(c.env for c in CREDENTIALS["s3"])
    return (f"  {REDIS_PASSWORD_ENV}  Redis password (redis://, rediss://, *-cluster://)\n"
            f"  {s3}  S3 credentials (else boto3's chain: profile, web identity, instance role)\n"
            f"  {', '.join(S3_ENDPOINT_ENVS)}  S3-compatible endpoint\n")


HELP_EXIT_AND_ENV = (
    "exit statuses:\n"
    "  0  done (preload and load: also a miss or a bad bundle, unless --strict)\n"
    "  1  failed: the store, the bundle or the command's work (one line on stderr says why)\n"
    "  2  bad arguments, before anything runs\n"
    "  3-7  warmup: the harness's own status (3 the target cannot be imported, 4 it failed to compile or run,\n"
    "       5 it returned something other than a list of (callable_or_module, example_args[, example_kwargs]),\n"
    "       6 its output cannot be written, 7 --require-precompile and the precompiled part was left out);\n"
    "       predict: 3 a pod is predicted to start cold\n"
    "  130  interrupted (one line says what was left where); 141  the reader of stdout went away (as SIGPIPE)\n"
    "  143  publish and warmup stopped by SIGTERM, after aborting the upload under way\n\n"
    "credentials (environment only, never printed):\n" + _credential_variables() +
    "  COMPILECACHE_STORE  default --store; COMPILECACHE_TRUSTED_KEYS  default --trusted-key"
)


def build_parser() -> argparse.ArgumentParser:
    parser = MaskingParser(
        prog="compilecache",
        description="Warm starts for torch.compile. Compile a model once (warmup), publish the compiled\n"
        "caches as a bundle to a store (a directory, Redis or S3), and preload that bundle before a\n"
        "process starts, so that its torch.compile finds everything cached instead of compiling again.",
        epilog="Start with `compilecache demo`: it does all of that on this machine's CPU in about a minute.\n\n"
        "examples:\n"
        "  compilecache demo\n"
        "  compilecache warmup --target tiny_mlp --name demo --store file:///tmp/store\n"
        "  compilecache ls --store file:///tmp/store\n"
        "  compilecache preload --store file:///tmp/store --cache default/demo --target /tmp/inductor\n"
        "  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor python train.py\n\n" + HELP_EXIT_AND_ENV,
        formatter_class=_formatter,
        parents=[_global_flags(after_command=False)],
    )
    parser.add_argument("--version", action="version", version=f"compilecache {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    p = _add(
        sub,
        "warmup",
        cmd_warmup,
        "compile a model with the harness, then pack and publish the bundle",
        "Run the warm-up harness (cachelib/in_image/harness.py) with this Python in a subprocess: it compiles the\n"
        "target into a fresh inductor cache directory. Then pack that directory into a bundle, verify\n"
        "it and publish it under its cache key. Prints the publish result as JSON.",
        "  compilecache warmup --target tiny_mlp --name demo --store file:///tmp/store\n"
        "  compilecache warmup --target mypkg.models:warm --namespace ml --name llama --backward \\\n"
        "      --mode max-autotune --store s3://bucket/compilecache",
    )
    _compile_args(p)
    _store_arg(p)
    p.add_argument("--out", help="keep the harness output directory here (default: a temporary one, removed "
                   "once published; kept when the publish fails)")
    p.add_argument("--force", action="store_true",
                   help="replace the output of an earlier warm-up in --out (a directory holding anything else is "
                        "never removed)")
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level (default: %(default)s)")
    p.add_argument(
        "--require-precompile",
        action="store_true",
        help="with --precompile auto: fail (exit 7, nothing published) when the warm-up's check leaves the "
        "precompiled part out; without it such a bundle is published and serves like one made with off",
    )

    p = _add(
        sub,
        "pack",
        cmd_pack,
        "turn a harness output directory into a bundle file",
        "Pack OUTDIR (result.json, megacache.bin, cachedir/ written by the harness) into one bundle\n"
        "file: header JSON plus zstd-compressed parts. Prints the key, size and sha256 as JSON.",
        "  compilecache pack /tmp/out /tmp/demo.ccb",
    )
    p.add_argument("outdir", help="the harness output directory")
    p.add_argument("bundle", help="the bundle file to write")
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level (default: %(default)s)")

    p = _add(
        sub,
        "publish",
        cmd_publish,
        "pack (if needed), verify and put a bundle into a store",
        "Pack OUTDIR (or take a bundle file), read it back to verify every part, then put it into the\n"
        "store under its cache key; readers never see a partial bundle. Prints key, sha256 and bytes as\n"
        "JSON and writes the same to the termination log ($COMPILECACHE_TERMINATION_LOG, default\n"
        "/dev/termination-log) when there is one.",
        "  compilecache publish /out --store redis://cache:6379/0\n"
        "  compilecache publish /tmp/demo.ccb --store file:///tmp/store",
    )
    p.add_argument("source", help="harness output directory or bundle file")
    _store_arg(p)
    p.add_argument("--level", type=parse_level_arg, default=3, help="zstd level when packing (default: %(default)s)")

    p = _add(
        sub,
        "preload",
        cmd_preload,
        "fetch, verify and unpack bundles into a cache directory (no torch)",
        "Resolve the bundle keys (--key, or --cache NS/NAME listed from the store and filtered by GPU and\n"
        "versions), fetch each, verify its sha256, and unpack its cache directory into --target\n"
        "atomically. Prints one JSON line: result hit|miss|error, keys, bytes, seconds, reason; also\n"
        "written to the termination log when there is one. A missing bundle or an unreachable store\n"
        "is a miss, a bad bundle an error: either way exit status 0 (the pod starts, compiling as\n"
        "usual) unless --strict (then 1). A --deadline that passes (default 30 s), a bundle that\n"
        "inflates beyond --max-ratio and any failure nobody foresaw are errors too. Point TORCHINDUCTOR_CACHE_DIR at\n"
        "--target; --share decides which users may write it (default: the directory's group, e.g. the\n"
        "pod's fsGroup). A bundle the target already holds complete (a node cache) is a hit without a\n"
        "download. With --sidecar it runs beside the workload instead of before it: the workload waits\n"
        "for the done file just before its first compiled call (cachelib.handoff.wait_for_preload).",
        "  compilecache preload --store file:///tmp/store --cache default/demo --target /tmp/inductor\n"
        "  compilecache preload --store s3://bucket/cc --key cc1/ml/llama/... --target /cache --strict\n"
        "  compilecache preload --store redis://cache:6379/0 --cache ml/llama --gpu NVIDIA-H100-80GB-HBM3 \\\n"
        "      --torch 2.13.0 --target /cache\n"
        "  compilecache preload --store redis://cache:6379/0 --cache ml/llama --target /cache --sidecar\n"
        "  compilecache preload --store s3://bucket/cc --cache ml/llama --target /node-cache/inductor \\\n"
        "      --share all --owner 1000:1000 --deadline 20",
    )
    _store_arg(p)
    _selection_args(p)
    _deadline_arg(p, DEFAULT_DEADLINE, "connecting, fetching and unpacking")
    p.add_argument("--target", required=True, help="the cache directory to fill (TORCHINDUCTOR_CACHE_DIR)")
    p.add_argument(
        "--share",
        choices=SHARE_MODES,
        default=DEFAULT_SHARE,
        help="who may write the unpacked cache: owner (only the preload's uid), group (directories 2775 "
        "setgid, files 664: any uid of the directory's group, e.g. the pod's fsGroup), all (777/666: any "
        "uid) (default: %(default)s)",
    )
    p.add_argument(
        "--owner",
        type=parse_owner_arg,
        metavar="UID:GID",
        help="hand the unpacked tree to this uid and gid (needs CAP_CHOWN, e.g. a preload running as root)",
    )
    p.add_argument(
        "--done-file",
        metavar="PATH",
        help="when finished, write the JSON result here (atomically) for a workload waiting in "
        f"cachelib.handoff.wait_for_preload() (default with --sidecar: TARGET/{DONE_FILE_NAME})",
    )
    p.add_argument(
        "--sidecar",
        action="store_true",
        help="run as a Kubernetes native sidecar beside the workload: write the done file, then stay "
        "running until SIGTERM (exit status 0 whatever the result)",
    )

    p = _add(
        sub,
        "vllm-watch",
        cmd_vllm_watch,
        "tell whether a vLLM server beside it loaded the preloaded bundle (a pod's sidecar)",
        "Watch a preloaded vLLM cache directory and the port vLLM serves on (this network namespace's\n"
        "sockets: a sidecar shares the pod's) until it is clear whether vLLM loaded the bundle's compiled\n"
        "artifact, could not load it, or compiled afresh under another key; then write the verdict, the\n"
        "same as a torch workload's, to compilecache-why.json in --cache-dir and to the termination log, and\n"
        "exit (a native sidecar is started again: that run finds the verdict delivered and waits for SIGTERM).\n"
        "The webhook adds it to the pods of a vLLM CompileCache.",
        "  compilecache vllm-watch --cache-dir /var/cache/compilecache/inductor --port 8000\n"
        "  compilecache vllm-watch --cache-dir /cache --port 8000 \\\n"
        "      --prediction '[{\"factor\": \"--max-model-len\", \"before\": \"8192\", \"after\": \"4096\"}]'",
    )
    p.add_argument("--cache-dir", required=True, help="the preloaded cache directory (vLLM's root is its vllm/)")
    p.add_argument("--port", type=int, default=8000, help="the port vLLM serves on (default: %(default)s)")
    p.add_argument(
        "--prediction",
        default="[]",
        help="JSON: the key factors the admission found different, each {factor, before, after, kind}",
    )
    p.add_argument(
        "--deadline", type=parse_seconds, default=6 * 3600.0,
        help="give up after this many seconds without a verdict (default: %(default)s)",
    )  # fmt: skip

    p = _add(
        sub,
        "load",
        cmd_load,
        "feed bundles' Mega-Cache part to torch.compiler.load_cache_artifacts()",
        "Like preload, but loads the portable Mega-Cache part through torch (which must be installed)\n"
        "into the inductor cache directory: --target, else $TORCHINDUCTOR_CACHE_DIR, else torch's default.\n"
        "On a CPU the Mega-Cache lacks the compiled C++ objects; preload carries them.",
        "  compilecache load --store file:///tmp/store --cache default/demo --target /tmp/inductor",
    )
    _store_arg(p)
    _selection_args(p)
    _deadline_arg(p, 120.0, "connecting, fetching, importing torch and loading")
    p.add_argument("--target", help="inductor cache directory to load into")

    p = _add(
        sub,
        "inspect",
        cmd_inspect,
        "print a bundle's header",
        "Print the header of a bundle file (or, with --store, of a stored bundle given by its key) as\n"
        "JSON (or YAML): key, versions, job id, producer, compile result, parts with sizes and sha256.",
        "  compilecache inspect /tmp/demo.ccb\n"
        "  compilecache inspect /tmp/demo.ccb --verify -o yaml\n"
        "  compilecache inspect --store file:///tmp/store cc1/default/demo/...",
    )
    p.add_argument("bundle", help="bundle file, or a key with --store")
    p.add_argument("--store", metavar="URL", help="read the bundle from this store")
    p.add_argument("-o", "--output", choices=("json", "yaml"), default="json", help="json (default) or yaml")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every part and check its sha256, and show who signed the bundle (key id; checked "
        "against --trusted-key when given, exit 1 when it does not verify)",
    )
    _trusted_key_arg(p)

    p = _add(
        sub,
        "why",
        cmd_why,
        "say which factor of torch's cache keys differs from the warm-up",
        "Compare what the warm-up recorded (compilecache-factors.json in a cache directory or a bundle's\n"
        "cachedir part: versions, installation, device, environment, and per graph the configs, inputs and\n"
        "source lines) with this process's versions, installation, device and environment; for a cache\n"
        "directory a pod used, also print the pod's verdict per graph (compilecache-why.json): hit, or the\n"
        "factor that differed with both values.",
        "  compilecache why $TORCHINDUCTOR_CACHE_DIR\n  compilecache why /tmp/demo.ccb -o json",
    )
    p.add_argument("path", help="a cache directory, or a bundle file")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text",
                   help="text (default), json or yaml")
    p.add_argument(
        "--vllm", metavar="COMMAND_LINE",
        help="for a vLLM cache: a start to check against the warm-up's ('vllm serve MODEL --max-model-len 4096', "
        "with this process's VLLM_* variables): every key factor that differs, with both values",
    )  # fmt: skip

    p = _add(
        sub,
        "predict",
        cmd_predict,
        "tell whether a manifest's pods will start warm, as the admission will",
        "Compare each pod a manifest makes (a Pod, a Deployment's, StatefulSet's, DaemonSet's, Job's or CronJob's\n"
        "pod template) with what the CompileCache's bundles recorded of their warm-up, as the operator's\n"
        "admission does: the image, a pinned GPU type, the variables that enter torch's keys, the job id,\n"
        "caching precompile and a vLLM start. Prints warm, cold with each factor and both values, or\n"
        "unknown with what cannot be told before the pod starts. The CompileCache is read from --cache-file\n"
        "or with kubectl get (nothing is written to the cluster). Exit status "
        f"{COLD_EXIT} when a pod is predicted cold.",
        "  compilecache predict --cache ml/llama -f deploy.yaml\n"
        "  kubectl get compilecache llama -n ml -o yaml > cc.yaml\n"
        "  compilecache predict --cache-file cc.yaml -f deploy.yaml -o json",
    )
    p.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                   help="a manifest (JSON or YAML; - for stdin); repeat for several")
    p.add_argument("--cache", type=parse_cache_arg, metavar="NS/NAME",
                   help="the CompileCache (read with kubectl unless --cache-file has it)")
    p.add_argument("--cache-file", metavar="FILE",
                   help="the CompileCache as kubectl get compilecache -o json|yaml shows it (status included)")
    p.add_argument("--kubectl", default="kubectl", help="the kubectl to read the CompileCache with")
    p.add_argument("--context", help="kubectl's context")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")

    p = _add(
        sub,
        "ls",
        cmd_ls,
        "list the bundles in a store",
        "List the bundles in a store with their key fields, size and age. -o wide also reads each bundle's\n"
        "header for the target it was compiled from and its compile mode, and shows the whole key; -o json\n"
        "prints one JSON object per line with all of that (--json is the same).",
        "  compilecache ls --store file:///tmp/store\n"
        "  compilecache ls --store file:///tmp/store -o wide\n"
        "  compilecache ls --store s3://bucket/cc --cache ml/llama -o json",
    )
    _store_arg(p)
    p.add_argument("--cache", type=parse_cache_arg, metavar="NS/NAME", help="only this cache's bundles")
    p.add_argument("--prefix", help="only keys starting with this prefix")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "yaml"),
        default="table",
        help="table (default), wide (adds target, mode and key from each bundle's header), json (JSON lines) or "
        "yaml (one list)",
    )
    p.add_argument("--json", action="store_true", help="the same as -o json")

    p = _add(
        sub,
        "gc",
        cmd_gc,
        "delete old bundles",
        "Delete bundles by age and/or keep the N newest per group. A group is one cache, model, option set\n"
        "and GPU; its bundles differ by software versions. A bundle is deleted when it is older than\n"
        "--older-than (if given) and not among the --keep newest of its group (if given).",
        "  compilecache gc --store file:///tmp/store --older-than 7d --dry-run\n"
        "  compilecache gc --store s3://bucket/cc --keep 2\n"
        "  compilecache gc --store redis://cache:6379/0 --cache ml/llama --older-than 30d --keep 1",
    )
    _store_arg(p)
    p.add_argument("--cache", type=parse_cache_arg, metavar="NS/NAME", help="only this cache's bundles")
    p.add_argument("--prefix", help="only keys starting with this prefix")
    p.add_argument("--older-than", metavar="AGE", help="e.g. 7d, 12h, 30m")
    p.add_argument("--keep", type=int, metavar="N", help="keep the N most recently published per group")
    p.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    p.add_argument("--yes", action="store_true",
                   help="confirm a gc that deletes every bundle of its scope (--keep 0 without --older-than) or of "
                        "the whole store (without --cache or --prefix); --dry-run needs none")

    p = _add(
        sub,
        "demo",
        cmd_demo,
        "warm a model on the CPU, then start warm in a fresh process (no cluster)",
        "Compile a built-in model on the CPU with the harness and publish it to a file store (a temporary\n"
        "one unless --store), then do what a pod does: preload the bundle into an empty cache directory\n"
        "in a fresh process and compile the same model there. Prints cold vs warm first-call times,\n"
        "torch's cache hit counters and the Prometheus metrics of the warm process.",
        "  compilecache demo\n  compilecache demo --target transformer_block --store file:///tmp/store",
    )
    _store_arg(p)
    p.add_argument(
        "--target",
        default="tiny_mlp",
        choices=BUILTIN_TARGETS,
        help="built-in model (default: %(default)s)",
    )
    p.add_argument("--keep", action="store_true", help="keep the demo's working directory")

    p = _add(
        sub,
        "completion",
        cmd_completion,
        "print the shell completion script (bash or zsh)",
        "Print a completion script for SHELL: the commands, their flags and the values of flags with a fixed\n"
        "set (-o, --log-format, ...).",
        '  eval "$(compilecache completion bash)"    # in ~/.bashrc\n'
        '  eval "$(compilecache completion zsh)"     # in ~/.zshrc',
    )
    from cachelib.completion import SHELLS

    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help=" or ".join(SHELLS))
    return parser
