import hashlib
import json
import tarfile

import pytest

from scorer_container.errors import ModelFileError
from scorer_container.model_files import ModelManifest, locate_model, pack_model, verify_model, write_manifest


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model" / "inner"
    folder.mkdir(parents=True)
    path = folder / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(100))
    manifest = ModelManifest(
        name="tiny", file="tiny.gguf", size=104, sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        source="test", revision="1", quantization="Q4_0", readout="likelihood",
    )
    write_manifest(path, manifest)
    return path


def test_verify_accepts_a_matching_file(model):
    assert verify_model(model).readout == "likelihood"


def test_the_manifest_carries_the_debiasing_defaults(model):
    # Older manifests without them keep both steps on; a manifest may switch either off.
    assert (verify_model(model).order_average, verify_model(model).prior) == (True, True)
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, "prior": False}))
    assert verify_model(model).prior is False


def test_a_debiasing_default_that_is_not_a_boolean_is_refused(model):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, "prior": "no"}))
    with pytest.raises(ModelFileError, match="true or false"):
        verify_model(model)


def test_a_changed_byte_is_refused(model):
    data = bytearray(model.read_bytes())
    data[-1] = 1
    model.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="sha256"):
        verify_model(model)


def test_a_changed_size_is_refused(model):
    model.write_bytes(model.read_bytes() + b"x")
    with pytest.raises(ModelFileError, match="size"):
        verify_model(model)


def test_a_missing_manifest_is_refused(model):
    (model.parent / "model-manifest.json").unlink()
    with pytest.raises(ModelFileError, match="missing"):
        verify_model(model)


def test_a_manifest_for_another_file_is_refused(model):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    manifest["file"] = "other.gguf"
    (model.parent / "model-manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFileError, match=r"other\.gguf"):
        verify_model(model)


def test_an_incomplete_manifest_is_refused(model):
    (model.parent / "model-manifest.json").write_text(json.dumps({"name": "tiny"}))
    with pytest.raises(ModelFileError, match="lacks"):
        verify_model(model)


def test_locate_prefers_the_explicit_model(model, tmp_path):
    assert locate_model(str(model), None) == model
    assert locate_model("inner/tiny.gguf", str(tmp_path / "model")) == model


def test_locate_searches_two_levels_deep(model, tmp_path):
    assert locate_model(None, str(tmp_path / "model")) == model
    deeper = tmp_path / "a" / "b" / "c" / "d"
    deeper.mkdir(parents=True)
    (deeper / "x.gguf").write_bytes(b"x")
    with pytest.raises(ModelFileError, match="two levels"):
        locate_model(None, str(tmp_path / "a"))


def test_locate_reports_missing_things(tmp_path):
    with pytest.raises(ModelFileError):
        locate_model(str(tmp_path / "nope.gguf"), None)
    with pytest.raises(ModelFileError):
        locate_model(None, str(tmp_path / "nowhere"))


def test_pack_writes_the_model_and_manifest_at_the_root(model, tmp_path):
    out = pack_model(model, tmp_path / "build" / "model.tar.gz")
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["model-manifest.json", "tiny.gguf"]


def test_pack_refuses_a_mismatched_model(model, tmp_path):
    model.write_bytes(b"tampered")
    with pytest.raises(ModelFileError):
        pack_model(model, tmp_path / "model.tar.gz")
    assert not (tmp_path / "model.tar.gz").exists()


def test_a_rewritten_artifact_with_a_matching_manifest_is_refused_by_the_pinned_sha(model):
    # Whoever rewrites the model file in S3 can write a manifest to match; the deployment's
    # pinned sha256 (a stack parameter) they cannot.
    pinned = hashlib.sha256(model.read_bytes()).hexdigest()
    model.write_bytes(b"GGUF" + bytes([1]) * 100)
    write_manifest(model, ModelManifest(name="tiny", file="tiny.gguf", size=104,
                                        sha256=hashlib.sha256(model.read_bytes()).hexdigest(), source="test", revision="1",
                                        quantization="Q4_0", readout="likelihood"))
    assert verify_model(model).name == "tiny"  # it matches its (rewritten) manifest
    with pytest.raises(ModelFileError, match="pinned"):
        verify_model(model, pinned)
    assert verify_model(model, hashlib.sha256(model.read_bytes()).hexdigest().upper()).name == "tiny"


def test_the_pinned_sha_setting_is_64_hex_digits():
    from scorer_container.settings import ScorerSettings

    assert ScorerSettings.from_env({"SCORER_MODEL_SHA256": "AB" * 32}).expected_sha256 == "ab" * 32
    with pytest.raises(ValueError, match="64 hex"):
        ScorerSettings.from_env({"SCORER_MODEL_SHA256": "abc"})


def test_the_manifest_carries_ordering_averaging_and_fitted_temperatures(model):
    # Older manifests get the canonical ordering, the reversal and no temperature.
    loaded = verify_model(model)
    assert (loaded.ordering, loaded.averaging, loaded.temperatures) == ("canonical", "reversal", {})
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps(
        {**manifest, "averaging": "rotations", "temperatures": {"likelihood": 0.7, "letters": 2}}))
    loaded = verify_model(model)
    assert loaded.averaging == "rotations" and loaded.temperatures == {"likelihood": 0.7, "letters": 2}


@pytest.mark.parametrize("change", [
    {"ordering": "alphabetical"}, {"averaging": "all"}, {"temperatures": {"likelihood": 0}},
    {"temperatures": {"likelihood": True}}, {"temperatures": {"words": 1.0}}, {"temperatures": [1.0]},
    {"temperatures": {"letters": float("inf")}}, {"temperatures": {"letters": "1"}},
])
def test_an_unknown_ordering_averaging_or_temperature_is_refused(model, change):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ModelFileError):
        verify_model(model)


def test_a_question_type_can_have_its_own_readout_debiasing_and_temperatures(model):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    by_type = {"noul": {"readout": "letters", "prior": False, "temperatures": {"letters": 1.3}}}
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, "by_type": by_type}))
    assert verify_model(model).by_type == by_type


@pytest.mark.parametrize("by_type", [
    {"yesno": {}}, {"noul": {"ordering": "declared"}}, {"noul": {"readout": "words"}},
    {"choice": {"prior": "off"}}, {"score": {"averaging": "all"}}, {"noul": {"temperatures": {"letters": 0}}},
    {"noul": ["letters"]}, [],
])
def test_a_bad_per_type_setting_is_refused(model, by_type):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, "by_type": by_type}))
    with pytest.raises(ModelFileError, match=r"by_type|temperatures"):
        verify_model(model)



@pytest.mark.parametrize("change", [{"framing": "base64"}, {"quarantine": "yes"}, {"injection_probe": 1}])
def test_a_manifest_with_an_unknown_framing_or_a_non_boolean_defense_is_refused(model, change):
    manifest = json.loads((model.parent / "model-manifest.json").read_text())
    (model.parent / "model-manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ModelFileError, match="framing"):
        verify_model(model)


def test_an_older_manifest_shows_the_state_as_before(model):
    loaded = verify_model(model)
    assert (loaded.framing, loaded.quarantine, loaded.injection_probe) == ("plain", False, False)


def test_the_manifest_knows_every_framing_the_contract_has():
    from typing import get_args

    from scorer_container.model_files import MANIFEST_FRAMINGS
    from scorer_container.prompts import FRAMINGS, PROMPT_VERSIONS
    from systemone.models import Framing

    assert MANIFEST_FRAMINGS == FRAMINGS == get_args(Framing) == tuple(PROMPT_VERSIONS)
