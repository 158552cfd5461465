"""Preload throughput: fetch, verify and unpack a bundle from each store, against the machine's limits.

For each bundle size and store it publishes a synthetic v1 bundle (a cache-dir tar of
incompressible and compressible files, written with cachelib.bundle), then measures in
fresh child processes:

  raw read   the store's get(), read to the end and discarded
  write      the bundle's files (same sizes, same directories) written from memory into a
             fresh directory next to the preload targets: open, write, close, no fsync
  preload    cachelib.preload.preload(store_url, [key], target_dir): fetch, verify sha256, unpack

round-robin, so that a slow spell of the shared machine hits all three alike; and the
machine's limits for the other stages: sha256 over memory (one thread) and zstd
decompression of the bundle's stored bytes. The ratio is preload rate ÷ the slowest of
(raw read of that store, write, sha256, zstd). Peak RSS is the preload child's VmHWM, next
to its RSS after imports (before the call). Rates are in MB/s of bundle bytes (10^6 bytes
per second; the write column too: bundle bytes ÷ the time to write the unpacked files).
It starts its own redis-server and moto server on loopback.

    python bench/preload.py --sizes 10M,1G --stores file,redis,s3 --write-docs docs/benchmarks.md
    python bench/preload.py --redis-chunk-sweep 256K,1M,2M,4M,8M,16M,64M --write-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cachelib.keyformat import CacheKey  # noqa: E402
from cachelib.stores import open_store  # noqa: E402
from cachelib.units import parse_size  # noqa: E402

MB = 1_000_000
MiB = 1024 * 1024
STORE_KINDS = ("file", "redis", "s3")
DEFAULT_FUNCTION = "cachelib.preload:preload"
SECTION = "## Preload throughput"
BENCH_KEY = CacheKey(
    namespace="bench",
    name="preload",
    model="0123456789abcdef",
    options="0123456789abcdef",
    gpu="cpu",
    capability="cpu",
    torch="2.13.0",
    triton="none",
    cuda="none",
    py="3.11",
)


# -- machine and versions --------------------------------------------------------------------------
LOAD_AT_START = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kib = next(
        (int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), 0
    )
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "memory": f"{mem_kib / 1024**2:.1f} GiB",
        "cpu": cpu,
        "kernel": platform.release(),
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True).stdout
        found["redis-server"] = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), out.strip())
    except (OSError, subprocess.CalledProcessError):
        found["redis-server"] = "missing"
    for package in ("moto", "zstandard", "redis", "hiredis", "boto3"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# -- synthetic bundle -------------------------------------------------------------------------------
def synthetic_members(size: int) -> Iterator[tuple[str, int, bool]]:
    """(name, bytes, compressible) of a cache dir whose bundle is about ``size`` bytes.

    Like a TORCHINDUCTOR_CACHE_DIR: compiled objects and kernels (incompressible, 97% of
    the bundle) plus generated source and metadata (compressible, ~30% of the size again,
    shrinking to ~1% in zstd).
    """
    incompressible = int(size * 0.97)
    compressible = int(size * 0.30)
    index = 0
    while incompressible > 0:
        n = min(incompressible, (index % 8 + 1) * 512 * 1024)  # 512 KiB .. 4 MiB
        yield f"triton/{index:06x}/kernel-{index:06x}.so", n, False
        incompressible -= n
        index += 1
    while compressible > 0:
        n = min(compressible, (index % 8 + 1) * 16 * 1024)  # 16 KiB .. 128 KiB
        yield f"fxgraph/{index % 64:02x}/{index:06x}.py", n, True
        compressible -= n
        index += 1


_SOURCE = b"def kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    xoffset = tl.program_id(0) * XBLOCK\n"


def write_cachedir_tar(out: IO[bytes], size: int) -> None:
    """Stream a tar of :func:`synthetic_members` into ``out``."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, n, compressible in synthetic_members(size):
            info = tarfile.TarInfo(name)
            info.size = n
            info.mode = 0o644
            info.mtime = 1_700_000_000
            if compressible:
                data = (_SOURCE + f"# {name}\n".encode()) * (n // len(_SOURCE) + 1)
                tar.addfile(info, io.BytesIO(data[:n]))
            else:
                tar.addfile(info, io.BytesIO(os.urandom(n)))


def build_bundle(path: Path, size: int) -> int:
    """Write a synthetic v1 bundle of about ``size`` bytes to ``path``; its actual size."""
    from cachelib.bundle import CACHEDIR_PART, MEGACACHE_PART, write_bundle_file

    def cachedir(out: Any) -> None:
        write_cachedir_tar(out, size)

    def megacache(out: Any) -> None:
        out.write(os.urandom(min(size // 100, 4 * MiB)))

    written = write_bundle_file(
        path,
        key=BENCH_KEY,
        parts=[(CACHEDIR_PART, cachedir), (MEGACACHE_PART, megacache)],
        versions={"torch": "2.13.0", "triton": "none", "cuda": "none", "python": "3.11"},
        created=datetime.now(UTC).isoformat(),
        producer="bench/preload.py",
        job_id="bench-preload",
        result={"synthetic": True},
    )
    return int(written.bytes)


# -- servers ---------------------------------------------------------------------------------------
@contextmanager
def store_urls(kinds: Sequence[str], workdir: Path) -> Iterator[dict[str, str]]:
    """A base URL per store kind, starting redis-server and moto on loopback as needed."""
    from testsupport.servers import aws_environment, start_moto, start_redis

    urls: dict[str, str] = {}
    with ExitStack() as stack:
        if "file" in kinds:
            urls["file"] = f"file://{workdir / 'file-store'}"
        if "redis" in kinds:
            redis = stack.enter_context(start_redis(workdir / "redis"))
            urls["redis"] = f"{redis.url}?prefix=bench"
        if "s3" in kinds:
            moto = stack.enter_context(start_moto(workdir / "moto"))
            stack.enter_context(aws_environment(moto.env))
            urls["s3"] = moto.new_bucket(prefix="bench")
        yield urls


# -- child processes -------------------------------------------------------------------------------
def high_water_rss() -> int:
    """Peak resident set size of this process so far, in bytes (VmHWM)."""
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_files(target: Path, size: int) -> int:
    """Write :func:`synthetic_members` of a ``size`` bundle under ``target`` (a new directory); bytes written."""
    block = memoryview(os.urandom(4 * MiB))
    made = {target}
    target.mkdir()
    total = 0
    for name, n, _ in synthetic_members(size):
        path = target / name
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            left = n
            while left:
                left -= os.write(fd, block[: min(left, len(block))])
        finally:
            os.close(fd)
        total += n
    return total


def child(argv: Sequence[str]) -> None:
    """``child read URL KEY``, ``child write TARGET SIZE`` or ``child preload URL KEY TARGET FUNCTION``:
    one JSON line."""
    if argv[0] == "write":
        start = time.perf_counter()
        total = write_files(Path(argv[1]), int(argv[2]))
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "bytes": total, "peak_rss": high_water_rss(), "baseline_rss": 0}))
        return
    mode, url, key = argv[0], argv[1], argv[2]
    store = open_store(url)  # imports the backend's client library before the baseline
    if mode == "read":
        baseline = high_water_rss()
        start = time.perf_counter()
        total = 0
        with store.get(key) as stream:
            while chunk := stream.read(MiB):
                total += len(chunk)
        seconds = time.perf_counter() - start
    else:
        target, function = Path(argv[3]), load_function(argv[4])
        store.close()
        baseline = high_water_rss()
        start = time.perf_counter()
        outcome = function(url, [key], target)
        seconds = time.perf_counter() - start
        status = getattr(outcome, "result", "hit")
        if status != "hit":
            raise SystemExit(f"preload did not hit: {getattr(outcome, 'reason', outcome)}")
        total = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(json.dumps({"seconds": seconds, "bytes": total, "peak_rss": high_water_rss(), "baseline_rss": baseline}))


def load_function(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"{spec} is not callable")
    return function  # type: ignore[no-any-return]


def run_child(*args: str) -> dict[str, Any]:
    answer = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "child", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    if answer.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed ({answer.returncode}):\n{answer.stderr[-3000:]}")
    return dict(json.loads(answer.stdout.strip().splitlines()[-1]))


# -- machine limits --------------------------------------------------------------------------------
def sha256_rate(size: int = 256 * MiB) -> float:
    data = os.urandom(size)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        best = max(best, size / (time.perf_counter() - start))
    return best


def zstd_rate(bundle: Path) -> float:
    """Decompression rate of the bundle's stored cachedir part, in stored bytes per second."""
    import zstandard

    from cachelib.bundle import CACHEDIR_PART, PREAMBLE
    from cachelib.bundlereader import read_header_file

    header = read_header_file(bundle)
    part = header.part(CACHEDIR_PART)
    with open(bundle, "rb") as stream:
        stream.seek(PREAMBLE.size + len(header.to_json()) + part.offset)
        stored = stream.read(part.stored_size)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored)) as reader:
            while reader.read(MiB):
                pass
        best = max(best, len(stored) / (time.perf_counter() - start))
    return best


# -- the measurement -------------------------------------------------------------------------------
@dataclass
class Row:
    size_label: str
    store: str
    bundle_bytes: int
    publish: float
    raw_read: float
    write: float
    preload: float | None
    sha256: float
    zstd: float
    peak_rss: int | None
    baseline_rss: int | None

    @property
    def slowest_limit(self) -> float:
        return min(self.raw_read, self.write, self.sha256, self.zstd)

    @property
    def ratio(self) -> float | None:
        return None if self.preload is None else self.preload / self.slowest_limit


def measure(sizes: Sequence[tuple[str, int]], kinds: Sequence[str], workdir: Path, function: str | None,
            repeat: int) -> list[Row]:  # fmt: skip
    rows: list[Row] = []
    sha = sha256_rate()
    print(f"sha256: {sha / MB:.0f} MB/s", flush=True)
    with store_urls(kinds, workdir) as urls:
        for label, size in sizes:
            bundle = workdir / f"bundle-{label}.ccb"
            start = time.perf_counter()
            bundle_bytes = build_bundle(bundle, size)
            print(
                f"[{label}] bundle {bundle_bytes / MB:.1f} MB built in {time.perf_counter() - start:.1f} s", flush=True
            )
            zstd = zstd_rate(bundle)
            print(f"[{label}] zstd decompress: {zstd / MB:.0f} MB/s of stored bytes", flush=True)
            key = str(BENCH_KEY)
            unpacked = sum(n for _, n, _ in synthetic_members(size))
            for kind in kinds:
                with open_store(urls[kind]) as store, open(bundle, "rb") as source:
                    start = time.perf_counter()
                    store.put(key, source, bundle_bytes)
                    publish = bundle_bytes / (time.perf_counter() - start)
                reads, writes, runs = [], [], []
                # Round-robin: raw read, write, preload, then again, so that all see the same spells.
                for attempt in range(repeat):
                    reads.append(run_child("read", urls[kind], key))
                    if reads[-1]["bytes"] != bundle_bytes:
                        raise RuntimeError(f"{kind}: raw read returned {reads[-1]} instead of {bundle_bytes} bytes")
                    scratch = workdir / f"write-{kind}-{label}-{attempt}"
                    writes.append(run_child("write", str(scratch), str(size)))
                    shutil.rmtree(scratch, ignore_errors=True)
                    if function is not None:
                        target = workdir / f"target-{kind}-{label}-{attempt}"
                        runs.append(run_child("preload", urls[kind], key, str(target), function))
                        shutil.rmtree(target, ignore_errors=True)
                        if runs[-1]["bytes"] != unpacked:
                            raise RuntimeError(f"{kind}: unpacked {runs[-1]['bytes']} bytes, expected {unpacked}")
                raw = bundle_bytes / statistics.median(read["seconds"] for read in reads)
                write = bundle_bytes / statistics.median(w["seconds"] for w in writes)
                preload, peak, baseline = None, None, None
                if runs:
                    preload = bundle_bytes / statistics.median(r["seconds"] for r in runs)
                    peak = max(r["peak_rss"] for r in runs)
                    baseline = max(r["baseline_rss"] for r in runs)
                row = Row(label, kind, bundle_bytes, publish, raw, write, preload, sha, zstd, peak, baseline)
                rows.append(row)
                print(render_row(row), flush=True)
                with open_store(urls[kind]) as store:
                    store.delete(key)
            bundle.unlink()
    return rows


# -- redis chunk size ----------------------------------------------------------------------------
@dataclass
class SweepRow:
    chunk: str
    workers: int
    put: float
    get: float


def chunk_sweep(chunks: Sequence[str], size: int, repeat: int, workers: Sequence[int], workdir: Path) -> list[SweepRow]:
    """Median put and get throughput of one ``size`` object per chunk size, on a loopback redis-server."""
    from testsupport.servers import start_redis

    data = os.urandom(size)
    configs = [(count, chunk) for count in workers for chunk in chunks]
    puts: dict[tuple[int, str], list[float]] = {c: [] for c in configs}
    gets: dict[tuple[int, str], list[float]] = {c: [] for c in configs}
    with start_redis(workdir / "redis-sweep") as server:
        # Round-robin over the configurations, so that a slow spell of the machine hits all alike.
        for attempt in range(repeat):
            for count, chunk in configs:
                with open_store(f"{server.url}?prefix=sweep&chunk={chunk}&workers={count}&grace=0") as store:
                    key = f"sweep/{attempt}"
                    start = time.perf_counter()
                    store.put(key, io.BytesIO(data), size)
                    puts[count, chunk].append(size / (time.perf_counter() - start))
                    start = time.perf_counter()
                    with store.get(key) as stream:
                        while stream.read(MiB):
                            pass
                    gets[count, chunk].append(size / (time.perf_counter() - start))
                    store.delete(key)
            print(f"round {attempt + 1}/{repeat} done", flush=True)
    rows = [SweepRow(chunk, count, statistics.median(puts[count, chunk]), statistics.median(gets[count, chunk]))
            for count, chunk in configs]  # fmt: skip
    for row in rows:
        print(f"chunk {row.chunk:>5} workers {row.workers}: put {row.put / MB:6.0f} MB/s  get {row.get / MB:6.0f} MB/s")
    return rows


# -- reports ---------------------------------------------------------------------------------------
def _mb(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate / MB:,.0f}"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:,.0f} MiB"


COLUMNS = ("bundle", "store", "publish", "raw read", "write", "preload", "sha256", "zstd -d", "slowest limit",
           "preload ÷ limit", "peak RSS (after imports)")  # fmt: skip


def render_row(row: Row) -> str:
    ratio = "n/a" if row.ratio is None else f"{row.ratio:.2f}"
    return (
        f"| {row.size_label} ({row.bundle_bytes / MB:,.1f} MB) | {row.store} | {_mb(row.publish)} "
        f"| {_mb(row.raw_read)} | {_mb(row.write)} "
        f"| {_mb(row.preload)} | {_mb(row.sha256)} | {_mb(row.zstd)} | {_mb(row.slowest_limit)} | {ratio} "
        f"| {_mib(row.peak_rss)} ({_mib(row.baseline_rss)}) |"
    )


def render_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + [render_row(r) for r in rows])


def environment_lines(command: str) -> str:
    m, v = machine(), versions()
    return (
        f"Command: `{command}`  \n"
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} memory, Linux {m['kernel']}  \n"
        f"Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + "  \n"
        f"Date: {datetime.now(UTC):%Y-%m-%d}, load average at the start: {LOAD_AT_START}"
    )


def render_main(rows: Sequence[Row], command: str) -> str:
    return (
        environment_lines(command)
        + "\n\n"
        + render_table(rows)
        + "\n\n"
        + "- Rates in MB/s (10^6 bytes per second) of bundle bytes. Raw read, write and preload are the median\n"
        "  of `--repeat` rounds, run round-robin (read, write, preload, read, ...) so that the machine's slow\n"
        "  spells hit all three alike; publish is a single run, sha256 and zstd the best of three.\n"
        "- raw read: the store's `get()` read to the end in a fresh process; preload: "
        "`cachelib.preload.preload()`\n"
        "  (fetch, verify, unpack the cache-dir part into an empty directory) in a fresh process, checked to\n"
        "  have unpacked every byte. sha256: one thread over memory; zstd -d: the bundle's stored cache-dir part.\n"
        "- write: the file system's own limit. The bundle's files (the same sizes in the same directories)\n"
        "  are written from memory into a fresh directory next to the preload's target, in a fresh process:\n"
        "  create, write, close, no fsync. Its rate is bundle bytes ÷ that time, like the preload's, although\n"
        "  it writes the unpacked bytes (about 1.3x the bundle). Creating files and directories and the\n"
        "  kernel's write-back of dirty pages make it the slowest limit for large bundles here.\n"
        "- Peak RSS is the preload process's high-water mark; in brackets its RSS after imports, before the call.\n"
        "- The servers run on the same machine and share its CPUs with the reader; the file store reads from the\n"
        "  page cache.\n"
        "- S3 is moto's server mode, a functional stand-in: it answers each ranged GET by reading and copying the\n"
        "  whole object, so for large bundles its rows measure moto, not the client (nor S3).\n"
    )


def redis_parser() -> str:
    """Which reply parser redis-py uses here: ``hiredis`` when installed, else ``python``."""
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return "python"
    return "hiredis"


def render_sweep(rows: Sequence[SweepRow], size: int, command: str) -> str:
    parser = "hiredis" if redis_parser() == "hiredis" else "redis-py's own (no hiredis)"
    lines = [f"Reply parser: {parser}.", "", "| chunk | workers | put MB/s | get MB/s |", "|---|---|---|---|"]
    lines += [f"| {r.chunk} | {r.workers} | {r.put / MB:,.0f} | {r.get / MB:,.0f} |" for r in rows]
    return (
        f"Median of the runs for one {size / MiB:,.0f} MiB object of random bytes, loopback redis-server, "
        "reader reading 1 MiB at a time.\n\n" + environment_lines(command) + "\n\n" + "\n".join(lines)
    )


def write_docs(path: Path, block: str, body: str) -> None:
    """Replace one marked block of the "Preload throughput" section, creating what is missing.

    Only the section's own text changes; other sections of the file are left as they are.
    """
    begin, end = f"<!-- {block}: begin -->", f"<!-- {block}: end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if SECTION not in text:
        text = text.rstrip("\n") + "\n\n" + SECTION_TEMPLATE
    if begin not in text:  # a block of its own at the end of the section
        start = text.index(SECTION)
        following = text.find("\n## ", start + len(SECTION))
        cut = len(text) if following < 0 else following + 1
        text = text[:cut].rstrip("\n") + f"\n\n{begin}\n{end}\n" + ("\n" + text[cut:] if following >= 0 else "")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body.strip()}\n{end}{tail}")


SECTION_TEMPLATE = f"""{SECTION}

How fast a pod's init container can fetch, verify (sha256) and unpack a bundle, per store,
next to what the machine allows: the store's raw read rate, the file system's write rate
for the bundle's files, sha256 and zstd decompression. The goal is a preload at 0.7 or
more of the slowest of those limits, with a peak memory that stays bounded, well under the
bundle size. Figures from `bench/preload.py`, on a shared 2-CPU virtual machine whose
throughput drifted by up to 2-3x from one minute to the next (other work ran on it). Within
a row, raw read, write and preload run round-robin, so their ratio is measured under the
same conditions; the rows themselves were measured minutes apart. The write limit is real:
writing the unpacked files (creating them and their directories, then the kernel's
write-back of dirty pages) is what bounds a large preload here, not sha256 or zstd.

<!-- preload-bench: begin -->
<!-- preload-bench: end -->

### Redis chunk size

Redis values are split into chunks (a Redis string holds at most 512 MB). The default chunk
size (1 MiB, see `REDIS_DEFAULT_CHUNK` in cachelib/stores/urls.py) comes from this
measurement (`--redis-chunk-sweep`), once with redis-py's own reply parser (the default
install) and once with hiredis installed:
"""


# -- command line ----------------------------------------------------------------------------------
def shown_command(args: Sequence[str]) -> str:
    """The command line as the docs show it: without the options that only say where output goes."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--write-docs", "--json", "--workdir"):
            skip = True
        elif not arg.startswith(("--write-docs=", "--json=", "--workdir=")):
            kept.append(arg)
    return " ".join(["python bench/preload.py", *kept])


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["child"]:
        child(args_list[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10M,1G", help="bundle sizes (K, M, G: binary units)")
    parser.add_argument("--stores", default=",".join(STORE_KINDS), help="any of file,redis,s3")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of raw read, write and preload per row")
    parser.add_argument("--function", default=DEFAULT_FUNCTION, help="the preload function, module:name")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a temporary one)")
    parser.add_argument("--write-docs", type=Path, help="update the 'Preload throughput' section of this file")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument("--redis-chunk-sweep", help="instead: Redis put/get throughput per chunk size, e.g. 1M,4M")
    parser.add_argument("--sweep-size", default="256M", help="object size for --redis-chunk-sweep")
    parser.add_argument("--sweep-workers", default="4", help="worker counts for --redis-chunk-sweep")
    args = parser.parse_args(args_list)
    command = shown_command(args_list)

    with ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preload-bench-")))
        workdir.mkdir(parents=True, exist_ok=True)
        if args.redis_chunk_sweep:
            size = parse_size(args.sweep_size, what="--sweep-size")
            workers = [int(w) for w in args.sweep_workers.split(",")]
            sweep = chunk_sweep(args.redis_chunk_sweep.split(","), size, args.repeat, workers, workdir)
            body = render_sweep(sweep, size, command)
            block, figures = f"redis-chunks-{redis_parser()}", [asdict(r) for r in sweep]
        else:
            kinds = [k for k in args.stores.split(",") if k]
            unknown = set(kinds) - set(STORE_KINDS)
            if unknown:
                parser.error(f"--stores: unknown {sorted(unknown)}; choose from {', '.join(STORE_KINDS)}")
            sizes = [(label, parse_size(label, what="--sizes")) for label in args.sizes.split(",")]
            function: str | None = args.function
            try:
                load_function(args.function)
            except (ImportError, AttributeError, TypeError) as exc:
                print(f"preload function {args.function} is not available ({exc}): measuring limits only",
                      file=sys.stderr)  # fmt: skip
                function = None
            rows = measure(sizes, kinds, workdir, function, args.repeat)
            print(render_table(rows))
            body = render_main(rows, command)
            block, figures = "preload-bench", [asdict(r) | {"ratio": r.ratio} for r in rows]
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        if args.write_docs:
            write_docs(args.write_docs, block, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
