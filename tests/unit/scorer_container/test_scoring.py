import numpy as np
import pytest

from scorer_container import scoring
from systemone import answers as formulas


def test_choice_confidence_is_zero_for_uniform_and_one_for_one_hot():
    assert formulas.choice_confidence(np.full(4, 0.25)) == pytest.approx(0.0)
    assert formulas.choice_confidence(np.array([0.0, 1.0, 0.0])) == pytest.approx(1.0)


def test_choice_confidence_formula():
    # Given p_max = 0.82 over three options, when the confidence is computed,
    # then it is (n * p_max - 1) / (n - 1).
    p = np.array([0.82, 0.10, 0.08])
    assert formulas.choice_confidence(p) == pytest.approx((3 * 0.82 - 1) / 2)


def test_expected_score_uses_zero_based_levels():
    assert formulas.expected_score(np.array([0.12, 0.64, 0.24])) == pytest.approx(0.64 + 2 * 0.24)


def test_score_confidence_formula_and_bounds():
    p = np.array([0.12, 0.64, 0.24])
    k = 1
    spread = sum(pi * abs(i - k) for i, pi in enumerate(p))
    uniform = sum(abs(i - k) for i in range(3)) / 3
    assert formulas.score_confidence(p) == pytest.approx(1 - spread / uniform)
    assert formulas.score_confidence(np.array([0.0, 0.0, 1.0])) == pytest.approx(1.0)
    # Mass on both extremes is worse than uniform: clamped at 0, never negative.
    assert formulas.score_confidence(np.array([0.5, 0.0, 0.0, 0.0, 0.5])) == 0.0


def test_softmax_with_temperature_flattens():
    logits = np.array([2.0, 0.0])
    sharp, flat = scoring.softmax(logits), scoring.softmax(logits, temperature=4.0)
    assert sharp.sum() == pytest.approx(1) and flat.sum() == pytest.approx(1)
    assert flat[0] < sharp[0]


def test_with_temperature_one_is_identity_and_keeps_normalisation():
    p = np.array([0.7, 0.2, 0.1])
    assert scoring.with_temperature(p, 1.0) is p
    hot = scoring.with_temperature(p, 2.0)
    assert hot.sum() == pytest.approx(1) and hot[0] < 0.7


def test_log_normalize_is_log_softmax():
    scores = np.array([-3.0, -1.0, -2.0])
    assert np.exp(scoring.log_normalize(scores)).sum() == pytest.approx(1)


def test_average_renormalises():
    avg = scoring.average([np.array([1.0, 0.0]), np.array([0.0, 1.0])])
    assert avg.tolist() == [0.5, 0.5]


def test_priors_used_twice_survive_a_stream_of_one_off_questions():
    # Given a prior used twice (a catalog entry's), when many one-off priors pass through
    # the cache, then the reused one is still there, and the cache never holds more than
    # its capacity.
    import numpy as np

    from scorer_container.priors import PriorCache

    cache = PriorCache(10)
    cache.put("entry", np.zeros(2))
    assert cache.get("entry") is not None
    for i in range(1000):
        cache.put(f"one-off {i}", np.ones(2))
        assert len(cache) <= 10
    assert cache.peek("entry") is not None
    assert cache.peek("one-off 0") is None and cache.peek("one-off 999") is not None


def test_a_prior_cache_of_size_zero_keeps_nothing():
    import numpy as np

    from scorer_container.priors import PriorCache

    cache = PriorCache(0)
    cache.put("a", np.zeros(1))
    assert cache.get("a") is None and len(cache) == 0
