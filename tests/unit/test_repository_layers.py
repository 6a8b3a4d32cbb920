"""The repository's shape, checked: each top-level package imports only its own modules and
the packages of the layers below it, so the deployables stay free of the tools and tests
that run beside them. (tests/unit/test_gateway.py checks the layers inside gateway/.)

Imports are read from the source (AST), at any depth: function bodies, `importlib`
calls with a literal name, and `python -m MODULE` argument lists, since a tool that starts
another process depends on that module as surely as one that imports it. scripts/ are
plain scripts that put their own folder on sys.path, so `import up` is scripts/up.py.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Bottom to top. A package may import packages of lower layers, never one of its own layer
# (the two deployables never import each other) nor one above.
LAYERS = (
    ("systemone",),  # the wire contract: imports neither deployable
    ("gateway", "scorer_container"),  # the deployables: the Lambda artifact and the SageMaker image
    ("devkit",),  # the tools that run beside the deployables, never inside them
    ("bench", "evals", "scripts"),  # measurements and the developer's commands
    ("tests",),  # nothing outside tests/ imports it
)
LAYER = {package: depth for depth, packages in enumerate(LAYERS) for package in packages}
SCRIPT_MODULES = frozenset(p.stem for p in (ROOT / "scripts").glob("*.py"))
MAX_FUNCTION_LINES = 60


def package_of_module(name: str) -> str | None:
    """The repository package a module name resolves to; None for the standard library and
    third-party packages."""
    top = name.split(".")[0]
    if top in LAYER:
        return top
    return "scripts" if top in SCRIPT_MODULES else None


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def imported_modules(tree: ast.AST) -> set[str]:
    """Every absolute module name a source imports or runs, at any level."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args and _literal(node.args[0]):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee in ("import_module", "__import__", "run_module"):
                found.add(_literal(node.args[0]))
        elif isinstance(node, ast.List | ast.Tuple):
            items = [_literal(item) for item in node.elts]
            found.update(module for flag, module in itertools.pairwise(items) if flag == "-m" and module)
    return found


def upward_imports(package: str, tree: ast.AST) -> set[str]:
    """The repository packages `package`'s source imports from its own layer or above."""
    imported = {package_of_module(name) for name in imported_modules(tree)} - {None, package}
    return {other for other in imported if LAYER[other] >= LAYER[package]}


def package_of(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


MODULES = sorted(p for package in LAYER for p in (ROOT / package).rglob("*.py"))


def test_every_package_at_the_root_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(LAYER), f"give {sorted(packages - set(LAYER))} a layer"


def test_the_scan_reads_every_layered_package():
    # An empty scan would pass every check below.
    assert {package_of(p) for p in MODULES} == set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_nothing_of_its_own_layer_or_above(path):
    package = package_of(path)
    wrong = upward_imports(package, ast.parse(path.read_text()))
    assert not wrong, f"{path.relative_to(ROOT)} ({package}) imports {sorted(wrong)}, not below it"


def test_nothing_outside_tests_imports_tests():
    importers = [str(p.relative_to(ROOT)) for p in MODULES if package_of(p) != "tests"
                 and "tests" in {package_of_module(name) for name in imported_modules(ast.parse(p.read_text()))}]
    assert not importers


def test_the_checks_see_an_upward_import():
    # A gateway module that reaches the tools, the tests, the scorer and a script, each way a
    # module can be reached, is refused for each; the contract it may use is not.
    source = (
        "import importlib, subprocess, sys\n"
        "from systemone.models import DecisionRequest\n"
        "def handler():\n"
        "    from tests.fakes import FixedBackend\n"
        "    import devkit.local\n"
        "    importlib.import_module('scorer_container.engine')\n"
        "    subprocess.run([sys.executable, '-m', 'evals.run'])\n"
        "    import up\n"
    )
    assert upward_imports("gateway", ast.parse(source)) == {"tests", "devkit", "scorer_container", "evals", "scripts"}
    assert upward_imports("tests", ast.parse(source)) == set()
    assert upward_imports("systemone", ast.parse("from gateway.functions.handler import lambda_handler\n")) == {"gateway"}


SCREENED = ("systemone", "gateway", "scorer_container", "devkit")  # the deployables, their contract, their tools


@pytest.mark.parametrize("path", sorted(p for package in SCREENED for p in (ROOT / package).rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_longer_than_a_screen(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long


# The unit tests mirror the source: tests/unit/<path>/test_<name>.py tests <path>/<name>.py or
# the package <path>/<name>/. These test the house as a whole, and say why.
WHOLE_HOUSE = {
    "test_contract_in_one_place.py": "the contract's literals live in systemone/ alone, across every package",
    "test_engine_skip.py": "the suite's own skip when no Docker engine runs (scripts/engine.sh, tests/docker_helpers.py)",
    "test_environment.py": "the suite passes whatever the developer's shell holds",
    "test_house_rules.py": "rules every deployable keeps: value classes, no environment writes, no circles",
    "test_readme.py": "the README and the documentation pages",
    "test_repository_layers.py": "the layers between the top-level packages, and this mirror",
}


def source_under_test(test: Path) -> Path | None:
    """The module or package a unit test file tests, by its place; None when there is none."""
    relative = test.relative_to(ROOT / "tests" / "unit")
    name = relative.name.removeprefix("test_").removesuffix(".py")
    base = ROOT / relative.parent / name
    return next((p for p in (base.with_suffix(".py"), base) if p.exists()), None)


UNIT_TESTS = sorted((ROOT / "tests" / "unit").rglob("test_*.py"))


@pytest.mark.parametrize("test", UNIT_TESTS, ids=lambda p: str(p.relative_to(ROOT / "tests" / "unit")))
def test_each_unit_test_file_mirrors_the_module_it_tests(test):
    relative = str(test.relative_to(ROOT / "tests" / "unit"))
    assert relative in WHOLE_HOUSE or source_under_test(test) is not None, (
        f"tests/unit/{relative} maps to no module: name it after the module it tests (tests/unit/<path>/test_<name>.py"
        " for <path>/<name>.py or the package <path>/<name>/), or say in WHOLE_HOUSE why it tests the house")


def test_the_mirror_rule_finds_modules_packages_and_strays():
    unit = ROOT / "tests" / "unit"
    assert source_under_test(unit / "gateway" / "services" / "test_throttle.py") == ROOT / "gateway" / "services" / "throttle.py"
    assert source_under_test(unit / "gateway" / "test_stores.py") == ROOT / "gateway" / "stores"
    assert source_under_test(unit / "gateway" / "test_nothing_here.py") is None
    assert set(WHOLE_HOUSE) <= {str(p.relative_to(unit)) for p in UNIT_TESTS}  # no stale reason
