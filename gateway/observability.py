"""Logging and metrics, configured in one place.

Logs are JSON lines (Powertools' formatter) on the `gateway` logger tree, so domain
modules log with the standard library and keyword context. A filter scrubs anything
that looks like a credential from every record before it is written: an API key, a
bearer header or a signed token never reaches a log, whatever a caller put where.
Metrics are CloudWatch EMF lines (Powertools Metrics), flushed once per invocation.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Mapping
from functools import cache
from typing import Any

NAMESPACE = "DecisionGateway"
REDACTED = "[redacted]"
# API keys (dgk_...), minted tokens (dgt_...), bearer values, and JWT-like tokens.
_CREDENTIAL = re.compile(
    r"dg[kt]_[A-Za-z0-9_.-]+|(?i:bearer)\s+[A-Za-z0-9._~+/=-]+|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"
)


def redact(text: str) -> str:
    return _CREDENTIAL.sub(REDACTED, text)


class RedactCredentials(logging.Filter):
    """Rewrites the message, its arguments and every extra string on the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.msg = record.getMessage()
            record.args = None
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        for key, value in list(vars(record).items()):
            if isinstance(value, str) and key not in ("msg", "name", "levelname", "pathname", "filename", "module", "funcName"):
                setattr(record, key, redact(value))
        if record.exc_info:
            # Exception text may quote input: the trace is kept, redacted, as a plain field.
            record.exception_trace = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info, record.exc_text = None, None
        return True


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is now (Lambda's, or a test's capture), not the one at setup."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


@cache
def configure_logging(service: str = "decision-gateway") -> logging.Logger:
    """Idempotent: one JSON handler with the redaction filter on the `gateway` logger."""
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    logger = logging.getLogger("gateway")
    handler = _StdoutHandler()
    handler.setFormatter(LambdaPowertoolsFormatter(service=service))
    handler.addFilter(RedactCredentials())
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("POWERTOOLS_LOG_LEVEL", "INFO").upper())
    logger.propagate = False
    return logger


def metrics_enabled() -> bool:
    return os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() not in ("1", "true", "yes")


@cache
def metrics(service: str = "decision-gateway") -> Any:
    from aws_lambda_powertools import Metrics

    return Metrics(namespace=NAMESPACE, service=service)


class _MetricCounters:
    """The domain's metrics sink (`count(name)`, `value(name, value)`), as Powertools EMF metrics."""

    def count(self, name: str) -> None:
        if metrics_enabled():
            metrics().add_metric(name=name, unit="Count", value=1)

    def value(self, name: str, value: float, unit: str = "None") -> None:
        """A measured value, of which CloudWatch keeps the distribution (a count of 0 or 1 gives a rate)."""
        if metrics_enabled():
            metrics().add_metric(name=name, unit=unit, value=value)

    def values_by(self, dimensions: Mapping[str, str], values: Mapping[str, tuple[float, str]]) -> None:
        """Measured values (name -> (value, unit)) under dimensions of their own (a tenant, an
        endpoint), in one EMF line written at once, apart from the request's other metrics."""
        if not metrics_enabled():
            return
        from aws_lambda_powertools.metrics import EphemeralMetrics

        line = EphemeralMetrics(namespace=NAMESPACE, service="decision-gateway")
        for key, dimension in dimensions.items():
            line.add_dimension(name=key, value=dimension)
        for name, (value, unit) in values.items():
            line.add_metric(name=name, unit=unit, value=value)
        line.flush_metrics()


def counters() -> _MetricCounters:
    return _MetricCounters()
