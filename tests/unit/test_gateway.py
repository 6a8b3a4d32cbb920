"""The gateway's shape, checked: packages import only packages below them (so no two
import each other). The function-length rule is in tests/unit/test_repository_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# Bottom to top; a unit may import units of its own layer or below, never above. The
# architecture page (docs/architecture.md) shows the same order.
LAYERS = (
    ("errors", "aws", "observability", "settings"),  # no domain types
    ("auth",),  # principals, credentials, tenants
    ("decisions",),  # the decision model, work limits, cost, records
    ("catalogs",),  # named, versioned questions; policies and calibration
    ("backends",),  # endpoint pools and the scorer's protocol
    ("batches",),  # files, uploads, batches, their ledger, and the worker that runs their lines
    ("stores",),  # SQLite and DynamoDB adapters of the store interfaces
    ("streaming",),  # a response that streams: its type, the relay of a backend's events, the integration's bytes
    ("services",),  # the use cases the routes call
    ("wire",),  # the public request and response codecs
    ("api",),  # one router per resource, and the app that assembles them
    ("functions",),  # the Lambda entry points, the streaming runtime loop, and the composition root they are built by
)  # the tools that run beside the functions are in devkit/ (tests/unit/test_repository_layers.py)
LAYER = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def unit_of(path: Path) -> str:
    return path.relative_to(GATEWAY).with_suffix("").parts[0]


def imported_units(tree: ast.AST) -> set[str]:
    """Every gateway unit a module imports, at any level (function bodies and TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gateway":
            names = [f"gateway.{a.name}" for a in node.names] if node.module == "gateway" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("gateway.")]
        else:
            continue
        found.update(name.split(".")[1] for name in names)
    return found


MODULES = sorted(p for p in GATEWAY.rglob("*.py") if p.name != "__init__.py" or p.parent != GATEWAY)


def test_every_unit_has_a_layer():
    assert {unit_of(p) for p in MODULES} <= set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(GATEWAY)))
def test_a_module_imports_nothing_above_its_layer(path):
    unit = unit_of(path)
    above = {u for u in imported_units(ast.parse(path.read_text())) if u != unit and LAYER[u] > LAYER[unit]}
    assert not above, f"{path.relative_to(GATEWAY)} ({unit}) imports {sorted(above)} from a layer above it"


def test_no_two_units_import_each_other():
    edges = {(unit_of(p), u) for p in MODULES for u in imported_units(ast.parse(p.read_text())) if u != unit_of(p)}
    assert not {(a, b) for a, b in edges if (b, a) in edges}


def test_the_checks_see_an_upward_import():
    # A module of the decision model that imports a route would be refused.
    tree = ast.parse("from gateway.api.records import router\nfrom gateway.functions import handler\n")
    assert imported_units(tree) == {"api", "functions"} and LAYER["api"] > LAYER["decisions"]


def test_the_contract_package_depends_on_neither_side():
    contract = GATEWAY.parent / "systemone"
    for path in contract.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.split(".")[0] in ("gateway", "scorer_container") for n in names), path.name
