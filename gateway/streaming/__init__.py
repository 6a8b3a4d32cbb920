"""A response that streams, from the scorer to the caller, in one place.

A streamed chat (`stream: true` on the streaming integration) walks through it in order:
the route returns an `EventStream` (`response.py`), whose events are a `ChatRelay`
(`relay.py`) over the backend's streamed answer put back together as whole server-sent
events (`events.py`); the handler sends the response's status and headers as the HTTP
integration stream's prelude, then the events as they come (`integration.py`), and the
streaming function's runtime loop (`gateway.functions.runtime_loop`) posts those bytes to Lambda.
"""
