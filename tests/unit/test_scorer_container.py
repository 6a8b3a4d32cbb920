"""The scorer's shape, checked: a module imports only modules below it (so no two import
each other), from the HTTP edge down to llama.cpp. The function-length rule for every
deployable is in tests/unit/test_repository_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCORER = Path(__file__).resolve().parents[2] / "scorer_container"
# Bottom to top; a module may import modules of its own layer or below, never above.
LAYERS = (
    ("errors", "scoring", "priors", "state_cache"),  # no domain types: errors, distributions, bounded caches
    ("deadline", "untrusted", "schema", "llama", "model_files"),  # the request, the state, the model
    ("prompts", "prefix_tree", "scheduler", "embedded", "settings"),  # templates, one tree of decodes, the line
    ("questions", "decision_settings", "chat"),  # the options as the model reads them; how they are read
    ("probes",),  # one prompt listing options in one order
    ("counting",),  # what a plan costs, before any decoding
    ("planning",),  # one plan per decision
    ("answers",),  # the response body from a plan's distributions
    ("engine",),  # runs a plan
    ("budget",),  # what a request may cost here, measured on the engine's own work
    ("service",),  # the loaded model
    ("streaming",),  # chat as server-sent events
    ("lines",),  # an invocation of many requests: its body read as lines
    ("server",),  # the HTTP routes
    ("__main__",),  # the command line
)
LAYER = {module: depth for depth, modules in enumerate(LAYERS) for module in modules}
MODULES = sorted(p for p in SCORER.glob("*.py") if p.name != "__init__.py")


def imported_modules(tree: ast.AST) -> set[str]:
    """Every scorer module a module imports, at any level (function bodies and TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "scorer_container":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scorer_container."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("scorer_container."))
    return found


def test_every_module_has_a_layer():
    assert {p.stem for p in MODULES} == set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_module_imports_nothing_above_its_layer(path):
    above = {m for m in imported_modules(ast.parse(path.read_text())) if LAYER[m] > LAYER[path.stem]}
    assert not above, f"{path.name} imports {sorted(above)} from a layer above it"


def test_the_checks_see_an_upward_import():
    # The planner importing the engine that runs its plans would be refused, even for typing alone.
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scorer_container.engine import "
                     "DecisionEngine\nfrom scorer_container import server\n")
    assert imported_modules(tree) == {"engine", "server"} and LAYER["engine"] > LAYER["planning"]
