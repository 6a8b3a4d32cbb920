"""The README is the project's front page: short, with both setup commands and a working
decision where a reader starts, its links alive, and no credential in it or the docs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_LINES = 40
MAX_LINES = 200
# A real API key (dgk_<16 hex>_<secret>) or minted token (dgt_...), as opposed to the
# placeholders the docs use (dgk_..., dgk_<key id>_<secret>, $DG_API_KEY).
CREDENTIAL = re.compile(r"dg[kt]_[0-9a-f]{16}_[A-Za-z0-9_-]{20,}|dgt_[A-Za-z0-9_.-]{40,}")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}: move the rest to docs/"


def test_both_commands_and_a_decision_come_first():
    head = "\n".join(README.read_text().splitlines()[:FIRST_LINES])
    assert re.search(r"^make up\b", head, re.M), "`make up` is not in the first lines"
    assert re.search(r"^make test\b", head, re.M), "`make test` is not in the first lines"
    runnable = [code for language, code in fenced_blocks(head + "\n```\n") if language == "bash"]
    assert any(code.lstrip().startswith("curl") and "/v1/systemone" in code for code in runnable), (
        "the curl decision is not in the first lines")


def test_the_examples_read_the_environment_the_readme_sets():
    # tests/e2e/test_readme.py runs the `bash` and `python` blocks with DG_URL and DG_API_KEY
    # set: the README must tell the reader to set the same two, and its examples use them.
    text = README.read_text()
    blocks = fenced_blocks(text)
    setup = "\n".join(code for language, code in blocks if language == "sh")
    assert "export DG_URL=" in setup and "export DG_API_KEY=" in setup
    bash = [code for language, code in blocks if language == "bash"]
    python = [code for language, code in blocks if language == "python"]
    assert bash and all("$DG_URL" in code and "$DG_API_KEY" in code for code in bash)
    assert python and all('os.environ["DG_URL"]' in code and 'os.environ["DG_API_KEY"]' in code for code in python)
    assert any("from openai import OpenAI" in code for code in python)


def test_the_readmes_links_lead_somewhere():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README maps no page of the documentation"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_no_credential_in_the_readme_or_the_docs():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}: {m.group(0)[:12]}..." for page in pages
             for m in CREDENTIAL.finditer(page.read_text())]
    assert not found, f"credential-shaped strings in the docs: {found}"


def test_the_retry_page_says_what_the_installed_sdks_do():
    # docs/reference/retries.md quotes each SDK's defaults: read from the packages the suite
    # runs (constraints.txt pins them), so that an upgrade which changes one fails here
    from importlib.metadata import version

    from openai import _constants as openai_defaults
    from typesafe_sdk import RetryPolicy
    from typesafe_sdk import constants as typesafe_defaults

    page = (ROOT / "docs" / "reference" / "retries.md").read_text()
    assert f"openai {version('openai')}" in page and f"typesafe-sdk {version('typesafe-sdk')}" in page
    assert (openai_defaults.DEFAULT_MAX_RETRIES, openai_defaults.INITIAL_RETRY_DELAY, openai_defaults.MAX_RETRY_DELAY,
            openai_defaults.MAX_RETRY_AFTER_DELAY) == (2, 0.5, 8.0, 120)
    assert (openai_defaults.DEFAULT_TIMEOUT.read, openai_defaults.DEFAULT_TIMEOUT.connect) == (600, 5.0)
    policy = RetryPolicy()
    assert (policy.max_retries, policy.backoff_initial, policy.backoff_max, policy.backoff_jitter, policy.timeout,
            policy.respect_retry_after) == (2, 0.5, 5.0, 0.25, 30.0, True)
    assert policy.http_statuses == {408, 429, *range(500, 600)} and typesafe_defaults.DEFAULT_TIMEOUT == 10.0


def _joined_source() -> str:
    """The code that writes messages, its implicitly concatenated string literals joined (a
    message split over lines in the source reads whole here)."""
    files = [p for folder in ("gateway", "scorer_container", "systemone", "devkit", "scripts")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh")]
    text = "\n".join(p.read_text() for p in files)
    return re.sub(r"\"\s*\n\s*[rbf]*\"", "", text)


def quoted_messages(page: str) -> list[str]:
    """The messages a page quotes: `message` and `reason` in its JSON blocks, every line of its text blocks."""
    found = []
    for kind, block in re.findall(r"```(json|text)\n(.*?)```", page, re.S):
        if kind == "json":
            found += re.findall(r'"(?:message|reason)": "([^"]+)"', block)
        else:
            found += [line for line in block.splitlines() if line.strip()]
    return found


def test_the_troubleshooting_page_quotes_messages_the_code_writes():
    source = _joined_source()
    messages = quoted_messages((ROOT / "docs" / "troubleshooting.md").read_text())
    assert len(messages) >= 6
    for message in messages:
        # The figures (counts, sizes, hashes, ports) are examples; the words around them are the code's.
        fragments = [f.strip(" .,:;") for f in re.split(r"\S*[0-9…]\S*", message)]
        for fragment in (f for f in fragments if len(f) >= 12):
            assert fragment in source, f"the troubleshooting page quotes {fragment!r}, which no code writes"


def test_every_figure_names_the_target_and_the_date_that_wrote_it():
    """A figure's fragment (docs/figures/*.md) opens with the command that wrote it and when;
    every picture on a page sits in one, and exists."""
    figures = ROOT / "docs" / "figures"
    for fragment in sorted(figures.glob("*.md")):
        text = fragment.read_text()
        first = text.splitlines()[0]
        assert re.search(r"`make [a-z-]+`", first) or "`python -m " in first, f"{fragment.name} names no target"
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", first), f"{fragment.name} gives no date"
        for picture in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert (ROOT / "docs" / picture).exists(), f"{fragment.name} shows {picture}, which is not there"
    pages = [p for p in (ROOT / "docs").rglob("*.md") if figures not in p.parents]
    for page in pages:
        loose = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text())
        assert not loose, f"{page.name} shows {loose} outside a figure's fragment (which names its target and date)"


def _fits(shown: Any, recorded: Any) -> bool:
    """`shown` is `recorded` trimmed: its keys a subset, its numbers rounded to 2 places at most."""
    if isinstance(shown, dict):
        return isinstance(recorded, dict) and all(k in recorded and _fits(v, recorded[k]) for k, v in shown.items())
    if isinstance(shown, list):
        return isinstance(recorded, list) and len(shown) == len(recorded) and all(map(_fits, shown, recorded))
    if isinstance(shown, float) and isinstance(recorded, (int, float)):
        return abs(shown - recorded) <= 0.005
    return shown == recorded


def test_the_readmes_first_answer_is_the_one_a_recorded_run_got():
    """The README shows the answer `make api-examples` recorded for its own curl (same body), and says
    when and with which model."""
    recorded = json.loads((ROOT / "docs" / "reference" / "examples.json").read_text())
    example = next(e for e in recorded["examples"] if e["operation"] == "POST /v1/systemone")
    text = README.read_text()
    blocks = fenced_blocks(text)
    curl = next(code for language, code in blocks if language == "bash" and "/v1/systemone" in code)
    assert json.loads(re.search(r"-d '(.*?)'", curl, re.S).group(1)) == example["request"]["body"]
    shown = [json.loads(code) for language, code in blocks if language == "json"]
    assert shown and _fits(shown[0], example["response"]["body"]), "the README's answer is not the recorded one"
    assert recorded["date"] in text and recorded["model"] in text


def test_the_decisions_page_shows_the_request_its_recorded_answer_answers():
    recorded = json.loads((ROOT / "docs" / "reference" / "examples.json").read_text())
    example = next(e for e in recorded["examples"] if e["operation"] == "POST /v1/decisions")
    page = (ROOT / "docs" / "concepts" / "decisions.md").read_text()
    curl = next(m.group(1) for m in re.finditer(r"```sh\n(.*?)```", page, re.S) if "/v1/decisions" in m.group(1))
    assert json.loads(re.search(r"-d '(.*?)'", curl, re.S).group(1)) == example["request"]["body"]
    assert "<!-- example-answer: POST /v1/decisions -->" in page


def curl_calls(text: str) -> list[tuple[str, str, str]]:
    """(method, path, JSON body) of every curl in a page's shell blocks that sends a JSON body."""
    calls = []
    for language, code in fenced_blocks(text):
        if language not in ("sh", "bash"):
            continue
        for command in re.split(r"\n(?=\S*curl )|\n(?=[A-Z_]+=\$\(curl )", code):
            target = re.search(r'"\$DG_URL(/[^"?]*)', command)
            body = re.search(r"-d '(\{.*?\})'", command, re.S)
            if "curl" not in command or not target or not body:
                continue
            method = re.search(r"-X (\w+)", command)
            calls.append((method.group(1) if method else "POST", target.group(1), body.group(1)))
    return calls


def test_every_request_body_the_docs_show_fits_the_served_schema():
    """The JSON a page's curl sends is held to the request schema of its operation in the document the
    gateway serves (the recorded examples are held to theirs in tests/unit/devkit/test_api_examples.py)."""
    from scripts import openapi_doc

    document = openapi_doc.document()
    templates = [(path, re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", path) + "$")) for path in document["paths"]]
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    checked = 0
    for page in pages:
        text = re.sub(r"^    ", "", page.read_text(), flags=re.M)  # blocks in content tabs, dedented
        for method, path, body in curl_calls(text):
            path = re.sub(r"\$\w+|\$\{\w+\}", "x1", path)
            operation = next(p for p, pattern in templates if pattern.match(path))
            schema = document["paths"][operation][method.lower()]["requestBody"]["content"]["application/json"]["schema"]
            openapi_doc.validate(document, schema, json.loads(body))
            checked += 1
    assert checked >= 8
