"""A.1 Query -- one round-trip with the LLM. No loop, no circle, no entity.

    python examples/grimoire/01_query.py [--offline]

What to notice: the response holds content and token usage, nothing else; no
state was created (LLM-1). Asked a follow-up on its own, the LLM cannot know
what came before -- everything it knows arrives in the request. And a reply
with neither text nor tool calls is refused (LLM-3).
"""

from __future__ import annotations

import trio
from _grimoire import choose_llm

from cantrip import InvalidResponseError, Message

# The LLM: a model behind one call, llm.query(messages) -> Response (spec 2.1).
# Offline it replays these three answers; the third is deliberately empty.
llm = choose_llm(
    [
        {"content": "2 + 2 = 4.", "usage": {"prompt_tokens": 14, "completion_tokens": 7}},
        {
            "content": "I don't know what you asked before: I only see this message.",
            "usage": {"prompt_tokens": 12, "completion_tokens": 14},
        },
        {},  # neither content nor tool calls
    ]
)


async def main() -> None:
    # One query: a list of messages in, one normalized Response out.
    question = [Message(role="user", content="What is 2 + 2?")]
    response = await llm.query(question)
    print("content:", response.content)
    print("usage:  ", response.usage.to_dict())

    # A second query without the first in its messages: the LLM is stateless
    # (LLM-1), so it cannot know the first question. Memory is the caller's job --
    # in a cantrip, the entity's context.
    follow_up = [Message(role="user", content="What did I just ask you?")]
    print("follow-up without context:", (await llm.query(follow_up)).content)

    # The non-happy path: an empty reply is not a response (LLM-3). The entity
    # loop calls validate() on every response and ends the cast on this error.
    empty = await llm.query([Message(role="user", content="Say nothing at all.")])
    try:
        empty.validate()
        print("a real model answered anyway:", empty.content)
    except InvalidResponseError as error:
        print("refused:", error)

    print("\n--- the loom recorded: nothing -- a query creates no entity and no turn ---")


if __name__ == "__main__":
    trio.run(main)
