"""Finding the GGUF file, checking it against its manifest, and packing it for SageMaker.

The manifest (`model-manifest.json`, next to the model) pins what runs: a model whose
size or sha256 differs from its manifest is refused, so a container never serves a
file nobody reviewed. The manifest also carries the model's defenses and calibration
(quarantine, framing, injection probe, readout, temperatures...), so the deployment
pins the manifest itself too: `manifest_sha256` (defined there, once) is what the pack
command prints and what a stack passes as the expected manifest hash. Whoever can
rewrite the artifact in S3 can rewrite both files, never the stack's pins.

Lookup follows the AWS llama.cpp container's conventions: `SM_LLAMA_CPP_MODEL`, else
the first `*.gguf` at most two levels under `SM_LLAMA_CPP_MODEL_DIR` (default
`/opt/ml/model`).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from scorer_container.errors import ModelFileError

MANIFEST_NAME = "model-manifest.json"
DEFAULT_MODEL_DIR = "/opt/ml/model"
_HASH_BLOCK = 4 * 1024 * 1024

Readout = Literal["letters", "likelihood"]


@dataclass(frozen=True)
class ModelManifest:
    name: str
    file: str
    size: int
    sha256: str
    source: str
    revision: str
    quantization: str
    # The readout this model answers best with (measured by `make eval`); a request may override it.
    readout: Readout = "letters"
    # The debiasing this model answers best with (also measured by `make eval`).
    order_average: bool = True
    prior: bool = True
    # How a choice question's options are listed and averaged (decision_settings.ORDERINGS, AVERAGINGS).
    ordering: str = "canonical"
    averaging: str = "reversal"
    # Per readout, the temperature `make eval` fitted on its dev split (1.0: none fitted).
    temperatures: dict[str, float] = field(default_factory=dict)
    # What differs for a question type ("noul", "choice", "score"): readout, order_average,
    # prior, averaging, temperatures; chosen per type by `make eval`.
    by_type: dict[str, dict] = field(default_factory=dict)
    # How the state is shown to the model (prompts.FRAMINGS) and whether the injection
    # probe's P(yes) counts in the answer's suspicion: chosen by `make eval` on its attack set.
    framing: str = "plain"
    quarantine: bool = False  # passages the pattern checks flag are kept from the model
    injection_probe: bool = False
    description: str = ""
    release_date: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: Path) -> ModelManifest:
        required = ("name", "file", "size", "sha256", "source", "revision", "quantization")
        missing = [key for key in required if key not in data]
        if missing:
            raise ModelFileError(f"{where}: manifest lacks {', '.join(missing)}")
        known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        manifest = cls(**known)  # type: ignore[arg-type]
        if manifest.readout not in ("letters", "likelihood"):
            raise ModelFileError(f"{where}: readout must be 'letters' or 'likelihood'")
        if not isinstance(manifest.order_average, bool) or not isinstance(manifest.prior, bool):
            raise ModelFileError(f"{where}: order_average and prior must be true or false")
        if manifest.ordering not in ("declared", "canonical") or manifest.averaging not in ("reversal", "rotations"):
            raise ModelFileError(f"{where}: ordering must be 'declared' or 'canonical', averaging 'reversal' or"
                                 " 'rotations'")
        _check_temperatures(manifest.temperatures, where)
        if manifest.framing not in MANIFEST_FRAMINGS or not all(
                isinstance(flag, bool) for flag in (manifest.injection_probe, manifest.quarantine)):
            raise ModelFileError(f"{where}: framing must be 'plain', 'spotlight' or 'datamark', injection_probe and"
                                 " quarantine true or false")
        if not isinstance(manifest.by_type, dict) or not set(manifest.by_type) <= {"noul", "choice", "score"}:
            raise ModelFileError(f"{where}: by_type maps 'noul', 'choice' or 'score' to settings")
        for kind, over in manifest.by_type.items():
            if not isinstance(over, dict) or not set(over) <= _TYPE_SETTINGS:
                raise ModelFileError(f"{where}: by_type.{kind} may set only {', '.join(sorted(_TYPE_SETTINGS))}")
            merged = {"readout": manifest.readout, "order_average": manifest.order_average, "prior": manifest.prior,
                      "averaging": manifest.averaging, **over}
            if merged["readout"] not in ("letters", "likelihood") or merged["averaging"] not in ("reversal",
                                                                                               "rotations"):
                raise ModelFileError(f"{where}: by_type.{kind}: unknown readout or averaging")
            if not isinstance(merged["order_average"], bool) or not isinstance(merged["prior"], bool):
                raise ModelFileError(f"{where}: by_type.{kind}: order_average and prior must be true or false")
            _check_temperatures(over.get("temperatures", {}), where)
        if not isinstance(manifest.size, int) or manifest.size <= 0:
            raise ModelFileError(f"{where}: size must be a positive integer")
        return manifest

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def canonical_sha256(self) -> str:
        """The pin of the manifest file `write_manifest` writes for this manifest."""
        return manifest_sha256(json.loads(self.to_json()))


@dataclass(frozen=True)
class ModelPins:
    """What a deployment pins: the GGUF file's sha256 and its manifest's canonical hash."""

    sha256: str
    manifest_sha256: str

    def parameter_overrides(self) -> str:
        """The stack parameters that carry the pins (`sam deploy --parameter-overrides ...`)."""
        return f"ModelSha256={self.sha256} ModelManifestSha256={self.manifest_sha256}"


def manifest_sha256(document: Mapping[str, object]) -> str:
    """The manifest's pin: the sha256 of its canonical JSON, as 64 lowercase hex digits.

    The one definition of the canonical form (the pack command, the stack parameter
    `ModelManifestSha256` and the check at load all use this function): the manifest
    file parsed as JSON (a key given twice counts once, with its last value, as the
    loader reads it), written back with the keys of every object sorted by code point,
    no whitespace (`,` and `:` as separators), strings as UTF-8 with only the escapes
    JSON requires, integers as integers and other numbers in Python's shortest
    round-trip form; NaN and infinities are refused. Every key counts, including keys
    this version does not read, so the pin covers what a later version may read too.
    Reformatting or reordering the file keeps its pin; any change of a value does not
    (1.0 rewritten as 1 is a change too: the pin fails closed).
    """
    try:
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ModelFileError("the manifest is not plain JSON (NaN, infinity or a non-JSON value)") from exc
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# Where a model temperature may lie: the manifest's fitted ones, SCORER_TEMPERATURE and
# the grid `make eval` fits on all share it.
TEMPERATURE_RANGE = (0.05, 20.0)
# prompts.FRAMINGS, written out: this module is read by `make setup` before the
# dependencies exist (a test holds the two equal).
MANIFEST_FRAMINGS = ("plain", "spotlight", "datamark")
_TYPE_SETTINGS = {"readout", "order_average", "prior", "averaging", "temperatures"}


def _check_temperatures(temperatures: object, where: Path) -> None:
    if not isinstance(temperatures, dict) or any(
        k not in ("letters", "likelihood") or isinstance(v, bool) or not isinstance(v, int | float)
        or not TEMPERATURE_RANGE[0] <= v <= TEMPERATURE_RANGE[1] for k, v in temperatures.items()
    ):
        raise ModelFileError(f"{where}: temperatures maps 'letters'/'likelihood' to a number in"
                             f" {TEMPERATURE_RANGE[0]}..{TEMPERATURE_RANGE[1]:g}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def locate_model(model: str | None, model_dir: str | None) -> Path:
    """Return the GGUF file to load, following the AWS llama.cpp container's rules."""
    if model:
        path = Path(model)
        if not path.is_absolute() and model_dir:
            candidate = Path(model_dir) / path
            path = candidate if candidate.exists() else path
        if not path.is_file():
            raise ModelFileError(f"model file {path} does not exist")
        return path
    root = Path(model_dir or DEFAULT_MODEL_DIR)
    if not root.is_dir():
        raise ModelFileError(f"model directory {root} does not exist")
    # Sorted, so that the same directory always yields the same model.
    for pattern in ("*.gguf", "*/*.gguf", "*/*/*.gguf"):
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
    raise ModelFileError(f"no *.gguf file within two levels of {root}")


def _manifest_document(where: Path, raw: bytes | None = None) -> dict:
    """The manifest file as parsed JSON: what both the loader and the pin read."""
    if raw is None:
        if not where.is_file():
            raise ModelFileError(f"{where} is missing: every model must ship its manifest")
        try:
            raw = where.read_bytes()
        except OSError as exc:
            raise ModelFileError(f"{where} is not readable JSON") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ModelFileError(f"{where} is not readable JSON") from exc
    if not isinstance(data, dict):
        raise ModelFileError(f"{where} must hold a JSON object")
    return data


def verify_model(model_path: Path, expected_sha256: str | None = None,
                 expected_manifest_sha256: str | None = None) -> ModelManifest:
    """Check the file against its manifest, and both against the deployment's pins (stack
    parameters: whoever can rewrite the artifact can rewrite its manifest too, but not the
    stack); raise ModelFileError naming the mismatch.

    A pinned file with an unpinned manifest is refused: the manifest carries the model's
    defenses (quarantine, framing, probe) and calibration, and pinning only the file
    would leave those to whoever can write the artifact. The manifest's pin alone is
    enough (the manifest names the file's sha256, checked against the file)."""
    return _verified(model_path, expected_sha256, expected_manifest_sha256)[0]


def model_pins(model_path: Path, expected_sha256: str | None = None,
               expected_manifest_sha256: str | None = None) -> ModelPins:
    """What a deployment pins for this model, once it is verified as `verify_model` does."""
    return _verified(model_path, expected_sha256, expected_manifest_sha256)[1]


def _verified(model_path: Path, expected_sha256: str | None,
              expected_manifest_sha256: str | None) -> tuple[ModelManifest, ModelPins]:
    where = model_path.parent / MANIFEST_NAME
    document = _manifest_document(where)
    pin = manifest_sha256(document)
    if expected_manifest_sha256 and pin != expected_manifest_sha256.strip().lower():
        raise ModelFileError(f"{MANIFEST_NAME}: its canonical sha256 {pin} is not the deployment's pinned manifest"
                             f" hash {expected_manifest_sha256}")
    manifest = ModelManifest.from_json(document, where)
    if expected_sha256 and manifest.sha256 != expected_sha256.strip().lower():
        raise ModelFileError(f"the manifest's sha256 {manifest.sha256} is not the deployment's pinned {expected_sha256}")
    if expected_sha256 and not expected_manifest_sha256:
        raise ModelFileError("the deployment pinned the model file's sha256 but not its manifest's hash: pin both"
                             " (SCORER_MODEL_SHA256 and SCORER_MANIFEST_SHA256, as the pack command prints them)")
    return _verify_file(model_path, manifest), ModelPins(manifest.sha256, pin)


def _verify_file(model_path: Path, manifest: ModelManifest) -> ModelManifest:
    if manifest.file != model_path.name:
        raise ModelFileError(f"manifest names {manifest.file!r} but the model file is {model_path.name!r}")
    size = model_path.stat().st_size
    if size != manifest.size:
        raise ModelFileError(f"{model_path.name}: size {size} differs from the manifest's {manifest.size}")
    digest = sha256_of(model_path)
    if digest != manifest.sha256:
        raise ModelFileError(f"{model_path.name}: sha256 {digest} differs from the manifest's {manifest.sha256}")
    return manifest


def write_manifest(model_path: Path, manifest: ModelManifest) -> Path:
    target = model_path.parent / MANIFEST_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(manifest.to_json(), encoding="utf-8")
    tmp.replace(target)
    return target


def pack_model(model_path: Path, output: Path) -> Path:
    """Write `model.tar.gz` for SageMaker's ModelDataUrl: the GGUF and its manifest at the root.

    The model is verified first, so a tarball can only carry a file that matches its
    manifest; the manifest goes in as the bytes that were verified, and first, so that
    `artifact_pins` reads it without decompressing the model.
    """
    where = model_path.parent / MANIFEST_NAME
    try:
        raw = where.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"{where} is missing: every model must ship its manifest") from exc
    manifest = _verify_file(model_path, ModelManifest.from_json(_manifest_document(where, raw), where))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".partial")
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        info = tar.gettarinfo(where, arcname=MANIFEST_NAME)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        tar.add(model_path, arcname=manifest.file)
    tmp.replace(output)
    return output


def artifact_pins(artifact: Path) -> ModelPins:
    """The pins of a packed `model.tar.gz`, read from the manifest inside it: what the
    container will find, so what the stack must pin."""
    try:
        with tarfile.open(artifact, "r:gz") as tar:
            for member in tar:
                if member.name == MANIFEST_NAME and member.isfile():
                    handle = tar.extractfile(member)
                    raw = handle.read() if handle else b""
                    break
            else:
                raise ModelFileError(f"{artifact} holds no {MANIFEST_NAME}")
    except (OSError, tarfile.TarError) as exc:
        raise ModelFileError(f"{artifact} is not a readable model.tar.gz") from exc
    document = _manifest_document(artifact / MANIFEST_NAME, raw)
    manifest = ModelManifest.from_json(document, artifact / MANIFEST_NAME)
    return ModelPins(manifest.sha256, manifest_sha256(document))
