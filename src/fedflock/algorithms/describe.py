"""An algorithm's parameters as a user reads them, for `fedflock list --params` and the
method pages of the documentation (both show the same rows, from the `Params` schema)."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel


@dataclass(frozen=True)
class ParameterRow:
    name: str
    kind: str  # `int`, `float | None`, `one of auto|eps`
    default: str  # its repr, or `required`
    description: str


def type_name(annotation: object) -> str:
    """`int`, `float | None`, `one of auto|eps`, `int | auto | None`: a parameter's type as a
    user reads it."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + "|".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("None" if a is type(None) else
                          "|".join(map(str, get_args(a))) if get_origin(a) is Literal else
                          type_name(a) for a in args)
    name = getattr(annotation, "__name__", None)
    return name if name and not args else str(annotation).replace("typing.", "")


def parameter_rows(params: type[BaseModel]) -> list[ParameterRow]:
    """One row per field of a parameter schema, in declaration order."""
    return [ParameterRow(name, type_name(info.annotation),
                         "required" if info.is_required()
                         else repr(info.get_default(call_default_factory=True)),
                         info.description or "")
            for name, info in params.model_fields.items()]


def markdown_table(params: type[BaseModel]) -> str:
    """The rows as a Markdown table (the method pages)."""
    rows = parameter_rows(params)
    if not rows:
        return "No parameters.\n"
    lines = ["| parameter | type | default | what it does |", "|---|---|---|---|"]
    lines += [f"| `{r.name}` | {r.kind.replace('|', '&#124;')} | `{r.default}` | "
              f"{r.description.replace('|', '&#124;')} |" for r in rows]
    return "\n".join(lines) + "\n"
