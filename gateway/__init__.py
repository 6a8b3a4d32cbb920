"""The decision gateway's Lambda functions (docs/architecture.md)."""

import os

# The gateway uses no pydantic plugins. Looking for them reads the metadata of every
# installed distribution on the first model built (about 5 ms of a cold start); an operator
# who wants one (an observability plugin) sets PYDANTIC_DISABLE_PLUGINS to "" or a list.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
