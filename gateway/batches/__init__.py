"""Bulk work through OpenAI's Batch API: files, uploads, batches and the worker that runs them.

A batch is a JSONL file of ordinary requests (`{custom_id, method, url, body}`) for one
endpoint (`/v1/decisions`, `/v1/systemone`, `/v1/chat/completions`) and one model. Each line
runs through the same route and services as its synchronous twin, as the batch's creator,
at the scorer's bulk priority; the answers come back as an output file and an error file.

    model.py    the objects (files, uploads, batches, the per-line ledger) and the store interface
    jsonl.py    reading an input file: its lines, or OpenAI's `errors` list when it is refused
    worker.py   running a batch's lines, exactly once each, resumable, and writing its output
"""
