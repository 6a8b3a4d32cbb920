"""The few rules the deployables keep, checked (docs/contributing.md says why each exists).

- A value class is a stdlib dataclass or a pydantic model: one idiom a newcomer and a type
  checker already know, no second dialect of a standard feature.
- Importing the deployables writes nothing into the process environment (settings that must
  be there are the template's and `make up`'s).
- SageMaker is called through botocore's `sagemaker-runtime` client: nothing in gateway/
  computes a request signature of its own.
- The cyclic collector runs as Python runs it: no pause or freeze around the init phase.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The packages whose modules import without a model or a GPU (the scorer's engine needs llama_cpp).
VALUE_PACKAGES = ("systemone", "gateway")


def modules_of(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [package] + [info.name for info in pkgutil.walk_packages(root.__path__, f"{package}.")]


def declared_classes() -> list[type]:
    found = []
    for name in (m for p in VALUE_PACKAGES for m in modules_of(p)):
        module = importlib.import_module(name)
        found += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == name]
    return found


def is_exempt(cls: type) -> bool:
    """Classes whose annotations are not a value's fields: protocols, enums, typed dicts,
    named tuples, exceptions, and a subclass of a library's class that names an attribute it
    sets (an ExitStack that carries a meter)."""
    return (getattr(cls, "_is_protocol", False) or issubclass(cls, (enum.Enum, BaseException, tuple))
            or typing.is_typeddict(cls) or cls.__bases__ != (object,))


def test_every_class_with_fields_is_a_dataclass_or_a_pydantic_model():
    classes = declared_classes()
    assert len(classes) > 100  # the walk found the packages' classes
    odd = [f"{c.__module__}.{c.__qualname__}" for c in classes
           if inspect.get_annotations(c) and not is_exempt(c)
           and not dataclasses.is_dataclass(c) and not issubclass(c, pydantic.BaseModel)]
    assert odd == []


def test_immutable_values_are_frozen_dataclasses_and_no_module_brings_its_own_decorator():
    frozen = [c for c in declared_classes() if dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen]
    assert len(frozen) > 30
    sources = [p for package in (*VALUE_PACKAGES, "devkit", "scorer_container") for p in (ROOT / package).rglob("*.py")]
    assert not [p for p in sources if "dataclass_transform" in p.read_text()]


def test_importing_the_functions_writes_nothing_into_the_environment():
    probe = ("import json, os, sys; before = dict(os.environ); "
             "import gateway.functions.authorizer, gateway.functions.handler, gateway.functions.runtime_loop, gateway.functions.rotation, gateway.functions.refits; "
             "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PYDANTIC_", "OPENBLAS_"))}
    env |= {"GATEWAY_MODELS": json.dumps({"models": []}), "AWS_REGION": "us-east-1"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize("package", ["gateway", "systemone", "scorer_container"])
def test_no_module_writes_the_environment(package):
    """`os.environ[...] =`, `.setdefault`, `.update`, `os.putenv`: only the runtime loop's
    per-invocation trace id, which a custom runtime must set."""
    allowed = {("gateway/functions/runtime_loop.py", "_X_AMZN_TRACE_ID")}
    writes = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, (ast.Assign, ast.Call)) else ""
            if ("os.environ[" in text and isinstance(node, ast.Assign)
                    and any("os.environ" in ast.unparse(t) for t in node.targets)) \
                    or any(f"{w}(" in text for w in ("os.environ.setdefault", "os.environ.update", "os.putenv")):
                where = str(path.relative_to(ROOT))
                if not any(where == a and name in text for a, name in allowed):
                    writes.append(f"{where}:{node.lineno}: {text[:80]}")
    assert writes == []


def test_no_collector_pause_and_no_own_request_signer():
    gateway = [p for p in (ROOT / "gateway").rglob("*.py")]
    text = {p: p.read_text() for p in gateway}
    assert not [p for p, t in text.items() if "gc.disable" in t or "gc.freeze" in t]
    assert not [p for p, t in text.items() if "AWS4-HMAC-SHA256" in t]
    assert not (ROOT / "gateway" / "sigv4.py").exists()


def test_the_artifact_pins_the_botocore_the_tests_run_against():
    def pins(path: Path) -> dict[str, str]:
        lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        return {name.lower().replace("_", "-"): version for name, version in
                (line.split("==") for line in lines if "==" in line)}

    artifact, tested = pins(ROOT / "requirements" / "lambda.txt"), pins(ROOT / "constraints.txt")
    import botocore

    assert artifact["botocore"] == botocore.__version__
    assert {name: tested.get(name) for name in artifact} == artifact


def test_routes_name_their_response_models_by_class():
    """A route's `responses` is `doc(responses.Model, ...)`: a renamed model breaks the
    import, never only the documentation build."""
    found, by_name = 0, []
    for path in (ROOT / "gateway" / "api").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                if keyword.arg == "responses":
                    found += 1
                    call = keyword.value
                    # A model named by a bare name or a string (not `responses.Model`) is what drifts.
                    bare = [n for n in ast.walk(call) if isinstance(n, ast.Name) and n.id[:1].isupper() and not n.id.isupper()]
                    if not isinstance(call, ast.Call) or bare:
                        by_name.append(f"{path.name}:{node.lineno}")
    assert found >= 12 and by_name == []


def test_the_contract_depends_on_pydantic_the_standard_library_and_zstandard_only():
    allowed = {"pydantic", "pydantic_core", "zstandard", "systemone"}
    found = set()
    for path in (ROOT / "systemone").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    assert found - allowed - set(sys.stdlib_module_names) == set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of `packages` and the modules of them it imports, at any depth of its
    source (function bodies and TYPE_CHECKING blocks too: a circle there is still one)."""
    paths = {_module_name(p): p for package in packages for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            groups.append([module, *group])

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [sorted(g) for g in groups if len(g) > 1]


def test_no_two_modules_of_the_deployables_import_each_other_however_indirectly():
    # A package importing its own __init__ is no circle; everything else is.
    graph = _import_graph(("gateway", "scorer_container", "systemone"))
    graph = {m: {o for o in others if not m.startswith(o + ".")} for m, others in graph.items()}
    assert _circles(graph) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check finds one


# Where the gateway builds AWS clients: the composition root and the functions it serves
# (which hand them in), and the settings' own source (an SSM parameter). No adapter,
# service or route builds one: each takes the client it is given.
CLIENT_BUILDERS = {"gateway/functions/composition.py", "gateway/functions/rotation.py", "gateway/settings.py",
                   "gateway/aws.py"}


def _builds_a_client(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("client",
                                                                                                      "create_client"):
            return True
    return False


@pytest.mark.parametrize("path", sorted((ROOT / "gateway").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_composition_root_builds_aws_clients(path):
    if str(path.relative_to(ROOT)) not in CLIENT_BUILDERS:
        assert not _builds_a_client(path.read_text()), "take the client from the composition root instead"


def test_the_client_rule_sees_a_client_built():
    assert _builds_a_client("from gateway import aws\nc = aws.client('dynamodb')\n")
    assert not _builds_a_client("def f(client):\n    return client.get_item()\n")
