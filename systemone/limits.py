"""The sizes the contract allows (the gateway's tenant limits may be lower, never higher)."""

MAX_QUESTIONS = 400
MAX_CHOICES = 255
MAX_LEVELS = 10
# A question's id (System One) or name (OpenAI Decisions): any non-empty text, returned
# unchanged, never shown to the model. Generous for any name a person writes, and bounded:
# it is kept in the decision's record for its retention, in its log line and in an
# idempotent reply, while the scorer is sent a position.
MAX_QUESTION_NAME_CHARS = 1024
MAX_JSON_DEPTH = 64  # arrays and objects: a structured state is a record, not a tree of a million levels
MAX_INT_DIGITS = 100
# An answer's x_features.state: this many numbers (a sketch of the answer position's logits
# row, scorer_container.prefix_tree.Sketch), sent as little-endian float16 in base64.
STATE_FEATURE_DIMS = 256

# What AWS carries in front of the gateway; the gateway's own body limit
# (gateway.settings.MAX_BODY_BYTES) must stay below the last figure, so that its clear 413
# is the answer a caller gets, not AWS's.
# - API Gateway (REST) takes a request payload of at most 10 MB (REST API quotas,
#   "Payload size", not adjustable).
# - Lambda takes a synchronous invocation of at most 6 MB: the whole proxy event as JSON,
#   headers, request context and authorizer context included ("Request must be smaller
#   than 6291456 bytes for the InvokeFunction operation", RequestEntityTooLargeException).
# - The event carries the body base64-encoded (binary media type */*): 4 bytes for every 3.
# So no body over 6,291,456 * 3 / 4 = 4,718,592 bytes can reach the function whatever its
# headers: the largest body API Gateway and Lambda can carry. (A real event's headers and
# context lower it further; the gateway's limit leaves 64 KiB of event for them.)
API_GATEWAY_MAX_REQUEST_BYTES = 10 * 1024 * 1024
# A buffered REST API integration's timeout (the default quota): no buffered request's deadline
# is longer, so the scorer reads a longer one as the gateway's long work (its streaming routes).
API_GATEWAY_TIMEOUT_S = 29.0
LAMBDA_INVOKE_PAYLOAD_BYTES = 6 * 1024 * 1024
MAX_CARRIED_BODY_BYTES = LAMBDA_INVOKE_PAYLOAD_BYTES * 3 // 4

# SageMaker Serverless Inference takes a request payload of at most 4 MB (read as 4,000,000
# bytes, the smaller reading).
SERVERLESS_MAX_PAYLOAD_BYTES = 4_000_000
