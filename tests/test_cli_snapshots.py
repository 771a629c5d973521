"""Every command's `--help` and `--print-config` output, byte for byte, against the golden files
in tests/cli_snapshots/ (written at 100 columns). A change to what a command says about its
options shows here as a failing test; where the change is meant, the golden file changes with it
in the same commit.

File names: `COMMAND.help` and `COMMAND.pc` (`tokenizer_train.help` for `egbert tokenizer
train`); `prepare_bert.pc` for `egbert prepare --model bert --print-config`; `prepare.pc` and
`pretrain.pc` hold the error that --print-config without --model gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from egbert.cli import main

SNAPSHOTS = Path(__file__).parent / "cli_snapshots"
FAMILIES = ("bert", "gpt", "elmo")
SIMPLE_COMMANDS = (
    "prepare",
    "pretrain",
    "finetune",
    "embed",
    "probe",
    "prompt-eval",
    "reward",
    "rlhf",
    "compare",
    "generate",
    "convert",
    "push",
    "quickstart",
)


def snapshot_runs() -> dict[str, list[str]]:
    """{golden file name: the egbert command line that writes it}."""
    runs = {"tokenizer.help": ["tokenizer", "--help"]}
    for words in (*([command] for command in SIMPLE_COMMANDS), ["tokenizer", "train"]):
        runs[f"{'_'.join(words)}.help"] = [*words, "--help"]
        runs[f"{'_'.join(words)}.pc"] = [*words, "--print-config"]
    runs["tokenizer_stats.help"] = ["tokenizer", "stats", "--help"]
    runs["tokenizer_stats.pc"] = ["tokenizer", "stats", "--print-config"]
    for command in ("prepare", "pretrain"):
        for family in FAMILIES:
            runs[f"{command}_{family}.pc"] = [command, "--model", family, "--print-config"]
    return runs


RUNS = snapshot_runs()


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, int]:
    """What `egbert ARGV` writes (stdout, then stderr) and its exit code."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    written = capsys.readouterr()
    return written.out + written.err, exit_.value.code or 0


def test_every_golden_file_has_its_command_line():
    assert sorted(path.name for path in SNAPSHOTS.iterdir()) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_output_is_the_golden_file_byte_for_byte(name: str, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps at shutil.get_terminal_size()
    output, code = run_cli(RUNS[name], capsys)
    assert output == (SNAPSHOTS / name).read_text(encoding="utf-8")
    assert code == (2 if name in ("prepare.pc", "pretrain.pc") else 0)
