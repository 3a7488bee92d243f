"""The sign-in's loopback callback (`http://localhost:PORT/callback`) and the pasted redirect URL.

Only a redirect that carries the `state` of this sign-in's authorization URL counts: another one (an
old tab, a forged link) is answered "ignored" and the sign-in goes on waiting, where it used to end
the sign-in. The browser's page says what happened: the authorization server's refusal, or, for the
redirect that carried the code, whether the sign-in then finished (its request is held until it
does), where every page said "Signed in" even when the token exchange failed.
"""

from __future__ import annotations

import contextlib
import html
import sys
import threading
from typing import TextIO
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectSendStream
from anyio.streams.stapled import MultiListener
from mcp.client.auth import OAuthFlowError
from mcp.shared.auth import AuthorizationCodeResult

from breakwater._clock import Clock

__all__ = ["Outcome", "Redirects", "listen"]

Outcome = AuthorizationCodeResult | Exception

_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
#: How long the held page may take to reach a browser once the sign-in ended (it ends the command's wait).
_PAGE_SEND_S = 5.0


def page(status: str, text: str) -> bytes:
    """An HTTP response with a one-paragraph page (`text` is escaped)."""
    body = f"<!doctype html><meta charset=utf-8><title>breakwater</title><p>{html.escape(text)}</p>".encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def parse_redirect(target: str) -> tuple[Outcome, str | None]:
    """The redirect's outcome (the code, or the refusal as an error) and the `state` it carried."""
    query = parse_qs(urlsplit(target).query)

    def one(key: str) -> str | None:
        values = query.get(key)
        return values[0] if values else None

    state = one("state")
    error = one("error")
    if error is not None:
        detail = one("error_description")
        return OAuthFlowError(f"the authorization server refused: {error}" + (f" ({detail})" if detail else "")), state
    code = one("code")
    if code is None:
        return OAuthFlowError("the redirect carried no authorization code"), state
    return AuthorizationCodeResult(code=code, state=state, iss=one("iss")), state


class Redirects:
    """One sign-in's side of the redirect: the state it waits for, where outcomes go, and the page the browser gets."""

    def __init__(self, name: str, send: MemoryObjectSendStream[Outcome], clock: Clock) -> None:
        self.name = name
        self.send = send
        self._clock = clock
        #: The `state` of the authorization URL (None until it was shown).
        self.state: str | None = None
        self._finished = anyio.Event()
        self._page = page("200 OK", f"The sign-in to {name} did not finish; the terminal running breakwater says why.")

    def shown(self, url: str) -> None:
        """The authorization URL went to the person: remember its state."""
        values = parse_qs(urlsplit(url).query).get("state")
        self.state = values[0] if values else None

    def expects(self, outcome: Outcome, state: str | None) -> bool:
        """Whether a redirect is this sign-in's. A refusal without a state still counts: it can only end the
        sign-in, as an authorization server that leaves the state out of its errors would otherwise make it wait."""
        if self.state is None or state == self.state:
            return True
        return state is None and isinstance(outcome, Exception)

    def finish(self, *, ok: bool) -> None:
        """The sign-in ended (each time: also when it failed or was cancelled): the held page may go."""
        if ok:
            self._page = page("200 OK", f"Signed in to {self.name}. You can close this tab.")
        self._finished.set()

    async def answer(self, stream: anyio.abc.SocketStream) -> None:
        """One HTTP request on the loopback listener: the redirect, or anything else (404)."""
        async with stream:
            data = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    data += await stream.receive()
            parts = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            target = parts[1] if len(parts) >= 2 else ""
            if urlsplit(target).path != "/callback":
                await _send(stream, _NOT_FOUND)
                return
            outcome, state = parse_redirect(target)
            if not self.expects(outcome, state):
                why = "This redirect is not from the sign-in breakwater is waiting for (its state differs): ignored."
                await _send(stream, page("400 Bad Request", f"{why} Finish the sign-in in the tab breakwater opened."))
                return
            await self.send.send(outcome)
            if isinstance(outcome, Exception):
                await _send(stream, page("200 OK", f"The sign-in to {self.name} failed: {outcome}. You can close this tab."))
                return
            # Shielded: the sign-in's end cancels this task, and the page saying how it ended must still go out.
            with anyio.CancelScope(shield=True):
                await self._finished.wait()
                with self._clock.deadline_scope(self._clock.monotonic() + _PAGE_SEND_S):
                    await _send(stream, self._page)

    def read_pasted(self, stdin: TextIO) -> None:
        """A final redirect URL pasted on standard input (a machine whose browser is elsewhere).

        A daemon thread, not a worker thread: when the loopback wins, a read still blocked on the
        terminal must not keep the finished command from exiting.
        """
        token = anyio.lowlevel.current_token()

        def read() -> None:
            for line in iter(stdin.readline, ""):
                if "code=" not in line and "error=" not in line:
                    continue
                outcome, state = parse_redirect(line.strip())
                if not self.expects(outcome, state):
                    print(
                        "breakwater: that URL is not from this sign-in (its state differs); paste the one the browser ended on",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                with contextlib.suppress(Exception):  # the sign-in already ended: nothing to hand it to
                    anyio.from_thread.run_sync(self.send.send_nowait, outcome, token=token)
                return

        threading.Thread(target=read, name="breakwater-paste", daemon=True).start()


async def _send(stream: anyio.abc.SocketStream, data: bytes) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(data)


async def listen(port: int) -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], int]:
    """Listen on 127.0.0.1 (and ::1 at the same port when the machine has it): `localhost` is either."""
    v4 = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    bound = int(v4.extra(anyio.abc.SocketAttribute.local_port))
    listeners: list[anyio.abc.Listener[anyio.abc.SocketStream]] = [v4]
    with contextlib.suppress(OSError):
        listeners.append(await anyio.create_tcp_listener(local_host="::1", local_port=bound))
    return MultiListener(listeners), bound
