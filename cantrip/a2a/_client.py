"""A remote A2A agent as one gate: the client side, on the official ``a2a-sdk``.

Opening reads the agent's Agent Card (within ``startup_timeout_s``; a card that
cannot be had is a :class:`ProviderStartError` before the cast's first turn) and
makes the SDK's client for the interface the card names. The gate ``<name>``
takes ``message`` and sends it as an A2A message; its record says which remote
task and context answered (``detail``: ``via``, ``task_id``, ``context_id``,
``state``), the way a child entity's call names the child.

* The remote context is kept for the entity's life: later calls continue the
  same remote conversation.
* A task that ends ``input-required`` returns the remote agent's question; the
  next call of the gate is sent to that task and answers it.
* Failed, rejected or cancelled tasks, transport errors and timeouts are
  ``is_error`` records; the loop goes on.
* Cancellation both ways: when the call is cancelled (the cast is cancelled, a
  ward cuts it off) or runs out of ``timeout_s``, the remote task is cancelled
  with ``CancelTask`` (shielded, bounded by :data:`CANCEL_GRACE_S`).

Streaming agents are followed over ``SendStreamingMessage``; others are sent the
message with ``returnImmediately`` and polled with ``GetTask``, so the task id is
known from the start and a cancel can reach it either way.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import pydantic
import trio

from cantrip._gate import Gate, GateResult
from cantrip._providers import ProviderStartError
from cantrip._redact import get_logger, redact
from cantrip.a2a._parts import parts_text

if TYPE_CHECKING:
    import httpx

log = get_logger("cantrip.a2a")

CANCEL_GRACE_S = 5.0
"""How long a cancelled call waits for the remote ``CancelTask`` to be answered."""
POLL_S = (0.05, 1.0)
"""First and longest wait between ``GetTask`` polls of a non-streaming agent."""


class A2AAgent(Protocol):
    """What this module reads of an agent's description (:class:`cantrip.a2a.A2AAgent`)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def startup_timeout_s(self) -> float: ...
    def describe(self) -> dict[str, Any]: ...


class _Arguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    message: str = pydantic.Field(min_length=1)


async def open_agent(spec: A2AAgent) -> A2AProvider:
    """Read ``spec``'s Agent Card and make its client; the agent as one gate."""
    await trio.to_thread.run_sync(_import_sdk)  # a few hundred ms the first time: off the loop
    provider = A2AProvider(spec)
    await provider.start()
    return provider


def _import_sdk() -> None:
    import a2a.client  # noqa: F401


@attrs.define
class _Progress:
    """What the events of one remote task have said so far."""

    task_id: str = ""
    context_id: str = ""
    state: int = 0
    artifacts: dict[str, list[Any]] = attrs.field(factory=dict)
    status_message: Any = None
    reply: Any = None
    """A direct ``Message`` answer (no task)."""

    def absorb(self, event: Any) -> None:
        kind = event.WhichOneof("payload")
        if kind == "task":
            self.take_task(event.task)
        elif kind == "status_update":
            update = event.status_update
            self.task_id = update.task_id or self.task_id
            self.context_id = update.context_id or self.context_id
            self.take_status(update.status)
        elif kind == "artifact_update":
            artifact = event.artifact_update.artifact
            parts = self.artifacts.setdefault(artifact.artifact_id, [])
            if not event.artifact_update.append:
                parts.clear()
            parts.extend(artifact.parts)
        elif kind == "message":
            self.reply = event.message
            self.context_id = event.message.context_id or self.context_id

    def take_task(self, task: Any) -> None:
        self.task_id, self.context_id = task.id, task.context_id
        self.artifacts = {a.artifact_id: list(a.parts) for a in task.artifacts}
        self.take_status(task.status)

    def take_status(self, status: Any) -> None:
        self.state = status.state
        if status.HasField("message"):
            self.status_message = status.message

    @property
    def settled(self) -> bool:
        """Ended, or waiting for the caller (input or auth): nothing more will come."""
        from a2a.types import a2a_pb2 as pb

        return self.reply is not None or self.state in (
            pb.TASK_STATE_COMPLETED,
            pb.TASK_STATE_FAILED,
            pb.TASK_STATE_CANCELED,
            pb.TASK_STATE_REJECTED,
            pb.TASK_STATE_INPUT_REQUIRED,
            pb.TASK_STATE_AUTH_REQUIRED,
        )


class A2AProvider:
    """One remote agent opened for one entity: its gate, its client, its context."""

    def __init__(self, spec: A2AAgent) -> None:
        self.spec = spec
        self.gates: tuple[Gate, ...] = ()
        self.card: Any = None
        self.context_id = ""
        """The remote conversation this entity's calls continue."""
        self.waiting_task = ""
        """A remote task that asked for input: the next call answers it."""
        self._http: httpx.AsyncClient | None = None
        self._client: Any = None
        self._streaming = False

    async def start(self) -> None:
        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
        from a2a.utils.errors import A2AError

        self._http = httpx.AsyncClient(headers=dict(self.spec.headers), timeout=self.spec.timeout_s)
        try:
            with trio.fail_after(self.spec.startup_timeout_s):
                self.card = await A2ACardResolver(self._http, self.spec.url).get_agent_card()
        except (A2AError, httpx.HTTPError, trio.TooSlowError) as exc:
            await self.aclose()
            reason = (
                f"no Agent Card within {self.spec.startup_timeout_s:g}s"
                if isinstance(exc, trio.TooSlowError)
                else str(exc) or type(exc).__name__
            )
            raise ProviderStartError(
                self.scrub(f"A2A agent {self.spec.name!r} ({self.where}) did not start: {reason}")
            ) from None
        self._streaming = bool(self.card.capabilities.streaming)
        config = ClientConfig(
            streaming=self._streaming, polling=not self._streaming, httpx_client=self._http
        )
        self._client = ClientFactory(config).create(self.card)
        self.gates = (self._gate(),)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            client, self._client = self._client, None
            if client is not None:
                await client.close()
            http, self._http = self._http, None
            if http is not None:
                await http.aclose()

    @property
    def where(self) -> str:
        return str(self.spec.describe()["target"])

    def scrub(self, text: str) -> str:
        """``text`` without the spec's header values (credentials) or known secrets."""
        for value in self.spec.headers.values():
            if len(value) >= 4:
                text = text.replace(value, "[REDACTED]")
        return redact(text)

    def _gate(self) -> Gate:
        card = self.card
        skills = "; ".join(f"{s.name}: {s.description}" for s in card.skills)
        description = (
            f"Delegate to the remote agent {card.name or self.spec.name!r} (A2A): "
            f"{card.description}".strip()
            + (f" Skills: {skills}." if skills else "")
            + " Send it a message; its answer comes back. Calls continue one conversation;"
            " when it asks a question, call again with the answer."
        )

        async def delegate(message: str) -> GateResult:
            return await self.call(message)

        return Gate(
            name=self.spec.name,
            fn=delegate,
            description=description,
            args_model=_Arguments,
            parameters=_Arguments.model_json_schema(),
        )

    async def call(self, text: str) -> GateResult:
        """Send ``text`` to the remote agent and wait for its task to settle."""
        import httpx
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import A2AError

        progress = _Progress()
        detail: dict[str, Any] = {"via": f"a2a:{self.spec.name}", "url": self.where}
        if self._client is None:
            return GateResult(f"A2A agent {self.spec.name!r} is closed", detail, is_error=True)
        message = pb.Message(
            message_id=uuid.uuid4().hex,
            role=pb.ROLE_USER,
            parts=[pb.Part(text=text)],
            context_id=self.context_id,
            task_id=self.waiting_task,
        )
        self.waiting_task = ""
        request = pb.SendMessageRequest(message=message)
        failure: list[BaseException] = []
        known = trio.Event()  # the remote task's id is known
        finished = trio.Event()
        reader = trio.CancelScope(shield=True)

        async def read() -> None:
            # Shielded: a cancel of the call must not cut the stream before it has
            # told us which remote task to cancel; the call cancels it when done.
            with reader:
                try:
                    await self._follow(request, progress, known)
                except (A2AError, httpx.HTTPError) as exc:
                    failure.append(exc)
                finally:
                    finished.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            try:
                with trio.move_on_after(self.spec.timeout_s) as timer:
                    await finished.wait()
            finally:
                if not finished.is_set():  # cancelled or out of time: cancel the remote task
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(CANCEL_GRACE_S):
                            await known.wait()
                        reader.cancel()
                        if progress.task_id:
                            await self._cancel_remote(progress.task_id)
        detail.update(self._ids(progress))
        if failure:
            exc = failure[0]
            reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            return GateResult(
                self.scrub(f"A2A agent {self.spec.name!r} failed: {type(exc).__name__}: {reason}"),
                detail,
                is_error=True,
            )
        if timer.cancelled_caught:
            return GateResult(
                f"A2A agent {self.spec.name!r} did not finish within {self.spec.timeout_s:g}s; "
                "its task was cancelled",
                detail,
                is_error=True,
            )
        return self._result(progress, detail)

    async def _follow(self, request: Any, progress: _Progress, known: trio.Event) -> None:
        """The task's events until it settles: streamed, or polled with ``GetTask``;
        ``known`` is set once the remote task's id is."""
        from a2a.types import a2a_pb2 as pb

        async for event in self._client.send_message(request):
            progress.absorb(event)
            if progress.task_id or progress.reply is not None:
                self.context_id = progress.context_id or self.context_id
                known.set()
        if self._streaming or progress.settled or not progress.task_id:
            return
        wait = POLL_S[0]
        while not progress.settled:
            await trio.sleep(wait)
            wait = min(wait * 2, POLL_S[1])
            progress.take_task(await self._client.get_task(pb.GetTaskRequest(id=progress.task_id)))

    async def _cancel_remote(self, task_id: str) -> None:
        """``CancelTask`` for a task this call leaves behind (the external-server boundary:
        a remote that cannot be reached is logged, the call's own outcome stands)."""
        import httpx
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import A2AError

        client = self._client
        if client is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE_S) as late:
            try:
                await client.cancel_task(pb.CancelTaskRequest(id=task_id))
            except (A2AError, httpx.HTTPError) as exc:
                log.warning(
                    "A2A agent %r: cancelling task %s failed: %s",
                    self.spec.name,
                    task_id,
                    self.scrub(str(exc)),
                )
        if late.cancelled_caught:
            log.warning("A2A agent %r: cancelling task %s timed out", self.spec.name, task_id)

    def _ids(self, progress: _Progress) -> dict[str, Any]:
        from a2a.types import a2a_pb2 as pb

        out: dict[str, Any] = {"task_id": progress.task_id, "context_id": progress.context_id}
        if progress.state:
            out["state"] = _state(pb, progress.state)
        return out

    def _result(self, progress: _Progress, detail: dict[str, Any]) -> GateResult:
        from a2a.types import a2a_pb2 as pb

        if progress.reply is not None:
            return GateResult(self.scrub(parts_text(progress.reply.parts)), detail)
        said = parts_text(progress.status_message.parts) if progress.status_message else ""
        state = progress.state
        if state == pb.TASK_STATE_COMPLETED:
            answer = "\n".join(parts_text(parts) for parts in progress.artifacts.values())
            return GateResult(self.scrub(answer or said), detail)
        if state in (pb.TASK_STATE_INPUT_REQUIRED, pb.TASK_STATE_AUTH_REQUIRED):
            self.waiting_task = progress.task_id
            need = "input" if state == pb.TASK_STATE_INPUT_REQUIRED else "authorization"
            return GateResult(
                self.scrub(
                    f"the remote agent needs {need}: {said or '(no question given)'} -- call "
                    f"{self.spec.name} again with the reply"
                ),
                detail,
            )
        if progress.settled:
            return GateResult(
                self.scrub(
                    f"the remote task ended {_state(pb, state)}" + (f": {said}" if said else "")
                ),
                detail,
                is_error=True,
            )
        return GateResult(
            f"the remote agent stopped answering before its task settled ({_state(pb, state)})",
            detail,
            is_error=True,
        )


def _state(pb: Any, state: int) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` -> ``input-required`` (the protocol's own words)."""
    name = str(pb.TaskState.Name(state))
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")
