"""The API verbs the operator's code uses per resource, read from its source (its watches, Kopf's, its calls)."""

from __future__ import annotations

import ast
import importlib
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.chart.chart import REPO_ROOT

OPERATOR_DIR = REPO_ROOT / "operator" / "compilecache_operator"


UNKNOWN = "{}"


HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


KOPF_CORE = {
    # Kopf's resource observer lists and watches the CRDs (to follow the CompileCache CRD's installation); it posts
    # the Events of handler failures and of the operator's own kopf.event() calls.
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "events"): {"create"},
}


PERMISSION_CHECKS = {
    # Not a call: the OwnerReferencesPermissionEnforcement admission plugin checks that whoever creates a Job with
    # blockOwnerDeletion on its CompileCache owner may update that owner's finalizers.
    ("compilecache.io", "compilecaches/finalizers"): {"update"},
}


CALL_NAMES = {"request", "get", "list_all"}


KUBE_PLUMBING = CALL_NAMES | {"list_versioned", "watch"}
"""KubeAPI's methods that take the path they are given: their callers are read."""


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    where: str


def _module(path: Path) -> ModuleType:
    parts = path.relative_to(OPERATOR_DIR.parent).with_suffix("").parts
    return importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))


def _constant_strings(value: object) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list, frozenset, set)) and value and all(isinstance(v, str) for v in value):
        return sorted(str(v) for v in value)
    return None


class PathReader:
    """Evaluates a path expression to the strings it can be, unknown parts as ``{}``: constants, f-strings, ``+``,
    local names (assignments, and ``for`` targets over constants), module constants, ``self.<attr>`` set in the
    class's ``__init__``, and calls of ``*_path`` static methods of the KubeAPI class."""

    def __init__(self, tree: ast.Module, module: ModuleType, builders: Mapping[str, ast.FunctionDef]) -> None:
        self.tree, self.module, self.builders = tree, module, builders

    def values(self, node: ast.expr | None, scope: ast.AST, env: Mapping[str, list[str]] | None = None) -> list[str]:
        env = env or {}
        if node is None:
            return [UNKNOWN]
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else [UNKNOWN]
        if isinstance(node, ast.JoinedStr):
            parts = [self.values(v.value, scope, env) if isinstance(v, ast.FormattedValue) else self.values(v, scope,
                                                                                                         env)
                     for v in node.values]
            return ["".join(p) for p in itertools.product(*parts)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return [a + b for a in self.values(node.left, scope, env) for b in self.values(node.right, scope, env)]
        if isinstance(node, ast.Name):
            return self._name(node.id, scope, env)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return self._self_attribute(node.attr, scope)
        if isinstance(node, ast.Call):
            return self._call(node, scope, env)
        if isinstance(node, ast.IfExp):
            return self.values(node.body, scope, env) + self.values(node.orelse, scope, env)
        return [UNKNOWN]

    def _name(self, name: str, scope: ast.AST, env: Mapping[str, list[str]]) -> list[str]:
        if name in env:
            return env[name]
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return self.values(node.value, scope, env)
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == name:
                return self._iterated(node.iter, scope)
        constant = _constant_strings(getattr(self.module, name, None))
        return constant or [UNKNOWN]

    def _iterated(self, node: ast.expr, scope: ast.AST) -> list[str]:
        if isinstance(node, ast.Name):
            return _constant_strings(getattr(self.module, node.id, None)) or [UNKNOWN]
        if isinstance(node, (ast.Tuple, ast.List)):
            return [v for element in node.elts for v in self.values(element, scope)]
        return [UNKNOWN]

    def _self_attribute(self, attr: str, scope: ast.AST) -> list[str]:
        for cls in (n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)):
            if not any(node is scope for node in ast.walk(cls)):
                continue
            for init in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
                for node in ast.walk(init):
                    if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets
                    ):
                        return self.values(node.value, init)
        return [UNKNOWN]

    def _call(self, node: ast.Call, scope: ast.AST, env: Mapping[str, list[str]]) -> list[str]:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "quote" and node.args:
            return self.values(node.args[0], scope, env)
        builder = self.builders.get(name)
        if builder is None:
            return [UNKNOWN]
        params = [a.arg for a in builder.args.args]
        bound = {p: [UNKNOWN] for p in params[: len(node.args)]}
        bound.update({k.arg: [UNKNOWN] for k in node.keywords if k.arg})
        unbound = {p: [""] for p in params if p not in bound}  # their default, "": an IfExp picks its orelse
        local = {**bound, **unbound}
        ret = next(n for n in ast.walk(builder) if isinstance(n, ast.Return))
        assert ret.value is not None
        if isinstance(ret.value, ast.IfExp) and isinstance(ret.value.test, ast.Name):
            branch = ret.value.body if ret.value.test.id in bound else ret.value.orelse
            return self.values(branch, builder, local)
        return self.values(ret.value, builder, local)


def _api_receiver(node: ast.Call, scope_class: str | None) -> bool:
    """``api.request(...)``, ``self.api.get(...)``, ``state.api.list_all(...)``, or ``self.…`` inside KubeAPI."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in CALL_NAMES:
        return False
    receiver = ast.unparse(func.value)
    return receiver.endswith("api") or (receiver == "self" and scope_class == "KubeAPI")


def calls_in(path: Path, builders: Mapping[str, ast.FunctionDef]) -> Iterator[Call]:
    tree = ast.parse(path.read_text())
    reader = PathReader(tree, _module(path), builders)
    classes = {id(fn): cls.name for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
               for fn in ast.walk(cls) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call) or not _api_receiver(node, classes.get(id(fn))):
                continue
            assert isinstance(node.func, ast.Attribute)
            where = f"{path.name}:{node.lineno} ({fn.name})"
            if node.func.attr == "request":
                method = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if not isinstance(method, str):
                    continue  # KubeAPI's own generic plumbing (request -> _send), whose callers are read
                target = node.args[1] if len(node.args) > 1 else None
            else:
                method, target = ("LIST" if node.func.attr == "list_all" else "GET"), (node.args or [None])[0]
            if fn.name in KUBE_PLUMBING and path.stem == "kube":
                continue  # get, list_all, list_versioned and watch themselves, defined on the path they are given
            for value in reader.values(target, fn):
                yield Call(method, value, where)


def api_calls() -> list[Call]:
    kube = ast.parse((OPERATOR_DIR / "edge" / "kube.py").read_text())
    builders = {n.name: n for n in ast.walk(kube) if isinstance(n, ast.FunctionDef) and n.name.endswith("_path")}
    return [c for path in sorted(OPERATOR_DIR.rglob("*.py")) for c in calls_in(path, builders)]


PATH_PATTERN = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/{}]+)/[^/{}]+)(?:/namespaces/\{\})?/(?P<resource>[a-z]+)"
    r"(?P<item>/\{\}(?:/(?P<sub>[a-z]+))?)?$"
)


def verb_of(call: Call) -> tuple[tuple[str, str], str] | None:
    """((group, resource[/subresource]), verb) of a call; None for a non-resource path (``/version``)."""
    if not call.path.startswith(("/api/", "/apis/")):
        return None
    match = PATH_PATTERN.match(call.path)
    assert match, f"{call.where}: cannot read the resource of {call.method} {call.path}"
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    item = bool(match["item"])
    if call.method in ("GET", "LIST"):
        verb = "get" if item and call.method == "GET" else "list"
    else:
        verb = HTTP_VERBS[call.method]
    return (match["group"] or "", resource), verb


def kopf_watches() -> dict[tuple[str, str], set[str]]:
    """What Kopf lists and watches for the operator's indexes and event handlers."""
    import kopf
    from compilecache_operator import handlers  # noqa: F401  (registers them)

    registry = kopf.get_default_registry()
    found: dict[tuple[str, str], set[str]] = {}
    for handler in itertools.chain(registry._indexing.get_all_handlers(), registry._watching.get_all_handlers()):
        selector = handler.selector
        assert selector is not None
        plural = selector.plural or selector.any_name
        assert isinstance(plural, str)
        found.setdefault((selector.group or "", plural), set()).update({"list", "watch"})
    return found


def informer_watches() -> dict[tuple[str, str], set[str]]:
    """What the operator's own watches list and watch: every :class:`Resource` of its watches module."""
    from compilecache_operator.controller import watches
    from compilecache_operator.edge.informer import Resource

    found: dict[tuple[str, str], set[str]] = {}
    for resource in vars(watches).values():
        if isinstance(resource, Resource):
            group = resource.api_version.rpartition("/")[0]
            found.setdefault((group, resource.plural), set()).update({"list", "watch"})
    return found


def used_verbs() -> dict[tuple[str, str], set[str]]:
    used: dict[tuple[str, str], set[str]] = {}
    for source in (kopf_watches(), informer_watches(), KOPF_CORE, PERMISSION_CHECKS):
        for key, verbs in source.items():
            used.setdefault(key, set()).update(verbs)
    for call in api_calls():
        found = verb_of(call)
        if found is not None:
            used.setdefault(found[0], set()).add(found[1])
    return used
