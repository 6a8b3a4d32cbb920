"""Batches from the command line, with the OpenAI SDK: `python -m devkit.batch`.

    submit FILE --endpoint /v1/systemone [--watch] [--out DIR]
                        upload FILE (in parts through the Uploads API when it is larger than one
                        request carries), create the batch; with --watch, show its progress until
                        it ends and write its output and error files to DIR
    status BATCH_ID     the batch as the API shows it
    watch BATCH_ID      its progress until it ends, then its files (--out DIR)
    cancel BATCH_ID     cancel it (what finished is kept)

Reads DG_URL and DG_API_KEY (or --url, --api-key) as the README's examples do; the key is never
printed. The exit status is 0 when the batch completed (or the command did its part), 1 when it
failed, expired or was cancelled, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gateway.batches.model import ENDPOINTS, FINAL, MAX_PART_BYTES

BAR = 30


def client(url: str, api_key: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=url.rstrip("/").removesuffix("/v1") + "/v1", api_key=api_key, max_retries=2, timeout=120)


def upload(openai: Any, path: Path) -> str:
    """The id of FILE uploaded with purpose batch: whole, or in parts when it is larger than MAX_PART_BYTES."""
    size = path.stat().st_size
    if size <= MAX_PART_BYTES:  # what one request carries; a larger file goes up in parts of that size
        with path.open("rb") as data:
            return openai.files.create(file=(path.name, data), purpose="batch").id
    done = openai.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="batch",
                                              part_size=MAX_PART_BYTES)
    return done.file.id


def watch(openai: Any, batch_id: str, out: TextIO, poll_s: float = 1.0) -> Any:
    """Show the batch's progress on one line until it ends; the batch as it ended."""
    started = time.monotonic()
    while True:
        batch = openai.batches.retrieve(batch_id)
        counts = batch.request_counts
        total = counts.total if counts else 0
        finished = (counts.completed + counts.failed) if counts else 0
        filled = BAR * finished // total if total else 0
        elapsed = time.monotonic() - started
        rate = finished / elapsed if elapsed > 0 else 0.0
        eta = f", about {(total - finished) / rate:.0f} s left" if rate > 0 and total > finished else ""
        out.write(f"\r{batch.status:<11} [{'#' * filled}{'.' * (BAR - filled)}] {finished}/{total}"
                  f" ({counts.failed if counts else 0} failed){eta}   ")
        out.flush()
        if batch.status in FINAL:
            out.write("\n")
            return batch
        time.sleep(poll_s)


def save_files(openai: Any, batch: Any, folder: Path, out: TextIO) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for kind, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id:
            safe = "".join(c for c in batch.id if c.isascii() and (c.isalnum() or c in "_-"))  # a name, never a path
            target = folder / f"{safe}_{kind}.jsonl"
            openai.files.content(file_id).write_to_file(target)
            out.write(f"{kind}: {target}\n")
    if batch.errors and batch.errors.data:
        for error in batch.errors.data[:10]:
            out.write(f"error: line {error.line}: {error.code}: {error.message}\n")


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None, out: TextIO = sys.stdout) -> int:
    environ = dict(os.environ) if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m devkit.batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=environ.get("DG_URL", "http://127.0.0.1:3000"), help="the gateway (DG_URL)")
    parser.add_argument("--api-key", default=None, help="else DG_API_KEY")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="upload a JSONL file and create its batch")
    submit.add_argument("file", type=Path)
    submit.add_argument("--endpoint", required=True, choices=list(ENDPOINTS))
    submit.add_argument("--watch", action="store_true", help="show progress until it ends, then save its files")
    submit.add_argument("--out", type=Path, default=Path("."), help="where --watch writes the output files")
    for name in ("status", "watch", "cancel"):
        command = commands.add_parser(name)
        command.add_argument("batch_id")
        command.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    api_key = args.api_key or environ.get("DG_API_KEY")
    if not api_key:
        print("batch: set DG_API_KEY (or pass --api-key)", file=sys.stderr)
        return 2
    openai = client(args.url, api_key)
    if args.command == "submit":
        if not args.file.is_file():
            print(f"batch: {args.file} is not a file", file=sys.stderr)
            return 2
        batch = openai.batches.create(input_file_id=upload(openai, args.file), endpoint=args.endpoint,
                                      completion_window="24h")
        out.write(f"batch {batch.id} created ({batch.status})\n")
        if not args.watch:
            return 0
        args.batch_id = batch.id
    elif args.command == "status":
        out.write(openai.batches.retrieve(args.batch_id).model_dump_json(indent=2) + "\n")
        return 0
    elif args.command == "cancel":
        out.write(f"batch {args.batch_id}: {openai.batches.cancel(args.batch_id).status}\n")
        return 0
    batch = watch(openai, args.batch_id, out)
    save_files(openai, batch, args.out, out)
    return 0 if batch.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
