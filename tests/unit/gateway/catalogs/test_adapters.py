"""Adapters: the fit (numpy, gateway.catalogs.fitting) and the decision-time head (plain
Python, gateway.catalogs.adapters) are two copies of one formula, held equal here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.catalogs import fitting
from gateway.catalogs.adapters import Head
from gateway.catalogs.vectors import decode_vector, encode_vector
from gateway.decisions.model import ReadFeatures
from systemone.features import SKETCH, decode_state, encode_state
from systemone.limits import STATE_FEATURE_DIMS

D = STATE_FEATURE_DIMS


def _samples(n: int, signal: bool, seed: int = 0) -> list[fitting.Sample]:
    """Three options and a flat zero-shot answer; with `signal` each option's states lie
    around a centre of their own, spread over every dimension as a hidden state's are."""
    centres = np.random.default_rng(42).normal(size=(3, D)) * 0.2
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = int(rng.integers(3))
        state = rng.normal(size=D)
        if signal:
            state += centres[label]
        flat = [math.log(1 / 3)] * 3
        out.append(fitting.Sample([flat, flat], state.tolist(), label, group=f"text-{i // 2}"))
    return out


def test_the_decision_time_head_computes_what_the_fitted_one_does():
    rng = np.random.default_rng(3)
    reach = np.array([[-0.3, 0.2], [-1.0, 1.0], [-0.05, 0.4], [-5.0, 5.0]])  # some terms held, some not
    head = fitting.Head(1.7, rng.normal(size=4), rng.normal(size=(4, D)) / 10, rng.normal(size=D), rng.random(D) + 0.5,
                        reach)
    pure = Head(head.scale, tuple(head.bias), tuple(head.center), tuple(head.spread),
                tuple(tuple(row) for row in head.weights), tuple(map(tuple, reach)))
    for _ in range(5):
        orders = [np.log(rng.dirichlet(np.ones(4))) for _ in range(2)]
        state = rng.normal(size=D)
        expected = head.probabilities(fitting.zero_shot(orders)[None, :], state[None, :])[0]
        read = ReadFeatures(tuple(tuple(o) for o in orders), tuple(state), SKETCH)
        assert pure.probabilities(read) == pytest.approx(expected.tolist(), abs=1e-9)


def test_folds_never_split_a_group_and_do_not_depend_on_the_order():
    groups = [f"g{i % 17}" for i in range(60)]
    folds = fitting.grouped_folds(groups)
    for group in set(groups):
        assert len({f for g, f in zip(groups, folds, strict=True) if g == group}) == 1
    reordered = fitting.grouped_folds(groups[::-1])[::-1]
    assert list(reordered) == list(folds) and set(folds) == set(range(5))


def test_an_adapter_is_kept_where_it_beats_the_calibrated_answer_out_of_fold():
    fitted = fitting.fit(_samples(120, signal=True), 3)
    assert fitted.head is not None and fitted.adapted.accuracy > fitted.zero_shot.accuracy + 0.3
    held_out = fitting.evaluate(fitted.head, _samples(60, signal=True, seed=9))
    assert held_out.accuracy > 0.7


def test_no_adapter_where_the_features_say_nothing_or_the_outcomes_are_too_few():
    noise = fitting.fit(_samples(120, signal=False), 3)
    assert noise.head is None and "does not surely beat" in noise.reason
    few = fitting.fit(_samples(fitting.MIN_SAMPLES - 1, signal=True), 3)
    assert few.head is None and "at least" in few.reason
    one_text = [fitting.Sample(s.orders, s.state, s.label, "same") for s in _samples(30, signal=True)]
    assert fitting.fit(one_text, 3).head is None


def test_vectors_travel_exactly_and_refuse_what_they_are_not():
    values = [0.5, -1.25, 3.0e5, 1e-7]
    assert decode_vector(encode_vector(values), 4) == pytest.approx(values, rel=1e-6)
    for bad, length in ((encode_vector(values), 5), ("not base64!", 4), (encode_vector([math.inf, 0, 0, 0]), 4)):
        with pytest.raises(ValueError):
            decode_vector(bad, length)
    sketch = [float(i % 7) - 3 for i in range(D)]
    assert decode_state(encode_state(sketch)) == sketch  # small integers are exact in float16
    with pytest.raises(ValueError):
        decode_state(encode_state(sketch)[:-4])


def test_an_adapter_whose_numbers_could_overflow_a_decision_is_refused_on_write():
    from gateway.catalogs.model import Adapter
    from gateway.catalogs.vectors import adapter_id

    fit = {"fitted_at": 0.0, "samples": 20, "folds": 5, "l2": 0.1, "accuracy": 0.9, "nll": 0.3, "brier": 0.2,
           "zero_shot_accuracy": 0.5, "zero_shot_nll": 0.69, "zero_shot_brier": 0.5, "sources": {}, "outcomes": None}
    good = {"model_sha256": "a" * 64, "prompt_version": "decision-prompt/2", "readout": "letters", "sketch": SKETCH,
            "listing": "canonical/reversal/raw",
            "options": ["true", "false"], "scale": 1.0, "bias": [0.0, 0.0], "center": encode_vector([0.0] * D),
            "spread": encode_vector([1.0] * D), "weights": encode_vector([0.01] * 2 * D), "fit": fit}
    Adapter.model_validate({**good, "id": adapter_id(good)})
    for bad in ({"spread": encode_vector([1e-30] * D)}, {"weights": encode_vector([3e38] * 2 * D)},
                {"bias": [1e300, 0.0]}, {"center": encode_vector([1e30] * D)}, {"scale": -1.0}):
        fields = {**good, **bad}
        with pytest.raises(ValueError):
            Adapter.model_validate({**fields, "id": adapter_id(fields)})


def test_a_state_far_outside_what_the_head_learned_from_moves_it_no_further_than_the_clip():
    from gateway.catalogs.vectors import STATE_CLIP

    weights = tuple(tuple(1.0 if (d == 3 and k == 0) else 0.0 for d in range(D)) for k in range(2))
    unbounded = ((-math.inf, math.inf),) * 2  # an adapter from before reach was kept: the clip alone
    head = Head(1.0, (0.0, 0.0), (0.0,) * D, (1.0,) * D, weights, unbounded)
    flat = ((math.log(0.5), math.log(0.5)),) * 2

    def p_true(value: float) -> float:
        state = tuple(value if d == 3 else 0.0 for d in range(D))
        return head.probabilities(ReadFeatures(flat, state, SKETCH))[0]

    assert p_true(60000.0) == pytest.approx(p_true(STATE_CLIP)) == pytest.approx(1 / (1 + math.exp(-STATE_CLIP)))
    fitted = fitting.Head(1.0, np.zeros(2), np.array(weights), np.zeros(D), np.ones(D), np.array(unbounded))
    far = np.zeros((1, D))
    far[0, 3] = 60000.0
    assert fitted.probabilities(np.log(np.full((1, 2), 0.5)), far)[0, 0] == pytest.approx(p_true(60000.0))


def test_a_crafted_state_moves_a_logit_no_further_than_the_training_states_did():
    """Anyone can write the text the model reads: a state built to push the sketch's term of
    one option up and another's down (every dimension at the clip, on the weights' side)
    leads by no more than the training samples' largest lead."""
    samples = _samples(200, signal=True)
    z = np.stack([fitting.zero_shot(s.orders) for s in samples])
    states = np.asarray([s.state for s in samples])
    head = fitting.train(z, states, np.asarray([s.label for s in samples]), 3, 0.01)
    x = np.clip((states - head.center) / head.spread, -4, 4)
    terms = x @ head.weights.T
    trained_lead = float(np.max(terms[:, 0] - terms[:, 1]))
    pure = Head(head.scale, tuple(head.bias), tuple(head.center), tuple(head.spread),
                tuple(tuple(row) for row in head.weights), tuple(map(tuple, head.reach)))
    crafted = head.center + np.sign(head.weights[0] - head.weights[1]) * 4 * head.spread * 1000
    unheld = float(np.clip((crafted - head.center) / head.spread, -4, 4) @ (head.weights[0] - head.weights[1]))
    assert unheld > 3 * trained_lead  # what the clip alone let through
    flat = ((math.log(1 / 3),) * 3,) * 2
    p = pure.probabilities(ReadFeatures(flat, tuple(crafted), SKETCH))
    lead = math.log(p[0] / p[1]) - (head.bias[0] - head.bias[1])
    assert lead <= head.reach[0, 1] - head.reach[1, 0] + 1e-9  # each term within what training saw
    assert lead < unheld / 3


def test_an_adapter_fitted_before_reach_was_kept_still_reads_and_applies():
    from gateway.catalogs.model import Adapter

    fitted = fitting.Head(1.0, np.zeros(2), np.zeros((2, D)), np.zeros(D), np.ones(D), np.zeros((2, 2)))
    fields = {"model_sha256": "ab" * 32, "prompt_version": "p1", "readout": "letters", "sketch": SKETCH,
              "listing": "l1", "options": ["true", "false"], "scale": 1.0, "bias": [0.0, 0.0],
              "center": encode_vector(fitted.center.tolist()), "spread": encode_vector(fitted.spread.tolist()),
              "weights": encode_vector(fitted.weights.reshape(-1).tolist()),
              "fit": {"fitted_at": 1.0, "samples": 20, "folds": 2, "l2": 0.1, "accuracy": 0.9, "nll": 0.3, "brier": 0.1,
                      "zero_shot_accuracy": 0.8, "zero_shot_nll": 0.4, "zero_shot_brier": 0.2, "sources": {"audit": 20},
                      "outcomes": "0" * 16}}
    from gateway.catalogs.vectors import adapter_id

    old = Adapter.model_validate({**fields, "id": adapter_id(fields)})  # its id made without reach
    assert old.reach is None and Head.of(old).reach == ((-math.inf, math.inf),) * 2
    with pytest.raises(ValueError, match="reach"):
        Adapter.model_validate({**fields, "reach": [[1.0, 0.0], [0.0, 1.0]],
                                "id": adapter_id({**fields, "reach": [[1.0, 0.0], [0.0, 1.0]]})})
