"""`make docs-check`: the built site (build/site) in headless Chromium, as a reader sees it.

The site is served over HTTP on a free loopback port (search needs that), and every page is
opened at 1280 x 800. A page fails when

- its content is wider than its column: the page scrolls sideways, or a code block, table
  or picture inside the article is wider than the article (a reader would have to scroll it);
- the browser logs an error: a script exception, a console error, a resource that failed.

Then the search box is given a query, and must list results.

Chromium is driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`:
JSON messages ended by a NUL byte on file descriptors 3 and 4), so nothing beyond Debian's
`chromium` package is needed. Without it the check says so and exits 3 (`make test` reports
it skipped, with the reason).

    python scripts/docs_check.py [--site build/site] [--page reference/api.html]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 800
SEARCH_QUERY = "idempotency"
NO_BROWSER = 3
PAGE_TIMEOUT_S = 30.0

# What sticks out of the article, in the page's own terms. Material wraps tables in a
# scrolling box (.md-typeset__scrollwrap): the box is what must fit, and its table must not
# need scrolling inside it either.
MEASURE = """(() => {
  const doc = document.documentElement;
  const found = [];
  // Every content tab and folded example shown, so that what a click would show is measured too.
  document.querySelectorAll('.tabbed-block').forEach(b => { b.style.display = 'block'; });
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  if (doc.scrollWidth > window.innerWidth + 1) found.push(`the page is ${doc.scrollWidth}px wide`);
  const column = (document.querySelector('.md-content') || document.body).getBoundingClientRect();
  const article = document.querySelector('article') || document.body;
  const describe = el => {
    const near = (el.closest('[id]') || {}).id || '';
    const text = (el.innerText || el.getAttribute('alt') || '').trim().slice(0, 60).replace(/\\s+/g, ' ');
    return `${el.tagName.toLowerCase()} near #${near}: ${text}`;
  };
  for (const el of article.querySelectorAll('pre > code, .md-typeset__scrollwrap, table, img, svg')) {
    const box = el.getBoundingClientRect();
    if (box.left < column.left - 1 || box.right > column.right + 1)
      found.push(`${describe(el)} sticks out of the column (${Math.round(box.left)}-${Math.round(box.right)} px,`
                 + ` the column ${Math.round(column.left)}-${Math.round(column.right)} px)`);
    else if (el.scrollWidth > el.clientWidth + 1 && el.tagName !== 'svg' && el.tagName !== 'IMG')
      found.push(`${describe(el)} scrolls sideways (${el.scrollWidth} > ${el.clientWidth} px)`);
  }
  return found;
})()"""
SEARCH = """(async () => {
  const input = document.querySelector('input.md-search__input');
  if (!input) return 'no search box';
  input.focus();
  input.value = QUERY;
  input.dispatchEvent(new Event('input', {bubbles: true}));
  input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true, key: 'y'}));
  for (let i = 0; i < 100; i++) {
    const items = document.querySelectorAll('.md-search-result__item');
    if (items.length) return items.length;
    await new Promise(r => setTimeout(r, 100));
  }
  return (document.querySelector('.md-search-result__meta') || {}).innerText || 'no results';
})()""".replace("QUERY", json.dumps(SEARCH_QUERY))


class Browser:
    """One headless Chromium, spoken to over the DevTools pipe."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="docs-check-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def fds() -> None:  # the browser reads commands on fd 3 and writes answers on fd 4
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        # Chromium's sandbox cannot start as root (a CI runner, a container): only there is it off.
        sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []
        try:
            self.process = subprocess.Popen(
                [executable, "--headless=new", "--remote-debugging-pipe", *sandbox, "--disable-gpu",
                 "--no-first-run", "--no-default-browser-check", f"--user-data-dir={self.profile}",
                 f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                preexec_fn=fds, pass_fds=(3, 4),  # kept open past preexec_fn, which put the pipes there
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            for fd in (to_browser_read, self._to_browser, self._from_browser, from_browser_write):
                os.close(fd)
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        finally:
            if hasattr(self, "process"):
                os.close(to_browser_read)
                os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = PAGE_TIMEOUT_S) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = PAGE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        """The browser gone, its pipes closed and its profile deleted, whatever it answers."""
        try:
            self.send("Browser.close", timeout_s=5)
            self.process.wait(timeout=10)
        except Exception:
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)


def open_page(browser: Browser) -> str:
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for method in ("Page.enable", "Runtime.enable", "Log.enable"):
        browser.send(method, session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session=session)
    return session


def errors_in(events: list[dict[str, Any]]) -> list[str]:
    """What the browser reported as going wrong on a page."""
    found = []
    for event in events:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            found.append("exception: " + str((details.get("exception") or {}).get("description") or details.get("text")))
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            found.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
    return found


def check_page(browser: Browser, session: str, url: str) -> list[str]:
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_for("Page.loadEventFired")
    time.sleep(0.2)  # the theme's scripts run once the page has loaded
    measured = browser.send("Runtime.evaluate", {"expression": MEASURE, "returnByValue": True}, session=session)
    problems = list(measured.get("result", {}).get("value") or [])
    return problems + errors_in(browser.events)


def check_search(browser: Browser, session: str, url: str) -> str | None:
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_for("Page.loadEventFired")
    found = browser.send("Runtime.evaluate", {"expression": SEARCH, "returnByValue": True, "awaitPromise": True},
                         session=session).get("result", {}).get("value")
    return None if isinstance(found, int) and found > 0 else f"search for {SEARCH_QUERY!r} listed nothing ({found})"


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def pages_of(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if p.name != "404.html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--page", action="append", help="only these pages (paths under the site)")
    args = parser.parse_args(argv)
    executable = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if executable is None:
        print("[docs-check] skipped: no Chromium (Debian: apt-get install chromium)")
        return NO_BROWSER
    if not (args.site / "index.html").exists():
        print(f"[docs-check] no site at {args.site}: run make docs first", file=sys.stderr)
        return 2
    browser = Browser(executable)  # started before the server's thread: a fork with no other thread running
    server = serve(args.site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    failures: dict[str, list[str]] = {}
    try:
        session = open_page(browser)
        pages = args.page or pages_of(args.site)
        for number, page in enumerate(pages, start=1):
            problems = check_page(browser, session, base + page)
            print(f"[docs-check] {number}/{len(pages)} {page}: {'ok' if not problems else f'{len(problems)} problems'}")
            if problems:
                failures[page] = problems
        searched = check_search(browser, session, base + "index.html")
        if searched:
            failures["search"] = [searched]
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    for page, problems in failures.items():
        for problem in problems:
            print(f"  {page}: {problem}")
    print(f"[docs-check] {'passed' if not failures else 'failed'}: {len(pages)} pages at {WIDTH} px, search "
          f"{'answers' if 'search' not in failures else 'does not answer'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
