"""The store contract's capability table, rendered from ``CAPABILITY_GROUPS``.

``ptb_fence.contract.CAPABILITY_GROUPS`` is data: each group has its name, the methods it
needs (per operation, the forms that provide it), what the runtime does with it and the
groups it requires. ``.. ptb-fence-capabilities::`` renders one row per group, so the table
cannot drift from the contract.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def plain(text: str) -> str:
    """``text`` with reStructuredText markup characters escaped."""
    return re.sub(r"([\\`*_|])", r"\\\1", text)


def rows() -> "List[List[str]]":
    """(capability, methods, what it gives) for every group, in the contract's order."""
    from ptb_fence.contract import CAPABILITY_GROUPS

    table = []
    for group in CAPABILITY_GROUPS:
        methods = ", ".join(" | ".join(f"``{form}``" for form in forms) for forms in group.needs)
        gives = plain(group.feature)
        if group.requires:
            gives += f" (with {', '.join(f'``{name}``' for name in group.requires)})"
        table.append([f"``{group.name}``", methods, gives])
    return table


class CapabilitiesDirective(SphinxDirective):
    """``.. ptb-fence-capabilities::``: the capability table."""

    has_content = False

    def run(self) -> "List[nodes.Node]":
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 20 40 40", ""]
        lines += ["   * - capability", "     - methods (all of them)", "     - what it gives"]
        for name, methods, gives in rows():
            lines += [f"   * - {name}", f"     - {methods}", f"     - {gives}"]
        container = nodes.container()
        source = StringList(lines, source="ptb_fence.contract.CAPABILITY_GROUPS")
        self.state.nested_parse(source, 0, container)
        return list(container.children)


def setup(app: Sphinx) -> "Dict[str, Any]":
    app.add_directive("ptb-fence-capabilities", CapabilitiesDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
