"""Command line: `python -m scorer_container serve | pack | verify`.

`serve` is also what SageMaker runs (`docker run IMAGE serve`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scorer_container.model_files import ModelPins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scorer_container", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server (SageMaker's container entrypoint)")
    serve.add_argument("--host", default=os.environ.get("SCORER_HOST", "0.0.0.0"))  # noqa: S104 - a container listens on all interfaces
    serve.add_argument("--port", type=int, default=int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080")))
    serve.add_argument("--model", help="GGUF file (default: SM_LLAMA_CPP_MODEL, else the first under the model dir)")
    serve.add_argument("--model-dir", help="directory searched for *.gguf (default: SM_LLAMA_CPP_MODEL_DIR or /opt/ml/model)")
    pack = commands.add_parser("pack", help="write model.tar.gz (GGUF + model-manifest.json) for ModelDataUrl")
    pack.add_argument("model", type=Path)
    pack.add_argument("--output", type=Path, default=Path("model.tar.gz"))
    verify = commands.add_parser("verify", help="check a GGUF against its model-manifest.json (and the pins, if given)")
    verify.add_argument("model", type=Path)
    verify.add_argument("--sha256", help="the model file's pinned sha256 (the stack's ModelSha256)")
    verify.add_argument("--manifest-sha256", help="the manifest's pinned hash (the stack's ModelManifestSha256)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SCORER_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from scorer_container.errors import ServiceError

    try:
        if args.command == "serve":
            return _serve(args)
        from scorer_container.model_files import artifact_pins, model_pins, pack_model

        if args.command == "pack":
            artifact = pack_model(args.model, args.output)
            _print_pins(str(artifact), artifact_pins(artifact))
        else:
            pins = model_pins(args.model, args.sha256, args.manifest_sha256)
            pinned = " and the given pins" if args.sha256 or args.manifest_sha256 else ""
            _print_pins(f"{args.model}: {args.model.stat().st_size} bytes, matches its manifest{pinned}", pins)
    except (ServiceError, ValueError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    return 0


def _print_pins(headline: str, pins: ModelPins) -> None:
    """What a deployment pins, printed for the stack's parameters."""
    print(headline)
    print(f"  model sha256     {pins.sha256}")
    print(f"  manifest sha256  {pins.manifest_sha256}")
    print(f"  stack parameters {pins.parameter_overrides()}")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from scorer_container.server import create_app
    from scorer_container.settings import ScorerSettings

    settings = ScorerSettings.from_env()
    overrides = {}
    if args.model:
        overrides["model"] = args.model
    if args.model_dir:
        overrides["model_dir"] = args.model_dir
    if overrides:
        settings = settings.__class__(**{**settings.__dict__, **overrides})
    app = create_app(settings)
    # SageMaker sends SIGTERM and kills 30 s later; uvicorn drains in-flight requests on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
