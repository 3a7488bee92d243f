"""`DrainGuard` and `Drain` in-process: what a draining replica refuses, what it lets through, when the window ends."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from breakwater.gate._tasks import TASK_OWNER, TaskOwner
from breakwater.gateway import _drain
from breakwater.gateway._drain import Drain, DrainGuard, stdio_refusal
from breakwater.tasks._store import PendingTask
from breakwater.testing import FakeClock

pytestmark = pytest.mark.anyio


async def _post(guard: DrainGuard, body: bytes, method: str = "POST") -> tuple[int, bytes, list[Any]]:
    """Send one request through `guard`; the status, the body and what reached the app behind it."""
    reached: list[Any] = []
    sent: list[dict[str, Any]] = []
    chunks: list[dict[str, Any]] = [
        {"type": "http.request", "body": body[:5], "more_body": True},
        {"type": "http.request", "body": body[5:]},
    ]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        reached.append(message["body"])
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard.app = app
    await guard({"type": "http", "method": method, "headers": []}, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), reached


async def test_a_draining_replica_refuses_requests_and_lets_notifications_and_responses_through() -> None:
    drain = Drain(FakeClock())
    guard = DrainGuard(None, drain)
    call = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "x"}}).encode()
    cancel = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}).encode()
    answer = json.dumps({"jsonrpc": "2.0", "id": 4, "result": {}}).encode()
    assert (await _post(guard, call))[0] == 202  # serving: everything reaches the app
    drain.draining = True
    status, body, reached = await _post(guard, call)
    assert (status, reached) == (503, []) and json.loads(body)["id"] == 7
    # The whole body reaches the app, though it was read to be looked at.
    assert (await _post(guard, cancel))[::2] == (202, [cancel])
    assert (await _post(guard, answer))[::2] == (202, [answer])
    assert (await _post(guard, b"", method="GET"))[0] == 503  # a new GET stream goes to another replica
    # A list runs nothing, and the SDK's client sends one to finish a call (it checks the result's structured content
    # against the tool's schema): refused, the call's result was lost.
    listing = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/list"}).encode()
    assert (await _post(guard, listing))[::2] == (202, [listing])
    assert (await _post(guard, b"", method="DELETE"))[0] == 202
    assert drain.requests == 0


async def test_the_window_waits_for_calls_then_cuts_what_is_left() -> None:
    """A call shorter than the window finishes; a longer one is cut exactly when the window ends."""
    clock = FakeClock()
    drain = Drain(clock)
    cut: dict[str, bool] = {}
    took: list[float] = []

    async def call(name: str, seconds: float) -> None:
        drain.request_started()
        try:
            with drain.call(lambda: True) as entry:
                await clock.sleep(seconds)
            cut[name] = entry.scope.cancelled_caught
        finally:
            drain.request_done()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "short", 3.0)
            tg.start_soon(call, "long", 60.0)
            await clock.sleep(1.0)
            started = clock.monotonic()
            await drain.run(10.0)
            took.append(clock.monotonic() - started)

    await clock.run(main)
    assert cut == {"short": False, "long": True}
    assert drain.cut == 1 and drain.cutting
    # The window, then the linger after the cut call's answer (its POST's end) for what its client sends next.
    assert took == [10.0 + _drain.LINGER_S]


async def test_the_drain_lingers_after_the_last_post_for_what_its_client_sends_next() -> None:
    """No POST for a while: the drain ends at once. A POST just ended: the gateway serves until `LINGER_S` after it,
    and a list that came meanwhile is answered before it stops; a second stop signal ends the linger at once."""
    clock = FakeClock()
    idle = Drain(clock)
    idle.request_started()
    idle.request_done()
    took: list[float] = []

    async def stop_again(drain: Drain, after: float) -> None:
        await clock.sleep(after)
        drain.cut_now()

    async def timed(drain: Drain, *, second_signal: float | None = None) -> None:
        started = clock.monotonic()
        async with anyio.create_task_group() as tg:
            if second_signal is not None:
                tg.start_soon(stop_again, drain, second_signal)
            await drain.run(10.0)
        took.append(round(clock.monotonic() - started, 6))

    async def a_list(drain: Drain, after: float, lasting: float) -> None:
        await clock.sleep(after)
        drain.request_started()
        await clock.sleep(lasting)
        drain.request_done()

    async def main() -> None:
        await clock.sleep(_drain.LINGER_S)  # the last POST ended a linger ago: nothing to wait for
        await timed(idle)
        lingering = Drain(clock)
        lingering.request_started()
        lingering.request_done()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a_list, lingering, 0.3, 0.4)  # the client's list, while the gateway lingers
            await clock.sleep(0.1)
            await timed(lingering)
        hurried = Drain(clock)
        hurried.request_started()
        hurried.request_done()
        await timed(hurried, second_signal=0.1)

    await clock.run(main)
    # At once; until the list ended (the drain began 0.1 s after the last POST, the list came at 0.3 and ended at 0.7,
    # past the linger's 0.5); at the second signal's instant.
    assert took == [0.0, 0.6, 0.1]


def _request(request_id: int, method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()


async def test_a_draining_replica_answers_polls_of_the_tasks_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll runs nothing new: `tasks/get` and `tasks/cancel` of a gateway task this process holds still reach it (a
    task whose upstream task ended answers its result from memory); one naming a task it does not hold is refused with
    words that say so (taking it over would start polling here), and a new call as before."""
    monkeypatch.setattr(_drain, "issued_here", lambda task_id: task_id == "held")
    drain = Drain(FakeClock())
    guard = DrainGuard(None, drain)
    drain.draining = True
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        poll = _request(1, method, taskId="held")
        assert (await _post(guard, poll))[::2] == (202, [poll])
    assert (await _post(guard, _request(2, "tasks/result", taskId="other")))[0] == 202  # 2025-11-25: the SDK says no
    status, body, reached = await _post(guard, _request(3, "tasks/get", taskId="other"))
    message = json.loads(body)["error"]["message"]
    assert (status, reached) == (503, []) and "takes over no task" in message and "nothing was run" not in message
    status, body, _ = await _post(guard, _request(4, "tools/call", name="x"))
    assert status == 503 and "runs nothing new" in json.loads(body)["error"]["message"]
    assert stdio_refusal(_request(5, "tasks/get", taskId="held")) is None
    refused = stdio_refusal(_request(6, "tasks/get", taskId="other"))
    assert refused is not None and "takes over no task" in refused[2]


async def test_a_gateway_tasks_upstream_task_outlives_the_drain() -> None:
    """From the drain's start, a gateway task's call that became an upstream task is no call in flight: the window
    does not wait for it, the cut leaves it alone, and its upstream task is kept (`TaskOwner.kept`). A gateway task's
    call that is still a plain call is waited for and cut like any call."""
    clock = FakeClock()
    drain = Drain(clock)
    cut: dict[str, bool] = {}
    owners = {"upstream task": TaskOwner("a"), "plain call": TaskOwner("b")}
    owners["upstream task"].following = PendingTask(
        server="jobs", tool="t", task_id="u", operation_id=None, retry_class="never", started_at=0.0, deadline_at=60.0
    )
    took: list[float] = []

    async def call(name: str) -> None:
        TASK_OWNER.set(owners[name])
        with drain.call(lambda: True) as entry:
            await clock.sleep(60.0)
        cut[name] = entry.scope.cancelled_caught

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for name in owners:
                tg.start_soon(call, name)
            await clock.sleep(1.0)
            started = clock.monotonic()
            await drain.run(10.0)
            took.append(clock.monotonic() - started)
            assert cut == {"plain call": True}  # the survivor still runs
            tg.cancel_scope.cancel()

    await clock.run(main)
    assert drain.cut == 1 and 10.0 <= took[0] <= 10.5
    assert owners["upstream task"].kept  # its follow, cancelled at the process's end, leaves the upstream task running
