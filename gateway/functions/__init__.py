"""The Lambda functions and the one place they are built from.

`composition` builds every adapter and service from settings; `handler` is the gateway
function (buffered and streaming), `authorizer` the REQUEST authorizer, `refits` the
scheduled refit, `rotation` the signing keys' rotation; `runtime_loop` is the streaming
function's Lambda Runtime API client, in front of `handler` (template.yaml names each).
"""
