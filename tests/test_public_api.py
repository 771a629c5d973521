"""Scripts use egbert's public API only: every name they take from egbert is in `egbert.__all__`
(read from their source with ast, nothing run), and every name there resolves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import egbert

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


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
