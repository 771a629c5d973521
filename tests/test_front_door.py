"""The front door every command shares (egbert/arguments.py): one-line errors for unknown options
with a suggestion, kebab-case options with the old spellings as aliases, --config and
--print-config round trips, and the family recipes as the defaults that --help shows and the
runs use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from option_coverage import proves

import egbert
from egbert.arguments import arguments_from_options
from egbert.cli import COMMANDS, main
from egbert.config import FinetuneArguments, TrainingArguments, load_recipe
from egbert.errors import ConfigError
from egbert.finetune.run import finetuning_recipe, parse_finetune_args
from egbert.pretrain.run import parse_pretrain_args, pretrain_arguments

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

# A command's words: `tokenizer` needs its action before its options.
COMMAND_WORDS = {name: [name] for name in COMMANDS} | {"tokenizer": ["tokenizer", "train"]}
REQUIRED = ["--tokenizer", "tok", "--train-files", "a.txt", "--output-dir", "out"]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """egbert's CLI in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    code = exit_info.value.code
    if isinstance(code, str):  # sys.exit(message): Python prints it to stderr, exit code 1
        return 1, out, err + code + "\n"
    return code or 0, out, err


@pytest.mark.parametrize("command", [*COMMAND_WORDS, "tokenizer stats"])
def test_every_command_answers_an_unknown_option_in_one_line(command, capsys):
    words = COMMAND_WORDS.get(command, command.split())
    code, _, err = run_cli([*words, "--bogus", "1"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err
    assert lines[-1] == f"egbert {' '.join(words)}: error: unrecognized option --bogus"
    assert len(lines) <= 2 and all(line.startswith("usage: ") for line in lines[:-1])


def test_a_misspelt_option_gets_the_one_meant(capsys):
    code, _, err = run_cli(["pretrain", "--model", "bert", *REQUIRED, "--lr-rate", "1"], capsys)
    assert code == 2 and err.splitlines()[-1].endswith("--lr-rate (did you mean --lr?)")
    code, _, err = run_cli(["probe", "--batchsize", "8"], capsys)
    assert err.splitlines()[-1].endswith("--batchsize (did you mean --batch-size?)")


def test_old_spellings_stay_aliases_of_the_kebab_case_options():
    new = parse_pretrain_args(["--model", "bert", *REQUIRED, "--no-nsp", "--bf16", "false"])
    for old in (["--nsp", "false"], ["--no_nsp"], ["--nsp=false"]):
        argv = ["--model", "bert", "--tokenizer", "tok", "--train_files", "a.txt"]
        argv += ["--output_dir", "out", *old, "--bf16", "false"]
        assert parse_pretrain_args(argv) == new
    assert new[0].nsp is False and new[0].train_files == ["a.txt"] and new[1].bf16 is False
    assert parse_pretrain_args(["--model", "gpt", *REQUIRED, "--bf16"])[1].bf16 is True
    assert parse_pretrain_args(["--model", "gpt", *REQUIRED, "--nsp", "true"])[0].nsp is True


def option_help(text: str) -> dict[str, str]:
    """--help's entries by their first option string, each on one line."""
    entries: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("  -"):
            entries[line.split()[0]] = [line.strip()]
        elif line.startswith("    ") and entries:
            entries[list(entries)[-1]].append(line.strip())
    return {name: " ".join(words) for name, words in entries.items()}


def test_help_lists_kebab_case_first_and_the_familys_own_defaults(capsys):
    helps = {}
    for family in ("bert", "gpt"):
        code, out, _ = run_cli(["pretrain", "--model", family, "--help"], capsys)
        assert code == 0
        helps[family] = option_help(out)
    bert, gpt = helps["bert"], helps["gpt"]
    assert bert["--mlm-probability"].endswith("(default: 0.4)")
    assert bert["--lr"].endswith("(default: 0.001)") and bert["--batch-size"].endswith("16)")
    assert gpt["--mlm-probability"].endswith("(default: 0.15)")
    assert gpt["--lr"].endswith(f"(default: {load_recipe('gpt', 'pretrain')['lr']})")
    assert gpt["--batch-size"].endswith(f"(default: {TrainingArguments.batch_size})")
    assert "--train-files," not in bert and "--train_files" not in str(bert)
    assert "--nsp," in bert and "--no-nsp" in bert["--nsp,"]


def test_validation_sees_the_familys_batch_size():
    # bert's batch is 16, so a ramp to 32 is a multiple larger than it (refused before: the
    # first of two parses checked it against the trainer's batch of 32).
    _, training = parse_pretrain_args(["--model", "bert", *REQUIRED, "--batch-ramp-to", "32"])
    assert training.batch_size == 16 and training.batch_ramp_to == 32
    with pytest.raises(ConfigError, match="a multiple of --batch-size 32 larger than it"):
        parse_pretrain_args(["--model", "gpt", *REQUIRED, "--batch-ramp-to", "32"])


def test_the_python_api_gets_the_recipe_of_the_command_line():
    options = {"tokenizer": "tok", "train_files": ["a.txt"], "output_dir": "out"}
    for family in ("bert", "gpt", "elmo"):
        argv = ["--model", family, *REQUIRED]
        assert pretrain_arguments(model=family, **options) == parse_pretrain_args(argv)
    assert pretrain_arguments(model="bert", **options)[0].mlm_probability == 0.4


def _round_trip(argv: list[str], tmp_path: Path, capsys) -> dict:
    """--print-config's YAML, checked to come back the same through --config."""
    code, printed, _ = run_cli([*argv, "--print-config"], capsys)
    assert code == 0, printed
    config = tmp_path / f"{argv[0]}.yaml"
    config.write_text(printed, encoding="utf-8")
    words = argv[:2] if argv[0] == "tokenizer" else argv[:1]
    code, again, _ = run_cli([*words, "--config", str(config), "--print-config"], capsys)
    assert code == 0 and again == printed
    return yaml.safe_load(printed)


@proves("finetune", "--config", "--print-config")
@proves("probe", "--config", "--print-config")
@proves("prompt-eval", "--config", "--print-config")
@proves("embed", "--config", "--print-config")
@proves("generate", "--config", "--print-config")
def test_print_config_round_trips_through_config(tmp_path, capsys):
    pretrain = _round_trip(
        ["pretrain", "--model", "bert", *REQUIRED, "--no_nsp", "--warmup-ratio", "0.2"],
        tmp_path,
        capsys,
    )
    assert pretrain["nsp"] is False and pretrain["warmup_steps"] == 0.2
    assert pretrain["lr"] == 1e-3 and pretrain["mlm_probability"] == 0.4
    config = tmp_path / "pretrain.yaml"
    same = ["--model", "bert", *REQUIRED, "--no_nsp", "--warmup-ratio", "0.2"]
    assert parse_pretrain_args(["--config", str(config)]) == parse_pretrain_args(same)
    finetune = _round_trip(
        ["finetune", "--task", "rte", "--model", "m", "--output-dir", "o", "--epochs", "2"],
        tmp_path,
        capsys,
    )
    assert finetune["epochs"] == 2 and finetune["lr"] == load_recipe(None, "finetune")["lr"]
    probe = _round_trip(
        ["probe", "--model", "m", "--task", "rte", "sst2", "--data-dir", "g", "--no-bf16"],
        tmp_path,
        capsys,
    )
    assert probe["tasks"] == ["rte", "sst2"] and probe["bf16"] is False
    embed = _round_trip(
        ["embed", "--model", "m", "--input", "in.txt", "--output", "o.npy", "--layers", "-1,-2"],
        tmp_path,
        capsys,
    )
    assert embed["layers"] == "-1,-2"
    quickstart = _round_trip(["quickstart", "--budget-minutes", "3"], tmp_path, capsys)
    assert quickstart["budget_minutes"] == 3
    prompt_eval = ["prompt-eval", "--model", "m", "--task", "rte", "--data-dir", "g"]
    _round_trip(prompt_eval, tmp_path, capsys)
    _round_trip(["generate", "--model", "m", "--prompt", "Once"], tmp_path, capsys)
    tokenizer = _round_trip(
        ["tokenizer", "train", "--files", "a.txt", "--out", "t", "--lowercase"], tmp_path, capsys
    )
    assert tokenizer["lowercase"] is True and "action" not in tokenizer


def test_config_files_take_option_names_and_refuse_unknown_ones(tmp_path, capsys):
    config = tmp_path / "probe.json"
    config.write_text(json.dumps({"model": "m", "task": ["rte"], "data-dir": "g", "seed": 3}))
    code, printed, _ = run_cli(["probe", "--config", str(config), "--print-config"], capsys)
    assert code == 0 and yaml.safe_load(printed)["seed"] == 3
    config.write_text(json.dumps({"model": "m", "sede": 3}))
    code, _, err = run_cli(["probe", "--config", str(config)], capsys)
    assert code != 0 and err.strip() == (
        f"egbert probe: error: config file {config}: unknown option(s) sede"
    )


def test_warmup_ratio_is_an_option_alike_everywhere(tmp_path, wikitext_slice, tiny_tokenizer_dir):
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt\nwarmup_ratio: 0.25\n")
    assert parse_pretrain_args(["--config", str(config), *REQUIRED])[1].warmup_steps == 0.25
    assert parse_pretrain_args(["--model", "gpt", *REQUIRED, "--warmup_ratio", "0.25"]) == (
        parse_pretrain_args(["--config", str(config), *REQUIRED])
    )
    finetune = ["--model", "m", "--output-dir", "o", "--warmup-ratio", "0.3"]
    assert parse_finetune_args(finetune)[1].warmup_steps == 0.3
    types = (FinetuneArguments, TrainingArguments)  # run_finetuning's keyword arguments
    options = {"model": "m", "output_dir": "o", "warmup_ratio": 0.3}
    assert arguments_from_options(types, options, finetuning_recipe(options))[1].warmup_steps == 0.3
    out = tmp_path / "run"
    result = egbert.run_pretraining(
        model="gpt",
        preset="tiny",
        tokenizer=str(tiny_tokenizer_dir),
        train_files=[str(wikitext_slice)],
        output_dir=str(out),
        seq_len=32,
        batch_size=4,
        max_steps=4,
        warmup_ratio=0.5,
        report_to=["none"],
    )
    saved = json.loads((out / "pretrain_args.json").read_text(encoding="utf-8"))
    assert result.step == 4 and saved["training"]["warmup_steps"] == 0.5
