"""The LLM judge: a rubric, any configured LLM, a verdict with its reasoning.

The judge is asked through one tool, ``verdict(passed, reasoning)``, so its answer
is structured on every provider that calls tools; an answer without the call is a
failed check that quotes what the judge wrote. Its tokens and cost are its own,
reported apart from the agent's.
"""

from __future__ import annotations

import attrs

from cantrip.evals._evaluators import Check, EvaluatorError, Outcome
from cantrip.llm._contract import LLM, Message, ToolDefinition
from cantrip.llm._cost import response_cost

VERDICT = ToolDefinition(
    name="verdict",
    description="Give your verdict on the answer: whether it meets the rubric, and why.",
    parameters={
        "type": "object",
        "properties": {
            "passed": {"type": "boolean", "description": "true when the answer meets the rubric"},
            "reasoning": {"type": "string", "description": "why, in a few sentences"},
        },
        "required": ["passed", "reasoning"],
        "additionalProperties": False,
    },
)

SYSTEM = (
    "You grade an AI agent's answer against a rubric. Read the task, the answer and "
    "the rubric, then call the verdict tool exactly once."
)


@attrs.frozen
class JudgeVerdict:
    check: Check
    cost_usd: float | None
    tokens: int


async def judge(llm: LLM, rubric: str, outcome: Outcome) -> JudgeVerdict:
    """Ask ``llm`` whether ``outcome`` meets ``rubric``."""
    prompt = (
        f"Task given to the agent:\n{outcome.intent}\n\n"
        f"The agent's answer:\n{outcome.text}\n\n"
        f"Rubric:\n{rubric}"
    )
    response = await llm.query(
        [Message(role="system", content=SYSTEM), Message(role="user", content=prompt)],
        tools=(VERDICT,),
        tool_choice="required",
    )
    cost = response_cost(response, llm)
    tokens = int(response.usage.prompt_tokens + response.usage.completion_tokens)
    calls = [call for call in response.tool_calls if call.name == "verdict"]
    if not calls:
        said = (response.content or "").strip() or "nothing"
        raise EvaluatorError(f"the judge gave no verdict (it wrote {said[:200]!r})")
    args = calls[0].arguments
    passed, reasoning = args.get("passed"), args.get("reasoning", "")
    if not isinstance(passed, bool):
        raise EvaluatorError(f"the judge's verdict has no boolean 'passed' ({dict(args)!r})")
    check = Check(
        "judge",
        passed,
        "" if passed else f"judge: {reasoning}",
        {"reasoning": str(reasoning), "cost_usd": cost, "tokens": tokens},
    )
    return JudgeVerdict(check, cost, tokens)
