"""Imports run down the floors of docs/layout.md, never up or across: the list there is read, and
every import of every module of egbert (with `ast`, those inside functions too) is held against
it, so that an arrow back up fails the suite instead of a picture of the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import egbert

PACKAGE = Path(egbert.__file__).parent
LAYOUT = PACKAGE.parent / "docs" / "layout.md"
PACKAGE_FACE = "egbert"  # the package's __init__.py, as docs/layout.md names it


def floors(layout: str) -> dict[str, int]:
    """part -> its floor, counted from the top, from the first code block under the heading."""
    section = layout.split("## Which way imports go", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "docs/layout.md: 'Which way imports go' holds the floors in a code block"
    return {
        part: floor
        for floor, line in enumerate(block.group(1).splitlines())
        for part in line.split()
    }


def part_of(module: str) -> str:
    """egbert.pretrain.data -> pretrain, egbert.tokenizer -> tokenizer, egbert -> egbert."""
    names = module.split(".")
    return names[1] if len(names) > 1 else PACKAGE_FACE


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package: Path) -> list[tuple[int, str]]:
    """(line, module) of every egbert module the file imports; `from egbert import name` is
    the module egbert.name where there is one, else the package face (its `__version__`)."""
    module = module_name(path, package).split(".")
    if path.name != "__init__.py":
        module = module[:-1]  # a relative import counts from the module's package
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            start = module[: len(module) - node.level + 1] if node.level else []
            base = ".".join(start + ([node.module] if node.module else []))
            for alias in node.names:
                where = package.parent / f"{base}.{alias.name}".replace(".", "/")
                is_module = where.with_suffix(".py").exists() or where.is_dir()
                found.append((node.lineno, f"{base}.{alias.name}" if is_module else base))
    return sorted({(line, name) for line, name in found if name.split(".")[0] == package.name})


def arrows_against_the_floors(package: Path, floor_of: dict[str, int]) -> list[str]:
    wrong = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        source = part_of(module_name(path, package))
        for line, target in imported_modules(path, package):
            imported = part_of(target)
            if imported == source:
                continue
            if source not in floor_of or imported not in floor_of:
                missing = source if source not in floor_of else imported
                wrong.append(f"{where}: {missing!r} has no floor in docs/layout.md")
            elif floor_of[imported] <= floor_of[source]:
                way = "across" if floor_of[imported] == floor_of[source] else "up"
                wrong.append(f"{where}:{line}: {source} imports {target}, {way} the floors")
    return wrong


def parts_of(package: Path) -> set[str]:
    return {part_of(module_name(path, package)) for path in package.rglob("*.py")}


def test_every_import_runs_down_the_floors_of_the_layout():
    floor_of = floors(LAYOUT.read_text(encoding="utf-8"))
    assert arrows_against_the_floors(PACKAGE, floor_of) == []


def test_every_part_of_the_package_has_a_floor_and_every_floor_a_part():
    floor_of = floors(LAYOUT.read_text(encoding="utf-8"))
    assert parts_of(PACKAGE) == set(floor_of)


def test_the_tokenizer_imports_nothing_from_pretrain_or_models():
    imported = imported_modules(PACKAGE / "tokenizer.py", PACKAGE)
    assert {part_of(name) for _, name in imported}.isdisjoint({"pretrain", "models"})


def test_an_import_up_or_across_is_named_with_its_line(tmp_path):
    """The check itself, on a package of four files: the tokenizer reading pretrain/ (up),
    pretrain/ reading finetune/ by a relative import (across), finetune/ reading errors (down)."""
    files = {
        "__init__.py": "",
        "errors.py": "",
        "tokenizer.py": "import os\n\nfrom egbert.pretrain import data\n",
        "pretrain/__init__.py": "",
        "pretrain/data.py": "def read():\n    from ..finetune.tasks import TASKS\n",
        "finetune/__init__.py": "",
        "finetune/tasks.py": "from egbert import errors\nfrom egbert.errors import DataError\n",
    }
    package = tmp_path / "egbert"
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text, encoding="utf-8")
    floor_of = floors(LAYOUT.read_text(encoding="utf-8"))
    assert arrows_against_the_floors(package, floor_of) == [
        "egbert/pretrain/data.py:2: pretrain imports egbert.finetune.tasks, across the floors",
        "egbert/tokenizer.py:3: tokenizer imports egbert.pretrain.data, up the floors",
    ]
    (package / "hub.py").write_text("", encoding="utf-8")
    (package / "hub_twin.py").write_text("from egbert import hub\n", encoding="utf-8")
    assert "egbert/hub_twin.py: 'hub_twin' has no floor in docs/layout.md" in (
        arrows_against_the_floors(package, floor_of)
    )
