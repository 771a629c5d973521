"""Options that must do what their help and the docs say, each run through its job's Python API
(`egbert.run_pretraining` / `egbert.run_finetuning`) or the command, on tiny data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from egbert import run_finetuning, run_pretraining
from egbert.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def small_corpus(wikitext_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """300 lines of the WikiText slice to train on (or its first 100), the next 100 to validate
    on."""
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("small-corpus")
    (folder / "train.tokens").write_text("".join(lines[:300]), encoding="utf-8")
    (folder / "short.tokens").write_text("".join(lines[:100]), encoding="utf-8")
    (folder / "valid.tokens").write_text("".join(lines[300:400]), encoding="utf-8")
    return {name: folder / f"{name}.tokens" for name in ("train", "short", "valid")}


def tiny_run(model: str, tokenizer: Path, corpus: dict, out: Path, **options) -> dict:
    """The options of a few-step tiny run; `options` override or add to them."""
    return {
        "model": model,
        "preset": "tiny",
        "tokenizer": str(tokenizer),
        "train_files": [str(corpus["train"])],
        "doc_boundary": "wikitext",
        "output_dir": str(out),
        "seq_len": 32,
        "batch_size": 8,
        "max_steps": 4,
        "report_to": ["none"],
        **options,
    }


def records(out: Path, split: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


# ---------------------------------------------------------------- item 8: --report-to


@pytest.mark.parametrize("tracker", ["wandb", "mlflow", "trackio"])
def test_a_tracker_that_is_not_installed_is_refused_before_training(
    tracker, small_corpus, tiny_tokenizer_dir, tmp_path
):
    pytest.importorskip("accelerate.tracking")
    from accelerate.tracking import get_available_trackers

    if tracker in {str(name) for name in get_available_trackers()}:
        pytest.skip(f"{tracker} is installed here")
    out = tmp_path / "run"
    options = tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out, report_to=[tracker])
    with pytest.raises(ConfigError) as error:
        run_pretraining(**options)
    message = str(error.value)
    assert "\n" not in message and f"--report-to {tracker}" in message
    assert f"pip install {tracker}" in message
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


# ---------------------------------------------------------------- item 2: tokenizer everywhere


def test_every_checkpoint_and_the_best_model_hold_the_tokenizer(
    small_corpus, tiny_tokenizer_dir, tmp_path
):
    out = tmp_path / "run"
    options = tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out, save_every=2)
    options |= {"validation_files": [str(small_corpus["valid"])], "eval_every": 2}
    run_pretraining(**options, metric_for_best_model="loss", keep_checkpoints=3)
    expected = AutoTokenizer.from_pretrained(out / "model").get_vocab()
    folders = [out / "checkpoints" / "step-2", out / "checkpoints" / "step-4", out / "best"]
    for folder in folders:
        assert AutoTokenizer.from_pretrained(folder).get_vocab() == expected, folder


# ---------------------------------------------------------------- item 6: finetune's intervals


def rte_run(model: Path, micro_data: Path, out: Path, **options) -> dict:
    """RTE's 24 training rows in batches of 4: 6 batches an epoch."""
    return {
        "task": "rte",
        "model": str(model),
        "data_dir": str(micro_data / "glue"),
        "output_dir": str(out),
        "batch_size": 4,
        "max_seq_length": 32,
        "lr": 1e-3,
        "report_to": ["none"],
        **options,
    }


def test_finetune_keeps_the_users_eval_and_save_intervals(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    out = tmp_path / "rte"
    options = rte_run(tiny_egbert_bert_dir, micro_data, out, epochs=1, eval_every=2, save_every=4)
    run_finetuning(**options, keep_checkpoints=3)
    assert [record["step"] for record in records(out, "eval")] == [2, 4, 6]
    # every 4 steps and at the end, not at the epoch's end only
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-4", "step-6"]


def test_finetune_evaluates_at_each_epoch_end_by_default(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    out = tmp_path / "rte"
    result = run_finetuning(**rte_run(tiny_egbert_bert_dir, micro_data, out, epochs=2)).results[0]
    assert [record["step"] for record in records(out, "eval")] == [6, 12]
    assert [entry["epoch"] for entry in result["history"]] == [1, 2]


def test_finetune_with_a_batch_ramp_evaluates_where_epochs_end(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """The ramp from 1 to 2 batches a step over 8 steps: the first epoch's 6 batches end after
    step 5 (1+1+1+1+2), the second's at step 8 (2+2+2); evaluations and best_epoch follow."""
    out = tmp_path / "rte"
    options = rte_run(tiny_egbert_bert_dir, micro_data, out, batch_ramp_to=8, max_steps=8)
    result = run_finetuning(**options).results[0]
    assert [record["step"] for record in records(out, "eval")] == [5, 8]
    assert [entry["epoch"] for entry in result["history"]] == [1, 2]
    best = max(result["history"], key=lambda entry: entry["score"])
    assert result["best_epoch"] == best["epoch"]


# ---------------------------------------------------------------- item 3: what --resume allows

REQUIRED = {
    "ModelArguments": {"model": "bert"},
    "DataArguments": {"tokenizer": "tok", "train_files": ["a.txt"]},
    "ObjectiveArguments": {},
    "TrainingArguments": {"output_dir": "out"},
    "FinetuneArguments": {"model": "model-dir"},
}


def changed_value(value):
    """Another value of the same kind (a set value for an unset one)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, list):
        return [*value, "changed"]
    return 1


def every_option() -> list[tuple[str, str, object]]:
    from dataclasses import asdict

    import egbert

    found = []
    for name, required in REQUIRED.items():
        defaults = asdict(getattr(egbert, name)(**required))
        found += [(name, field, value) for field, value in defaults.items()]
    return found


# What a resume may change, as docs/training.md and docs/guarantees.md list it (written here,
# not read from egbert.training.checkpoints, whose list is what this checks): what is logged,
# evaluated when, saved, tracked or written beside the model, never what is trained; and a
# longer run.
MAY_CHANGE = {
    "output_dir", "resume", "resume_anyway", "log_every", "eval_every", "eval_every_minutes",
    "save_every",
    "keep_checkpoints", "report_to", "num_workers", "skip_nonfinite", "num_proc",
    "card_datasets", "license", "base_model_id", "predict", "test_file",
    "resume_from_checkpoint", "overwrite_output_dir",  # which checkpoint a run starts from
}  # fmt: skip
MAY_GROW = {"max_steps", "epochs", "budget_minutes"}


@pytest.mark.parametrize(("group", "field", "default"), every_option())
def test_resume_refuses_every_changed_option_but_the_allowed_ones(group, field, default):
    from egbert.training.checkpoints import config_differences

    new = changed_value(default)
    refused = config_differences({"options": {field: default}}, {"options": {field: new}})
    if field in MAY_CHANGE:
        assert refused == []
    else:
        assert refused == [f"--{field.replace('_', '-')} {default} -> {new}"]
    if field in MAY_GROW:  # a longer run may go on from a shorter one, not the reverse
        assert config_differences({"options": {field: 2}}, {"options": {field: 3}}) == []
        assert config_differences({"options": {field: 3}}, {"options": {field: 2}}) != []


def test_the_allow_list_names_only_real_options():
    names = {field for _, field, _ in every_option()}
    assert names >= MAY_CHANGE | MAY_GROW


def test_a_pretraining_checkpoint_holds_every_option(small_corpus, tiny_tokenizer_dir, tmp_path):
    from dataclasses import fields

    from egbert.pretrain.options import PRETRAIN_ARGUMENTS

    out = tmp_path / "run"
    run_pretraining(**tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out, max_steps=2))
    state = json.loads((out / "checkpoints/step-2/trainer_state.json").read_text())
    names = {f.name for cls in PRETRAIN_ARGUMENTS for f in fields(cls)}
    assert set(state["run_config"]["options"]) == names


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (["--config-overrides", "hidden_dropout_prob=0.2"], "--config-overrides"),
        (["--short-seq-prob", "0.3"], "--short-seq-prob 0.1 -> 0.3"),
        (["--encoding-errors", "replace"], "--encoding-errors strict -> replace"),
        (["--max-steps", "2"], "--max-steps 4 -> 2"),
        (["--lr", "0.002"], "--lr 0.001 -> 0.002"),
    ],
)
def test_pretrain_resume_refuses_a_changed_option_in_one_line(
    change, refused, small_corpus, tiny_tokenizer_dir, tmp_path
):
    from egbert.cli import main as cli_main

    out = tmp_path / "run"
    argv = ["pretrain", "--model", "bert", "--preset", "tiny", "--tokenizer"]
    argv += [str(tiny_tokenizer_dir), "--train-files", str(small_corpus["train"])]
    argv += ["--doc-boundary", "wikitext", "--output-dir", str(out), "--seq-len", "32"]
    argv += ["--batch-size", "8", "--max-steps", "4", "--report-to", "none", "--nsp", "true"]
    cli_main(argv)
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*argv, "--resume", *change])
    message = str(exit_info.value.code)
    assert message.startswith("egbert pretrain: error: cannot resume") and "\n" not in message
    assert refused in message, message


def test_pretrain_resume_takes_new_intervals_and_a_longer_run(
    small_corpus, tiny_tokenizer_dir, tmp_path
):
    out = tmp_path / "run"
    options = tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out)
    run_pretraining(**options)
    resumed = run_pretraining(
        **options
        | {"resume": True, "max_steps": 6, "log_every": 1, "save_every": 5, "num_proc": 1}
        | {"keep_checkpoints": 3, "report_to": ["tensorboard"]}
    )
    assert resumed.step == 6
    assert [record["step"] for record in records(out, "train")] == [4, 5, 6]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-4",
        "step-5",
        "step-6",
    ]


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"max_train_samples": 12}, "--max-train-samples None -> 12"),
        ({"max_seq_length": 48}, "--max-seq-length 32 -> 48"),
        ({"config_overrides": "hidden_dropout_prob=0.2"}, "--config-overrides None -> hidden"),
    ],
)
def test_finetune_resume_refuses_a_changed_option(
    change, refused, tiny_egbert_bert_dir, micro_data, tmp_path
):
    out = tmp_path / "rte"
    options = rte_run(tiny_egbert_bert_dir, micro_data, out, max_steps=2, predict=False)
    run_finetuning(**options)
    with pytest.raises(ConfigError, match="cannot resume") as error:
        run_finetuning(**options | change | {"resume": True})
    assert refused in str(error.value)


# ---------------------------------------------------------------- item 1: --dupe-factor


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_dupe_factor_without_nsp_makes_that_many_masked_copies(
    objective, small_corpus, tiny_tokenizer_dir, tmp_path
):
    """One epoch of --dupe-factor 3 is three times the steps of one epoch of the examples."""
    steps = {}
    for dupe in (1, 3):
        options = tiny_run("bert", tiny_tokenizer_dir, small_corpus, tmp_path / f"dupe-{dupe}")
        options |= {"max_steps": None, "epochs": 1, "batch_size": 32, "nsp": False}
        options |= {"train_files": [str(small_corpus["short"])]}
        options |= {"objective": objective, "dupe_factor": dupe}
        steps[dupe] = run_pretraining(**options).step
    assert steps[1] >= 3 and steps[3] in range(3 * steps[1] - 2, 3 * steps[1] + 1), steps


@pytest.mark.parametrize("family", ["gpt", "elmo"])
def test_dupe_factor_is_refused_where_it_does_not_apply(
    family, small_corpus, tiny_tokenizer_dir, tmp_path
):
    out = tmp_path / "run"
    options = tiny_run(family, tiny_tokenizer_dir, small_corpus, out, dupe_factor=2)
    with pytest.raises(ConfigError, match="--dupe-factor 2: .*bert") as error:
        run_pretraining(**options)
    assert "\n" not in str(error.value) and not out.exists()


# ---------------------------------------------------------------- items 4, 5: budget and epochs


def last_lr(checkpoint: Path) -> float:
    """The learning rate the scheduler saved in a checkpoint sets for the next update."""
    import torch

    state = torch.load(checkpoint / "scheduler.bin", weights_only=True)
    return state["_last_lr"][0]


def test_a_budget_run_that_ends_with_its_epochs_ends_its_schedule(
    small_corpus, tiny_tokenizer_dir, tmp_path
):
    """--budget-minutes 10 with --epochs 1: the epoch ends first, and so does the schedule."""
    out = tmp_path / "run"
    options = tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out, max_steps=None, epochs=1)
    options |= {"train_files": [str(small_corpus["short"])], "budget_minutes": 10}
    result = run_pretraining(**options | {"batch_size": 32}, log_every=1, lr=1e-3)
    assert result.step >= 4 and result.elapsed_seconds < 600
    lrs = [record["lr"] for record in records(out, "train")]
    assert lrs[0] > 0.5e-3 and lrs[-1] <= 1e-3 / result.step + 1e-9, lrs
    assert last_lr(out / "checkpoints" / f"step-{result.step}") == 0.0


def test_a_budgeted_finetune_ends_at_the_end_of_its_schedule(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    out = tmp_path / "rte"
    options = rte_run(
        tiny_egbert_bert_dir, micro_data, out, epochs=2, budget_minutes=10, log_every=1
    )
    result = run_finetuning(**options, warmup_steps=0, predict=False).results[0]
    assert result["epochs"] == 2 and [entry["epoch"] for entry in result["history"]] == [1, 2]
    assert last_lr(out / "checkpoints" / "step-12") == 0.0


def test_a_budget_run_keeps_its_elapsed_time_on_resume(small_corpus, tiny_tokenizer_dir, tmp_path):
    """The schedule of a budget run follows its training time: a resume goes on from the
    checkpoint's elapsed time, not from zero."""
    out = tmp_path / "run"
    options = tiny_run("gpt", tiny_tokenizer_dir, small_corpus, out, budget_minutes=10)
    first = run_pretraining(**options, log_every=1)
    resumed = run_pretraining(**options | {"max_steps": 8, "resume": True, "log_every": 1})
    elapsed = [record["elapsed_s"] for record in records(out, "train")]
    assert len(elapsed) == 8 and elapsed == sorted(elapsed)
    assert elapsed[4] > first.elapsed_seconds - 1e-3
    assert resumed.elapsed_seconds > first.elapsed_seconds
    state = json.loads((out / "checkpoints/step-8/trainer_state.json").read_text())
    assert state["elapsed_seconds"] == pytest.approx(resumed.elapsed_seconds)
