"""Reading a batch's input: its lines, or why the file is refused, as OpenAI lists errors."""

import json

from gateway.batches import jsonl
from gateway.batches.jsonl import MAX_ERRORS, first_model, read_input, split_lines


def line(custom_id: str, **body) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/systemone",
                       "body": {"model": "m", "state": "s", **body}}).encode()


def test_lines_split_on_any_chunk_boundary_and_crlf():
    data = b"a\r\nbb\n\nccc"
    for size in (1, 2, 3, 100):
        assert list(split_lines(data[i:i + size] for i in range(0, len(data), size))) == [b"a", b"bb", b"", b"ccc"]


def test_a_good_file_gives_its_lines_in_order_and_its_model():
    lines, model, errors = read_input([line("a") + b"\n\n" + line("b") + b"\n"], "/v1/systemone")
    assert [c for c, _ in lines] == ["a", "b"] and model == "m" and errors.count == 0
    assert json.loads(lines[0][1]) == {"model": "m", "state": "s"}


def test_a_line_whose_body_is_not_a_valid_request_is_not_the_files_fault():
    lines, _, errors = read_input([line("a", state=3, questions="nonsense")], "/v1/systemone")
    assert len(lines) == 1 and errors.count == 0  # its route refuses it, in the error file


def test_errors_name_their_line_counting_from_one_and_stop_at_their_cap():
    bad = b"\n".join([line("a")] + [b"{"] * (MAX_ERRORS + 5))
    _, _, errors = read_input([bad], "/v1/systemone")
    assert errors.count == MAX_ERRORS + 5 and len(errors.items) == MAX_ERRORS
    assert errors.items[0] == {"code": "invalid_json_line", "message": errors.items[0]["message"], "param": None, "line": 2}


def test_more_lines_than_a_batch_holds_are_refused(monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINES", 2)
    _, _, errors = read_input([b"\n".join(line(str(i)) for i in range(3))], "/v1/systemone")
    assert [(e["code"], e["line"]) for e in errors.items] == [("too_many_requests", 3)]


def test_custom_ids_are_strings_of_bounded_length():
    for custom_id in ("", "x" * 513, 7):
        raw = json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/systemone", "body": {}}).encode()
        assert read_input([raw], "/v1/systemone")[2].items[0]["code"] == "invalid_custom_id"


def test_the_first_model_is_read_from_the_first_request_only():
    assert first_model(iter([b"\n" + line("a") + b"\n{broken"])) == "m"
    assert first_model(iter([b"not json\n"])) is None
    assert first_model(iter([])) is None


def test_a_line_nested_past_the_parsers_depth_or_holding_what_utf8_cannot_is_not_json():
    deep = b'{"custom_id": "a", "method": "POST", "url": "/v1/systemone", "body": {"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}"
    surrogate = b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/systemone", "body": {}}'
    lone_in_body = b'{"custom_id": "b", "method": "POST", "url": "/v1/systemone", "body": {"state": "\\udfff"}}'
    _, _, errors = read_input([b"\n".join([deep, surrogate, lone_in_body])], "/v1/systemone")
    assert [(e["code"], e["line"]) for e in errors.items] == [("invalid_json_line", n) for n in (1, 2, 3)]
    assert first_model(iter([deep])) is None
