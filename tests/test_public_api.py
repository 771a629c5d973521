"""Scripts use egbert's public API only: every name they take from egbert is in `egbert.__all__`
(read from their source with ast, nothing run), every name there resolves, and docs/layout.md's
"The public API" lists exactly those names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import egbert

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
LAYOUT = REPO / "docs" / "layout.md"


def egbert_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each use of egbert in a script: `from egbert import NAME`, `egbert.NAME`,
    and `import egbert.MODULE` / `from egbert.MODULE import ...` as the dotted module name."""
    found = []
    # `egbert.NAME` counts where the script imports the package itself (bench.py, which does
    # not, names a model `egbert`)
    imports_package = any(
        isinstance(node, ast.Import) and any(alias.name == "egbert" for alias in node.names)
        for node in ast.walk(tree)
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("egbert"):
            if node.module == "egbert":
                found += [(node.lineno, alias.name) for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("egbert.")]
        elif (
            imports_package
            and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "egbert"
        ):
            found.append((node.lineno, node.attr))
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_scripts_take_only_exported_names_from_egbert(script: Path):
    names = egbert_names(ast.parse(script.read_text(encoding="utf-8")))
    private = [
        f"{script.name}:{line}: {name}" for line, name in names if name not in egbert.__all__
    ]
    assert not private, private


def test_the_check_sees_internals():
    source = "import egbert\nfrom egbert.quickstart import steps\negbert.quickstart.Budget\n"
    names = sorted(name for _, name in egbert_names(ast.parse(source)))
    assert names == ["egbert.quickstart", "quickstart"]
    assert not set(names) & set(egbert.__all__)


def test_every_exported_name_resolves():
    for name in egbert.__all__:
        assert getattr(egbert, name) is not None, name


def documented_names(layout: str) -> list[str]:
    """The names listed in layout's "The public API" section: each line "- `NAME`: what for"."""
    section = layout.split("\n## The public API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(\w+)`:", section, flags=re.MULTILINE)


def test_the_layout_lists_every_exported_name_once_and_nothing_else():
    documented = documented_names(LAYOUT.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), "a name listed twice"
    unlisted = sorted(set(egbert.__all__) - set(documented))
    assert not unlisted, f"exported, not listed in docs/layout.md: {unlisted}"
    unexported = sorted(set(documented) - set(egbert.__all__))
    assert not unexported, f"listed in docs/layout.md, not exported: {unexported}"
