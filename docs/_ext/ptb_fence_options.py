"""The options of the runtime in one table, rendered from :class:`ptb_fence.RuntimeOptions`.

``RuntimeOptions`` is a dataclass: its fields are the options, their defaults are the
defaults, and its docstring's ``Args:`` section describes each one. ``.. ptb-fence-options::``
renders one row per field (name, default, the description's first sentence), so the table
cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Dict, List

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

# "    name (type): text" opens an entry of a Google-style Args section.
_ENTRY = re.compile(r"^(?P<name>\w+)(?: \((?P<type>.*?)\))?:\s*(?P<text>.*)$")
# A description sentence ends with a period before a space, not inside ``literal`` text.
_SENTENCE_END = re.compile(r"(?<=[.])\s+(?=[A-Z`:])")
_DEFAULT = re.compile(r"\s*Default(?:s to)?\b.*$", re.DOTALL)


def descriptions(cls: type) -> "Dict[str, str]":
    """Each argument's description in ``cls``'s ``Args:`` section, joined into one line."""
    doc = inspect.getdoc(cls) or ""
    found: "Dict[str, List[str]]" = {}
    current = None
    in_args = False
    for line in doc.splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if not in_args:
            continue
        if line and not line.startswith(" "):
            break  # the next section (Raises:)
        stripped = line.strip()
        entry = _ENTRY.match(stripped) if line.startswith("    ") and not line.startswith("     ") else None
        if entry:
            current = entry.group("name")
            found[current] = [entry.group("text")]
        elif current is not None and stripped:
            found[current].append(stripped)
    return {name: " ".join(parts) for name, parts in found.items()}


def first_clause(text: str) -> str:
    """``text`` up to its first semicolon outside parentheses and literals."""
    depth = 0
    literal = False
    for index, char in enumerate(text):
        if text.startswith("``", index):
            literal = not literal
        elif not literal and char == "(":
            depth += 1
        elif not literal and char == ")":
            depth -= 1
        elif not literal and depth == 0 and char == ";":
            return text[:index] + "."
    return text


def summary(text: str) -> str:
    """The first clause of ``text``'s first sentence, without its "Default ..." remark."""
    first = first_clause(_SENTENCE_END.split(text, maxsplit=1)[0])
    return _DEFAULT.sub("", first).strip() or text


def default_text(value: Any) -> str:
    """The default as a reader types it."""
    if value is None or isinstance(value, (bool, str)):
        return f"``{value!r}``"
    if isinstance(value, float) and value.is_integer():
        return f"``{int(value)}``"
    if isinstance(value, (int, float)):
        return f"``{value!r}``"
    if inspect.isbuiltin(value) or inspect.isfunction(value):
        return f":func:`{value.__module__}.{value.__qualname__}`"
    if dataclasses.is_dataclass(value):
        return f"``{type(value).__name__}()``"
    return f"``{value!r}``"


def rows() -> "List[List[str]]":
    """(option, default, meaning) for every field of :class:`ptb_fence.RuntimeOptions`."""
    from ptb_fence import RuntimeOptions

    texts = descriptions(RuntimeOptions)
    table = []
    for field in dataclasses.fields(RuntimeOptions):
        if field.name not in texts:
            raise ValueError(
                f"RuntimeOptions.{field.name} has no entry in the class docstring's Args: "
                "section; describe it there"
            )
        table.append([f"``{field.name}``", default_text(field.default), summary(texts[field.name])])
    return table


class OptionsDirective(SphinxDirective):
    """``.. ptb-fence-options::``: the option table."""

    has_content = False

    def run(self) -> "List[nodes.Node]":
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 25 15 60", ""]
        lines += ["   * - option", "     - default", "     - meaning"]
        for name, default, meaning in rows():
            lines += [f"   * - {name}", f"     - {default}", f"     - {meaning}"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="ptb_fence.RuntimeOptions"), 0, container)
        return list(container.children)


def setup(app: Sphinx) -> "Dict[str, Any]":
    app.add_directive("ptb-fence-options", OptionsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
