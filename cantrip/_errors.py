"""The exceptions a user of cantrip can see.

The error model (SPEC.md, "Errors") has three kinds of failure:

* Failures *inside* the loop -- a gate that raises, bad gate arguments, a
  child entity that fails -- never appear here. They become observations with
  ``is_error=True`` and the entity reads them on its next turn.
* Failures of *input* -- an invalid cantrip, a missing intent, mutating an
  identity, deleting from the loom, an invalid LLM response -- raise one of the
  :class:`CantripError` subclasses below with a message written for the person
  who has to fix it.
* Bugs in the runtime itself are not caught anywhere: they crash the entity's
  task to its supervisor.
"""

from __future__ import annotations


class CantripError(Exception):
    """Base class of every error cantrip raises on purpose."""


class ConstructionError(CantripError, ValueError):
    """A cantrip, circle, gate or spec document is invalid.

    ``problems`` lists every problem found, so a user fixes them in one pass;
    the message joins them.
    """

    def __init__(self, problems: str | list[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class IntentError(CantripError, ValueError):
    """A cast was attempted without a usable intent (INTENT-1)."""


class ImmutableError(CantripError, AttributeError):
    """Something immutable was mutated (an identity, IDENTITY-1)."""


class LoomAppendOnlyError(CantripError):
    """A turn was to be deleted or modified (LOOM-3)."""


class LoomError(CantripError, LookupError):
    """A loom lookup failed (unknown turn or entity id, bad index)."""


class CastSuspended(CantripError):
    """The cast stopped at a turn boundary because :meth:`Entity.suspend` asked it to.

    Nothing records its stop: its turns so far are in the loom, as after a crash, and
    ``resume_cast`` continues it from there (a worker handing its casts back at
    shutdown). Not a failure of the cast."""


class LLMError(CantripError):
    """The LLM could not give a usable answer for a turn.

    Raised after retries are spent. It ends the cast (the final turn is
    recorded as truncated with reason ``llm_error``); a child entity that ends
    this way returns an ``is_error`` result to its parent.
    """


class ProviderError(LLMError):
    """A provider answered with an error status or could not be reached.

    ``status`` is the HTTP status code when there is one; ``retryable`` says
    whether the retry policy may try again.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.retryable = retryable

    def __str__(self) -> str:
        if self.status is not None:
            return f"provider error {self.status}: {self.message}"
        return self.message


class InvalidResponseError(LLMError):
    """The LLM's response breaks the LLM contract (LLM-3, LLM-4, LLM-7)."""


class ScriptExhaustedError(LLMError):
    """A scripted LLM was queried more often than it has responses.

    It never invents an answer: the test or example that scripted it is wrong.
    """


class ChildCrashedError(Exception):
    """A child entity crashed with a runtime bug (not a gate's fault, not its LLM's).

    Deliberately not a :class:`CantripError` and not turned into an observation:
    it passes through the parent's gate-call boundary, ends the parent's cast as
    ``crashed`` and reaches the parent's supervisor
    (SPEC.md "Supervision model": runtime bugs crash).
    The child's own exception is its ``__cause__``.
    """
