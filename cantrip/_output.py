"""Structured output: the shape a cast's answer must have.

A structured answer is not a new phase of the loop; it is the ``done`` gate's
parameter schema (SPEC.md "Structured output"). :class:`OutputSchema` turns a pydantic model
(or any type pydantic can validate) or a plain JSON Schema into

* the ``answer`` parameter the LLM sees on ``done`` -- the schema itself, so a
  provider can constrain the call and a code medium's ``done(obj)`` is checked
  by the same gate;
* a validator: an answer that does not fit is an ``is_error`` observation with
  the validation message, and the loop goes on (the model can try again);
* a loader: the cast's ``result`` is the parsed value (a model instance), while
  the loom keeps its JSON form so any process can read it back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pydantic

from cantrip._errors import ConstructionError
from cantrip._gate import Gate, GateArgumentError, gate
from cantrip._json_schema import check_meta_schema, compile_schema
from cantrip._reference import import_reference


def _identity(value: Any) -> Any:
    return value


@attrs.frozen(eq=False)
class OutputSchema:
    """What ``done``'s answer must be, and how to read it back."""

    schema: Mapping[str, Any]
    """The JSON Schema of the answer (``$defs`` included)."""
    check: Callable[[Any], Any] = attrs.field(repr=False)
    """Validate an answer: the parsed value, or :class:`GateArgumentError`."""
    dump: Callable[[Any], Any] = attrs.field(default=_identity, repr=False)
    """The parsed value as JSON (what the loom records)."""
    name: str = "output"

    @classmethod
    def of(cls, output: Any) -> OutputSchema:
        """An output schema from a pydantic model / type, a JSON Schema mapping, or itself."""
        if isinstance(output, OutputSchema):
            return output
        if isinstance(output, Mapping):
            return cls.from_json_schema(output)
        return cls.from_type(output)

    @classmethod
    def from_type(cls, output: Any) -> OutputSchema:
        """A pydantic model (or anything ``pydantic.TypeAdapter`` accepts)."""
        try:
            adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output)
            schema = adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
            raise ConstructionError(f"output: {output!r} cannot be a schema ({exc})") from None

        def check(value: Any) -> Any:
            try:
                return adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                raise GateArgumentError(_pydantic_message(exc)) from None

        def dump(value: Any) -> Any:
            return adapter.dump_python(value, mode="json")

        return cls(schema, check, dump, getattr(output, "__name__", "output"))

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any]) -> OutputSchema:
        """A plain JSON Schema: checked against its meta-schema, answers checked by a
        compiled validator that cannot stall the loop (linear-time patterns, no
        retrieval, no ``$ref`` cycles: :mod:`cantrip._json_schema`)."""
        plain = _plain(schema)
        check_meta_schema(plain)
        validator = compile_schema(plain)

        def check(value: Any) -> Any:
            errors = sorted(
                validator.iter_errors(value), key=lambda e: list(map(str, e.instance_path))
            )
            if errors:
                raise GateArgumentError(
                    "the answer does not match the output schema: "
                    + "; ".join(_json_schema_message(e) for e in errors[:5])
                )
            return value

        return cls(plain, check, _identity, str(plain.get("title", "output")))

    @classmethod
    def from_reference(cls, reference: str) -> OutputSchema:
        """``"package.module:Class"``, as a spec file names a model."""
        target = import_reference(reference, "output model", "package.module:Class")
        return cls.from_type(target)

    def parameters(self) -> dict[str, Any]:
        """``done``'s parameter schema: ``{answer: <schema>}`` with ``$defs`` at the root,
        where ``#/$defs/...`` references resolve."""
        answer = dict(self.schema)
        defs = answer.pop("$defs", None)
        parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"answer": answer},
            "required": ["answer"],
            "additionalProperties": False,
        }
        if defs:
            parameters["$defs"] = defs
        return parameters

    def done_gate(self, base: Gate) -> Gate:
        """``base`` (the circle's terminating gate) answering in this schema."""
        check, dump = self.check, self.dump

        def answer_in_schema(answer: Any) -> Any:
            return dump(check(answer))

        description = (
            "Finish the task: call it once, last, with `answer` matching the "
            f"{self.name} schema. An answer that does not match is refused with the "
            "reason, and you can call again."
        )
        return gate(
            name=base.name,
            description=description,
            terminates=True,
            aliases=base.aliases,
            parameters=self.parameters(),
        )(answer_in_schema)

    def load(self, value: Any) -> Any:
        """The recorded JSON answer as the parsed value (a model instance)."""
        return self.check(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "answer"
        problems.append(f"{where}: {error['msg']}")
    return "the answer does not match the output schema: " + "; ".join(problems)


def _json_schema_message(error: Any) -> str:
    where = ".".join(str(part) for part in error.instance_path) or "answer"
    return f"{where}: {error.message}"
