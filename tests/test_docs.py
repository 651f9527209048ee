"""The user documentation's code: every ```python block of README.md and docs/**/*.md is valid Python,
and every `from client... import ...` statement in them runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# The user guide, whose prose names the errors a user catches; docs/protocol.md is the wire contract
# and also names the protocol package's own errors (`ProtocolError`).
GUIDE = [document for document in DOCUMENTS if document.name != "protocol.md"]
_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[ \t]*\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[tuple[str, str]]:
    """(where, code) of every ```python block: where is "README.md:LINE", LINE that of the fence."""
    blocks = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group("lang") in ("python", "py"):
                line = text.count("\n", 0, match.start()) + 1
                blocks.append((f"{document.relative_to(REPO)}:{line}", match.group("code")))
    return blocks


def client_imports() -> list[tuple[str, str]]:
    """(where, source) of every `from client[.x] import ...` statement of the python blocks,
    parenthesised multi-line imports included; blocks that do not parse are left to the test below."""
    imports = []
    for where, code in python_blocks():
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "client":
                imports.append((f"{where}+{node.lineno - 1}", ast.unparse(node)))
    return imports


def test_the_documents_have_python_blocks_and_client_imports() -> None:
    assert len(python_blocks()) >= 5 and len(client_imports()) >= 4


@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_python_block_parses(where: str, code: str) -> None:
    try:
        ast.parse(code)
    except SyntaxError as exc:
        pytest.fail(f"{where} (block line {exc.lineno}): {exc.msg}: {exc.text!r}")


@pytest.mark.parametrize(("where", "statement"), client_imports(), ids=[w for w, _ in client_imports()])
def test_every_client_import_of_the_documents_runs(where: str, statement: str) -> None:
    exec(compile(statement, where, "exec"), {})   # raises ImportError naming the missing name


def test_every_error_the_guide_names_is_exported_by_client() -> None:
    """An error class named in the prose of the README or a page of the user guide
    (`SubscriptionParseFailed`) is importable `from client import ...` like the rest of the public API."""
    import client
    from protocol import errors

    named = {name for document in GUIDE
             for name in re.findall(r"`([A-Z][A-Za-z_]+)`", document.read_text(encoding="utf-8"))}
    error_names = {name for name in named if isinstance(getattr(errors, name, None), type)}
    assert "SubscriptionParseFailed" in error_names
    assert error_names <= set(client.__all__), sorted(error_names - set(client.__all__))


def test_the_readme_stays_a_front_page() -> None:
    """The README is what rocketq is, the two commands, a quick start, the features and links (issue
    #36: at most 200 lines); the details live in docs/."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
