"""A2A push notifications from ``cantrip serve``: updates POSTed to a client's webhook.

The webhook is a real loopback HTTP server (tests/fake_providers.py's server); the
client is the a2a-sdk's. The server calls loopback only because these tests start it
with ``a2a_push_private`` (``--a2a-push-private``); by default such URLs are refused."""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from fake_providers import FakeProvider, Request, Sender, serve
from test_a2a_server import call, client_for, immediately, message, sent, serving, spell

from cantrip.protocols.a2a._push import Pushes, RefusedURL, _blocked, parse_url
from cantrip.protocols.middleware._lifecycle import ServeOptions

pytest.importorskip("a2a.client", reason="the a2a extra is part of dev")

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

pytestmark = pytest.mark.loop_watch

TOKEN = "push-token-0123456789"
CREDENTIALS = "push-credentials-abcdef"
PRIVATE = ServeOptions(a2a_push_private=True)


class Webhook(FakeProvider):
    """Takes every POST (200) and keeps it."""

    def __init__(self) -> None:
        super().__init__([])
        self.arrived = trio.Event()

    async def respond(self, request: Request, send: Sender) -> None:
        self.requests.append(request)
        self.arrived.set()
        await send.json(200, {})

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests]


@asynccontextmanager
async def webhook() -> AsyncIterator[tuple[Webhook, str]]:
    hook = Webhook()
    async with serve(hook) as base:
        yield hook, f"{base}/hook?k=v"


def config(url: str) -> pb.TaskPushNotificationConfig:
    return pb.TaskPushNotificationConfig(
        url=url,
        token=TOKEN,
        authentication=pb.AuthenticationInfo(scheme="Bearer", credentials=CREDENTIALS),
    )


async def until_state(hook: Webhook, state: str) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        while not any(
            b.get("statusUpdate", {}).get("status", {}).get("state") == state for b in hook.bodies()
        ):
            hook.arrived = trio.Event()
            await hook.arrived.wait()
    return hook.bodies()


async def test_a_message_with_a_push_config_gets_its_updates_posted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    script = [call("echo", text="looking"), call("done", answer="found")]
    async with (
        webhook() as (hook, url),
        serving(spell(script), options=PRIVATE) as base,
        client_for(base) as client,
    ):
        request = message("find it")
        request.configuration.task_push_notification_config.CopyFrom(config(url))
        (done,) = await sent(client, request)
        assert done.task.status.state == pb.TASK_STATE_COMPLETED
        bodies = await until_state(hook, "TASK_STATE_COMPLETED")
        (listed,) = (
            await client.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id=done.task.id)
            )
        ).configs
        assert listed.url == url and listed.id and listed.task_id == done.task.id
    states = [b["statusUpdate"]["status"]["state"] for b in bodies if "statusUpdate" in b]
    assert states[0] == "TASK_STATE_WORKING" and states[-1] == "TASK_STATE_COMPLETED"
    (artifact,) = [b["artifactUpdate"] for b in bodies if "artifactUpdate" in b]
    assert artifact["artifact"]["parts"][0]["text"] == "found"
    assert all(b[next(iter(b))]["taskId"] == done.task.id for b in bodies)
    first = hook.requests[0]
    assert first.method == "POST" and first.path == "/hook?k=v"
    assert first.headers["x-a2a-notification-token"] == TOKEN
    assert first.headers["authorization"] == f"Bearer {CREDENTIALS}"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "push notifications to http://127.0.0.1:" in logged
    assert TOKEN not in logged and CREDENTIALS not in logged and "k=v" not in logged


async def test_configs_are_created_read_listed_and_deleted_for_a_task() -> None:
    script = [call("slow")]
    async with (
        webhook() as (hook, url),
        serving(spell(script), options=PRIVATE) as base,
        client_for(base) as client,
    ):
        (started,) = await sent(client, immediately(message("wait")))
        task_id = started.task.id
        made = config(url)
        made.task_id = task_id
        made.id = "mine"
        created = await client.create_task_push_notification_config(made)
        assert created.id == "mine" and created.token == TOKEN
        got = await client.get_task_push_notification_config(
            pb.GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine")
        )
        assert got.url == url
        await client.cancel_task(pb.CancelTaskRequest(id=task_id))
        bodies = await until_state(hook, "TASK_STATE_CANCELED")
        assert bodies, "the cancellation was pushed"
        await client.delete_task_push_notification_config(
            pb.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="mine")
        )
        listed = await client.list_task_push_notification_configs(
            pb.ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert list(listed.configs) == []
        with pytest.raises(TaskNotFoundError):
            await client.get_task_push_notification_config(
                pb.GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine")
            )
        orphan = config(url)
        orphan.task_id = "no-such-task"
        with pytest.raises(TaskNotFoundError):
            await client.create_task_push_notification_config(orphan)


async def test_webhook_urls_are_untrusted_by_default() -> None:
    """Without ``--a2a-push-private`` loopback and private hosts are refused, before any
    task starts; only http(s) is ever called."""
    async with (
        webhook() as (hook, url),
        serving(spell([call("done", answer="x")])) as base,
        client_for(base) as client,
    ):
        for bad in (url, "http://10.0.0.7/hook", "http://[::1]:9/h", "ftp://example.com/x",
                    "http://169.254.169.254/latest", "file:///etc/passwd",
                    "http://[fec0::1]/h", "http://[2002:a9fe:a9fe::]/latest"):  # fmt: skip
            request = message("go")
            request.configuration.task_push_notification_config.CopyFrom(config(bad))
            with pytest.raises(InvalidParamsError, match="push notification URL refused"):
                await sent(client, request)
        listed = await client.list_tasks(pb.ListTasksRequest())
        assert list(listed.tasks) == [], "a refused config starts no task"
    assert hook.requests == []


def test_addresses_and_urls_the_guard_refuses() -> None:
    refused = "127.0.0.1 10.1.2.3 192.168.0.1 100.64.0.1 169.254.169.254 ::1 fe80::1"
    for address in [*refused.split(), "::ffff:127.0.0.1", "0.0.0.0", "224.0.0.1", "nonsense"]:
        assert _blocked(address), address
    for address in ("8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8"):
        assert not _blocked(address), address
    assert parse_url("https://example.com/x") == ("https", "example.com", 443)
    for url in ("gopher://x/", "http:///nohost", "http://x:99999/"):
        with pytest.raises(RefusedURL):
            parse_url(url)


async def _delivered(pushes: Pushes, until: Any) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(pushes.run)
        with trio.fail_after(10):
            while not until():
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


def _update(task_id: str) -> pb.TaskStatusUpdateEvent:
    return pb.TaskStatusUpdateEvent(
        task_id=task_id, context_id="c", status=pb.TaskStatus(state=pb.TASK_STATE_WORKING)
    )


async def test_the_address_is_checked_again_when_connecting() -> None:
    """A config whose host resolved to a public address when it was given, and to
    loopback now (DNS rebinding), reaches nothing: the check runs in the connection."""
    async with webhook() as (hook, url):
        pushes = Pushes(timeout_s=2)
        rebound = config(url)
        rebound.task_id = "t1"
        pushes.keep(rebound)  # as if checked when the name resolved elsewhere
        pushes.notify("t1", _update("t1"))
        await _delivered(pushes, lambda: pushes.failed == 1)
        assert hook.requests == [] and pushes.delivered == 0


async def test_a_webhook_that_never_answers_costs_one_round_of_attempts_then_rests() -> None:
    """Each attempt is bounded by the timeout; the first notification is tried three
    times (delays 0.2 s), the second finds the config resting and is dropped at once;
    the other lane's webhook gets its notification meanwhile."""
    reached: list[int] = []

    async def silent(stream: trio.SocketStream) -> None:
        reached.append(1)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery, webhook() as (hook, url):
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        pushes = Pushes(allow_private=True, timeout_s=0.5, lanes=2, retry_delays=(0.2, 0.2))
        slow, fast = config(f"http://127.0.0.1:{port}/never"), config(url)
        # task ids in different lanes (crc32 % 2)
        ids = [f"t{i}" for i in range(10)]
        slow.task_id = next(i for i in ids if zlib.crc32(i.encode()) % 2 == 0)
        fast.task_id = next(i for i in ids if zlib.crc32(i.encode()) % 2 == 1)
        for c in (slow, fast):
            pushes.keep(c)
        started = trio.current_time()
        pushes.notify(slow.task_id, _update(slow.task_id))
        pushes.notify(slow.task_id, _update(slow.task_id))
        pushes.notify(fast.task_id, _update(fast.task_id))
        await _delivered(pushes, lambda: pushes.failed == 2 and pushes.delivered == 1)
        assert trio.current_time() - started < 5, "each attempt bounded by timeout_s"
        assert len(hook.requests) == 1
        assert len(reached) == 3  # three attempts for the first, none for the second
        nursery.cancel_scope.cancel()


class Flaky(Webhook):
    """Answers each POST with the next of ``statuses`` (then 200), with ``headers``."""

    def __init__(self, statuses: list[int], headers: dict[str, str] | None = None) -> None:
        super().__init__()
        self.statuses = statuses
        self.headers = headers or {}
        self.times: list[float] = []

    async def respond(self, request: Request, send: Sender) -> None:
        self.requests.append(request)
        self.times.append(trio.current_time())
        self.arrived.set()
        status = self.statuses.pop(0) if self.statuses else 200
        await send.json(status, {}, headers=self.headers if status != 200 else {})


async def flaky_round(
    statuses: list[int], headers: dict[str, str] | None = None, notes: int = 2
) -> tuple[Flaky, Pushes]:
    hook = Flaky(statuses, headers)
    async with serve(hook) as base:
        pushes = Pushes(allow_private=True, timeout_s=2, retry_delays=(0.1, 0.3))
        hooked = config(f"{base}/hook")
        hooked.task_id = "t1"
        pushes.keep(hooked)
        for _ in range(notes):
            pushes.notify("t1", _update("t1"))
        await _delivered(pushes, lambda: pushes.failed + pushes.delivered == notes)
    return hook, pushes


async def test_a_delivery_that_fails_transiently_is_tried_again_in_order() -> None:
    """503 then 502: the first notification arrives at its third attempt, after
    waits of 0.1 and 0.3 s; the second arrives after it, at once."""
    hook, pushes = await flaky_round([503, 502])
    assert (pushes.delivered, pushes.failed) == (2, 0)
    assert len(hook.requests) == 4
    gaps = [b - a for a, b in zip(hook.times, hook.times[1:], strict=False)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.3


async def test_a_refusal_is_final_and_a_retry_after_is_waited() -> None:
    """A 404 is the webhook refusing the call: not tried again. A 429 asking for 1 s
    is waited 1 s (not the 0.1 s of our own delay)."""
    hook, pushes = await flaky_round([404], notes=1)
    assert (len(hook.requests), pushes.failed) == (1, 1)
    hook, pushes = await flaky_round([429], {"retry-after": "1"}, notes=1)
    assert (len(hook.requests), pushes.delivered) == (2, 1)
    assert hook.times[1] - hook.times[0] >= 1.0


async def test_a_retry_after_longer_than_a_lane_waits_ends_the_delivery() -> None:
    hook, pushes = await flaky_round([503], {"retry-after": "3600"}, notes=1)
    assert (len(hook.requests), pushes.failed) == (1, 1)


def test_push_configs_are_kept_for_the_newest_tasks() -> None:
    """The tasks are the session backend's; their push configs are bounded on their
    own (``KEPT_TASKS``), the oldest task's going first."""
    pushes = Pushes(kept_tasks=2)
    for task in ("a", "b", "c"):
        pushes.keep(pb.TaskPushNotificationConfig(task_id=task, url="https://x.example/h"))
    assert [bool(pushes.configs(t)) for t in "abc"] == [False, True, True]
