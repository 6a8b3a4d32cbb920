"""The labelled set's loader and the eval's own arithmetic (no model)."""

import json
from collections import Counter

import numpy as np
import pytest

from evals import metrics
from evals.labelled import Item, load
from evals.probing import Config
from evals.run import CORE, configs, invariance, variants

CHOICE = {"type": "choice", "instructions": "Which team?",
          "criteria": {"billing": "charges", "shipping": "parcels", "account": None, "sales": "quotes"}}
SYNONYMS = {"billing": "payments", "shipping": "delivery", "account": "login", "sales": "presales"}


def write(tmp_path, *rows):
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def row(**change):
    return {"id": "t-001", "domain": "test", "state": "I paid twice.", "question": CHOICE, "gold": "billing",
            "synonyms": SYNONYMS, **change}


def test_the_shipped_set_loads_and_holds_300_dev_items_and_a_held_out_split():
    items = load()
    splits = {s: [it for it in items if it.split == s] for s in ("dev", "heldout")}
    assert len(splits["dev"]) >= 300 and len(splits["heldout"]) >= 150
    for kind in ("noul", "choice", "score"):
        assert all(any(it.kind == kind for it in part) for part in splits.values())
    noul = [it for it in items if it.kind == "noul"]
    assert abs(sum(it.gold == 0 for it in noul) - len(noul) / 2) <= 0.05 * len(noul)  # yes as often as no


def test_the_split_depends_on_the_id_alone(tmp_path):
    first = load([write(tmp_path, row())])[0]
    moved = load([write(tmp_path, row(state="Something else entirely.", gold="sales"))])[0]
    assert first.split == moved.split
    assert {Item(f"x-{i}", "d", "noul", "s", {}, 0).split for i in range(200)} == {"dev", "heldout"}


@pytest.mark.parametrize(("change", "error"), [
    ({"gold": "refunds"}, "not an option"),
    ({"synonyms": {**SYNONYMS, "sales": "billing"}}, "distinct new names"),
    ({"synonyms": {"billing": "payments"}}, "every option"),
    ({"question": {"type": "score", "criteria": ["low", "high"]}, "gold": 0}, "3 to 10 levels"),
    ({"question": {"type": "score", "criteria": ["a", "b", "c"]}, "gold": 3}, "level index"),
    ({"question": {"type": "noul", "instructions": "Paid twice?"}, "gold": "yes"}, "true or false"),
    ({"question": {"type": "choice", "criteria": {"only": None}}}, "criteria"),
])
def test_a_bad_item_is_refused_with_its_line(tmp_path, change, error):
    with pytest.raises(ValueError, match=error):
        load([write(tmp_path, row(**change))])


def test_duplicate_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="duplicate ids"):
        load([write(tmp_path, row(), row())])


def item():
    return Item("t-001", "test", "choice", "I paid twice.", CHOICE, 0, SYNONYMS)


def test_variants_permute_rename_and_duplicate_one_option():
    shapes = variants(item())
    names = list(CHOICE["criteria"])
    for k in range(3):
        perm = shapes[f"perm{k}"]["criteria"]
        assert sorted(perm) == sorted(names) and list(perm) != names
        assert all(perm[n] == CHOICE["criteria"][n] for n in names)
    target, alias = shapes["target"]["name"], shapes["target"]["alias"]
    assert alias == SYNONYMS[target]
    assert list(shapes["renamed"]["criteria"]) == [alias if n == target else n for n in names]
    duplicated = shapes["duplicated"]["criteria"]
    assert len(duplicated) == 5 and duplicated[alias] == duplicated[target] == CHOICE["criteria"][target]
    assert variants(item()) == shapes  # seeded by the id


def test_invariance_is_zero_for_an_invariant_answer_and_measures_a_moved_one():
    it = item()
    shapes = variants(it)
    shape = {**shapes["target"], **{k: v for k, v in shapes.items() if k != "target"}}
    p0 = np.array([0.4, 0.3, 0.2, 0.1])
    by_name = dict(zip(CHOICE["criteria"], p0, strict=True))
    target, alias = shape["name"], shape["alias"]

    def listed(criteria, values):
        return np.array([values[n] for n in criteria])

    dup = {**by_name, target: by_name[target] / 2, alias: by_name[target] / 2}
    same = {f"perm{k}": listed(shape[f"perm{k}"]["criteria"], by_name) for k in range(3)}
    same["renamed"] = listed(shape["renamed"]["criteria"], {**by_name, alias: by_name[target]})
    same["duplicated"] = listed(shape["duplicated"]["criteria"], dup)
    assert all(v == 0 for v in invariance(p0, it, same, shape).values())
    moved = dict(same)
    moved["perm1"] = listed(shape["perm1"]["criteria"], dict(zip(CHOICE["criteria"], [0.1, 0.2, 0.3, 0.4],
                                                                  strict=True)))
    found = invariance(p0, it, moved, shape)
    assert found["perm_flip"] == 1.0 and found["perm_shift"] == pytest.approx(0.3)


def test_the_fitted_temperature_lowers_nll_and_one_is_in_reach():
    rng = np.random.default_rng(0)
    golds = list(rng.integers(0, 4, 200))
    overconfident = [np.eye(4)[g] * 0.9 + 0.025 if rng.random() < 0.5 else np.roll(np.eye(4)[g] * 0.9 + 0.025, 1)
                     for g in golds]
    t = metrics.fit_temperature(overconfident, golds)
    assert t > 1.5
    assert metrics.nll(metrics.at_temperature(overconfident, t), golds) < metrics.nll(overconfident, golds)
    assert 1.0 in np.round(metrics.TEMPERATURES, 6)


def test_a_report_compares_with_the_uniform_answer():
    uniform = [np.full(2, 0.5), np.full(4, 0.25)]
    r = metrics.report(uniform, [0, 3], ["noul", "choice"])
    assert r["nll_vs_uniform"] == pytest.approx(0) and r["brier_vs_uniform"] == pytest.approx(0)


def test_configuration_keys_round_trip_and_only_canonical_ones_count_as_invariant():
    for config in configs():
        assert Config.parse(config.key) == config
    assert {c.invariant for c in configs() if c.ordering == "declared"} == {False}
    assert len(configs(("likelihood",))) == 10 and {c.key for c in configs(full=False)} == set(CORE)


def test_out_of_fold_losses_do_not_reward_a_temperature_fitted_on_noise():
    # Random distributions carry no information: fitted in sample, a temperature still
    # scores below uniform; out of fold it cannot, and the gain is not real.
    rng = np.random.default_rng(1)
    golds = list(rng.integers(0, 4, 120))
    noise = [rng.dirichlet(np.ones(4)) for _ in golds]
    t = metrics.fit_temperature(noise, golds)
    in_sample = metrics.nll(metrics.at_temperature(noise, t), golds)
    losses = metrics.out_of_fold_losses(noise, golds)
    assert losses.shape == (120,) and losses.mean() > in_sample
    assert not metrics.gain_is_real(losses, [4] * len(golds))


def test_out_of_fold_losses_keep_a_real_signal_real():
    rng = np.random.default_rng(2)
    golds = list(rng.integers(0, 4, 120))
    informed = [0.55 * np.eye(4)[g] + 0.45 * rng.dirichlet(np.ones(4)) for g in golds]
    losses = metrics.out_of_fold_losses(informed, golds)
    assert losses.mean() < np.log(4)
    assert metrics.gain_is_real(losses, [4] * len(golds))
    assert not metrics.gain_is_real(losses[:9], [4] * 9)  # too few items to say


def test_writing_the_quality_defaults_keeps_what_the_attack_eval_chose(tmp_path):
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps({"m": {"framing": "spotlight", "quarantine": True, "injection_probe": False,
                                      "readout": "letters", "accuracy": 0.81},
                                "other": {"readout": "letters"}}))
    key = "likelihood/canonical+reversal/prior"
    dev_by_type = {"choice": {"temperature": 1.5}, "noul": {"temperature": 2.0}}
    held = {"accuracy": 0.4, "nll_vs_uniform": -0.03, "brier_vs_uniform": -0.02}
    model = {"plan": {"dev": None}, "by_type": {"choice": key, "noul": key}, "flat": ["noul"],
             "results": {key: {"dev_by_type": dev_by_type}, "per-type": {"heldout": held}}}
    from evals.run import write_defaults

    write_defaults({"m": model}, path)
    written = json.loads(path.read_text())
    assert {k: written["m"][k] for k in ("framing", "quarantine", "injection_probe")} == {
        "framing": "spotlight", "quarantine": True, "injection_probe": False}
    assert written["m"]["readout"] == "likelihood" and "accuracy" not in written["m"]
    assert written["m"]["temperatures"] == {"likelihood": 1.5}
    assert written["m"]["by_type"]["noul"]["temperatures"]["likelihood"] == round(metrics.FLAT, 3)
    assert written["other"] == {"readout": "letters"}


def judged(cv_nll, real, t=1.5, vs_uniform=-0.1):
    return {"cv_nll": cv_nll, "real_gain": real, "temperature": t, "cv_nll_vs_uniform": vs_uniform}


def test_each_type_is_chosen_on_its_own_out_of_fold_loss_and_flat_where_its_gain_is_not_real():
    from evals.run import choose_per_type

    a, b = "likelihood/canonical+reversal/prior", "letters/canonical+reversal/raw"
    results = {a: {"dev_by_type": {"choice": judged(1.0, True, 1.2), "score": judged(1.5, False)},
                   "dev_pooled": judged(1.2, True)},
               b: {"dev_by_type": {"choice": judged(1.1, True), "score": judged(1.4, False)},
                   "dev_pooled": judged(1.3, True)}}
    by_type, flat, pooled, temperatures = choose_per_type(results, Counter(choice=100, score=100), [a, b],
                                                          {a: 240.0, b: 400.0})
    # score is flat, so it pays for the cheapest configuration, not its best one (b)
    assert by_type == {"choice": a, "score": a} and flat == ["score"] and pooled == []
    assert temperatures == {"choice": 1.2, "score": metrics.FLAT}


def test_a_type_with_few_dev_items_takes_the_pooled_choice_and_its_temperature():
    from evals.run import MIN_TYPE_TO_CHOOSE, choose_per_type

    a, b = "likelihood/canonical+reversal/raw", "likelihood/canonical+reversal/prior"
    results = {a: {"dev_by_type": {"noul": judged(0.6, False), "choice": judged(1.0, True)},
                   "dev_pooled": judged(0.9, True, 1.32)},
               b: {"dev_by_type": {"noul": judged(0.5, False), "choice": judged(1.2, True)},
                   "dev_pooled": judged(1.0, True)}}
    counts = Counter(noul=MIN_TYPE_TO_CHOOSE - 1, choice=MIN_TYPE_TO_CHOOSE)
    by_type, flat, pooled, temperatures = choose_per_type(results, counts, [a, b], {a: 1.0, b: 2.0})
    assert pooled == ["noul"] and flat == []
    assert by_type == {"noul": a, "choice": a} and temperatures["noul"] == 1.32
    # a pooled gain that comes from the other types alone does not carry a type: flat
    results[a]["dev_by_type"]["noul"]["cv_nll_vs_uniform"] = 0.01
    assert choose_per_type(results, counts, [a, b], {a: 1.0, b: 2.0})[1] == ["noul"]
    results[a]["dev_by_type"]["noul"]["cv_nll_vs_uniform"] = -0.01
    results[a]["dev_pooled"]["real_gain"] = False  # nor does the pooled set show a gain: flat
    assert choose_per_type(results, counts, [a, b], {a: 1.0, b: 2.0})[1] == ["noul"]


def test_a_pooled_type_is_written_with_the_pooled_temperature(tmp_path):
    from evals.run import write_defaults

    path = tmp_path / "defaults.json"
    key = "likelihood/canonical+reversal/raw"
    model = {"plan": {"dev": None}, "by_type": {"choice": key, "noul": key}, "flat": [], "pooled": ["noul"],
             "results": {key: {"dev_by_type": {"choice": {"temperature": 1.5}, "noul": {"temperature": 3.0}},
                               "dev_pooled": {"temperature": 1.32}},
                         "per-type": {"heldout": {"accuracy": 0.5, "nll_vs_uniform": -0.1, "brier_vs_uniform": -0.1}}}}
    write_defaults({"m": model}, path)
    written = json.loads(path.read_text())["m"]
    assert written["temperatures"] == {"likelihood": 1.5}
    assert written["by_type"]["noul"]["temperatures"] == {"likelihood": 1.32}


def test_the_held_out_interval_brackets_the_figure_and_narrows_with_more_items():
    rng = np.random.default_rng(3)
    golds = list(rng.integers(0, 4, 400))
    informed = [0.3 * np.eye(4)[g] + 0.7 * rng.dirichlet(np.ones(4) * 5) for g in golds]
    wide = metrics.report(informed[:40], golds[:40], ["choice"] * 40)
    narrow = metrics.report(informed, golds, ["choice"] * 400)
    for r in (wide, narrow):
        low, high = r["nll_vs_uniform_95"]
        assert low < r["nll_vs_uniform"] < high
    assert np.diff(narrow["nll_vs_uniform_95"])[0] < np.diff(wide["nll_vs_uniform_95"])[0]
