"""Catalogs, thresholds, records and the calibration tool over HTTP against the local
stack, answered by the real model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from devkit import calibrate

pytestmark = pytest.mark.model
ROUTING = {
    "type": "choice",
    "instructions": "Which support queue should handle this ticket?",
    "options": [{"name": "billing", "description": "payments, refunds, invoices"},
                {"name": "delivery", "description": "shipping, parcels, tracking"},
                {"name": "account", "description": "login, passwords, profile"},
                {"name": "technical", "description": "bugs, errors, crashes"}],
    "abstain": {"name": "human-triage"},
    "policy": {"mode": "enforcing"},
}


def test_a_catalog_entry_answers_in_both_formats_and_calibrates_through_the_tool(local_stack, tmp_path, capsys):
    headers = {"Authorization": f"Bearer {local_stack.api_key}"}
    written = httpx.put(f"{local_stack.url}/v1/catalogs/e2e-routing", json=ROUTING, headers=headers, timeout=30)
    assert written.status_code in (200, 201), written.text
    version = written.json()["version"]

    client = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key, max_retries=0)
    decision = client.decisions.create(model="decision-default", input="I was charged twice, refund one please.",
                                       questions=[{"catalog": "e2e-routing", "name": "queue"}])
    [answer] = decision.answers
    assert answer.choice in {"billing", "delivery", "account", "technical", "human-triage"}
    extra = answer.model_extra
    assert extra["x_catalog"] == f"e2e-routing@{version}" and extra["x_action"] in ("auto", "review", "abstain")

    labelled = tmp_path / "labelled.jsonl"
    lines = [json.loads(line) for line in open("evals/support_routing.jsonl")][:12]
    labelled.write_text("".join(json.dumps(item) + "\n" for item in lines))
    status = calibrate.main(["--file", str(labelled), "--catalog", "e2e-routing", "--url", local_stack.url,
                             "--api-key", local_stack.api_key, "--out", str(tmp_path / "report"), "--apply"])
    assert status == 0
    report = json.loads((tmp_path / "report" / "calibration.json").read_text())
    assert report["samples"] == 12 and 0.05 <= report["temperature"] <= 20
    assert (tmp_path / "report" / "reliability.png").stat().st_size > 10_000
    latest = httpx.get(f"{local_stack.url}/v1/catalogs/e2e-routing", headers=headers, timeout=30).json()
    assert latest["version"] == version + 1 and latest["calibration"]["fit"]["samples"] == 12
    # The fit names the template it holds for: the one the scorer answered with.
    assert report["prompt_versions"] == [latest["calibration"]["fit"]["prompt_version"]]
    assert latest["calibration"]["fit"]["prompt_version"].startswith("decision-prompt/2")
    assert "applied: e2e-routing@" in capsys.readouterr().out

    listed = httpx.get(f"{local_stack.url}/v1/records?catalog=e2e-routing", headers=headers, timeout=30).json()
    assert listed["records"] and listed["records"][0]["model_sha256"]
    # The fit belongs to the model and readout that answered, so the next decision is calibrated by it.
    fit = latest["calibration"]["fit"]
    assert fit["model_sha256"] == listed["records"][0]["model_sha256"] and fit["readout"] in ("letters", "likelihood")
    after = client.decisions.create(model="decision-default", input="I was charged twice, refund one please.",
                                    questions=[{"catalog": "e2e-routing", "name": "queue"}]).answers[0].model_extra
    assert after["x_catalog"] == f"e2e-routing@{version + 1}" and "x_action_reason" not in after
