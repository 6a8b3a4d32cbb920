"""The System One contract, one copy for every side of it: the gateway (which speaks it to
callers and to the scorer), the scorer (which answers it) and the test fakes.

- `limits`: how many questions, options and levels; how deep and how large JSON may be;
- `json_text`: request bodies as JSON values (no NaN, no unpaired surrogates, bounded
  nesting and integers) and the canonical rendering of a JSON value;
- `body`: the bounded body reader (Content-Encoding gzip or zstd, inflated with a limit);
- `models`: the request (questions and their options) and the typed answers;
- `errors`: validation problems as 422 items, and the two error-body shapes, written and read;
- `answers`: the answer formulas (confidence, expected score);
- `sidechannel`: what travels beside the body (custom attributes, request ids, error hints);
- `chat`: the chat request as both sides validate it.

It depends on pydantic and the standard library only (zstandard when a body is zstd),
so both deployables carry it unchanged.
"""
