"""pyproject.toml's dependencies match the code: every third-party package egbert imports is
declared, the floors admit no release that lacks an API egbert calls, and transformers, whose
internals egbert builds on, is capped below its next major version."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10, which requires-python admits: tomli, if there
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None

REPO = Path(__file__).resolve().parents[1]


def dependencies_read_line_by_line(text: str) -> list[str]:
    """[project]'s `dependencies = [...]` as pyproject.toml writes it (one quoted requirement a
    line, comments between), for a Python without a TOML parser."""
    block = text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    found = (re.match(r'\s*"([^"]+)",', line) for line in block.splitlines())
    return [match.group(1) for match in found if match]


def declared_requirements() -> dict[str, Requirement]:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is None:
        dependencies = dependencies_read_line_by_line(text)
    else:
        dependencies = tomllib.loads(text)["project"]["dependencies"]
    requirements = map(Requirement, dependencies)
    return {canonicalize_name(requirement.name): requirement for requirement in requirements}


@pytest.mark.skipif(tomllib is None, reason="no TOML parser to compare with")
def test_the_reading_without_a_toml_parser_finds_what_a_parser_finds() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    parsed = tomllib.loads(text)["project"]["dependencies"]
    assert dependencies_read_line_by_line(text) == parsed and len(parsed) > 10


def third_party_imports() -> dict[str, list[str]]:
    """Top-level module imported -> the files under egbert/ that import it (stdlib and egbert
    itself left out; imports inside functions included)."""
    importers: dict[str, list[str]] = {}
    for path in sorted((REPO / "egbert").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "egbert" and top not in sys.stdlib_module_names:
                    importers.setdefault(top, []).append(str(path.relative_to(REPO)))
    return importers


def distribution_of(module: str) -> str:
    """The installed distribution that provides `module` (sklearn -> scikit-learn, yaml ->
    PyYAML), as the environment's package metadata records it."""
    distributions = packages_distributions().get(module, [module])
    return canonicalize_name(distributions[0])


def test_every_imported_package_is_declared() -> None:
    imports = third_party_imports()
    assert {"torch", "transformers", "numpy", "yaml", "sklearn"} <= set(imports)  # the scan works
    declared = declared_requirements()
    missing = {
        module: files
        for module, files in imports.items()
        if distribution_of(module) not in declared
    }
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"


def test_transformers_is_capped_below_its_next_major_version() -> None:
    specifier = declared_requirements()["transformers"].specifier
    assert specifier.contains("5.99.0") and not specifier.contains("6.0.0")


@pytest.mark.parametrize(
    ("package", "too_old", "why"),
    [
        ("datasets", "4.2.0", "sources.py: Dataset.from_generator(fingerprint=...) (4.3)"),
        ("accelerate", "1.7.0", "the trainer calls load_state(load_kwargs=...) (1.8)"),
        ("accelerate", "1.14.0", "skip_first_batches forgets the epoch before 1.15"),
        ("torch", "2.5.1", "transformers 5 disables torch below 2.6"),
    ],
)
def test_floors_leave_out_releases_the_code_cannot_run_on(
    package: str, too_old: str, why: str
) -> None:
    assert not declared_requirements()[package].specifier.contains(too_old), why
