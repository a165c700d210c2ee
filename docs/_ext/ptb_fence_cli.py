"""The ``ptb-fence`` command line, rendered from its argparse parsers.

``.. ptb-fence-cli::`` imports :func:`ptb_fence.cli.build_parser` and writes one section per
command: its description, its usage line and its options. The page cannot drift from the
command: a new subcommand or option appears at the next build.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Dict, Iterator, List, Set, Tuple

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

# Section underlines by depth: the page's title uses "=", the directive starts below it.
_UNDERLINES = ("-", "~", "^")


_LONG_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z_-]*)")


def escape(text: str) -> str:
    """Escape reStructuredText markup in argparse help, which is plain text.

    Long options (``--check``) become literals: as plain text, "--" would be typeset as a dash.
    """
    parts = _LONG_OPTION.split(text)
    # split() with one group alternates plain text (even indexes) and options (odd indexes)
    return "".join(
        f"``{part}``" if index % 2 else re.sub(r"([\\`*_|])", r"\\\1", part)
        for index, part in enumerate(parts)
    )


def subcommands(parser: argparse.ArgumentParser) -> "List[Tuple[str, argparse.ArgumentParser]]":
    """The (name, parser) pairs of ``parser``'s subcommands, in the order they were added."""
    found: "List[Tuple[str, argparse.ArgumentParser]]" = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.items())
    return found


def walk(parser: argparse.ArgumentParser, path: "Tuple[str, ...]" = ()) -> Iterator[
    "Tuple[Tuple[str, ...], argparse.ArgumentParser]"
]:
    """Every command below ``parser`` as (words after the program name, parser), depth first."""
    for name, sub in subcommands(parser):
        yield path + (name,), sub
        yield from walk(sub, path + (name,))


def _option_lines(parser: argparse.ArgumentParser, skip: "Set[str]" = frozenset()) -> "List[str]":
    formatter = parser._get_formatter()
    lines: "List[str]" = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if skip.intersection(action.option_strings):
            continue  # a global option, listed once at the top
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = " " + formatter._format_args(action, action.dest.upper())
            term = ", ".join(f"{flag}{metavar}" for flag in action.option_strings)
        else:
            term = formatter._format_args(action, action.dest)
        help_text = formatter._expand_help(action) if action.help else ""
        if not help_text and not action.option_strings:
            continue  # a bare positional (CALL_ID): the usage line shows it
        lines.append(f"``{term}``")
        lines.append(f"   {escape(' '.join(help_text.split())) or '(a flag)'}")
        lines.append("")
    return lines


def global_options(parser: argparse.ArgumentParser) -> "Set[str]":
    """The option strings every command takes (``--store``, ``--table``, ...), help aside."""
    return {
        flag
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for flag in action.option_strings
    }


def render(parser: argparse.ArgumentParser, depth: int) -> "List[str]":
    """The reStructuredText of every command below ``parser``, sections from ``depth`` on."""
    skip = global_options(parser)
    lines: "List[str]" = []
    for path, sub in walk(parser):
        title = f"``{parser.prog} {' '.join(path)}``"
        level = min(depth + len(path) - 1, len(_UNDERLINES) - 1)
        lines += [title, _UNDERLINES[level] * len(title), ""]
        if sub.description:
            lines += [escape(" ".join(sub.description.split())), ""]
        usage = sub.format_usage().strip()
        lines += [".. code-block:: text", "", *(f"   {line}" for line in usage.splitlines()), ""]
        lines += _option_lines(sub, skip)
    return lines


class CliDirective(SphinxDirective):
    """``.. ptb-fence-cli::``: the global options, then every command and its options."""

    has_content = False

    def run(self) -> "List[nodes.Node]":
        from ptb_fence.cli import build_parser

        parser = build_parser()
        lines = ["Global options", _UNDERLINES[0] * len("Global options"), ""]
        lines += [escape(" ".join((parser.description or "").split())), ""]
        lines += [".. code-block:: text", "", f"   {parser.format_usage().strip()}", ""]
        lines += _option_lines(parser)
        lines += ["Every command takes these options, before or after its name.", ""]
        lines += render(parser, 0)
        container = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source="ptb_fence.cli"), container)
        return list(container.children)


def setup(app: Sphinx) -> "Dict[str, Any]":
    app.add_directive("ptb-fence-cli", CliDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
