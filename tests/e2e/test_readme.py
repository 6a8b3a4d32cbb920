"""The README's examples, run as written against the local stack (a real model behind the
gateway's local runner), and those of the getting-started page beside them.

Every fenced `bash` and `python` block runs, unchanged, with DG_URL and DG_API_KEY set the
way the README tells a reader to set them; a block not meant to run is fenced `sh`
(tests/unit/test_readme.py holds the README to that)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The page's `language` blocks, those in a content tab (indented under `=== "..."`) too."""
    text = path.read_text()
    return [textwrap.dedent(m.group(2)) for m in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", text, re.S | re.M)]


def examples(language: str) -> list:
    found = [pytest.param(page, i, code, id=f"{page}:{language}{i}")
             for page in PAGES for i, code in enumerate(fenced_blocks(ROOT / page, language))]
    assert any(p.values[0] == "README.md" for p in found), f"the README has no {language} example"
    return found


def environment(local_stack) -> dict[str, str]:
    """The test process's environment (the developer's own already removed by conftest), and
    the two variables the README has the reader export."""
    return {**os.environ, "DG_URL": local_stack.url, "DG_API_KEY": local_stack.api_key}


def sent_questions(code: str) -> dict:
    """The questions of the body a curl example sends (`-d '...'`)."""
    body = re.search(r"-d '(.*?)'", code, re.S)
    assert body, "the example sends no JSON body"
    return json.loads(body.group(1))["questions"]


@pytest.mark.parametrize(("page", "index", "code"), examples("bash"))
def test_the_shell_examples_answer(local_stack, page, index, code):
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=environment(local_stack), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    questions = sent_questions(code)
    assert set(answer["answers"]) == set(questions), answer
    for qid, question in questions.items():
        got = answer["answers"][qid]
        assert got["type"] == question["type"]
        if question["type"] == "noul":
            assert 0 <= got["noul"] <= 1
        elif question["type"] == "choice":
            assert set(got["probabilities"]) == set(question["criteria"])
            assert sum(got["probabilities"].values()) == pytest.approx(1, abs=1e-6)
            assert got["choice"] == max(got["probabilities"], key=got["probabilities"].get)
        else:
            assert set(got["legend"].values()) == set(question["criteria"])
            assert 0 <= got["score"] <= len(question["criteria"]) - 1
    assert answer["x_decision_id"] and answer["usage"]["input_tokens"] > 0
    # What the pages say comes with it: what the scorer applied, and its injection signal.
    assert {"x_readout", "x_debias", "x_injection"} <= set(answer)


@pytest.mark.parametrize(("page", "index", "code"), examples("python"))
def test_the_python_examples_answer(local_stack, page, index, code):
    done = subprocess.run([sys.executable, "-c", code], env=environment(local_stack), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines, "the example printed nothing"
    assert 0 <= float(lines[0]) <= 1, "the first line printed is not the decision's probability"
    assert len(done.stdout.strip()) > len(lines[0]), "the chat printed nothing"
