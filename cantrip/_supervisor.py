"""OTP-style supervision on trio: restart strategies, restart types, intensity.

A :class:`Supervisor` runs child tasks in its own nursery -- the supervision
tree *is* the nursery tree -- and is the one place where an unexpected
exception of a child is caught: it is logged with its traceback, and the
child is restarted according to its restart type and the strategy:

* restart types -- ``permanent`` (always restarted), ``transient`` (restarted
  only after a crash), ``temporary`` (never restarted);
* strategies -- ``one_for_one`` (only the crashed child restarts) and
  ``one_for_all`` (all children are stopped and started again);
* intensity -- more than ``max_restarts`` restarts within ``period_s``
  seconds and the supervisor gives up: it stops its children and raises
  :class:`SupervisorEscalation` to *its* parent, exactly as OTP escalates.

Retries inside a turn never reach the supervisor, so they never count as
restarts. :meth:`Supervisor.stop` is an orderly shutdown: ``stopping`` is set
so children can finish what they are doing, and whatever still runs after the
grace period is cancelled (and, for entities, recorded as cancelled).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from cantrip._errors import CantripError
from cantrip._redact import get_logger

log = get_logger("cantrip.supervisor")


class Restart(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(enum.Enum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"


class SupervisorEscalation(CantripError):
    """Restart intensity was exceeded; the supervisor failed upward."""


ChildMain = Callable[["Supervisor"], Awaitable[None]]


@attrs.frozen
class ChildSpec:
    """One supervised child: an id, an async main taking the supervisor, a restart type."""

    id: str
    main: ChildMain
    restart: Restart = Restart.PERMANENT


@attrs.frozen
class Exit:
    child_id: str
    generation: int
    error: BaseException | None


class Supervisor:
    """Supervises children; run it with ``await supervisor.run()`` inside a nursery."""

    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = 3,
        period_s: float = 5.0,
        name: str = "supervisor",
    ) -> None:
        ids = [c.id for c in children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"child ids must be unique: {ids}")
        self.children = list(children)
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.period_s = period_s
        self.name = name
        self.stopping = trio.Event()
        self.restarts: dict[str, int] = {c.id: 0 for c in children}
        self.crashes: list[tuple[str, BaseException]] = []
        self._history: deque[float] = deque()
        self._scopes: dict[str, trio.CancelScope] = {}
        self._generation: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None
        self._send, self._receive = trio.open_memory_channel[Exit](math.inf)

    async def run(self) -> None:
        """Run until every child is finished for good, or escalate."""
        escalation: SupervisorEscalation | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for spec in self.children:
                self._start(spec)
            try:
                await self._supervise()
            except SupervisorEscalation as exc:
                escalation = exc  # raised below, once the children are stopped
            finally:
                for scope in self._scopes.values():
                    scope.cancel()
                self._nursery = None
        if escalation is not None:
            raise escalation

    def stop(self, grace_s: float = 5.0) -> None:
        """Orderly shutdown: ask children to finish, cancel them after ``grace_s``."""
        self.stopping.set()
        deadline = trio.current_time() + grace_s
        for scope in self._scopes.values():
            scope.deadline = min(scope.deadline, deadline)

    # -- internals -------------------------------------------------------------

    def _start(self, spec: ChildSpec) -> None:
        assert self._nursery is not None
        generation = self._generation.get(spec.id, -1) + 1
        self._generation[spec.id] = generation
        scope = trio.CancelScope()
        self._scopes[spec.id] = scope
        self._nursery.start_soon(
            self._child, spec, scope, generation, name=f"{self.name}/{spec.id}"
        )

    async def _child(self, spec: ChildSpec, scope: trio.CancelScope, generation: int) -> None:
        error: BaseException | None = None
        with scope:
            try:
                await spec.main(self)
            except Exception as exc:  # the supervision boundary: log, then decide
                error = exc
                log.error("child %s of %s crashed", spec.id, self.name, exc_info=exc)
        self._send.send_nowait(Exit(spec.id, generation, error))

    async def _supervise(self) -> None:
        running = {spec.id for spec in self.children}
        specs = {spec.id: spec for spec in self.children}
        while running:
            event = await self._receive.receive()
            if event.generation != self._generation.get(event.child_id):
                continue  # an exit of a generation we already replaced
            running.discard(event.child_id)
            spec = specs[event.child_id]
            if event.error is not None:
                self.crashes.append((spec.id, event.error))
            if self.stopping.is_set() or not self._should_restart(spec, event.error):
                continue
            self._count_restart(spec, event.error)
            if self.strategy is Strategy.ONE_FOR_ONE:
                self._start(spec)
                running.add(spec.id)
                continue
            # one_for_all: stop the others, then start everyone again.
            others = [specs[i] for i in running]
            for other in others:
                self._scopes[other.id].cancel()
            while running:
                stopped = await self._receive.receive()
                if stopped.generation == self._generation.get(stopped.child_id):
                    running.discard(stopped.child_id)
            for again in [spec, *others]:
                if again.restart is not Restart.TEMPORARY or again is spec:
                    self._start(again)
                    running.add(again.id)

    def _should_restart(self, spec: ChildSpec, error: BaseException | None) -> bool:
        if spec.restart is Restart.PERMANENT:
            return True
        if spec.restart is Restart.TRANSIENT:
            return error is not None
        return False

    def _count_restart(self, spec: ChildSpec, error: BaseException | None) -> None:
        now = trio.current_time()
        self._history.append(now)
        while self._history and self._history[0] < now - self.period_s:
            self._history.popleft()
        if len(self._history) > self.max_restarts:
            raise SupervisorEscalation(
                f"{self.name}: more than {self.max_restarts} restarts in {self.period_s}s "
                f"(last: child {spec.id!r})"
            ) from error
        self.restarts[spec.id] += 1
        log.warning("%s restarts child %s (%d so far)", self.name, spec.id, self.restarts[spec.id])
