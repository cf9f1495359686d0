"""A remote A2A agent built with the official a2a-sdk (its DefaultRequestHandler,
task store and Starlette routes, under uvicorn on asyncio): what a cantrip circle
delegates to in tests/test_a2a_gate.py. It binds 127.0.0.1 on a free port and
prints the port; it writes what it was asked and cancelled to $A2A_LOG.

Messages: ``slow`` works for a minute (until cancelled); ``ask`` needs input (the
follow-up completes the task); ``fail`` fails; anything else is echoed back.
With $A2A_TOKEN set, every request needs ``Authorization: Bearer $A2A_TOKEN``."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as pb
from starlette.applications import Starlette
from starlette.responses import JSONResponse

LOG = os.environ.get("A2A_LOG")
TOKEN = os.environ.get("A2A_TOKEN")


def log(line: str) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class Agent(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        log(f"asked {task.id} {task.context_id} {text}")
        if task.status.state == pb.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([new_text_part(f"booked for {text}")], name="answer")
            await updater.complete()
            return
        await updater.start_work()
        if text == "slow":
            await asyncio.sleep(60)
            await updater.add_artifact([new_text_part("too late")])
            await updater.complete()
        elif text == "ask":
            await updater.requires_input(updater.new_agent_message([new_text_part("which city?")]))
        elif text == "fail":
            await updater.failed(updater.new_agent_message([new_text_part("no seats left")]))
        else:
            await updater.add_artifact([new_text_part(f"echo: {text}")], name="answer")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        log(f"cancel {context.task_id}")
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def app(port: int) -> Starlette:
    card = pb.AgentCard(
        name="travel",
        description="Books trips for other agents.",
        version="1.0.0",
        supported_interfaces=[
            pb.AgentInterface(
                url=f"http://127.0.0.1:{port}/",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=pb.AgentCapabilities(streaming=os.environ.get("A2A_STREAMING") != "0"),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[pb.AgentSkill(id="book", name="book", description="Book a trip", tags=["t"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Agent(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
    starlette = Starlette(routes=routes)

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if TOKEN and scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await JSONResponse({"error": "unauthorized"}, 401)(scope, receive, send)
                return
        await starlette(scope, receive, send)

    return guarded  # type: ignore[return-value]


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app(port), log_level="warning", lifespan="off")
    print(port, flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
