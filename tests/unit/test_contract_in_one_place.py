"""Every byte between the deployables is written and read in systemone/ only.

The custom attributes' names, the request-id alphabet, the error bodies' fields, the
ModelError fields and the answer formulas are the contract; a copy of any of them on
one side is a place where the two sides can drift. This reads every string literal
(docstrings aside) and every function name outside systemone/ and tests/, and refuses
the contract's own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("gateway", "scorer_container", "devkit", "bench", "evals", "scripts")
CONTRACT_LITERALS = re.compile(
    r"x-amzn-sagemaker-custom-attributes"  # the header the side channel travels in
    r"|^timeout_ms$|(timeout_ms|request_id|route)="  # its keys, as written into it
    r"|0123456789-_\."  # the request-id alphabet
    r"|^(x_state|x_retry_after|error_type|detail|OriginalStatusCode|OriginalMessage)$",  # error bodies, ModelError
    re.IGNORECASE)
CONTRACT_FUNCTIONS = {"choice_confidence", "score_confidence", "expected_score", "safe_request_id",
                      "parse_attributes", "system_one_body", "openai_body", "read_error_body", "hints_of"}


def docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def log_fields(tree: ast.AST) -> set[int]:
    """The keys of a log call's `extra=` (a log line's field names, not wire bytes)."""
    return {id(key) for node in ast.walk(tree) if isinstance(node, ast.Call)
            for keyword in node.keywords if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict)
            for key in keyword.value.keys if key is not None}


def copies(source: str) -> list[str]:
    """The contract's literals and function names this source holds."""
    tree = ast.parse(source)
    skip = docstrings(tree) | log_fields(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if CONTRACT_LITERALS.search(node.value):
                found.append(repr(node.value))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in CONTRACT_FUNCTIONS:
            found.append(f"def {node.name}")
    return found


SOURCES = sorted(p for package in OUTSIDE for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_side_holds_a_copy_of_the_contract(path):
    assert not copies(path.read_text()), f"{path.relative_to(ROOT)}: use systemone/ instead"


def test_the_contract_holds_them_and_the_check_sees_a_copy():
    contract = "".join(p.read_text() for p in (ROOT / "systemone").glob("*.py"))
    assert len(copies(contract)) >= 10  # the check reads what systemone/ writes
    sneaked = ('"""Docstrings may name timeout_ms= and x_state."""\n'
               'HEADER = "X-Amzn-SageMaker-Custom-Attributes"\n'
               'body = {"detail": {"error_type": "overloaded"}, "x_retry_after": 5}\n'
               'log.warning("failed", extra={"error_type": "overloaded"})\n'
               'def choice_confidence(p):\n    return max(p)\n'
               'value = f"route={1};timeout_ms={2}"\n')
    assert sorted(copies(sneaked)) == sorted(["'X-Amzn-SageMaker-Custom-Attributes'", "'detail'", "'x_retry_after'",
                                              "def choice_confidence", "'error_type'", "'route='", "';timeout_ms='"])
