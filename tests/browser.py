"""A headless Chromium driven through the DevTools protocol, for tests of the web page.

Debian's `chromium` package and nothing else: no driver, no download, no new dependency. The
browser picks a free DevTools port and writes it to `DevToolsActivePort` in its profile;
aiohttp's websocket client speaks the protocol to one tab. Chromium runs in a process group of
its own, which is killed on the way out however the test ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pathlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

CHROMIUM = pathlib.Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often give /dev/shm only 64 MiB
    "--password-store=basic",  # no desktop keyring to wait for
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 60.0
"""Generous: two shared cores start a browser slowly; a healthy one answers in seconds."""
COMMAND_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


class BrowserError(Exception):
    """Chromium did not start, or a DevTools command failed."""


def available() -> bool:
    """Whether Debian's Chromium is installed (scripts/lib.sh `browser_prereq` installs it)."""
    return os.access(CHROMIUM, os.X_OK)


class DevTools:
    """One DevTools websocket: commands matched to answers by id, events kept in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []
        self.events: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read(), name="devtools-reader")

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one command and return its result; raise BrowserError with its error."""
        ident = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._answers[ident] = answer
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        try:
            reply = await asyncio.wait_for(answer, COMMAND_TIMEOUT_S)
        finally:
            self._answers.pop(ident, None)
        if "error" in reply:
            msg = f"{method} failed: {reply['error']}"
            raise BrowserError(msg)
        return dict(reply.get("result") or {})

    def expect(self, method: str) -> asyncio.Future[dict[str, Any]]:
        """A future for the next event named `method` (ask before causing it)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((method, waiter))
        return waiter

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                answer = self._answers.get(data["id"])
                if answer is not None and not answer.done():
                    answer.set_result(data)
                continue
            self.events.append(data)
            for method, waiter in list(self._waiters):
                if method == data.get("method") and not waiter.done():
                    waiter.set_result(data.get("params") or {})
                    self._waiters.remove((method, waiter))
        closed = BrowserError("the DevTools connection closed")
        for answer in self._answers.values():
            if not answer.done():
                answer.set_exception(closed)

    async def close(self) -> None:
        """Stop reading and close the socket."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


class Page:
    """One tab: load, evaluate, type and click as a user would, and what went wrong in it."""

    def __init__(self, devtools: DevTools) -> None:
        self.devtools = devtools

    async def enable(self) -> None:
        """Turn on the events the test reads: loads, exceptions, console and browser log."""
        for domain in ("Page", "Runtime", "Log"):
            await self.devtools.send(f"{domain}.enable")

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        loaded = self.devtools.expect("Page.loadEventFired")
        result = await self.devtools.send("Page.navigate", url=url)
        if result.get("errorText"):
            msg = f"could not load {url}: {result['errorText']}"
            raise BrowserError(msg)
        await asyncio.wait_for(loaded, COMMAND_TIMEOUT_S)

    async def reload(self) -> None:
        """Reload the tab (sessionStorage survives, as in a user's reload) and wait for it."""
        loaded = self.devtools.expect("Page.loadEventFired")
        await self.devtools.send("Page.reload", ignoreCache=True)
        await asyncio.wait_for(loaded, COMMAND_TIMEOUT_S)

    async def evaluate(self, expression: str) -> Any:
        """Evaluate JavaScript in the page (promises awaited) and return its JSON value."""
        result = await self.devtools.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text")
            msg = f"evaluating {expression[:80]!r} threw: {text}"
            raise BrowserError(msg)
        return (result.get("result") or {}).get("value")

    async def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type `text` into it through the input pipeline."""
        focused = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return false; e.focus(); return document.activeElement === e; })()"
        )
        if not focused:
            msg = f"no focusable element matches {selector!r}"
            raise BrowserError(msg)
        await self.devtools.send("Input.insertText", text=text)

    async def press_enter(self) -> None:
        """Press and release Enter in the focused element (submits its form)."""
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        await self.devtools.send("Input.dispatchKeyEvent", type="keyDown", text="\r", **key)
        await self.devtools.send("Input.dispatchKeyEvent", type="keyUp", **key)

    async def click(self, selector: str) -> None:
        """Click the middle of the element with the mouse, as a user would."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width}; })()"
        )
        if not box or not box["w"]:
            msg = f"no visible element matches {selector!r}"
            raise BrowserError(msg)
        for kind in ("mousePressed", "mouseReleased"):
            await self.devtools.send("Input.dispatchMouseEvent", type=kind, x=box["x"],
                                     y=box["y"], button="left", clickCount=1)  # fmt: skip

    async def set_viewport(self, width: int, height: int) -> None:
        """Emulate a window of `width` × `height` CSS pixels (a desktop one: a mobile viewport
        would zoom out to fit a page that is too wide, hiding the overflow a test looks for)."""
        await self.devtools.send("Emulation.setDeviceMetricsOverride", width=width,
                                 height=height, deviceScaleFactor=1, mobile=False)  # fmt: skip

    def problems(self) -> list[str]:
        """Uncaught exceptions, console errors and the browser's own error log, in order."""
        out = []
        for event in self.devtools.events:
            method, params = event.get("method"), event.get("params") or {}
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails") or {}
                exc = (details.get("exception") or {}).get("description") or details.get("text")
                out.append(f"exception: {exc}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                args = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
                out.append(f"console.{params['type']}: {' '.join(args)}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                out.append(
                    f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
                )
        return out


@contextlib.asynccontextmanager
async def launch(tmp: pathlib.Path) -> AsyncIterator[Page]:
    """Start Chromium with a fresh profile under `tmp` and yield its first tab."""
    profile = tmp / "chromium-profile"
    profile.mkdir()
    log_path = tmp / "chromium.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank",
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    try:
        port = await _devtools_port(proc, profile, log_path)
        async with aiohttp.ClientSession() as http:
            ws_url = await _first_tab(http, port)
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                devtools = DevTools(ws)
                try:
                    page = Page(devtools)
                    await page.enable()
                    yield page
                finally:
                    await devtools.close()
    finally:
        await _stop(proc)


async def _devtools_port(
    proc: asyncio.subprocess.Process, profile: pathlib.Path, log_path: pathlib.Path
) -> int:
    """Wait for Chromium to write its DevTools port (first line of DevToolsActivePort)."""
    active = profile / "DevToolsActivePort"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while loop.time() < deadline:
        if proc.returncode is not None:
            msg = f"chromium exited with {proc.returncode}: {_tail(log_path)}"
            raise BrowserError(msg)
        lines = active.read_text().splitlines() if active.exists() else []
        if len(lines) >= 2 and lines[0].isdigit():
            return int(lines[0])
        await asyncio.sleep(0.1)
    msg = f"chromium wrote no DevTools port within {START_TIMEOUT_S:.0f}s: {_tail(log_path)}"
    raise BrowserError(msg)


async def _first_tab(http: aiohttp.ClientSession, port: int) -> str:
    """The websocket URL of the tab Chromium opened at start."""
    async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
        targets = await resp.json()
    for target in targets:
        if target.get("type") == "page":
            return str(target["webSocketDebuggerUrl"])
    msg = f"chromium has no page target: {targets}"
    raise BrowserError(msg)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End Chromium's whole process group: TERM, a short grace, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            continue
        break
    # Renderers and helpers share the group and may outlive the main process by a moment.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def _tail(path: pathlib.Path, lines: int = 20) -> str:
    """The end of Chromium's log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
