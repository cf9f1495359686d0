"""MkDocs hooks: the reference pages that are generated from the code, so they cannot drift.

A page holds a marker comment and the build puts the generated Markdown in its place:

- ``<!-- generated: cli -->``: every ``cantrip`` command and option, from the argparse
  parser the command itself uses;
- ``<!-- generated: spec -->``: every spec-file table and key, from the pydantic models
  that validate a spec file;
- ``<!-- generated: http -->``: every route and schema of ``cantrip serve``, from the
  OpenAPI document the server publishes at ``/openapi.json`` (also written to the site
  as ``reference/openapi.json``);
- ``<!-- generated: guides -->``: every page of the site's navigation, section by
  section, so the home page lists every guide (a page added to ``mkdocs.yml`` appears).

``tests/test_docs.py`` builds the site with ``mkdocs build --strict`` and checks that
each marker was replaced.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any

MARKERS = ("cli", "spec", "http", "guides")


def on_page_markdown(markdown: str, *, config: Any = None, **_: Any) -> str:
    """Replace each marker with its generated Markdown."""
    for name in MARKERS:
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            text = guides_markdown(config["nav"]) if name == "guides" else GENERATORS[name]()
            markdown = markdown.replace(marker, text)
    return markdown


def guides_markdown(nav: list[Any]) -> str:
    """One bullet per section of the navigation, linking each of its pages by title
    (links relative to the site's root, where the home page is)."""
    lines = []
    for entry in nav:
        if not isinstance(entry, dict):
            continue
        ((section, pages),) = entry.items()
        if not isinstance(pages, list):
            continue
        links = [
            f"[{title}]({path})"
            for page in pages
            if isinstance(page, dict)
            for title, path in page.items()
        ]
        lines.append(f"- **{section}**: " + ", ".join(links) + ".")
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """Publish the OpenAPI document beside the HTTP reference page."""
    from mkdocs.structure.files import File

    from cantrip.protocols.asgi._openapi import openapi_document

    content = json.dumps(openapi_document(), indent=2)
    files.append(File.generated(config, "reference/openapi.json", content=content))
    return files


# -- the command line -------------------------------------------------------------------


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_commands(sub, (*path, name)))
    return found


def cli_markdown() -> str:
    """Every command: its description, usage, arguments and options."""
    from cantrip.cli._parser import build_parser

    out: list[str] = []
    for path, parser in _commands(build_parser()[0]):
        title = " ".join(("cantrip", *path))
        out.append(f"## `{title}`\n")
        if parser.description:
            out.append(parser.description.strip() + "\n")
        out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
        rows = []
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = ", ".join(action.option_strings) or (action.metavar or action.dest)
            if action.option_strings and action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
            default = action.default
            shown = (
                ""
                if default in (None, False, [], argparse.SUPPRESS) or not action.option_strings
                else f"`{default}`"
            )
            rows.append(f"| `{_cell(str(name))}` | {_cell(action.help)} | {shown} |")
        if rows:
            out.append("| argument | what it does | default |\n| --- | --- | --- |")
            out.extend(rows)
            out.append("")
        if parser.epilog:
            out.append("```text\n" + parser.epilog.strip() + "\n```\n")
    return "\n".join(out)


# -- spec files -------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return (
            "table" if origin is dict else "array of " + _type_name(typing.get_args(annotation)[0])
        )
    if isinstance(annotation, type):
        return {
            "str": "string",
            "int": "integer",
            "float": "number",
            "bool": "boolean",
            "Any": "any",
        }.get(annotation.__name__, f"table ({annotation.__name__})")
    return "any"


def spec_markdown() -> str:
    """Every table of a spec file and its keys, from the models that validate them."""
    from pydantic import BaseModel

    from cantrip.spec import SpecDocument

    out: list[str] = []
    seen: set[type[BaseModel]] = set()

    def table(title: str, model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        doc = " ".join((model.__doc__ or "").split())
        out.append(f"### `{title}`\n")
        if doc and not doc.startswith(model.__name__ + "("):
            out.append(doc.replace("``", "`") + "\n")
        out.append("| key | type | default |\n| --- | --- | --- |")
        nested: list[tuple[str, type[BaseModel]]] = []
        for name, field in model.model_fields.items():
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(
                "test_double"
            ):
                continue  # docs/reference/test-doubles.md
            key = field.alias or name
            default = "" if field.is_required() else field.get_default(call_default_factory=True)
            shown = "required" if field.is_required() else f"`{json.dumps(default)}`"
            if default is None:
                shown = ""
            out.append(f"| `{key}` | {_type_name(field.annotation)} | {shown} |")
            for arg in (field.annotation, *typing.get_args(field.annotation)):
                for inner in (arg, *typing.get_args(arg)):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        nested.append((f"{title}.{key}" if title != "[llms.NAME]" else key, inner))
        out.append("")
        for sub_title, sub in nested:
            table(sub_title, sub)

    scalars = [
        (name, field)
        for name, field in SpecDocument.model_fields.items()
        if not any(
            isinstance(a, type) and issubclass(a, BaseModel)
            for a in (field.annotation, *typing.get_args(field.annotation))
        )
        and name != "llms"
    ]
    if scalars:
        out.append("### Top-level keys\n\n| key | type | what |\n| --- | --- | --- |")
        for name, field in scalars:
            what = " ".join((field.description or "").split())
            out.append(f"| `{name}` | {_type_name(field.annotation)} | {what} |")
        out.append("")
    for name, field in SpecDocument.model_fields.items():
        annotation = field.annotation
        models = [
            a for a in (annotation, *typing.get_args(annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]  # fmt: skip
        if name == "llms":
            out.append(
                "### `[llms.NAME]`\n\nNamed LLMs, each an `[llm]` table (below), for "
                "`[folding] folder_llm`, `loom fork --llm` and delegation.\n"
            )
            continue
        for model in models:
            table(f"[{name}]", model)
    return "\n".join(out)


# -- HTTP -------------------------------------------------------------------------------


def _ref(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array":
        return "array of " + _ref(schema.get("items", {}))
    if "anyOf" in schema:
        return " or ".join(_ref(s) for s in schema["anyOf"])
    return f"`{schema.get('type', 'any')}`"


def http_markdown() -> str:
    """Every route (summary, body, responses) and every schema, from the OpenAPI document."""
    from cantrip.protocols.asgi._openapi import openapi_document

    document = openapi_document()
    out: list[str] = ["## Routes\n"]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            if method == "parameters":
                continue
            out.append(f"### `{method.upper()} {path}`\n")
            out.append(_cell(op.get("summary")) + "\n")
            if op.get("description"):
                out.append(op["description"].strip() + "\n")
            body = (op.get("requestBody") or {}).get("content", {})
            for media, content in body.items():
                out.append(f"Body (`{media}`): {_ref(content.get('schema', {}))}\n")
            params = [p for p in op.get("parameters", []) if p.get("in") in ("query", "header")]
            if params:
                out.append("| parameter | in | what it does |\n| --- | --- | --- |")
                for p in params:
                    out.append(f"| `{p['name']}` | {p['in']} | {_cell(p.get('description'))} |")
                out.append("")
            out.append("| status | meaning |\n| --- | --- |")
            for status, response in sorted(op.get("responses", {}).items()):
                out.append(f"| {status} | {_cell(response.get('description'))} |")
            out.append("")
    out.append("## Schemas\n")
    for name, schema in document["components"]["schemas"].items():
        out.append(f"### {name}\n")
        if schema.get("description"):
            out.append(_cell(schema["description"]) + "\n")
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out.append("| field | type | required | description |\n| --- | --- | --- | --- |")
            for field, spec in props.items():
                out.append(
                    f"| `{field}` | {_ref(spec)} | {'yes' if field in required else ''} "
                    f"| {_cell(spec.get('description'))} |"
                )
            out.append("")
    return "\n".join(out)


GENERATORS = {"cli": cli_markdown, "spec": spec_markdown, "http": http_markdown}
