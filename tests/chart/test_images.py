"""The image recipes: Dockerfiles read as text (no Docker engine here), the site-packages slimming run on real
installed packages, and the wheel-set size computation."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.chart.chart import REPO_ROOT

IMAGES = REPO_ROOT / "images"
DOCKERFILES = {"operator": IMAGES / "operator" / "Dockerfile", "preloader": IMAGES / "preloader" / "Dockerfile"}
EXPECTED_EXTRA = {"operator": "operator", "preloader": "preloader"}
SITE_PACKAGES = Path(next(p for p in sys.path if p.endswith("site-packages")))


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def pyproject() -> dict[str, object]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def extra_requirements(extra: str, project: dict[str, object]) -> set[str]:
    """Distribution names an extra pulls in, following the project's self-references (compilecache[a,b])."""
    meta = project["project"]
    assert isinstance(meta, dict)
    extras = meta["optional-dependencies"]
    names: set[str] = {re.split(r"[\[<>=!~; ]", d)[0].lower() for d in meta["dependencies"]}
    todo, seen = extra.split(","), set()
    while todo:
        current = todo.pop()
        assert current in extras, f"extra [{current}] is not in pyproject.toml"
        seen.add(current)
        for req in extras[current]:
            name = re.split(r"[\[<>=!~; ]", req)[0].lower()
            if name == meta["name"]:
                todo += [e for e in re.search(r"\[(.*)\]", req).group(1).split(",") if e not in seen]  # type: ignore[union-attr]
            else:
                names.add(name)
    return names


@pytest.mark.parametrize("image", DOCKERFILES)
def test_dockerfile_is_multi_stage_on_a_pinned_base_and_runs_as_non_root(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    steps = instructions(dockerfile)
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", args["PYTHON_DIGEST"])
    assert "slim" in args["PYTHON_IMAGE"] and "python:3.11" in args["PYTHON_IMAGE"]
    all_stages = stages(dockerfile)
    assert len(all_stages) >= 2
    for stage in all_stages:
        assert stage[0][1].split()[0] == "${PYTHON_IMAGE}@${PYTHON_DIGEST}", stage[0]
    final = all_stages[-1]
    users = [a for kind, a in final if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert int(users[-1].split(":")[0]) >= 1000
    # Only the built virtual environment (and files) come over from the build stage: no compilers, no pip cache.
    assert not [a for kind, a in final if kind == "RUN" and "pip install" in a]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_dockerfile_installs_an_existing_extra_without_torch(image: str) -> None:
    steps = instructions(DOCKERFILES[image])
    installs = [a for kind, a in steps if kind == "RUN" and "pip install" in a]
    assert len(installs) == 1
    lock = f"images/{image}/requirements.lock"
    assert f"pip install --require-hashes --no-deps -r {lock} && pip install --no-deps --no-build-isolation . " \
        in " ".join(installs[0].split())  # fmt: skip
    (extra,) = re.findall(r"# compilecache\[([a-z,]+)\]", (REPO_ROOT / lock).read_text())
    assert extra == EXPECTED_EXTRA[image]
    requirements = extra_requirements(extra, pyproject())
    assert "torch" not in requirements and "torch" not in locked(image)
    assert "find_spec('torch')" in installs[0]  # the build fails if torch ever slips in
    if image == "operator":
        assert {"kopf", "prometheus-client"} <= requirements
    else:
        assert {"redis", "boto3", "zstandard", "cryptography"} <= requirements and "kopf" not in requirements


@pytest.mark.parametrize("image", DOCKERFILES)
def test_dockerfile_copies_files_that_exist_and_the_context_includes(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    ignore = (dockerfile.parent / "Dockerfile.dockerignore").read_text().splitlines()
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore  # everything else stays out of the context
    for kind, arg in instructions(dockerfile):
        if kind != "COPY" or "--from=" in arg:
            continue
        *sources, _dest = arg.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"{image}: COPY {source} does not exist"
            assert source.rstrip("/") in included, f"{image}: {source} is ignored by Dockerfile.dockerignore"


def test_images_run_console_scripts_the_project_declares() -> None:
    scripts = pyproject()["project"]["scripts"]  # type: ignore[index]
    operator = instructions(DOCKERFILES["operator"])
    assert ("ENTRYPOINT", '["compilecache-operator"]') in operator
    assert "compilecache-operator" in scripts
    preloader = instructions(DOCKERFILES["preloader"])
    assert ("CMD", '["compilecache", "--help"]') in preloader
    assert "compilecache" in scripts


def test_preloader_ships_the_harness_only_as_the_installed_package() -> None:
    """The warm-up Job copies harness.py and its companions out of the installed cachelib
    (warmup_job.COPY_HARNESS): the image carries no second copy and no variable naming one."""
    text = DOCKERFILES["preloader"].read_text()
    assert "/opt/compilecache" not in text and "COMPILECACHE_HARNESS" not in text
    for module in ("harness", "compilekey", "podcontract", "targets", "warmstart"):
        assert (REPO_ROOT / "cachelib" / "in_image" / f"{module}.py").is_file()


def test_slim_rules() -> None:
    slim = load(IMAGES / "slim.py")
    assert slim.is_removed("botocore/data/ec2/2016-11-15/service-2.json.gz")
    assert not slim.is_removed("botocore/data/s3/2006-03-01/service-2.json.gz")
    assert not slim.is_removed("botocore/data/sts/2011-06-15/service-2.json.gz")
    assert not slim.is_removed("botocore/data/endpoints.json")
    assert not slim.is_removed("botocore/client.py")
    assert slim.is_removed("zstandard/_cffi.cpython-311-x86_64-linux-gnu.so")
    assert not slim.is_removed("zstandard/backend_c.cpython-311-x86_64-linux-gnu.so")


def probe_in(site: Path, code: str) -> str:
    """What ``code`` prints, run by this interpreter with only ``site`` on its path (as the slimmed image has it)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_slimmed_botocore_still_serves_s3_and_sts(tmp_path: Path) -> None:
    """Copies the installed boto3/botocore, slims them, and drives S3 and STS clients up to the network (a closed
    loopback port): their models load and requests serialise; another service is gone."""
    slim = load(IMAGES / "slim.py")
    for package in ("botocore", "boto3", "s3transfer"):
        shutil.copytree(SITE_PACKAGES / package, tmp_path / package)
    before = sum(f.stat().st_size for f in (tmp_path / "botocore").rglob("*") if f.is_file())
    freed = slim.slim(tmp_path)
    assert freed > before / 2
    probe = f"""
import boto3, botocore, botocore.config, botocore.exceptions
assert botocore.__file__.startswith({str(tmp_path)!r}), botocore.__file__
session = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
config = botocore.config.Config(retries={{"max_attempts": 1}}, connect_timeout=2)
for service, call in (("s3", lambda c: c.list_objects_v2(Bucket="b", Prefix="cc1/")),
                      ("sts", lambda c: c.get_caller_identity())):
    client = session.client(service, endpoint_url="http://127.0.0.1:9", config=config)
    try:
        call(client)
    except botocore.exceptions.EndpointConnectionError:
        pass
try:
    session.client("ec2")
except botocore.exceptions.UnknownServiceError:
    print("ok")
"""
    assert probe_in(tmp_path, probe) == "ok"


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed")
def test_slimmed_and_stripped_zstandard_still_uses_its_c_backend(tmp_path: Path) -> None:
    slim = load(IMAGES / "slim.py")
    shutil.copytree(SITE_PACKAGES / "zstandard", tmp_path / "zstandard")
    backend = next((tmp_path / "zstandard").glob("backend_c.*.so"))
    size = backend.stat().st_size
    slim.slim(tmp_path, strip=True)
    assert not list((tmp_path / "zstandard").glob("_cffi.*.so"))
    assert backend.stat().st_size <= size
    probe = f"""
import zstandard
assert zstandard.__file__.startswith({str(tmp_path)!r})
data = bytes(range(256)) * 4096
assert zstandard.ZstdDecompressor().decompress(zstandard.ZstdCompressor(level=3).compress(data)) == data
print(zstandard.backend)
"""
    assert probe_in(tmp_path, probe) == "cext"


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed")
def test_stripped_native_extensions_of_the_operator_image_still_work(tmp_path: Path) -> None:
    """The operator image's compiled dependencies (Kopf's aiohttp stack, cryptography, PyYAML) after strip."""
    slim = load(IMAGES / "slim.py")
    packages = ["aiohttp", "yarl", "multidict", "frozenlist", "propcache", "yaml", "cryptography", "aiosignal",
                "attr", "aiohappyeyeballs", "idna", "typing_extensions.py"]
    for name in [*packages, *(p.name for p in SITE_PACKAGES.glob("_cffi_backend*.so"))]:
        source = SITE_PACKAGES / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        elif source.is_file():
            shutil.copy2(source, tmp_path / name)
    assert list(tmp_path.rglob("*.so"))
    slim.slim(tmp_path, strip=True)
    probe = f"""
import aiohttp, cryptography, multidict, yarl, yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
assert all(m.__file__.startswith({str(tmp_path)!r}) for m in (aiohttp, cryptography, multidict, yarl, yaml))
assert yaml.__with_libyaml__
key = ec.generate_private_key(ec.SECP256R1())
key.public_key().verify(key.sign(b"x", ec.ECDSA(hashes.SHA256())), b"x", ec.ECDSA(hashes.SHA256()))
assert yaml.load("a: [1, 2]", Loader=yaml.CSafeLoader) == {{"a": [1, 2]}}
assert str(yarl.URL("https://h/p").with_path("/q")) == "https://h/q"
print("ok")
"""
    assert probe_in(tmp_path, probe) == "ok"


def test_slim_refuses_an_unexpected_botocore_layout(tmp_path: Path) -> None:
    slim = load(IMAGES / "slim.py")
    (tmp_path / "botocore" / "data" / "ec2").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="lacks the models"):
        slim.slim(tmp_path)
    assert (tmp_path / "botocore" / "data" / "ec2").is_dir()  # nothing removed


def test_wheel_size_sums_installed_members(tmp_path: Path) -> None:
    wheel_size = load(IMAGES / "wheel-size.py")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    source = b"def f():\n    return 1\n" * 50
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("demo/__init__.py", source)
        archive.writestr("botocore/data/ec2/2016-11-15/service-2.json.gz", b"x" * 5000)
        archive.writestr("botocore/data/s3/2006-03-01/service-2.json.gz", b"y" * 3000)
    full = wheel_size.installed_size(wheel)
    assert full.installed_bytes == len(source) + 8000
    assert full.download_bytes == wheel.stat().st_size
    assert full.bytecode_bytes > 16
    slimmed = wheel_size.installed_size(wheel, wheel_size.load_slim())
    assert slimmed.installed_bytes == len(source) + 3000
    rows, download, installed = wheel_size.summarize([slimmed, full])
    assert rows[0] is full and installed == full.installed_bytes + slimmed.installed_bytes
    assert download == 2 * wheel.stat().st_size


# -- hash-pinned requirements -----------------------------------------------------------------------------
LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\]+) \\$")


def locked(image: str) -> dict[str, tuple[str, list[str]]]:
    """Package -> (version, sha256 hashes) of an image's requirements.lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in (IMAGES / image / "requirements.lock").read_text().splitlines():
        match = LOCKED.match(line)
        if match:
            current = match.group(1).lower().replace("_", "-")
            out[current] = (match.group(2), [])
        elif line.strip().startswith("--hash=sha256:") and current:
            out[current][1].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"{image}/requirements.lock: unexpected line {line!r}")
    return out


def test_the_locks_are_current_with_pyproject() -> None:
    lock = load(IMAGES / "lock.py")
    assert lock.stale_locks() == [], "run python images/lock.py (pip install pip-tools)"
    changed = (REPO_ROOT / "pyproject.toml").read_text().replace('"zstandard>=0.22"', '"zstandard>=0.23"')
    assert lock.pyproject_digest(changed) != lock.pyproject_digest((REPO_ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("image", DOCKERFILES)
def test_every_locked_package_is_pinned_with_hashes(image: str) -> None:
    from packaging.requirements import Requirement

    packages = locked(image)
    assert "setuptools" in packages  # the build requirement: pip install . runs without build isolation
    for name, (version, hashes) in packages.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{name}=={version}: no sha256"
    meta = pyproject()["project"]
    assert isinstance(meta, dict)
    wanted = [*meta["dependencies"], *[r for extra in meta["optional-dependencies"].values() for r in extra]]
    for text in wanted:
        req = Requirement(text)
        name = req.name.lower().replace("_", "-")
        if name in packages:
            version = packages[name][0]
            assert req.specifier.contains(version, prereleases=True), f"{image}: {name} {version} vs {text}"
    assert extra_requirements(EXPECTED_EXTRA[image], pyproject()) <= set(packages)
