"""The documentation site builds with Sphinx, warnings as errors, and is what it says.

One build serves every test here: the reference names every public name, the site's search
finds the everyday questions, intersphinx links go upstream without network, the command
line page lists every command of the parser, and the option table lists every option.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import json
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = (
    "ptb_fence",
    "ptb_fence.ptb",
    "ptb_fence.testing",
    "ptb_fence.conformance",
    "ptb_fence.cli",
    "ptb_fence.chaos",
)
# Modules whose names are documented where ptb_fence re-exports them, or on their own
REEXPORTING_MODULES = (
    "ptb_fence.stores",
    "ptb_fence.runtime",
    "ptb_fence.metrics",
    "ptb_fence.contrib.sqlalchemy",
    "ptb_fence.contrib.django",
)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert result.returncode == 0, f"sphinx -W failed:\n{result.stdout}\n{result.stderr}"
    return out


def _text(page: Path) -> str:
    """A built page's article as plain text (code blocks are split into highlighted spans)."""
    markup = page.read_text(encoding="utf-8")
    start = markup.find("<article")
    article = markup[start:markup.find("</article>", start)] if start >= 0 else markup
    return html.unescape(re.sub(r"<[^>]+>", "", article))


def _documented(build: Path) -> "Dict[str, str]":
    """Each object the site documents, with the page it is on."""
    from sphinx.util.inventory import InventoryFile

    with open(build / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath.join)
    pages: "Dict[str, str]" = {}
    for entries in inventory.values():
        for name, entry in entries.items():
            # the uri is "page.html#anchor"; older Sphinx gives a tuple (project, version, uri, _)
            uri = entry.uri if hasattr(entry, "uri") else entry[2]
            pages[name] = uri.split("#")[0]
    return pages


def test_every_public_name_has_a_reference_entry(built_site: Path) -> None:
    documented = _documented(built_site)
    missing = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if not name.startswith("__") and f"{module}.{name}" not in documented
    ]
    assert missing == [], f"public names missing from docs/reference/*.rst: {missing}"
    import ptb_fence

    missing = [
        f"{module}.{name}"
        for module in REEXPORTING_MODULES
        for name in importlib.import_module(module).__all__
        if f"{module}.{name}" not in documented
        and not (getattr(ptb_fence, name, None) is getattr(importlib.import_module(module), name)
                 and f"ptb_fence.{name}" in documented)
    ]
    assert missing == [], f"public names missing from docs/reference/*.rst: {missing}"


def test_the_user_pages_show_the_public_members_only(built_site: Path) -> None:
    """``Attempt`` shows what a handler calls, not the runtime's plumbing."""
    documented = _documented(built_site)
    attempt = {name.rsplit(".", 1)[1] for name in documented
               if name.startswith("ptb_fence.Attempt.")}
    assert {"outbox", "transaction", "run_in_transaction", "exhaust", "retry_follows"} <= attempt
    assert not attempt & {"begin_settling", "take_effects", "renewed", "mark_owner_lost"}
    # A processor shows what a bot calls, not the hooks PTB calls.
    processor = {name.rsplit(".", 1)[1] for name in documented
                 if name.startswith("ptb_fence.ptb.FencedUpdateProcessor.")}
    assert {"install", "stats", "healthy", "outbox_call"} <= processor
    assert not processor & {"do_process_update", "process_update", "initialize", "shutdown"}
    # The store contract is on the page for store authors, away from the stores a bot uses.
    assert documented["ptb_fence.UpdateStore.claim"] == "reference/store-contract.html"
    assert "ptb_fence.SQLiteUpdateStore.claim_owned" not in documented


def test_every_property_type_on_the_reference_is_a_type(built_site: Path) -> None:
    """A property docstring that opens with "text: more" is read as "type: description".

    Its type field then shows a sentence (\"The update being handled, as the front end has it
    (PTB\"). Such docstrings open with their type, as python-telegram-bot's do.
    """
    sentences = []
    for page in sorted((built_site / "reference").glob("*.html")):
        markup = page.read_text(encoding="utf-8")
        for field in re.findall(r'>Type<span class="colon">:</span></dt>\s*<dd[^>]*>(.*?)</dd>',
                                markup, re.DOTALL):
            text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", field)).split())
            if len(text) > 45 or text.count("(") != text.count(")"):
                sentences.append(f"{page.name}: {text}")
    assert sentences == []


def test_every_error_is_on_the_errors_page_with_what_to_do(built_site: Path) -> None:
    documented = _documented(built_site)
    errors = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if isinstance(getattr(importlib.import_module(module), name), type)
        and issubclass(getattr(importlib.import_module(module), name), Exception)
    ]
    assert len(errors) >= 10
    assert {error: documented.get(error) for error in errors} == {
        error: "reference/errors.html" for error in errors
    }
    page = _text(built_site / "reference" / "errors.html")
    assert page.count("What to do:") == len(errors)


def _search(build: Path, word: str) -> "Set[str]":
    """The pages Sphinx's own search finds for ``word``, read from the built searchindex.js."""
    from sphinx.search.en import SearchEnglish

    text = (build / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    stem = SearchEnglish({}).stem(word.lower())
    found: "Set[str]" = set()
    for table in ("terms", "titleterms"):
        hits = index[table].get(stem, [])
        found.update(index["docnames"][hit] for hit in ([hits] if isinstance(hits, int) else hits))
    return found


@pytest.mark.parametrize(("words", "page"), [
    (("monitoring",), "howto/monitoring"),
    (("reply", "outbox"), "tutorial/02-replies-through-the-outbox"),
    (("two", "processes"), "howto/several-processes-and-webhooks"),
    (("migrate", "PicklePersistence"), "howto/migrate-picklepersistence"),
    (("Prometheus",), "howto/monitoring"),
    (("strict_chat_order",), "reference/options"),
    (("recovery",), "explanation/recovery"),
    (("reminder",), "howto/durable-jobs"),
    (("broadcast",), "howto/broadcasts"),
    (("charge", "card"), "howto/payments-and-outside-apis"),
])
def test_the_search_finds_the_page(built_site: Path, words: "Tuple[str, ...]", page: str) -> None:
    """Sphinx's search shows the pages that have every word of the query."""
    found = set.intersection(*(_search(built_site, word) for word in words))
    assert page in found


def test_the_sidebar_shows_the_four_sections_and_every_page(built_site: Path) -> None:
    markup = (built_site / "index.html").read_text(encoding="utf-8")
    # furo's sidebar comes before the page's article
    sidebar = markup[markup.index('class="sidebar-tree"'):markup.index("<article")]
    captions = re.findall(r'<span class="caption-text">(.*?)</span>', sidebar)
    assert captions == ["Tutorial", "How-to guides", "Reference", "Explanation", "Project"]
    pages = {str(path.relative_to(built_site)) for path in built_site.glob("*/*.html")
             if path.parent.name in ("tutorial", "howto", "reference", "explanation")}
    assert len(pages) >= 35
    linked = set(re.findall(r'href="([a-z]+/[^"#]+\.html)"', sidebar))
    assert pages - linked == set()


def test_the_everyday_questions_are_one_click_from_the_index(built_site: Path) -> None:
    markup = (built_site / "index.html").read_text(encoding="utf-8")
    tasks = markup[markup.index('id="common-tasks"'):]
    tasks = tasks[:tasks.index("</section>")]
    for page in ("tutorial/02-replies-through-the-outbox.html",
                 "howto/several-processes-and-webhooks.html",
                 "howto/migrate-picklepersistence.html", "howto/monitoring.html",
                 "howto/durable-jobs.html", "howto/broadcasts.html",
                 "howto/payments-and-outside-apis.html"):
        assert f'href="{page}"' in tasks, page


def test_intersphinx_links_go_upstream_without_network(built_site: Path) -> None:
    """docs/_inventories/*.inv stand in for the upstream inventories (CI has no network)."""
    pages = "".join(path.read_text(encoding="utf-8")
                    for path in (built_site / "reference").glob("*.html"))
    for url in (
        "https://docs.python-telegram-bot.org/en/v22.x/telegram.ext.application.html"
        "#telegram.ext.Application",
        "https://docs.python.org/3/library/datetime.html#datetime.timedelta",
        "https://www.psycopg.org/docs/pool.html#psycopg2.pool.ThreadedConnectionPool",
        "https://docs.sqlalchemy.org/en/20/core/connections.html#sqlalchemy.engine.Engine",
    ):
        assert f'href="{url}"' in pages, url


def _commands(parser: argparse.ArgumentParser, path: "Tuple[str, ...]" = ()) -> Iterator[
    "Tuple[Tuple[str, ...], argparse.ArgumentParser]"
]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from _commands(sub, path + (name,))


def test_the_cli_page_lists_every_command_and_option(built_site: Path) -> None:
    from ptb_fence.cli import build_parser

    page = _text(built_site / "reference" / "cli.html")
    commands = list(_commands(build_parser()))
    assert len(commands) >= 18
    for path, parser in commands:
        section = f"ptb-fence {' '.join(path)}"
        assert f"{section}¶" in page, section
        assert f"usage: {section}" in page, section
        body = page.split(f"{section}¶", 1)[1]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert flag in body, f"{section} {flag}"


def test_the_option_table_lists_every_option_the_processors_take(built_site: Path) -> None:
    from ptb_fence import MemoryUpdateStore, RuntimeOptions, UpdateIntake
    from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor

    page = _text(built_site / "reference" / "options.html")
    table = page[page.index("meaning"):]
    rows: "List[str]" = [line.strip() for line in table.splitlines() if line.strip()]
    fields = dataclasses.fields(RuntimeOptions)
    for field in fields:
        assert field.name in rows, field.name
        default = rows[rows.index(field.name) + 1]
        if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
            assert float(default) == field.default, field.name
        elif field.default is None or isinstance(field.default, (bool, str)):
            assert default == repr(field.default), field.name
    # Every option in the table is a keyword the front ends take, and nothing else is.
    options = {field.name: getattr(RuntimeOptions(), field.name) for field in fields}
    with MemoryUpdateStore() as store:
        for front_end in (FencedUpdateProcessor, DurableUpdateProcessor):
            assert front_end(store, **options).runtime.options == RuntimeOptions(**options)
            with pytest.raises(TypeError, match="valid options are"):
                front_end(store, not_an_option=1)
        intake = UpdateIntake(store, handle=lambda update: None, **options)
        assert intake.options == RuntimeOptions(**options)
        with pytest.raises(TypeError, match="valid options are"):
            UpdateIntake(store, handle=lambda update: None, not_an_option=1)


def test_the_store_contract_page_lists_every_capability_with_its_methods(
    built_site: Path,
) -> None:
    from ptb_fence.contract import CAPABILITY_GROUPS

    markup = (built_site / "reference" / "store-contract.html").read_text(encoding="utf-8")
    table = markup[markup.index('id="capabilities"'):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<td>(.*?)</td>", row, re.DOTALL)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.DOTALL)]
    assert [row[0] for row in rows] == [group.name for group in CAPABILITY_GROUPS]
    for row, group in zip(rows, CAPABILITY_GROUPS):
        assert re.findall(r"[a-z_]+", row[1]) == list(group.methods), group.name
        for required in group.requires:
            assert required in row[2], (group.name, required)


def test_the_changelog_is_on_the_site(built_site: Path) -> None:
    import ptb_fence

    changes = _text(built_site / "changes.html")
    assert f"{ptb_fence.__version__} (unreleased)" in changes
    assert 'href="changes.html"' in (built_site / "index.html").read_text(encoding="utf-8")


def _code_blocks(page: Path) -> "List[str]":
    """The code blocks of a built page, as the reader sees them."""
    markup = page.read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="highlight-\w+[^"]*"><div class="highlight"><pre>(.*?)</pre>',
                        markup, re.DOTALL)
    return [html.unescape(re.sub(r"<[^>]+>", "", block)) for block in blocks]


def _namespace(tmp_path: Path) -> "Dict[str, object]":
    """What a reference example takes from the page around it, as real objects."""
    from telegram.ext import Application, ApplicationBuilder, ContextTypes

    import ptb_fence
    import ptb_fence.ptb
    import ptb_fence.testing

    namespace: "Dict[str, object]" = {"__name__": "reference_example"}
    exec("import time", namespace)
    namespace.update({name: getattr(ptb_fence, name) for name in ptb_fence.__all__})
    for module in (ptb_fence.ptb, ptb_fence.testing):
        namespace.update({name: getattr(module, name) for name in module.__all__})
    store = ptb_fence.SQLiteUpdateStore(str(tmp_path / "processor.sqlite3"))
    namespace.update(
        Application=Application,
        ApplicationBuilder=ApplicationBuilder,
        ContextTypes=ContextTypes,
        TOKEN="123456:TEST",
        builder=Application.builder().token("123456:TEST"),
        processor=ptb_fence.ptb.FencedUpdateProcessor(store),
        # a custom store that takes a file, as the conformance example expects
        MyUpdateStore=ptb_fence.SQLiteUpdateStore,
    )
    return namespace


class _AlembicContext:
    """Alembic's ``context`` in env.py: records what the example configures."""

    def __init__(self) -> None:
        self.configured: "Dict[str, object]" = {}

    def configure(self, *args: object, **kwargs: object) -> None:
        self.configured.update(kwargs)


def test_every_code_block_of_the_reference_runs(
    built_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The examples in the reference's docstrings run as shown (the CLI page is generated)."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for page in sorted((built_site / "reference").glob("*.html")):
        if page.name == "cli.html":
            continue
        for code in _code_blocks(page):
            if code.startswith("python -m ptb_fence.chaos"):
                # a usage line: every option it shows is one the runner takes
                usage = subprocess.run([sys.executable, "-m", "ptb_fence.chaos", "--help"],
                                       capture_output=True, text=True, timeout=60).stdout
                for flag in re.findall(r"--[a-z-]+", code):
                    assert flag in usage, flag
                ran += 1
                continue
            namespace = _namespace(tmp_path)
            alembic = namespace["context"] = _AlembicContext()
            # start_http_server(9100) in the metrics example: any free port here
            source = code.replace("start_http_server(9100)", "start_http_server(0)")
            exec(compile(source, f"{page.name} example", "exec"), namespace)
            if "test_my_store_conforms" in namespace:
                namespace["test_my_store_conforms"](tmp_path)  # type: ignore[operator]
            if alembic.configured:
                hook = alembic.configured["include_object"]
                assert hook(None, "bot_updates", "table", True, None) is False  # type: ignore[operator]
            ran += 1
    assert ran >= 10


def test_the_pages_outside_the_tutorial_and_the_guides_type_no_code() -> None:
    """The index, the reference, the explanations and the changelog show code only from
    docstrings (run by the test above) or rendered from the code (the CLI, the tables).

    The tutorial and the how-to guides include files that tests run
    (tests/unit/test_docs_code_is_tested.py).
    """
    pages = [ROOT / "CHANGES.rst"] + [
        page for page in sorted((ROOT / "docs").rglob("*.rst"))
        if page.relative_to(ROOT / "docs").parts[0] not in ("tutorial", "howto")
    ]
    assert len(pages) >= 20
    typed = {
        str(page.relative_to(ROOT)): line
        for page in pages
        for line in page.read_text(encoding="utf-8").splitlines()
        if re.match(r"\s*\.\. (code-block|code|literalinclude|sourcecode)::", line)
        or (line.rstrip().endswith("::") and not line.lstrip().startswith(".."))
    }
    assert typed == {}


def test_the_doctests_and_the_internal_links_pass(tmp_path: Path) -> None:
    """``-b doctest`` runs the pages' doctest blocks, ``-b linkcheck`` their references.

    External links are ignored by the link check (docs/conf.py: CI has no network); internal
    ones are checked by the -W build too.
    """
    for builder in ("doctest", "linkcheck"):
        result = subprocess.run(
            [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
             str(ROOT / "docs"), str(tmp_path / builder)],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
        )
        assert result.returncode == 0, f"{builder}:\n{result.stdout}\n{result.stderr}"
