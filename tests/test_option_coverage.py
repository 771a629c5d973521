"""Every option of every egbert command is proved by a test: some test carries
`@proves(command, "--option")` (tests/option_coverage.py), a promise that it fails when that
option is ignored or wired to the wrong thing.

The options come from the commands' real parsers, caught as each command's `main` hands its
argv to egbert.arguments; the marks from importing every tests/test_*.py module. Nothing here
depends on which tests ran before, in this process or another (pytest-xdist).

An option with several spellings on one action (`--warmup-steps`, `--warmup-ratio`; `--nsp`,
`--no-nsp`) is one option: a proof of any of its spellings proves it. --help is argparse's own.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from egbert.arguments import ArgumentParser
from egbert.cli import COMMANDS, module_name

TESTS = Path(__file__).parent


class _Caught(Exception):
    def __init__(self, parser: ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _catch(parser: ArgumentParser, *args, **kwargs):
    raise _Caught(parser)


def command_parser(command: str) -> ArgumentParser:
    """The parser `egbert COMMAND` builds, caught as its main() starts parsing."""
    module = importlib.import_module(module_name(command))
    with mock.patch.object(ArgumentParser, "parse_args", _catch):
        try:
            module.main(["--help"])
        except _Caught as caught:
            return caught.parser
    raise AssertionError(f"egbert {command}: main() parsed nothing")


def command_parsers() -> dict[str, ArgumentParser]:
    """Each command's parser by its words: `tokenizer train` and `tokenizer stats` for the
    subcommands of `tokenizer`."""
    parsers = {}
    for command in COMMANDS:
        parser = command_parser(command)
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subcommands:
            parsers |= {f"{command} {name}": sub for name, sub in action.choices.items()}
        if not subcommands:
            parsers[command] = parser
    return parsers


def options_of(parser: ArgumentParser) -> dict[str, set[str]]:
    """{canonical option: every spelling of it}, the canonical one the first long spelling."""
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        spellings = {name for name in action.option_strings if name.startswith("--")}
        options[min(spellings, key=action.option_strings.index)] = spellings
    return options


def functions_of(module) -> Iterator:
    """The test functions of a module, its test classes' methods included."""
    for name, value in vars(module).items():
        if name.startswith("test") and inspect.isfunction(value):
            yield value
        elif name.startswith("Test") and inspect.isclass(value):
            yield from (v for n, v in vars(value).items() if n.startswith("test"))


def proved_options() -> dict[str, dict[str, list[str]]]:
    """{command: {option as marked: the tests marked}} from every test module."""
    proved: dict[str, dict[str, list[str]]] = {}
    for path in sorted(TESTS.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        for test in functions_of(module):
            for command, option in getattr(test, "proves", ()):
                proved.setdefault(command, {}).setdefault(option, []).append(
                    f"{path.name}::{test.__name__}"
                )
    return proved


PARSERS = command_parsers()
PROVED = proved_options()


@pytest.mark.parametrize("command", list(PARSERS))
def test_every_option_of_the_command_is_proved_by_a_test(command: str):
    proved = set(PROVED.get(command, {}))
    unproved = sorted(
        option
        for option, spellings in options_of(PARSERS[command]).items()
        if not spellings & proved
    )
    assert not unproved, f"egbert {command}: no test proves {', '.join(unproved)}"


def test_every_mark_names_a_command_and_one_of_its_options():
    unknown = [
        f"{tests[0]}: egbert {command} {option}"
        for command, options in PROVED.items()
        for option, tests in options.items()
        if command not in PARSERS
        or not any(option in spellings for spellings in options_of(PARSERS[command]).values())
    ]
    assert not unknown, f"marks of options no command has: {unknown}"
