"""The repository's example CompileCaches (examples/), as the tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


QUICK_START_STORE = "redis://redis.compilecache-system.svc:6379/0"


def compile_caches() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}:{doc['metadata']['name']}", doc)
        for path in sorted(EXAMPLES_DIR.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CompileCache"
    ]


EXAMPLES = compile_caches()
