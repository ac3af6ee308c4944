"""What `fedflock list --params` and the method pages show of an algorithm's parameters: every
field once, under what it controls."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import Field

from fedflock.algorithms import ALGORITHMS, AlgorithmParams
from fedflock.algorithms.describe import markdown_table, parameter_groups


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_parameter_is_shown_once(name: str) -> None:
    params = ALGORITHMS.get(name).Params
    shown = [r.name for _, rows in parameter_groups(params) for r in rows]
    assert sorted(shown) == sorted(params.model_fields)


def test_groups_come_subclass_first_extend_inherited_ones_and_leave_the_rest_as_other() -> None:
    class Base(AlgorithmParams):
        field_groups: ClassVar[dict[str, tuple[str, ...]]] = {"shared": ("a",)}
        a: int = Field(1, description="a")
        b: int = Field(2, description="b")

    class Child(Base):
        field_groups: ClassVar[dict[str, tuple[str, ...]]] = {"own": ("c",), "shared": ("d",)}
        c: int = Field(3, description="c")
        d: int = Field(4, description="d")
        e: int = Field(5, description="e")

    assert [(t, [r.name for r in rows]) for t, rows in parameter_groups(Child)] == [
        ("own", ["c"]), ("shared", ["a", "d"]), ("other", ["b", "e"])]
    assert "**own**" in markdown_table(Child) and "| `e` | int | `5` | e |" in markdown_table(Child)

    class Wrong(AlgorithmParams):
        field_groups: ClassVar[dict[str, tuple[str, ...]]] = {"typo": ("nope",)}

    with pytest.raises(ValueError, match="nope"):
        parameter_groups(Wrong)
