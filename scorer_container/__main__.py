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
    verify = commands.add_parser("verify", help="check a GGUF against its model-manifest.json")
    verify.add_argument("model", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SCORER_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from scorer_container.errors import ScorerError

    try:
        if args.command == "serve":
            return _serve(args)
        from scorer_container.model_files import pack_model, verify_model

        if args.command == "pack":
            print(pack_model(args.model, args.output))
        else:
            manifest = verify_model(args.model)
            print(f"{args.model}: {manifest.size} bytes, sha256 {manifest.sha256}: matches its manifest")
    except (ScorerError, ValueError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    return 0


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
