"""Finding the GGUF file, checking it against its manifest, and packing it for SageMaker.

The manifest (`model-manifest.json`, next to the model) pins what runs: a model whose
size or sha256 differs from its manifest is refused, so a container never serves a
file nobody reviewed. Lookup follows the AWS llama.cpp container's conventions:
`SM_LLAMA_CPP_MODEL`, else the first `*.gguf` at most two levels under
`SM_LLAMA_CPP_MODEL_DIR` (default `/opt/ml/model`).
"""

from __future__ import annotations

import hashlib
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
    # How a choice question's options are listed and averaged (engine.ORDERINGS, AVERAGINGS).
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


def load_manifest(model_path: Path) -> ModelManifest:
    where = model_path.parent / MANIFEST_NAME
    if not where.is_file():
        raise ModelFileError(f"{where} is missing: every model must ship its manifest")
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{where} is not readable JSON") from exc
    if not isinstance(data, dict):
        raise ModelFileError(f"{where} must hold a JSON object")
    return ModelManifest.from_json(data, where)


def verify_model(model_path: Path, expected_sha256: str | None = None) -> ModelManifest:
    """Check the file against its manifest, and against `expected_sha256` when the
    deployment pins one (a stack parameter: whoever can rewrite the artifact can rewrite
    its manifest too, but not the stack); raise ModelFileError naming the mismatch."""
    manifest = load_manifest(model_path)
    if expected_sha256 and manifest.sha256 != expected_sha256.strip().lower():
        raise ModelFileError(f"the manifest's sha256 {manifest.sha256} is not the deployment's pinned {expected_sha256}")
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

    The model is verified first, so a tarball can only carry a file that matches its manifest.
    """
    manifest = verify_model(model_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".partial")
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        tar.add(model_path, arcname=manifest.file)
        tar.add(model_path.parent / MANIFEST_NAME, arcname=MANIFEST_NAME)
    tmp.replace(output)
    return output
