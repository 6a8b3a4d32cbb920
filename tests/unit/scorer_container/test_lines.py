"""An invocation's body of lines, read as it arrives: bounded lines, blank ones skipped, each refused for its own reason."""

import asyncio
import json

from scorer_container.lines import MAX_LINES, is_lines, read_lines


def lines_of(pieces: list[bytes], max_line_bytes: int = 1000) -> list:
    async def stream():
        for piece in pieces:
            yield piece

    async def collect():
        return [line async for line in read_lines(stream(), max_line_bytes)]

    return asyncio.run(collect())


def line(number: int, **extra) -> bytes:
    return json.dumps({"id": f"l{number}", "route": "systemone", "body": {"n": number}, **extra}).encode()


def test_lines_split_across_pieces_come_whole_in_order_and_blank_ones_are_skipped():
    body = line(1) + b"\n\n" + line(2) + b"\r\n" + line(3)  # the last without its newline
    read = lines_of([body[i:i + 7] for i in range(0, len(body), 7)])
    assert [(r.number, r.id, r.body, r.refused) for r in read] == [(1, "l1", {"n": 1}, None), (2, "l2", {"n": 2}, None),
                                                                  (3, "l3", {"n": 3}, None)]


def test_a_line_too_long_is_refused_alone_and_the_next_is_read():
    read = lines_of([line(1, pad="x" * 5000) + b"\n", line(2) + b"\n"], max_line_bytes=1000)
    assert [r.refused[0] if r.refused else 200 for r in read] == [413, 200] and read[1].id == "l2"


def test_each_unreadable_line_says_why_and_keeps_its_number():
    bad = [b"{not json", b"[1]", json.dumps({"route": "systemone", "body": {}}).encode(),
           json.dumps({"id": "x", "route": "elsewhere", "body": {}}).encode(), json.dumps({"id": "y"}).encode()]
    read = lines_of([b"\n".join(bad) + b"\n"])
    assert [(r.number, r.refused[0]) for r in read] == [(n, 400) for n in range(1, 6)]
    assert read[3].id == "x" and "route" in read[3].refused[1] and "body" in read[4].refused[1]


def test_lines_past_the_most_an_invocation_holds_are_refused(monkeypatch):
    from scorer_container import lines

    monkeypatch.setattr(lines, "MAX_LINES", 2)
    read = lines_of([line(1) + b"\n" + line(2) + b"\n" + line(3) + b"\n"])
    assert [r.refused[0] if r.refused else 200 for r in read] == [200, 200, 413] and MAX_LINES == 50_000


def test_the_content_types_of_lines():
    assert is_lines("application/jsonlines") and is_lines("application/x-ndjson; charset=utf-8")
    assert not is_lines("application/json") and not is_lines("")
