"""The decision gateway's Lambda functions (docs/architecture.md)."""
