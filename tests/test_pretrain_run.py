"""End-to-end tests of `egbert pretrain`: each family's tiny preset on a WikiText-2 slice, bad
options, config files, and a SIGKILL + resume of the real job that must match a clean run."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import kill_once
from option_coverage import proves
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import egbert.models  # noqa: F401  (registers the Auto classes)
from egbert.arguments import parse_args
from egbert.cli import main as cli_main
from egbert.commands.pretrain import main
from egbert.config import TrainingArguments, load_preset
from egbert.errors import ConfigError
from egbert.pretrain.options import PRETRAIN_ARGUMENTS, DataArguments
from egbert.pretrain.run import (
    FAMILY_DEFAULTS,
    build_model,
    elmo_perplexities,
    gpt_perplexity,
    parse_pretrain_args,
    pretraining_data,
)
from egbert.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def corpus(wikitext_slice: Path, data_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """The slice for training, a short one for the resume test, 100 lines of valid for eval."""
    folder = tmp_path_factory.mktemp("pretrain-corpus")
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "short.tokens").write_text("".join(lines[:80]), encoding="utf-8")
    valid = (data_dir / "corpus/wikitext-2/wiki.valid.tokens").read_text(encoding="utf-8")
    (folder / "valid.tokens").write_text("".join(valid.splitlines(True)[:100]), encoding="utf-8")
    return {
        "train": wikitext_slice,
        "short": folder / "short.tokens",
        "valid": folder / "valid.tokens",
    }


def pretrain_argv(family: str, tokenizer: Path, train: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", family,
        "--preset", "tiny",
        "--tokenizer", str(tokenizer),
        "--train-files", str(train),
        "--doc-boundary", "wikitext",
        "--output-dir", str(out),
        "--seq-len", "32",
        "--batch-size", "8",
        "--seed", "3",
        *extra,
    ]  # fmt: skip


def split_records(out: Path, split: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


def examples_of(argv: list[str], split: str) -> list[list[int]]:
    """The `split` ("train" or "eval") examples of a run's options, as `pretraining_data` builds
    them (test_data_options.py proves them against examples built by definition)."""
    model_args, data_args, objective_args, training_args = parse_pretrain_args(argv)
    parts = (model_args.model, data_args, objective_args, load_tokenizer(data_args.tokenizer))
    examples = getattr(pretraining_data(*parts, training_args.seed, None), split)
    return [list(map(int, example["input_ids"])) for example in examples]


def next_token_loss(model_dir: Path, blocks: list[list[int]]) -> float:
    """The mean cross entropy of each next token of `blocks` under the saved causal LM."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor(blocks)  # (blocks, seq)
    with torch.no_grad():
        logits = torch.cat([model(chunk).logits for chunk in ids.split(8)])
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()


@pytest.mark.parametrize(
    ("family", "options", "metrics", "loss_parts"),
    [
        (
            "bert",
            [],
            {"loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy"},
            {"mlm_loss": 1, "nsp_loss": 1},
        ),
        (
            "bert",
            ["--objective", "rtd", "--nsp", "false"],
            {"loss", "generator_mlm_loss", "rtd_loss", "rtd_accuracy", "replaced_share"},
            {"generator_loss": 1, "rtd_loss": 50},
        ),
        ("gpt", [], {"loss", "perplexity"}, {}),
        (
            "elmo",
            [],
            {"loss", "forward_perplexity", "backward_perplexity", "perplexity"},
            {"forward_loss": 0.5, "backward_loss": 0.5},
        ),
        # Muon on every family's matrices (elmo's LSTMs included), AdamW on the rest
        ("bert", ["--optim", "muon", "--nsp", "false"], {"loss", "mlm_loss"}, {}),
        ("gpt", ["--optim", "muon"], {"loss", "perplexity"}, {}),
        (
            "elmo",
            ["--optim", "muon"],
            {"loss", "perplexity"},
            {"forward_loss": 0.5, "backward_loss": 0.5},
        ),
    ],
)
def test_tiny_preset_pretrains_and_validation_loss_falls(
    family, options, metrics, loss_parts, corpus, tiny_tokenizer_dir, tmp_path
):
    out = tmp_path / family
    extra = ["--validation-files", str(corpus["valid"]), "--max-steps", "36", "--lr", "2e-3"]
    extra += options
    extra += ["--label-smoothing", "0.1"]  # trains with it; the saved config keeps 0.0
    main(pretrain_argv(family, tiny_tokenizer_dir, corpus["train"], out, *extra,
                       "--eval-every", "12", "--warmup-steps", "0.1"))  # fmt: skip
    evals = split_records(out, "eval")
    assert [record["step"] for record in evals] == [12, 24, 36]
    assert metrics <= set(evals[-1])
    # gpt falls ~0.09-0.15 here
    if "rtd" in options:
        # rtd's total is 50 x the discriminator's loss, which is near its floor by step 12 and moves
        # by ±0.01 (±0.5 of the total) with the tokenizer: so the generator must learn, and the
        # discriminator must beat one that calls every token original (its accuracy: 1 - share;
        # ~0.03 above it here, level with it when the discriminator is shown the original tokens)
        generator = [record["generator_mlm_loss"] for record in evals]
        assert generator[-1] < generator[0] - 0.05, generator
        all_original = 1 - evals[-1]["replaced_share"]
        assert evals[-1]["rtd_accuracy"] > all_original + 0.01, (evals[-1], all_original)
    else:
        assert evals[-1]["loss"] < evals[0]["loss"] - 0.05, [record["loss"] for record in evals]
    last = evals[-1]
    if family == "gpt":  # the saved (step-36) model's next-token loss, by torch's cross entropy
        argv = pretrain_argv(family, tiny_tokenizer_dir, corpus["train"], out, *extra)
        held_out = next_token_loss(out / "model", examples_of(argv, "eval"))
        assert last["loss"] == pytest.approx(held_out, rel=1e-4)
        assert last["perplexity"] == pytest.approx(math.exp(held_out), rel=1e-4)
    if family == "elmo":  # commands.md: the mean of the two directions' perplexities
        forward, backward = math.exp(last["forward_loss"]), math.exp(last["backward_loss"])
        assert last["loss"] == pytest.approx((last["forward_loss"] + last["backward_loss"]) / 2)
        assert last["forward_perplexity"] == pytest.approx(forward, rel=1e-9)
        assert last["backward_perplexity"] == pytest.approx(backward, rel=1e-9)
        assert last["perplexity"] == pytest.approx((forward + backward) / 2, rel=1e-9)
    # the training log shows the parts of the loss beside it, and tokens/s and MFU
    train = split_records(out, "train")
    assert all(record["tokens_per_s"] > 0 and record["mfu"] > 0 for record in train)
    assert {name for name in train[-1] if name.endswith("loss")} == {"loss", *loss_parts}
    for record in train:
        total = sum(weight * record[name] for name, weight in loss_parts.items())
        assert record["loss"] == pytest.approx(total if loss_parts else record["loss"], rel=1e-5)
    model = AutoModel.from_pretrained(out / "model")
    assert model.config.model_type == f"egbert-{family}" and model.config.label_smoothing == 0.0
    assert len(AutoTokenizer.from_pretrained(out / "model")) == model.config.vocab_size == 1000
    for name in ("model.safetensors", "config.json", "README.md"):
        assert (out / "model" / name).is_file()
    for name in ("loss_curve.png", "train.log", "train_results.json", "pretrain_args.json"):
        assert (out / name).is_file()
    assert (out / "checkpoints" / "step-36").is_dir()


def test_perplexity_is_exp_of_the_loss_and_elmos_the_mean_of_its_directions():
    """docs/commands.md: gpt's perplexity is exp(loss); elmo's the mean of the forward and the
    backward perplexities (Peters et al.), here 250, not exp of the mean loss (200)."""
    assert gpt_perplexity({"loss": math.log(50.0)})["perplexity"] == pytest.approx(50.0)
    losses = {"forward_loss": math.log(100.0), "backward_loss": math.log(400.0)}
    elmo = elmo_perplexities({**losses, "loss": sum(losses.values()) / 2})
    assert elmo["forward_perplexity"] == pytest.approx(100.0)
    assert elmo["backward_perplexity"] == pytest.approx(400.0)
    assert elmo["perplexity"] == pytest.approx(250.0)


def _one_line_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["pretrain", *argv])
    message = str(exit_info.value.code)
    assert message.startswith("egbert pretrain: error: ") and "\n" not in message, message
    return message


def test_bad_options_end_with_one_line(corpus, tiny_tokenizer_dir, tmp_path, capsys):
    args = pretrain_argv("gpt", tiny_tokenizer_dir, corpus["short"], tmp_path / "run")
    assert "--lr must be > 0" in _one_line_error([*args, "--lr", "-0.1"], capsys)
    message = _one_line_error([*args, "--seq-len", "1024"], capsys)
    assert "--seq-len 1024 is above the model's max_position_embeddings (512)" in message
    preset = tmp_path / "odd.yaml"
    preset.write_text("hidden_size: 30\nnum_hidden_layers: 1\nnum_attention_heads: 4\n")
    message = _one_line_error([*args, "--preset", str(preset)], capsys)
    assert "hidden_size (30) must be divisible by num_attention_heads (4)" in message
    message = _one_line_error([*args, "--preset", "huge"], capsys)
    assert "unknown gpt preset 'huge'; use one of base, mini, small, tiny" in message
    message = _one_line_error([*args, "--objective", "rtd"], capsys)
    assert "--objective rtd pretrains a bert encoder without next-sentence prediction" in message
    bert = pretrain_argv("bert", tiny_tokenizer_dir, corpus["short"], tmp_path / "run")
    message = _one_line_error([*bert, "--objective", "rtd"], capsys)
    assert "use it with --model bert --nsp false" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


@proves("pretrain", "--config-overrides")
def test_config_overrides_change_a_fresh_models_config(corpus, tiny_tokenizer_dir, tmp_path):
    args = pretrain_argv("bert", tiny_tokenizer_dir, corpus["short"], tmp_path / "run")
    overrides = [
        "--config-overrides",
        "pre_layernorm=true,hidden_dropout_prob=0,max_position_embeddings=64",
    ]
    model_args, _, objective_args, _ = parse_args(PRETRAIN_ARGUMENTS, [*args, *overrides], "p", "")
    config = build_model(model_args, objective_args, load_tokenizer(tiny_tokenizer_dir))[0].config
    assert config.pre_layernorm is True and config.hidden_dropout_prob == 0.0
    assert config.max_position_embeddings == 64 and config.attention_probs_dropout_prob == 0.1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("warp_factor=9", "key warp_factor isn't in the original config dict"),
        ("pre_layernorm=maybe", "can't derive true or false from maybe"),
        ("hidden_dropout_prob", "write key=value pairs"),
        ("hidden_act=swish", "hidden_act 'swish' is not supported"),
        (
            "local_attention_init=true,position_embedding_type=sinusoidal",
            "local_attention_init needs learned positions",
        ),
    ],
)
def test_bad_config_overrides_end_with_one_line(
    overrides, message, corpus, tiny_tokenizer_dir, tmp_path, capsys
):
    args = pretrain_argv("bert", tiny_tokenizer_dir, corpus["short"], tmp_path / "run")
    error = _one_line_error([*args, "--config-overrides", overrides], capsys)
    # the error names the overrides merged into the recipe's (bert's adds three keys)
    assert "--config-overrides '" in error and message in error
    error = _one_line_error(
        [*args, "--config-overrides", "pre_layernorm=true", "--init-from", str(tmp_path)], capsys
    )
    assert "--config-overrides changes a fresh model's config" in error
    assert not (tmp_path / "run").exists()


def test_config_file_sets_options_and_the_command_line_wins(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: gpt\ntokenizer: tok\ntrain_files: [a.txt, b.txt]\noutput-dir: out\n"
        "lr: 1e-3\nseq_len: 64\nbf16: true\n"
    )
    model_args, data_args, _, training_args = parse_args(
        PRETRAIN_ARGUMENTS,
        ["--config", str(config), "--seq-len", "32"],
        prog="egbert pretrain",
        description="",
    )
    assert model_args.model == "gpt" and data_args.train_files == ["a.txt", "b.txt"]
    assert data_args.seq_len == 32 and training_args.lr == 1e-3 and training_args.bf16
    config.write_text("model: gpt\nlern_rate: 0.1\n")
    with pytest.raises(ConfigError, match="unknown option.*lern_rate"):
        parse_args(PRETRAIN_ARGUMENTS, ["--config", str(config)], "p", "")


def test_family_defaults_sit_under_the_config_file_and_the_command_line(tmp_path):
    required = ["--tokenizer", "tok", "--train-files", "a.txt", "--output-dir", "out"]
    bert_model, bert_data, bert_objective, bert_training = parse_pretrain_args(
        ["--model", "bert", *required]
    )
    elmo_model, elmo_data, _, elmo_training = parse_pretrain_args(["--model", "elmo", *required])
    gpt_model, _, _, gpt_training = parse_pretrain_args(["--model", "gpt", *required])
    assert gpt_training.lr == FAMILY_DEFAULTS["gpt"]["lr"] != TrainingArguments.lr
    assert "attention_probs_dropout_prob=0" in gpt_model.config_overrides
    # bert: the recipe comparison's choices, with next-sentence prediction kept
    assert bert_objective.nsp and bert_objective.mlm_probability == 0.4
    assert bert_training.batch_size == 16
    assert bert_training.lr == FAMILY_DEFAULTS["bert"]["lr"] != TrainingArguments.lr
    assert "local_attention_init=true" in bert_model.config_overrides
    assert elmo_training.lr == FAMILY_DEFAULTS["elmo"]["lr"] != TrainingArguments.lr
    assert elmo_model.config_overrides == FAMILY_DEFAULTS["elmo"]["config_overrides"]
    assert elmo_data.seq_len == FAMILY_DEFAULTS["elmo"]["seq_len"] != bert_data.seq_len
    assert parse_pretrain_args(["--model", "elmo", *required, "--seq-len", "32"])[1].seq_len == 32
    assert parse_pretrain_args(["--model", "elmo", *required, "--lr", "1e-4"])[3].lr == 1e-4
    config = tmp_path / "run.yaml"
    config.write_text("model: elmo\nlr: 3e-4\n")
    assert parse_pretrain_args(["--config", str(config), *required])[3].lr == 3e-4
    # A model from --init-from keeps its config, so the family's overrides of a fresh one go.
    init_args = parse_pretrain_args(["--model", "elmo", *required, "--init-from", "m"])[0]
    assert init_args.config_overrides is None


def test_presets_and_yaml_files_load():
    assert load_preset("bert", "tiny")["hidden_size"] == 128
    assert load_preset("elmo", "base")["cell_size"] == 4096
    with pytest.raises(ConfigError, match="use one of base, mini, small, tiny"):
        load_preset("elmo", "huge")


def _newest_checkpoint_epoch(out: Path) -> int:
    epochs = [-1]
    for state in (out / "checkpoints").glob("step-*/trainer_state.json"):
        try:
            epochs.append(json.loads(state.read_text())["epoch"])
        except FileNotFoundError:  # rotated away between the glob and the read
            continue
    return max(epochs)


@pytest.mark.slow
def test_sigkill_in_the_second_epoch_then_resume_equals_a_clean_run(
    corpus, tiny_tokenizer_dir, tmp_path, subprocess_env, warm_python, capsys
):
    """bert with dropout, NSP and dynamic masking: killed after a checkpoint in epoch 1 and
    resumed, it ends with the clean run's weights and loss (fp32 CPU, within 1e-6)."""
    extra = ["--epochs", "3", "--save-every", "3", "--log-every", "1", "--lr", "1e-3"]
    clean = tmp_path / "clean"
    main(pretrain_argv("bert", tiny_tokenizer_dir, corpus["short"], clean, *extra))
    final = json.loads(next((clean / "checkpoints").glob("step-*/trainer_state.json")).read_text())
    assert final["step"] >= 16  # >= 4 steps per epoch: epoch 1 has a checkpoint to kill after

    out = tmp_path / "killed"
    argv = pretrain_argv("bert", tiny_tokenizer_dir, corpus["short"], out, *extra, "--resume")
    env = subprocess_env
    command = [warm_python(env), "-m", "egbert.cli", "pretrain", *argv]
    kill_once(command, env, lambda: _newest_checkpoint_epoch(out) >= 1, "checkpoint in epoch 1")
    assert not (out / "model").exists()

    capsys.readouterr()
    main(argv)  # resumed in this process, as the clean run (a fresh interpreter costs ~5 s)
    assert "resumed from" in capsys.readouterr().out
    clean_weights, resumed_weights = (
        load_file(clean / "model/model.safetensors"),
        load_file(out / "model/model.safetensors"),
    )
    for name, tensor in clean_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, atol=1e-6, rtol=0)

    def train_losses(run: Path) -> list[float]:
        records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return [record["loss"] for record in records if record["split"] == "train"]

    assert train_losses(out) == pytest.approx(train_losses(clean), abs=1e-6)

    changed = [*argv[: argv.index("--seq-len") + 1], "48", *argv[argv.index("--seq-len") + 2 :]]
    with pytest.raises(ConfigError, match=r"--seq-len 32 -> 48"):
        main(changed)


def test_max_eval_samples_keeps_the_first_validation_examples():
    from datasets import Dataset

    from egbert.pretrain.run import first_examples

    examples = Dataset.from_dict({"input_ids": [[i] for i in range(10)]})
    assert first_examples(examples, 3)["input_ids"] == [[0], [1], [2]]
    assert len(first_examples(examples, 30)) == 10
    streamed = first_examples(examples.to_iterable_dataset(), 3)
    assert [example["input_ids"] for example in streamed] == [[0], [1], [2]]
    with pytest.raises(ConfigError, match="--max-eval-samples must be >= 1"):
        DataArguments(tokenizer="t", train_files=["a"], max_eval_samples=0)


# ---------------------------------------------------------------- the run options of run_mlm.py


@contextlib.contextmanager
def logged(*loggers: str) -> Iterator[list[logging.LogRecord]]:
    """The records these loggers emit meanwhile (transformers' own do not propagate to pytest's
    handler, so caplog would not see them)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    for name in loggers:
        logging.getLogger(name).addHandler(handler)
    try:
        yield records
    finally:
        for name in loggers:
            logging.getLogger(name).removeHandler(handler)


def gpt_argv(corpus, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    argv = pretrain_argv("gpt", tokenizer, corpus["short"], out, "--batch-size", "4")
    return [*argv, "--report-to", "none", "--log-every", "1", *extra]


@proves("pretrain", "--max-train-samples")
def test_max_train_samples_trains_on_the_first_examples_only(corpus, tiny_tokenizer_dir, tmp_path):
    """12 examples in batches of 4: 3 steps an epoch (the short corpus has some 80 blocks),
    the first 12 of those the corpus gives without the option."""
    out = tmp_path / "run"
    whole = examples_of(gpt_argv(corpus, tiny_tokenizer_dir, out), "train")
    first = examples_of(gpt_argv(corpus, tiny_tokenizer_dir, out, "--max-train-samples", "12"),
                        "train")  # fmt: skip
    assert len(whole) > 12 and first == whole[:12]
    with logged("accelerate.utils.other") as records:  # gpt ties its output weights
        main(
            gpt_argv(corpus, tiny_tokenizer_dir, out, "--max-train-samples", "12", "--epochs", "2")
        )
    assert [record["step"] for record in split_records(out, "train")] == [1, 2, 3, 4, 5, 6]
    assert not any("Removed shared tensor" in record.getMessage() for record in records)


@proves("pretrain", "--overwrite-output-dir")
def test_overwrite_output_dir_removes_the_earlier_checkpoints_and_says_so(
    corpus, tiny_tokenizer_dir, tmp_path
):
    out = tmp_path / "run"
    argv = gpt_argv(corpus, tiny_tokenizer_dir, out, "--save-every", "2")
    main([*argv, "--max-steps", "4"])
    with pytest.raises(ConfigError, match="already holds checkpoints.*--overwrite-output-dir"):
        main([*argv, "--max-steps", "2"])
    main([*argv, "--max-steps", "2", "--overwrite-output-dir"])
    said = [line for line in (out / "train.log").read_text().splitlines() if "overwrite" in line]
    assert said == [
        "egbert: --overwrite-output-dir: removed the earlier run's checkpoints step-2, step-4 "
        f"from {out / 'checkpoints'}"
    ]
    assert [path.name for path in (out / "checkpoints").iterdir()] == ["step-2"]
    assert [record["step"] for record in split_records(out, "train")] == [1, 2]  # this run's


@proves("pretrain", "--resume-from-checkpoint")
def test_resume_from_checkpoint_goes_on_from_the_one_named(corpus, tiny_tokenizer_dir, tmp_path):
    """Resumed from step-2 of a 6-step run, the run trains steps 3..6 again to the same weights;
    the later checkpoints, of the branch trained again, are removed."""
    out = tmp_path / "run"
    argv = gpt_argv(corpus, tiny_tokenizer_dir, out, "--max-steps", "6", "--save-every", "2")
    main([*argv, "--keep-checkpoints", "3"])
    first = load_file(out / "model/model.safetensors")
    main([*argv, "--resume-from-checkpoint", str(out / "checkpoints/step-2")])
    resumed = [line for line in (out / "train.log").read_text().splitlines() if "resumed" in line]
    assert resumed == [
        f"egbert: resumed from {out / 'checkpoints/step-2'} (step 2, epoch 0, batch 2 of the "
        "epoch); removed the later step-4, step-6"
    ]
    for name, tensor in load_file(out / "model/model.safetensors").items():
        torch.testing.assert_close(tensor, first[name], atol=1e-6, rtol=0)
    assert [record["step"] for record in split_records(out, "train")] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ConfigError, match="--resume-from-checkpoint .*: not a checkpoint"):
        main([*argv, "--resume-from-checkpoint", str(out)])


def test_a_resumed_run_checks_its_options_before_it_reads_the_corpus(
    corpus, tiny_tokenizer_dir, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    argv = gpt_argv(corpus, tiny_tokenizer_dir, out, "--max-steps", "2", "--save-every", "2")
    main(argv)

    def read_corpus(*args, **kwargs):
        raise AssertionError("the corpus was read before the options were checked")

    monkeypatch.setattr("egbert.pretrain.run.load_corpus", read_corpus)
    with pytest.raises(ConfigError, match=r"cannot resume from .*step-2: .*--lr 0.001 -> 0.002"):
        main([*argv, "--resume", "--lr", "2e-3"])
