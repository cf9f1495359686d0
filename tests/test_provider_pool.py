"""An adapter's connections (cantrip/llm/providers/_clients.py), against a real socket.

What the O(1) pool must keep of httpx's own: connections are reused (one for
sequential requests, none new for a second burst), concurrent requests each get
their own, a full pool makes a request wait (or time out, retryably), a
cancelled request gives its connection back, and the clients are closed when
the trio run ends while the adapter keeps working in the next run.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing
from fake_providers import Answer, FakeOpenAI, Request, isolate, running, serve

from cantrip import ProviderError
from cantrip.llm import Message, load_llm
from cantrip.llm.providers._clients import ClientPool, default_connections

HELLO = [Message("user", "hello")]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


class Gated(FakeOpenAI):
    """Holds every request until ``release`` is set; counts those waiting at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = trio.Event()
        self.waiting = 0
        self.most = 0
        self.arrived = trio.Condition()

    async def respond(self, request: Request, send: Any) -> None:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        async with self.arrived:
            self.arrived.notify_all()
        await self.release.wait()
        self.waiting -= 1
        await super().respond(request, send)

    async def until_waiting(self, count: int) -> None:
        with trio.fail_after(30):
            async with self.arrived:
                while self.waiting < count:
                    await self.arrived.wait()


async def test_sequential_requests_reuse_one_connection() -> None:
    async with running("openai", [Answer(text=f"a{i}") for i in range(5)]) as (fake, llm):
        for i in range(5):
            assert (await llm.stream(HELLO, on_event=lambda _: None)).content == f"a{i}"
        assert (fake.served, fake.connections) == (5, 1)


async def test_concurrent_requests_get_a_connection_each_and_reuse_them() -> None:
    fake = Gated([Answer(text="x")] * 20)
    async with serve(fake, "/v1") as url:
        llm = load_llm("openai", base_url=url)
        try:
            for burst in range(2):
                fake.release = trio.Event()
                async with trio.open_nursery() as nursery:
                    for _ in range(10):
                        nursery.start_soon(llm.query, HELLO)
                    await fake.until_waiting(10)  # all ten in flight at once
                    fake.release.set()
                # the second burst reuses the first burst's ten connections
                assert fake.connections == 10, burst
            assert fake.served == 20
        finally:
            await llm.aclose()


async def test_a_full_pool_makes_the_next_request_wait_for_a_free_connection() -> None:
    fake = Gated([Answer(text="x")] * 5)
    async with serve(fake, "/v1") as url:
        llm: Any = load_llm("openai", base_url=url)
        llm.max_connections = 2
        try:
            answers: list[str | None] = []

            async def one() -> None:
                answers.append((await llm.query(HELLO)).content)

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
                await fake.until_waiting(2)
                await trio.testing.wait_all_tasks_blocked()
                assert fake.waiting == 2 and llm._pool.busy == 2  # three wait for a slot
                fake.release.set()
            assert answers == ["x"] * 5
            assert fake.most == 2 and fake.connections == 2
        finally:
            await llm.aclose()


@pytest.fixture
def descriptors() -> Any:
    """Sets the soft descriptor limit for a test; the limit in force before comes back."""
    resource = pytest.importorskip("resource")  # POSIX (the suite runs on Linux)
    before = resource.getrlimit(resource.RLIMIT_NOFILE)

    def soft(limit: int) -> None:
        hard = before[1]
        assert hard == resource.RLIM_INFINITY or hard >= limit, f"hard limit {hard} < {limit}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    yield soft
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.mark.parametrize(
    ("soft", "connections"), [(40, 16), (1024, 256), (2000, 500), (17000, 4096)]
)
def test_the_pool_is_a_quarter_of_the_descriptor_limit(
    descriptors: Any, soft: int, connections: int
) -> None:
    descriptors(soft)
    assert default_connections() == connections


def test_an_adapter_takes_its_pool_size_from_the_descriptor_limit(descriptors: Any) -> None:
    descriptors(2000)
    assert load_llm("openai").max_connections == 500  # type: ignore[attr-defined]


async def test_more_than_256_concurrent_requests_each_get_a_connection(descriptors: Any) -> None:
    # A fixed pool of 256 made the 257th request wait: 1,000 entities at 50 ms a turn
    # then took 20 rounds of requests, not 5 (bench/realsocket.py).
    descriptors(2000)  # 500 connections; 300 requests and the server's 300 ends fit
    fake = Gated([Answer(text="x")] * 300)
    async with serve(fake, "/v1") as url:
        llm = load_llm("openai", base_url=url)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(300):
                    nursery.start_soon(llm.query, HELLO)
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                assert fake.waiting == 300  # all in flight at once, none waits for a slot
                fake.release.set()
            assert fake.served == 300 and fake.connections == 300
        finally:
            await llm.aclose()


async def test_waiting_for_a_connection_times_out_retryably(mock_clock: Any) -> None:
    mock_clock.autojump_threshold = 0
    pool = ClientPool(
        timeout=httpx.Timeout(5.0, pool=3.0), trust_env=False, provider="openai", limit=1
    )
    held = await pool.take()
    start = trio.current_time()
    with pytest.raises(ProviderError) as info:
        await pool.take()
    assert trio.current_time() - start == pytest.approx(3.0)
    assert info.value.retryable and info.value.code == "timeout"
    assert "PoolTimeout" in str(info.value)
    pool.give(held)
    assert await pool.take() is held  # the slot the timed-out request never took is free
    await pool.aclose()


async def test_a_cancelled_request_gives_its_connection_back() -> None:
    fake = Gated([Answer(text="late"), Answer(text="next")])
    async with serve(fake, "/v1") as url:
        llm: Any = load_llm("openai", base_url=url)
        try:
            with trio.move_on_after(60) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(llm.query, HELLO)
                    await fake.until_waiting(1)
                    assert llm._pool.busy == 1
                    nursery.cancel_scope.cancel()
            assert not scope.cancelled_caught
            assert llm._pool.busy == 0
            fake.release.set()
            assert (await llm.query(HELLO)).content in ("late", "next")
            assert llm._pool.busy == 0
        finally:
            await llm.aclose()


def test_clients_close_when_the_run_ends_and_the_next_run_gets_new_ones() -> None:
    fake = FakeOpenAI([Answer(text="one"), Answer(text="two")])
    llm: Any = load_llm("openai", base_url="http://127.0.0.1:9/v1")
    pools: list[Any] = []

    async def one_run() -> str | None:
        async with serve(fake, "/v1") as url:
            llm.base_url = url  # each run's fake listens on a port of its own
            answer = await llm.query(HELLO)
            pools.append((llm._pool, list(llm._pool.clients)))
            return answer.content

    # each in a trio run of its own, as two CLI commands in one process would be
    assert trio.run(one_run) == "one"
    first, clients = pools[0]
    assert clients and all(client.is_closed for client in clients)  # closed at the run's end
    assert trio.run(one_run) == "two"
    assert pools[1][0] is not first and fake.connections == 2


class SetsCookie(Gated):
    """Sets a cookie with its first answer (as a CDN in front of a provider may)."""

    async def respond(self, request: Request, send: Any) -> None:
        if self.served == 0:
            plain = send.json

            async def with_cookie(status: int, payload: Any, headers: Any = None) -> None:
                await plain(status, payload, {**(headers or {}), "set-cookie": "cf=abc; Path=/"})

            send.json = with_cookie
        await super().respond(request, send)


async def test_a_cookie_the_provider_sets_is_sent_on_every_connection() -> None:
    fake = SetsCookie([Answer(text="x")] * 4)
    fake.release.set()
    async with serve(fake, "/v1") as url:
        llm = load_llm("openai", base_url=url)
        try:
            await llm.query(HELLO)
            assert "cookie" not in fake.requests[0].headers
            fake.release = trio.Event()
            async with trio.open_nursery() as nursery:
                for _ in range(3):  # three at once: two of them on new connections
                    nursery.start_soon(llm.query, HELLO)
                await fake.until_waiting(3)
                fake.release.set()
            assert fake.connections == 3
            assert [r.headers.get("cookie") for r in fake.requests[1:]] == ["cf=abc"] * 3
        finally:
            await llm.aclose()


async def test_requests_carry_the_headers_httpx_would_have_built() -> None:
    """The pool builds its POSTs itself (parsed URL and merged headers made once);
    on the wire they are what ``AsyncClient.build_request`` makes, streamed or not."""
    async with running("openai", [Answer(text="a"), Answer(text="b")]) as (fake, llm):
        await llm.query(HELLO)
        await llm.stream(HELLO, on_event=lambda _: None)
        for sent, headers in zip(fake.requests, (llm._headers, llm._stream_headers), strict=True):
            async with httpx.AsyncClient() as reference:
                built = reference.build_request(
                    "POST", llm.base_url + "/chat/completions", content=sent.body, headers=headers
                )
            expected = {k.lower(): v for k, v in built.headers.items()}
            assert sent.headers == expected
            assert sent.method == "POST" and sent.path == "/v1/chat/completions"


async def test_a_host_by_name_or_by_address_connects_and_a_refused_one_says_why() -> None:
    # An IP address is connected to directly (nothing to resolve or race), a name
    # through trio's resolver and happy eyeballs; both reach the same server.
    fake = FakeOpenAI([Answer(text="by address"), Answer(text="by name")])
    async with serve(fake, "/v1") as url:
        for base in (url, url.replace("127.0.0.1", "localhost")):
            llm = load_llm("openai", base_url=base)
            try:
                assert (
                    await llm.query(HELLO)
                ).content == f"by {'address' if base == url else 'name'}"
            finally:
                await llm.aclose()
    closed = trio.socket.socket()
    await closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    llm = load_llm("openai", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ProviderError) as info:
        await llm.query(HELLO)
    assert info.value.code == "connect_error" and info.value.retryable
    assert "Connection refused" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)
