"""Every option of pretrain, finetune, probe, prompt-eval, embed and generate is given a
non-default value by some test that runs its job to the end (what the jobs received is recorded
by conftest.py's record_job_options). The module's name sorts last, so in a whole-suite run it
runs after every other test; run alone (or with -k, or a part of the suite) it skips."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from pathlib import Path

import pytest
from conftest import ARGPARSE_JOBS, JOB_OPTIONS

from egbert.config import FinetuneArguments, PretrainArguments, TrainingArguments

TESTS = Path(__file__).parent
DATACLASS_OPTIONS = {
    "pretrain": (PretrainArguments, TrainingArguments),
    "finetune": (FinetuneArguments, TrainingArguments),
}
# Options no test can give a job on this machine, and why.
NOT_RUNNABLE: dict[tuple[str, str], str] = {}
# The parser's own options, which no job receives: tests/test_front_door.py runs --config and
# --print-config through every command.
PARSER_OPTIONS = {"help", "config", "print_config"}


def parser_of(command: str) -> argparse.ArgumentParser:
    """The parser an argparse command's main() builds, caught as it parses --help."""
    module = importlib.import_module(ARGPARSE_JOBS[command][2])
    caught = []
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def catch(self, args=None, namespace=None):
        caught.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_known_args = catch
    try:
        with pytest.raises(SystemExit):
            module.main(["--help"])
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known_args
    return caught[0]


def command_options(command: str) -> set[str]:
    if command in DATACLASS_OPTIONS:
        return {f.name for cls in DATACLASS_OPTIONS[command] for f in dataclasses.fields(cls)}
    actions = parser_of(command)._actions
    return {action.dest for action in actions if action.dest not in PARSER_OPTIONS}


def whole_suite_ran(session: pytest.Session) -> bool:
    ran = {Path(str(item.path)).name for item in session.items}
    every = {path.name for path in TESTS.glob("test_*.py")}
    options = session.config.option
    return ran >= every and not options.keyword and not options.markexpr


@pytest.mark.parametrize("command", [*DATACLASS_OPTIONS, *ARGPARSE_JOBS])
def test_every_option_is_run_by_a_test(command: str, request: pytest.FixtureRequest) -> None:
    if not whole_suite_ran(request.session):
        pytest.skip("counts the options of a whole-suite run: pytest tests")
    uncovered = sorted(
        name
        for name in command_options(command) - JOB_OPTIONS.get(command, set())
        if (command, name) not in NOT_RUNNABLE
    )
    assert not uncovered, f"egbert {command}: no test runs the job with {uncovered}"
