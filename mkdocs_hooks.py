"""MkDocs hooks: a method page's `<!-- parameters: NAME -->` becomes the table of that
algorithm's parameters, generated from its `Params` schema (the rows `fedflock list --params
NAME` prints), so a page cannot drift from the code."""

from __future__ import annotations

import re
from typing import Any

MARKER = re.compile(r"<!-- parameters: ([a-z_0-9]+) -->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from fedflock.algorithms import ALGORITHMS
    from fedflock.algorithms.describe import markdown_table

    return MARKER.sub(lambda m: markdown_table(ALGORITHMS.get(m.group(1)).Params), markdown)
