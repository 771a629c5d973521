"""The front door every command shares (egbert/arguments.py): one-line errors for unknown options
with a suggestion, kebab-case options with the old spellings as aliases, --config and
--print-config round trips, and the family recipes as the defaults that --help shows and the
runs use."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from option_coverage import proves

import egbert
from egbert.arguments import arguments_from_options
from egbert.cli import COMMANDS, main
from egbert.config import TrainingArguments, load_recipe
from egbert.errors import ConfigError
from egbert.families import MODEL_FAMILIES
from egbert.finetune.options import FinetuneArguments
from egbert.finetune.run import finetuning_recipe, parse_finetune_args
from egbert.pretrain.prepare import prepare_arguments
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
    assert new[2].nsp is False and new[1].train_files == ["a.txt"] and new[3].bf16 is False
    assert parse_pretrain_args(["--model", "gpt", *REQUIRED, "--bf16"])[3].bf16 is True
    assert parse_pretrain_args(["--model", "gpt", *REQUIRED, "--nsp", "true"])[2].nsp is True


def option_help(text: str) -> dict[str, str]:
    """--help's entries by their first option string, each on one line."""
    entries: dict[str, list[str]] = {}
    current = None  # the entry the indented lines continue (none after a blank line: an epilog)
    for line in text.splitlines():
        if line.startswith("  -"):
            current = entries[line.split()[0]] = [line.strip()]
        elif line.startswith("    ") and current is not None:
            current.append(line.strip())
        elif not line.strip():
            current = None
    return {name: " ".join(words) for name, words in entries.items()}


def test_help_lists_kebab_case_first_and_the_familys_own_defaults(capsys):
    helps = {}
    for family in ("bert", "gpt"):
        code, out, _ = run_cli(["pretrain", "--model", family, "--help"], capsys)
        assert code == 0
        helps[family] = option_help(out)
    bert, gpt = helps["bert"], helps["gpt"]
    assert bert["--mlm-probability"].endswith("(default: 0.4)")
    assert bert["--lr,"].endswith("(default: 0.001)") and bert["--batch-size,"].endswith("16)")
    assert gpt["--mlm-probability"].endswith("(default: 0.15)")
    assert gpt["--lr,"].endswith(f"(default: {load_recipe('gpt', 'pretrain')['lr']})")
    assert gpt["--batch-size,"].endswith(f"(default: {TrainingArguments.batch_size})")
    assert "--train-files," not in bert and "--train_files" not in str(bert)
    assert "--nsp," in bert and "--no-nsp" in bert["--nsp,"]


def test_validation_sees_the_familys_batch_size():
    # bert's batch is 16, so a ramp to 32 is a multiple larger than it (refused before: the
    # first of two parses checked it against the trainer's batch of 32).
    *_, training = parse_pretrain_args(["--model", "bert", *REQUIRED, "--batch-ramp-to", "32"])
    assert training.batch_size == 16 and training.batch_ramp_to == 32
    with pytest.raises(ConfigError, match="a multiple of --batch-size 32 larger than it"):
        parse_pretrain_args(["--model", "gpt", *REQUIRED, "--batch-ramp-to", "32"])


def test_the_python_api_gets_the_recipe_of_the_command_line():
    options = {"tokenizer": "tok", "train_files": ["a.txt"], "output_dir": "out"}
    for family in ("bert", "gpt", "elmo"):
        argv = ["--model", family, *REQUIRED]
        assert pretrain_arguments(model=family, **options) == parse_pretrain_args(argv)
    assert pretrain_arguments(model="bert", **options)[2].mlm_probability == 0.4


def without_sources(printed: str) -> str:
    """--print-config's YAML less the comments that name each value's source."""
    return "\n".join(line.partition("  # ")[0] for line in printed.splitlines())


def printed_sources(printed: str) -> dict[str, str]:
    """{option: the source its --print-config line names}."""
    return {
        line.partition(":")[0]: line.partition("  # ")[2]
        for line in printed.splitlines()
        if "  # " in line
    }


def _round_trip(argv: list[str], tmp_path: Path, capsys) -> dict:
    """--print-config's YAML, checked to come back the same through --config (every value then
    from that file)."""
    code, printed, _ = run_cli([*argv, "--print-config"], capsys)
    assert code == 0, printed
    config = tmp_path / f"{argv[0]}.yaml"
    config.write_text(printed, encoding="utf-8")
    words = argv[:2] if argv[0] == "tokenizer" else argv[:1]
    code, again, _ = run_cli([*words, "--config", str(config), "--print-config"], capsys)
    assert code == 0 and without_sources(again) == without_sources(printed)
    options = yaml.safe_load(printed)
    assert printed_sources(again) == dict.fromkeys(options, f"config file {config}")
    return options


ROUND_TRIPPED = [*COMMANDS, "tokenizer train", "tokenizer stats"]
ROUND_TRIPPED.remove("tokenizer")


def proves_config_options(test):
    """The round trip below proves --config and --print-config of every command."""
    for command in ROUND_TRIPPED:
        test = proves(command, "--config", "--print-config")(test)
    return test


@proves_config_options
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
    stats = ["tokenizer", "stats", "--tokenizer", "t", "--files", "a.txt", "--json"]
    assert _round_trip(stats, tmp_path, capsys)["json"] is True
    prepare = ["prepare", "--model", "gpt", "--tokenizer", "t", "--train-files", "a.txt"]
    assert (
        _round_trip([*prepare, "--output-dir", "p", "--seed", "3"], tmp_path, capsys)["seed"] == 3
    )
    convert = ["convert", "--from", "m", "--to", "c", "--to-transformers"]
    assert _round_trip(convert, tmp_path, capsys)["to_transformers"] is True
    push = ["push", "--folder", "m", "--repo-id", "me/m", "--dry-run"]
    assert _round_trip(push, tmp_path, capsys)["dry_run"] is True
    reward = ["reward", "--model", "m", "--pairs", "p.jsonl", "--output-dir", "o", "--lr", "1e-4"]
    assert _round_trip(reward, tmp_path, capsys)["lr"] == 1e-4
    rlhf = ["rlhf", "--model", "m", "--reward-model", "s", "--output-dir", "o", "--kl-coef", "0.2"]
    assert _round_trip(rlhf, tmp_path, capsys)["kl_coef"] == 0.2


def test_print_config_names_where_each_value_came_from(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model: bert\nlr: 0.002\nvalidation_files: [v.txt]\n")
    argv = ["pretrain", "--config", str(config), *REQUIRED, "--block-size", "64"]
    code, printed, _ = run_cli([*argv, "--print-config"], capsys)
    sources = printed_sources(printed)
    assert code == 0 and len(sources) == len(yaml.safe_load(printed))
    recipe = "recipe egbert/configs/recipes/bert.yaml [pretrain]"
    assert sources["seq_len"] == sources["tokenizer"] == sources["output_dir"] == "command line"
    assert sources["train_files"] == "command line"
    assert (
        sources["lr"] == sources["model"] == sources["validation_files"] == f"config file {config}"
    )
    assert sources["mlm_probability"] == sources["batch_size"] == recipe
    assert sources["preset"] == sources["adam_beta1"] == sources["nsp"] == "default"
    # a value given as its default is still the command line's; the recipe's under a file's
    code, printed, _ = run_cli([*argv, "--preset", "tiny", "--print-config"], capsys)
    assert printed_sources(printed)["preset"] == "command line"
    config.write_text("model: bert\nmlm_probability: 0.2\n")
    code, printed, _ = run_cli([*argv, "--print-config"], capsys)
    assert printed_sources(printed)["mlm_probability"] == f"config file {config}"
    # a command without a recipe: the function's defaults, the command line, an option given twice
    code, printed, _ = run_cli(["probe", "--model", "m", "--task", "rte", "--task", "sst2",
                                "--print-config"], capsys)  # fmt: skip
    sources = printed_sources(printed)
    assert sources["tasks"] == sources["model_dir"] == "command line"
    assert sources["features"] == sources["seed"] == "default"
    # common.yaml's stage, for a model of no family
    code, printed, _ = run_cli(["finetune", "--model", "m", "--output-dir", "o", "--print-config"],
                               capsys)  # fmt: skip
    assert printed_sources(printed)["lr"] == "recipe egbert/configs/recipes/common.yaml [finetune]"


def test_the_command_lines_model_picks_the_recipe_over_the_config_files(tmp_path):
    """A config file of `model: gpt` and `--model elmo`: elmo trains with elmo's recipe (its
    lr, seq_len and config overrides, as egbert/configs/recipes/elmo.yaml writes them)."""
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt\n")
    recipe = yaml.safe_load(
        (Path(egbert.__file__).parent / "configs/recipes/elmo.yaml").read_text()
    )["pretrain"]
    model_args, data_args, _, training_args = parse_pretrain_args(
        ["--config", str(config), "--model", "elmo", *REQUIRED]
    )
    assert model_args.model == "elmo"
    assert training_args.lr == recipe["lr"] and data_args.seq_len == recipe["seq_len"]
    assert model_args.config_overrides == recipe["config_overrides"]


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
    assert parse_pretrain_args(["--config", str(config), *REQUIRED])[3].warmup_steps == 0.25
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


# ---------------------------------------------------------------- help and --print-config


def shown_defaults(argv: list[str], capsys) -> dict[str, str | None]:
    """{option: the default its --help line shows (None: none shown)}."""
    code, out, _ = run_cli([*argv, "--help"], capsys)
    assert code == 0
    return {
        option.rstrip(","): (match.group(1) if match else None)
        for option, text in option_help(out).items()
        for match in [re.search(r"\(default: (.*)\)$", text)]
    }


def as_shown(value) -> str:
    """A default as --help writes it (egbert.arguments.HelpFormatter)."""
    return (" ".join(map(str, value)) or "none") if isinstance(value, list) else str(value)


def assert_help_shows(shown: dict[str, str | None], resolved: tuple) -> None:
    """Each option of the resolved dataclasses that has a value shows it (an unset one's help
    says in words what unset means)."""
    checked = 0
    for instance in resolved:
        for name, value in dataclasses.asdict(instance).items():
            option = f"--{name.replace('_', '-')}"
            if option in shown and name not in ("output_dir", "model") and value is not None:
                assert shown[option] == as_shown(value), f"{option}: --help {shown[option]!r}"
                checked += 1
    assert checked > 10


def test_help_shows_the_defaults_the_python_api_runs_with(tmp_path, capsys, monkeypatch):
    """For each family F, `egbert pretrain|prepare --model F --help` shows the values
    run_pretraining(model=F) and prepare_corpus(model=F) use, and `egbert finetune --model DIR`
    those of run_finetuning(model=DIR); without --model, an option whose default depends on it
    says so, with each family's value (bert trains with lr 1e-3 and 40% masks)."""
    monkeypatch.setenv("COLUMNS", "2000")  # one line an option: no word cut by the wrapping
    families = {}
    for family in MODEL_FAMILIES:
        shown = shown_defaults(["pretrain", "--model", family], capsys)
        resolved = pretrain_arguments(model=family, output_dir="o")
        assert_help_shows(shown, resolved)
        assert_help_shows(
            shown_defaults(["prepare", "--model", family], capsys),
            prepare_arguments(model=family, output_dir="o"),
        )
        model_dir = tmp_path / family
        model_dir.mkdir()
        model_type = {"bert": "egbert-bert", "gpt": "egbert-gpt", "elmo": "egbert-elmo"}[family]
        (model_dir / "config.json").write_text(json.dumps({"model_type": model_type}))
        options = {"model": str(model_dir), "output_dir": "o"}
        types = (FinetuneArguments, TrainingArguments)
        assert_help_shows(
            shown_defaults(["finetune", "--model", str(model_dir)], capsys),
            arguments_from_options(types, options, finetuning_recipe(options)),
        )
        families[family] = {
            name: value
            for instance in resolved
            for name, value in dataclasses.asdict(instance).items()
        }
    for command in ("pretrain", "prepare"):
        shown = shown_defaults([command], capsys)
        for name in families["bert"]:
            option = f"--{name.replace('_', '-')}"
            values = [families[family][name] for family in MODEL_FAMILIES]
            if option not in shown or name in ("output_dir", "model") or values == [None] * 3:
                continue
            if len(set(map(str, values))) > 1:
                each = ", ".join(
                    f"{f} {as_shown(v)}" for f, v in zip(MODEL_FAMILIES, values, strict=True)
                )
                assert shown[option] == f"depends on --model: {each}", option
            else:
                assert shown[option] == as_shown(values[0]), option
    assert shown_defaults(["pretrain"], capsys)["--lr"] == (
        "depends on --model: bert 0.001, gpt 0.001, elmo 0.005"
    )


def test_help_text_is_printed_as_written(capsys):
    """A % in a help text is a percent sign, not a format (argparse's % formatting printed the
    action's dict); a default the help states is the one it shows."""
    _, out, _ = run_cli(["pretrain", "--model", "gpt", "--help"], capsys)
    assert "23% slower than eager" in option_help(out)["--compile,"]
    assert "option_strings" not in out
    _, out, _ = run_cli(["finetune", "--model", "m", "--help"], capsys)
    epochs = option_help(out)["--epochs,"]
    assert epochs.count("default") == 1 and epochs.endswith("(default: 3)"), epochs
    # unset by the recipe (issue 61: True kept the highest loss), as the help says
    assert option_help(out)["--greater-is-better,"].endswith("(unset: lower for loss-like ones)")


def test_prepare_help_says_which_options_it_ignores(capsys):
    _, out, _ = run_cli(["prepare", "--model", "bert", "--help"], capsys)
    helps = option_help(out)
    for option in ("--preset", "--init-from,", "--objective", "--config-overrides", "--license"):
        assert "(prepare ignores it: it shapes the model or the run)" in helps[option], option
    for option in ("--seq-len,", "--train-files", "--mlm-probability", "--tokenizer"):
        assert "prepare ignores it" not in helps[option], option


def test_print_config_needs_only_the_model_family(tmp_path, capsys):
    code, out, err = run_cli(["pretrain", "--model", "bert", "--print-config"], capsys)
    assert code == 0, err
    printed = yaml.safe_load(out)
    assert printed["output_dir"] is None and printed["lr"] == 1e-3  # bert's own
    code, _, err = run_cli(["pretrain", "--print-config"], capsys)  # the defaults depend on it
    assert code == 2 and err.splitlines()[-1].endswith("required: --model")
    config = tmp_path / "bert.yaml"
    config.write_text(out, encoding="utf-8")  # a template: the run still needs --output-dir
    code, _, err = run_cli(["pretrain", "--config", str(config)], capsys)
    assert code == 2 and err.splitlines()[-1].endswith("required: --output-dir")
    args = parse_pretrain_args(["--config", str(config), "--output-dir", "runs/b"])
    assert args == parse_pretrain_args(["--model", "bert", "--output-dir", "runs/b"])
    code, out, err = run_cli(["finetune", "--print-config"], capsys)
    assert code == 0 and yaml.safe_load(out)["model"] is None, err


# ---------------------------------------------------------------- run_mlm.py and run_clm.py names

# (their spelling, a value, the field it must reach)
TRANSFORMERS_NAMES = [
    ("--learning-rate", "3e-4", "lr"),
    ("--num-train-epochs", "4", "epochs"),
    ("--per-device-train-batch-size", "8", "batch_size"),
    ("--gradient-accumulation-steps", "3", "grad_accum"),
    ("--save-steps", "7", "save_every"),
    ("--eval-steps", "9", "eval_every"),
    ("--logging-steps", "11", "log_every"),
    ("--save-total-limit", "5", "keep_checkpoints"),
    ("--lr-scheduler-type", "cosine", "schedule"),
]
PRETRAIN_NAMES = [
    ("--block-size", "64", "seq_len"),
    ("--max-seq-length", "96", "seq_len"),
    ("--preprocessing-num-workers", "3", "num_proc"),
    ("--model-name-or-path", "runs/bert", "init_from"),
]
BASE = {"pretrain": ["--model", "bert", "--output-dir", "o"], "finetune": ["--output-dir", "o"]}


def resolved(command: str, argv: list[str]) -> dict:
    parse = {"pretrain": parse_pretrain_args, "finetune": parse_finetune_args}[command]
    parsed = parse([*BASE[command], *argv])
    return {k: v for instance in parsed for k, v in dataclasses.asdict(instance).items()}


def assert_alias_reaches(command: str, alias: str, value: str, name: str) -> None:
    canonical = f"--{name.replace('_', '-')}"
    base = [] if command == "pretrain" or name == "model" else ["--model", "m"]
    by_alias = resolved(command, [*base, alias, value])
    assert by_alias == resolved(command, [*base, canonical, value]), alias
    assert by_alias == resolved(
        command, [*base, alias.replace("-", "_").replace("__", "--"), value]
    )
    if name != "model":
        assert by_alias[name] != resolved(command, base)[name], f"{alias} changed nothing"


@proves("pretrain", *(alias for alias, _, _ in TRANSFORMERS_NAMES + PRETRAIN_NAMES))
def test_pretrain_takes_run_mlm_and_run_clm_names_for_its_options(tmp_path):
    for alias, value, name in TRANSFORMERS_NAMES + PRETRAIN_NAMES:
        assert_alias_reaches("pretrain", alias, value, name)
    # in a --config file and in Python as well
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt\nlearning_rate: 3.0e-4\nblock_size: 64\n")
    by_file = parse_pretrain_args(["--config", str(config), "--output-dir", "o"])
    assert by_file == parse_pretrain_args(
        ["--model", "gpt", "--output-dir", "o", "--lr", "3e-4", "--seq-len", "64"]
    )
    assert pretrain_arguments(model="gpt", output_dir="o", learning_rate=3e-4, block_size=64) == (
        by_file
    )


@proves("finetune", *(alias for alias, _, _ in TRANSFORMERS_NAMES), "--model-name-or-path")
def test_finetune_takes_run_glue_names_for_its_options():
    for alias, value, name in [*TRANSFORMERS_NAMES, ("--model-name-or-path", "runs/b", "model")]:
        assert_alias_reaches("finetune", alias, value, name)
    assert resolved("finetune", ["--model-name-or-path", "runs/b"])["model"] == "runs/b"


def test_their_values_egbert_lacks_and_their_options_it_lacks_get_one_line(tmp_path, capsys):
    pretrain = ["pretrain", *BASE["pretrain"]]
    code, _, err = run_cli([*pretrain, "--num-train-epochs", "2.5"], capsys)
    assert err.strip() == "egbert pretrain: error: --epochs 2.5: give whole epochs, or --max-steps"
    code, _, err = run_cli([*pretrain, "--lr-scheduler-type", "cosine_with_restarts"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "invalid choice: 'cosine_with_restarts'" in last
    assert all(schedule in last for schedule in ("linear", "cosine", "inverse_sqrt", "constant"))
    for command in ("pretrain", "finetune"):
        argv = [command, *BASE[command], "--model", "m"] if command == "finetune" else pretrain
        for option, hint in (
            ("--do-train", "egbert always trains; drop it"),
            ("--torch-dtype", "egbert's mixed precision is --bf16 or --fp16"),
            ("--dataset-name", "pretrain: --dataset; finetune: --task or --train-file"),
            ("--per_device_eval_batch_size", "evaluation batches are --batch-size"),
        ):
            code, _, err = run_cli([*argv, option, "x"], capsys)
            assert code == 2 and err.splitlines()[-1] == (
                f"egbert {command}: error: unrecognized option {option} ({hint})"
            )
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt\ntorch_dtype: float16\n")
    code, _, err = run_cli(["pretrain", "--config", str(config), "--output-dir", "o"], capsys)
    assert err.strip().endswith(
        "unknown option(s) torch_dtype (torch_dtype: egbert's mixed precision is --bf16 or --fp16)"
    )
