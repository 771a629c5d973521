"""Which test proves which option: `@proves("pretrain", "--lr")` on a test says that it fails when
that option of that command is ignored or wired to the wrong thing, against an expectation from
outside the code under test (a value computed from the option's definition, a reference library's
result, or a pair of runs that differ in what the option claims to change and agree elsewhere).

tests/test_option_coverage.py reads these marks from every test module (by import, so the check
holds under pytest-xdist and in any order) and fails for an option of a command that no test
proves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

Test = TypeVar("Test", bound=Callable)

# The --help lines every command's parser starts with (egbert.arguments), and those of the
# options that the commands reading a model folder share (egbert.evaluation.results'
# add_run_arguments), at 100 columns: the words a user reads, written out.
CONFIG_OPTIONS_HELP = (
    "  -h, --help            show this help message and exit\n"
    "  --config FILE         YAML or JSON file of options (option or field names); the "
    "command line\n"
    "                        overrides it\n"
    "  --print-config        print the resolved options as YAML (a file for --config) "
    "and exit; a\n"
    "                        comment on each line says where its value came from "
    "(default, recipe,\n"
    "                        config file or command line)\n"
)
RUN_OPTIONS_HELP = (
    "  --device DEVICE       cpu, cuda, ... (default: cuda when available)\n"
    "  --bf16, --no-bf16     bf16 autocast (default: where the device runs it faster "
    "than fp32)\n"
    "  --fp16, --no-fp16     fp16 autocast, for GPUs without bf16 (T4, V100); instead of "
    "--bf16\n"
    "                        (default: False)\n"
    "  --allow-pickle, --no-allow-pickle\n"
    "                        also load a pickle checkpoint (pytorch_model.bin, *.pt) "
    "when the model\n"
    "                        directory has no safetensors weights, with "
    "torch.load(weights_only=True);\n"
    "                        only for files you trust (default: False)\n"
)


def proves(command: str, *options: str) -> Callable[[Test], Test]:
    """Mark a test as the proof of `options` (as typed: "--lr") of `egbert command`."""
    if not options or not all(option.startswith("--") for option in options):
        raise ValueError(f"proves({command!r}, ...): name options as typed, e.g. '--lr'")

    def mark(test: Test) -> Test:
        test.proves = (*getattr(test, "proves", ()), *((command, o) for o in options))
        return test

    return mark


def help_text(command: str, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    """`egbert COMMAND --help` as a user reads it, at 100 columns."""
    from egbert.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out
