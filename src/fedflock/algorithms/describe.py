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


def parameter_groups(params: type[BaseModel]) -> list[tuple[str, list[ParameterRow]]]:
    """The rows under what they control (`AlgorithmParams.field_groups`, the class's own groups
    first, then those it inherits), fields in no group last under "other"; one untitled
    group when none is declared."""
    titles: dict[str, list[str]] = {}
    for klass in params.__mro__:
        for title, names in vars(klass).get("field_groups", {}).items():
            titles.setdefault(title, []).extend(names)
    rows = parameter_rows(params)
    if not titles:
        return [("", rows)] if rows else []
    order = {name: i for i, name in enumerate(r.name for r in rows)}
    by_name = {r.name: r for r in rows}
    unknown = sorted(n for names in titles.values() for n in names if n not in by_name)
    if unknown:
        raise ValueError(f"{params.__name__}.field_groups names no field {unknown}")
    out = [(title, [by_name[n] for n in sorted(names, key=order.__getitem__)])
           for title, names in titles.items()]
    grouped = {n for names in titles.values() for n in names}
    rest = [r for r in rows if r.name not in grouped]
    return out + ([("other", rest)] if rest else [])


def markdown_table(params: type[BaseModel]) -> str:
    """The groups as Markdown tables (the method pages)."""
    groups = parameter_groups(params)
    if not groups:
        return "No parameters.\n"
    parts = []
    for title, rows in groups:
        lines = ([f"**{title}**", ""] if title else []) + [
            "| parameter | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| `{r.name}` | {r.kind.replace('|', '&#124;')} | `{r.default}` | "
                  f"{r.description.replace('|', '&#124;')} |" for r in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
