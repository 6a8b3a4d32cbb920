"""The suite holds the handler to the statuses its OpenAPI document declares
(`gateway.api.reference`), both ways:

- every answer of the in-process function (a request, or a batch line through its route) is
  checked against its operation's declared statuses: a test in which a route answers one it
  does not declare fails, naming it;
- a run of the whole suite (`pytest` as `make test` runs it: every test path, nothing
  deselected) fails when a declared status of some operation was never answered: a
  declaration no test can reach is as wrong as an answer none declares.

Registered by tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest


class StatusLedger:
    def __init__(self) -> None:
        self.seen: set[tuple[str, str, int]] = set()
        self.undeclared: dict[str, list[str]] = {}  # test id -> what its routes answered undeclared
        self.deselected = False  # some test was left out of this run: the run is not the whole suite
        self._templates: list[tuple[str, str, re.Pattern[str]]] | None = None
        self._declared: dict[tuple[str, str], set[int]] | None = None
        self._building = False

    def declared(self) -> dict[tuple[str, str], set[int]]:
        """Every operation's statuses, success included, as the served document has them."""
        if self._declared is None:
            from scripts.openapi_doc import document

            self._building = True  # the document is asked of the function, whose answer is not a test's
            try:
                served = document()
            finally:
                self._building = False
            self._declared = {(method.upper(), path): {int(code) for code in operation["responses"]}
                              for path, operations in served["paths"].items()
                              for method, operation in operations.items()}
            self._templates = [(method, path, re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", path) + "$"))
                               for method, path in self._declared]
        return self._declared

    def operation(self, method: str, path: str) -> tuple[str, str] | None:
        from gateway.api.paths import route_path

        self.declared()
        path = route_path(path)
        for template_method, template, pattern in self._templates or ():
            if template_method == method.upper() and pattern.match(path):
                return template_method, template
        return None  # an unknown path (its 404 is the router's), or the document's own route

    def answered(self, method: str, path: str, status: int) -> None:
        if self._building:
            return
        operation = self.operation(method, path)
        if operation is None:
            return
        self.seen.add((*operation, status))
        if status not in self.declared()[operation]:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            self.undeclared.setdefault(test, []).append(f"{operation[0]} {operation[1]} answered {status}")

    def never_answered(self) -> list[str]:
        return sorted(f"{method} {path} {status}" for (method, path), statuses in self.declared().items()
                      for status in statuses if (method, path, status) not in self.seen)


LEDGER = StatusLedger()


def install() -> None:
    """Wrap the function's two entry points that answer through a route."""
    from gateway.functions.handler import GatewayFunction

    respond, run_line = GatewayFunction.respond, GatewayFunction.run_line

    def recorded_respond(self: Any, event: dict[str, Any], context: Any, *, streaming: bool) -> Any:
        result, body = respond(self, event, context, streaming=streaming)
        LEDGER.answered(event.get("httpMethod") or "GET", event.get("path") or "/", int(result.get("statusCode", 500)))
        return result, body

    def recorded_line(self: Any, principal: Any, call: Any) -> Any:
        answer = run_line(self, principal, call)
        LEDGER.answered("POST", call.url, answer[0])
        return answer

    GatewayFunction.respond = recorded_respond  # type: ignore[method-assign]
    GatewayFunction.run_line = recorded_line  # type: ignore[method-assign]


def report_undeclared(item: Any, report: Any) -> None:
    """Fail a passing test whose routes answered a status their operation does not declare."""
    found = LEDGER.undeclared.pop(item.nodeid, None)
    if found and report.passed:
        report.outcome = "failed"
        report.longrepr = ("a route answered a status the OpenAPI document does not declare "
                           f"(gateway.api.reference.DECLARED): {', '.join(sorted(set(found)))}")


def whole_suite(session: Any) -> bool:
    """Whether this process ran the whole suite itself: `pytest` with no paths, filters, ignores or
    workers (under xdist no one process sees every answer)."""
    config, option = session.config, session.config.option
    narrowed = (option.keyword or option.markexpr or getattr(option, "lf", False) or getattr(option, "ignore", None)
                or getattr(option, "ignore_glob", None) or getattr(option, "deselect", None)
                or getattr(option, "numprocesses", None) or hasattr(config, "workerinput"))
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not narrowed and not LEDGER.deselected
            and session.testscollected > 0 and not session.shouldstop)


def write_answered(session: Any) -> None:
    """With --statuses-answered PATH, every (operation, status) this process saw, one JSON line each
    (appended: the workers of one run, or runs of parts of the suite, add up in one file)."""
    path = session.config.getoption("--statuses-answered")
    if path:
        with open(path, "a") as out:
            for method, template, status in sorted(LEDGER.seen):
                out.write(json.dumps([method, template, status]) + "\n")


def check_every_status_answered(session: Any) -> None:
    write_answered(session)
    if not whole_suite(session) or session.testsfailed:
        return
    missing = LEDGER.never_answered()
    if missing:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("declared statuses no test drove a route into (gateway.api.reference.DECLARED): "
                            + "; ".join(missing), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
