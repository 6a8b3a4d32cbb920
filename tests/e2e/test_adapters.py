"""An adapter's round trip over HTTP against the local stack, answered by the real model:
decisions through the OpenAI SDK, outcomes from a credential allowed to train, a refit,
a new version, decisions answered by its adapter, records naming it."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.auth.tenants import issue_api_key

pytestmark = pytest.mark.model

ENTRY = {"type": "noul", "instructions": "Is this message about food or cooking?",
         "learning": {"keep_features": True}, "policy": {"mode": "advisory"}}
FOOD = ["Preheat the oven and roast the potatoes with rosemary.", "My sourdough starter finally bubbled today.",
        "Best way to keep basil fresh in the fridge?", "We grilled salmon with lemon and dill for dinner.",
        "The soup needs more salt and a splash of cream.", "How long should I boil eggs for a soft yolk?",
        "Chop the onions finely before frying them in butter.", "This pasta sauce recipe uses fresh tomatoes.",
        "Whisk the flour, sugar and eggs into a smooth batter.", "Our favourite curry has coconut milk and chickpeas.",
        "Marinate the chicken overnight in yogurt and spices.", "Bake the cookies for twelve minutes until golden.",
        "The risotto was creamy after adding parmesan.", "Slice the avocado and spread it on toast.",
        "A pinch of cinnamon makes the apple pie better.", "Steam the broccoli so it stays green and crisp.",
        "Knead the pizza dough for ten minutes.", "The stew simmered with carrots and beef all afternoon.",
        "Add garlic to the olive oil before the mushrooms.", "Freeze the leftover lasagne in portions."]
OTHER = ["The train to Leeds was cancelled again this morning.", "My laptop will not connect to the office VPN.",
         "Please renew the parking permit for the blue car.", "The quarterly report is due on Friday.",
         "Our team won the football match on Saturday.", "The printer on floor three is out of toner.",
         "I need to reset my password for the payroll portal.", "The concert tickets sold out in ten minutes.",
         "The roof leaks whenever it rains heavily.", "Book a meeting room for the budget review.",
         "The new phone battery lasts two days.", "Snow closed the mountain pass overnight.",
         "The museum opens late on Thursdays.", "Our flight was delayed by three hours.",
         "The kids start swimming lessons next week.", "Update the slides before the client call.",
         "The bike needs a new chain and brakes.", "He moved to a flat near the river.",
         "The library fine was paid online.", "Install the security update tonight."]


def test_an_entry_learns_from_its_outcomes_through_the_api(local_stack):
    headers = {"Authorization": f"Bearer {local_stack.api_key}"}
    trainer = issue_api_key(local_stack.store.tenants, "acme", ["decide", "catalogs:read", "catalogs:write", "outcomes:train"])
    trains = {"Authorization": f"Bearer {trainer.secret}"}
    written = httpx.put(f"{local_stack.url}/v1/catalogs/e2e-food", json=ENTRY, headers=headers, timeout=30)
    assert written.status_code in (200, 201), written.text
    first = written.json()["version"]

    client = openai.OpenAI(base_url=f"{local_stack.url}/v1", api_key=local_stack.api_key, max_retries=0)
    for text, truth in [(t, True) for t in FOOD] + [(t, False) for t in OTHER]:
        decision = client.decisions.create(model="decision-default", input=text,
                                           questions=[{"catalog": "e2e-food", "name": "food"}])
        assert "x_features" not in decision.answers[0].model_extra
        outcome = httpx.post(f"{local_stack.url}/v1/decisions/{decision.id}/outcome", headers=trains, timeout=30,
                             json={"answers": {"food": truth}, "source": "review"})
        assert outcome.status_code == 200 and outcome.json()["outcome"]["trains"] is True, outcome.text

    refit = httpx.post(f"{local_stack.url}/v1/catalogs/e2e-food/refit", json={}, headers=trains, timeout=60).json()
    assert refit["samples"] == 40 and refit["applied"] is True, refit
    assert refit["adapter_out_of_fold"]["accuracy"] >= refit["zero_shot_out_of_fold"]["accuracy"]
    entry = httpx.get(f"{local_stack.url}/v1/catalogs/e2e-food", headers=headers, timeout=30).json()
    assert entry["version"] == first + 1 and entry["adapter"]["id"] == refit["adapter"]
    assert entry["adapter"]["fit"]["sources"] == {"review": 40} and entry["adapter"]["fit"]["samples"] == 40

    decision = client.decisions.create(model="decision-default", input="Fry the garlic, then add the rice and stock.",
                                       questions=[{"catalog": "e2e-food", "name": "food"}])
    answer = decision.answers[0].model_extra
    assert answer["x_adapter"] == refit["adapter"] and answer["x_catalog"] == f"e2e-food@{first + 1}"
    record = httpx.get(f"{local_stack.url}/v1/records/{decision.id}", headers=headers, timeout=30).json()
    [question] = record["questions"]
    assert question["adapter"] == refit["adapter"] and "features" not in question
