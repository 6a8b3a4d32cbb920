import hashlib
import json
import tarfile

import pytest

from scorer_container.errors import ModelFileError
from scorer_container.model_files import (
    MANIFEST_NAME,
    ModelManifest,
    artifact_pins,
    locate_model,
    manifest_sha256,
    model_pins,
    pack_model,
    verify_model,
    write_manifest,
)


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
    manifest_pin = manifest_sha256(json.loads((model.parent / MANIFEST_NAME).read_text()))
    with pytest.raises(ModelFileError, match="pinned"):
        verify_model(model, pinned, manifest_pin)
    assert verify_model(model, hashlib.sha256(model.read_bytes()).hexdigest().upper(), manifest_pin.upper()).name == "tiny"


def test_the_pinned_sha_settings_are_64_hex_digits():
    from scorer_container.settings import ScorerSettings

    settings = ScorerSettings.from_env({"SCORER_MODEL_SHA256": "AB" * 32, "SCORER_MANIFEST_SHA256": "CD" * 32})
    assert (settings.expected_sha256, settings.expected_manifest_sha256) == ("ab" * 32, "cd" * 32)
    assert ScorerSettings.from_env({}).expected_manifest_sha256 is None
    for name in ("SCORER_MODEL_SHA256", "SCORER_MANIFEST_SHA256"):
        with pytest.raises(ValueError, match=f"{name} must be 64 hex"):
            ScorerSettings.from_env({name: "abc"})


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


# -- the manifest's pin -------------------------------------------------------------------

def _manifest(model) -> dict:
    return json.loads((model.parent / MANIFEST_NAME).read_text())


def _pins(model) -> tuple[str, str]:
    return hashlib.sha256(model.read_bytes()).hexdigest(), manifest_sha256(_manifest(model))


def test_the_manifest_pin_is_the_sha256_of_its_canonical_json(model):
    # Given the manifest as written
    document = _manifest(model)
    # When it is pinned
    pin = manifest_sha256(document)
    # Then the pin is the sha256 of the document with sorted keys and no whitespace, as UTF-8
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert pin == hashlib.sha256(canonical.encode()).hexdigest()
    assert ModelManifest.from_json(document, model).canonical_sha256() == pin


def test_the_manifest_pin_is_stable_across_key_order_and_layout(model):
    # Given the same manifest written in reverse key order, indented otherwise, with escapes
    document = _manifest(model)
    document["description"] = "modèle \u2014 tiny"
    pin = manifest_sha256(document)
    reordered = dict(reversed(list(document.items())))
    (model.parent / MANIFEST_NAME).write_text(json.dumps(reordered, indent=7, ensure_ascii=True))
    # When it is read back and pinned
    # Then the pin is the same, and the pinned model still verifies
    assert manifest_sha256(_manifest(model)) == pin
    assert verify_model(model, hashlib.sha256(model.read_bytes()).hexdigest(), pin).name == "tiny"


def test_any_changed_value_changes_the_manifest_pin(model):
    document = _manifest(model)
    pin = manifest_sha256(document)
    for change in ({"quarantine": True}, {"temperatures": {"letters": 1.5}}, {"by_type": {"noul": {"prior": False}}},
                   {"an_unknown_key": 1}):
        assert manifest_sha256({**document, **change}) != pin, change
    assert manifest_sha256({**document, "size": 104.0}) != pin  # 104.0 is not 104: the pin fails closed


def test_a_tampered_manifest_with_the_pinned_hash_is_refused(model):
    # Given a deployment that pinned the model with quarantine on
    document = {**_manifest(model), "quarantine": True, "framing": "spotlight"}
    (model.parent / MANIFEST_NAME).write_text(json.dumps(document))
    sha, pin = _pins(model)
    assert verify_model(model, sha, pin).quarantine is True  # the untampered one loads
    # When whoever can write the artifact switches quarantine off (the file is untouched)
    (model.parent / MANIFEST_NAME).write_text(json.dumps({**document, "quarantine": False}))
    # Then the model is refused, and the reason names the manifest's pin
    with pytest.raises(ModelFileError, match="pinned manifest hash"):
        verify_model(model, sha, pin)
    with pytest.raises(ModelFileError, match="pinned manifest hash"):
        verify_model(model, None, pin)  # the manifest's pin alone is enough


def test_the_manifest_pin_is_checked_before_the_manifest_is_read(model):
    # A manifest that is not even valid is refused for its pin, not interpreted.
    sha, pin = _pins(model)
    (model.parent / MANIFEST_NAME).write_text(json.dumps({"name": "tiny"}))
    with pytest.raises(ModelFileError, match="pinned manifest hash"):
        verify_model(model, sha, pin)


def test_a_pinned_model_file_with_an_unpinned_manifest_is_refused(model):
    # Pinning only the file would leave the defenses to whoever writes the artifact.
    sha, _ = _pins(model)
    with pytest.raises(ModelFileError, match="not its manifest"):
        verify_model(model, sha)


def test_the_manifest_pin_alone_also_pins_the_model_file(model):
    # The pinned manifest names the file's sha256: a rewritten file is refused.
    _, pin = _pins(model)
    model.write_bytes(b"GGUF" + bytes([7]) * 100)
    with pytest.raises(ModelFileError, match="differs from the manifest"):
        verify_model(model, None, pin)


def test_a_manifest_with_nan_cannot_be_pinned(model):
    with pytest.raises(ModelFileError, match="NaN"):
        manifest_sha256({**_manifest(model), "size": float("nan")})


def test_pack_puts_the_verified_manifest_first_and_its_pins_are_read_from_the_artifact(model, tmp_path):
    # Given a model packed for SageMaker
    out = pack_model(model, tmp_path / "model.tar.gz")
    # When its pins are read from the artifact
    pins = artifact_pins(out)
    # Then they are the model's own, and what the container will verify against
    assert (pins.sha256, pins.manifest_sha256) == _pins(model) == (model_pins(model).sha256, model_pins(model).manifest_sha256)
    assert pins.parameter_overrides() == f"ModelSha256={pins.sha256} ModelManifestSha256={pins.manifest_sha256}"
    with tarfile.open(out) as tar:
        assert tar.getnames() == [MANIFEST_NAME, "tiny.gguf"]
        unpacked = tmp_path / "unpacked"
        tar.extractall(unpacked, filter="data")
    assert verify_model(unpacked / "tiny.gguf", pins.sha256, pins.manifest_sha256).name == "tiny"


def test_artifact_pins_of_something_else_is_a_model_file_error(tmp_path):
    (tmp_path / "model.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(ModelFileError, match="readable"):
        artifact_pins(tmp_path / "model.tar.gz")
    with tarfile.open(tmp_path / "empty.tar.gz", "w:gz"):
        pass
    with pytest.raises(ModelFileError, match="holds no"):
        artifact_pins(tmp_path / "empty.tar.gz")


def test_the_command_line_prints_both_pins_and_checks_them(model, tmp_path, capsys):
    from scorer_container.__main__ import main

    sha, pin = _pins(model)
    assert main(["pack", str(model), "--output", str(tmp_path / "model.tar.gz")]) == 0
    printed = capsys.readouterr().out
    assert f"ModelSha256={sha} ModelManifestSha256={pin}" in printed
    assert main(["verify", str(model), "--sha256", sha, "--manifest-sha256", pin]) == 0
    assert pin in capsys.readouterr().out
    (model.parent / MANIFEST_NAME).write_text(json.dumps({**_manifest(model), "quarantine": True}))
    assert main(["verify", str(model), "--sha256", sha, "--manifest-sha256", pin]) == 2
    assert "pinned manifest hash" in capsys.readouterr().err
