"""Every option of `egbert finetune`, each against an expectation from outside the code under
test, read off what finetune builds (`finetuning_trainer`: the data, the model and the trainer,
before any step) or, where only a run shows it, off a short run's files.

The trainer's own options (`TrainingArguments`) are the trainer's to honour, which
tests/test_trainer_options.py proves through `egbert pretrain`; here they are proved to reach
the trainer finetune builds, each by what that trainer holds: its optimizer, its schedule, its
loader, its Accelerator, its model. The expectations come from the options' definitions
(counted or computed here), torch (cross entropy), transformers (the schedules), scipy (the
correlations of a regression task) and the files as Python's own readers read them.

Cost: about 1 s per built trainer (no training), a few seconds per run (2 cores, under load).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import torch_threads
from option_coverage import proves
from scipy.stats import pearsonr, spearmanr
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

import egbert.models.heads  # noqa: F401  (registers egbert's classifiers with the Auto classes)
from egbert import run_finetuning
from egbert.arguments import arguments_from_options
from egbert.config import TrainingArguments
from egbert.errors import CheckpointError
from egbert.finetune.options import FinetuneArguments
from egbert.finetune.run import (
    TaskTrainer,
    finetuning_recipe,
    finetuning_trainer,
    parse_finetune_args,
    tasks_to_run,
)
from egbert.lora import LoraArguments
from egbert.models.bert import EgbertBertModel
from egbert.training.optimization import batches_per_step
from egbert.training.trainer import COMPILE_SETTINGS

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

RTE_LABELS = {0: "entailment", 1: "not_entailment"}  # GLUE's RTE, in the hub's class order
CUSTOM_TEXT = "the river ran past the old castle where the king kept his horses and hounds"


def build(*argv: str) -> TaskTrainer:
    """What `egbert finetune ARGV` trains: its (one) task's trainer, built, not run."""
    args, training, lora = parse_finetune_args(list(argv))
    (task,) = tasks_to_run(args)
    return finetuning_trainer(task, args, training, Path(training.output_dir), lora)


def rte(model: Path, micro_data: Path, out: Path, *argv: str) -> list[str]:
    """The arguments of a fine-tune of RTE's 24 training rows (16 dev rows), without trackers."""
    common = ["--task", "rte", "--model", str(model), "--data-dir", str(micro_data / "glue")]
    return [*common, "--output-dir", str(out), "--report-to", "none", *argv]


def tsv_rows(path: Path) -> list[dict[str, str]]:
    """A GLUE TSV file's rows as Python's csv module reads it (no quoting: GLUE's own)."""
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def encoded(tokenizer, rows: list[dict], columns: list[str], max_length: int) -> list[list[int]]:
    """The ids a classifier is fed: the texts of `columns` (a pair: [CLS] a [SEP] b [SEP])."""
    texts = [[row[column] for row in rows] for column in columns]
    return tokenizer(*texts, truncation=True, max_length=max_length)["input_ids"]


def first_examples(trainer, count: int) -> dict[str, torch.Tensor]:
    """The first `count` training examples as one batch of the trainer's collator, on the
    trainer's device."""
    dataset = trainer.train_loader.dataset
    batch = trainer.data_collator([dataset[i] for i in range(count)])
    return {name: tensor.to(trainer.accelerator.device) for name, tensor in batch.items()}


def on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict's tensors on the CPU, to compare a model on any device with a saved one."""
    return {name: tensor.cpu() for name, tensor in state.items()}


# ---------------------------------------------------------------- the command and the Python API


def test_the_python_api_takes_every_option_as_the_command_line_does():
    """run_finetuning's keyword arguments and the command's options are one set of options:
    each non-default value given either way ends in the same dataclasses."""
    values = {
        "model": "m", "task": "rte", "data_dir": "g", "train_file": "t.csv",
        "validation_file": "v.csv", "test_file": "x.csv", "text_columns": ["a", "b"],
        "label_column": "y", "regression": True, "max_train_samples": 5, "max_seq_length": 16,
        "features": "last4-sum", "pool": "mean", "layer_norm": True, "freeze": True,
        "config_overrides": "hidden_dropout_prob=0", "allow_pickle": True, "predict": False,
        "base_model_id": "someone/base", "license": "mit", "output_dir": "o", "lr": 3e-4,
        "weight_decay": 0.2, "adam_beta1": 0.8, "adam_beta2": 0.9, "adam_epsilon": 1e-6,
        "batch_size": 4, "grad_accum": 1, "batch_ramp_to": 8, "max_steps": 6, "epochs": 2,
        "schedule": "cosine", "warmup_steps": 2.0, "bf16": False, "fp16": True,
        "gradient_checkpointing": True, "group_by_length": False, "max_grad_norm": 0.5,
        "label_smoothing": 0.1, "eval_every": 2, "save_every": 3, "keep_checkpoints": 4,
        "seed": 5, "budget_minutes": 3.0, "skip_nonfinite": 2, "log_every": 1,
        "report_to": ["none"], "resume": True, "resume_anyway": True,
        "metric_for_best_model": "loss", "greater_is_better": False, "num_workers": 1,
        "compile": True, "compile_mode": "max-autotune", "use_cpu": True,
        "ddp_find_unused_parameters": True, "resume_from_checkpoint": "o/checkpoints/step-3",
        "replay_clock": "done", "optim": "muon", "muon_lr": 0.02, "muon_weight_decay": 0.1,
        "muon_momentum": 0.9, "wsd_decay": 0.3, "eval_every_minutes": 2.5, "lora": True,
        "lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.1, "lora_target_modules": ["qkv"],
    }  # fmt: skip
    argv = []
    for name, value in values.items():
        option = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            argv.append(option if value else f"--no-{option[2:]}")
        else:
            argv += [option, *map(str, value if isinstance(value, list) else [value])]
    types = (FinetuneArguments, TrainingArguments, LoraArguments)
    from_python = arguments_from_options(types, values, finetuning_recipe(values))
    assert from_python == parse_finetune_args(argv)
    names = {name for cls in types for name in cls.__dataclass_fields__}
    # --overwrite-output-dir starts over where --resume goes on, --auto-find-batch-size sets
    # the accumulation where --batch-ramp-to does: given apart
    overwrite = {"model": "m", "output_dir": "o", "overwrite_output_dir": True}
    overwrite["auto_find_batch_size"] = True
    from_python_overwrite = arguments_from_options(types, overwrite, finetuning_recipe(overwrite))
    argv = ["--model", "m", "--output-dir", "o", "--overwrite-output-dir", "--auto-find-batch-size"]
    from_argv = parse_finetune_args(argv)
    assert from_python_overwrite == from_argv and from_argv[1].overwrite_output_dir is True
    assert from_argv[1].auto_find_batch_size is True
    assert set(values) | set(overwrite) == names, "the test gives every option"
    defaults = parse_finetune_args(["--model", "m", "--output-dir", "o"])
    # --batch-ramp-to accumulates by itself; the options given apart above are given apart
    kept = {"model", "output_dir", "grad_accum", "overwrite_output_dir", "auto_find_batch_size"}
    for instance, default in zip(from_python, defaults, strict=True):
        for name, value in vars(instance).items():
            if name not in kept:
                assert value != getattr(default, name), f"{name} is given its default"


# ---------------------------------------------------------------- the task, the data, the model


@proves("finetune", "--model", "--task", "--data-dir", "--output-dir")
def test_the_model_task_and_glue_folder_are_the_ones_named(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    built = build(*rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out"))
    trainer, tokenizer = built.trainer, AutoTokenizer.from_pretrained(tiny_egbert_bert_dir)
    assert trainer.output_dir == tmp_path / "out"
    model = trainer.model
    assert model.config.id2label == RTE_LABELS
    saved = EgbertBertModel.from_pretrained(tiny_egbert_bert_dir).state_dict()
    backbone = on_cpu(model.base_model.state_dict())
    assert saved.keys() == backbone.keys()
    assert all(torch.equal(backbone[name], saved[name]) for name in saved)
    train, dev = trainer.train_loader.dataset, trainer.evaluator.loaders[""].dataset
    for name, dataset in (("train", train), ("dev", dev)):
        rows = tsv_rows(micro_data / "glue" / "RTE" / f"{name}.tsv")
        # cut to the default length: 128, or the model's 64 positions where fewer
        expected = encoded(tokenizer, rows, ["sentence1", "sentence2"], 64)
        assert dataset["input_ids"] == expected
        labels = {label: i for i, label in RTE_LABELS.items()}
        assert dataset["labels"] == [labels[row["label"]] for row in rows]


@pytest.fixture(scope="module")
def custom_files(tmp_path_factory) -> dict[str, Path]:
    """A regression task in JSONL: pairs of texts in columns `a` and `b`, scores in `s`; long
    enough texts that 16 tokens cut them."""
    words = CUSTOM_TEXT.split()
    folder = tmp_path_factory.mktemp("custom-task")
    files = {}
    for name, count, offset in (("train", 8, 0), ("dev", 6, 3), ("test", 5, 5)):
        rows = []
        for i in range(count):
            first = " ".join(words[(i + offset) % 5 :] + words[: (i + offset) % 5])
            second = " ".join(reversed(words[: 4 + (i + offset) % 7]))
            rows.append({"a": first, "b": second, "s": round(0.7 * ((i + offset) % 6), 2)})
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return files


def jsonl_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def custom(model: Path, files: dict[str, Path], out: Path, *argv: str) -> list[str]:
    """The arguments of a regression fine-tune on `custom_files`."""
    paths = ["--train-file", str(files["train"]), "--validation-file", str(files["dev"])]
    paths += ["--test-file", str(files["test"])]
    task = ["--text-columns", "a", "b", "--label-column", "s", "--regression"]
    common = ["--model", str(model), "--output-dir", str(out), "--report-to", "none"]
    return [*common, *paths, *task, *argv]


@proves(
    "finetune", "--train-file", "--validation-file", "--test-file", "--text-columns",
    "--label-column", "--regression", "--max-train-samples", "--max-seq-length",
)  # fmt: skip
def test_a_custom_task_reads_its_files_columns_and_labels(
    tiny_egbert_bert_dir, custom_files, tmp_path
):
    argv = custom(tiny_egbert_bert_dir, custom_files, tmp_path / "out")
    built = build(*argv, "--max-train-samples", "5", "--max-seq-length", "16")
    trainer, tokenizer = built.trainer, AutoTokenizer.from_pretrained(tiny_egbert_bert_dir)
    train, dev = trainer.train_loader.dataset, trainer.evaluator.loaders[""].dataset
    rows = {name: jsonl_rows(path) for name, path in custom_files.items()}
    assert train["input_ids"] == encoded(tokenizer, rows["train"][:5], ["a", "b"], 16)
    assert max(map(len, train["input_ids"])) == 16  # the texts are longer: cut to 16
    assert train["labels"] == pytest.approx([row["s"] for row in rows["train"][:5]])
    assert dev["input_ids"] == encoded(tokenizer, rows["dev"], ["a", "b"], 16)
    assert dev["labels"] == pytest.approx([row["s"] for row in rows["dev"]])
    assert built.splits["test"]["a"] == [row["a"] for row in rows["test"]]
    config = trainer.model.config
    assert config.problem_type == "regression" and config.num_labels == 1
    scores = np.array([row["s"] for row in rows["train"][:5]], dtype=np.float32)
    assert config.regression_target_mean == pytest.approx(float(scores.mean()))
    assert config.regression_target_std == pytest.approx(float(scores.std()))


@proves("finetune", "--features", "--pool", "--layer-norm", "--freeze", "--config-overrides")
def test_the_head_options_make_the_head_and_the_backbone_they_name(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """The classifier reads the last four hidden states (all three of a 2-layer model), each
    mean-pooled over the real tokens and normalized, concatenated: computed here from the
    backbone's hidden states. The frozen backbone is out of the optimizer; the dropout of
    --config-overrides is the backbone's."""
    head = ["--features", "last4-concat", "--pool", "mean", "--layer-norm", "--freeze"]
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", *head)
    built = build(*argv, "--config-overrides", "hidden_dropout_prob=0.25")
    model = built.trainer.model.eval()
    dropouts = {
        (name.endswith("attention_dropout"), m.p)
        for name, m in model.base_model.named_modules()
        if isinstance(m, torch.nn.Dropout)
    }
    assert dropouts == {(False, 0.25), (True, 0.1)}  # attention's: attention_probs_dropout_prob
    batch = first_examples(built.trainer, 4)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    with torch.no_grad():
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
        states = model.base_model(**inputs, output_hidden_states=True).hidden_states
        pooled = [(layer * mask).sum(1) / mask.sum(1) for layer in reversed(states)]
        features = torch.cat([F.layer_norm(p, p.shape[-1:], eps=1e-12) for p in pooled], dim=-1)
        torch.testing.assert_close(model(**batch).logits, model.classifier(features))
    trained = {id(p) for group in built.trainer.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in model.classifier.parameters()}
    assert not any(p.requires_grad for p in model.base_model.parameters())


@proves("finetune", "--predict")
def test_no_predict_reads_no_test_set(tiny_egbert_bert_dir, custom_files, tmp_path):
    argv = custom(tiny_egbert_bert_dir, custom_files, tmp_path / "out")
    assert "test" in build(*argv).splits
    assert "test" not in build(*argv, "--no-predict").splits


@proves("finetune", "--allow-pickle")
def test_a_pickle_checkpoint_loads_with_allow_pickle_only(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    pickled = tmp_path / "pickled"
    AutoTokenizer.from_pretrained(tiny_egbert_bert_dir).save_pretrained(pickled)
    saved = EgbertBertModel.from_pretrained(tiny_egbert_bert_dir)
    saved.config.save_pretrained(pickled)
    torch.save(saved.state_dict(), pickled / "pytorch_model.bin")
    argv = rte(pickled, micro_data, tmp_path / "out")
    with pytest.raises(CheckpointError, match="pickle checkpoint.*--allow-pickle"):
        build(*argv)
    backbone = on_cpu(build(*argv, "--allow-pickle").trainer.model.base_model.state_dict())
    assert all(torch.equal(backbone[name], value) for name, value in saved.state_dict().items())


# ---------------------------------------------------------------- a run: predictions and card


@proves("finetune", "--base-model-id", "--license")
def test_a_regression_run_scores_and_predicts_what_its_model_says(
    tiny_egbert_bert_dir, custom_files, tmp_path
):
    """The dev metrics are scipy's correlations of the saved model's predictions, the test file's
    predictions that model's outputs; the card carries the Hub metadata given."""
    out = tmp_path / "out"
    run_finetuning(
        model=str(tiny_egbert_bert_dir), output_dir=str(out), report_to=["none"],
        train_file=str(custom_files["train"]), validation_file=str(custom_files["dev"]),
        test_file=str(custom_files["test"]), text_columns=["a", "b"], label_column="s",
        regression=True, epochs=2, batch_size=4, lr=1e-3, max_seq_length=24,
        base_model_id="someone/bert-tiny", license="mit",
        # fp32 on the CPU, as the predictions recomputed below: trained on a GPU, this tiny
        # model's nearly equal predictions moved pearson in the 4th digit (0.41095 vs 0.41014)
        bf16=False, use_cpu=True,
    )  # fmt: skip
    model = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "model")

    def predicted(name: str, threads: int = 1) -> np.ndarray:
        rows = jsonl_rows(custom_files[name])
        texts = [[row["a"] for row in rows], [row["b"] for row in rows]]
        inputs = tokenizer(*texts, truncation=True, max_length=24, padding=True)
        with torch.no_grad(), torch_threads(threads):
            logits = model(**inputs.convert_to_tensors("pt")).logits
        return logits[:, 0].numpy()

    scores = [row["s"] for row in jsonl_rows(custom_files["dev"])]
    results = json.loads((out / "eval_results.json").read_text(encoding="utf-8"))
    metrics = results["metrics"]["validation"]
    # With some tokenizers (their ids vary by process) this tiny model's six dev predictions lie
    # within 1e-4 of each other, and float32's summation order (1 or 2 threads) moves pearson by
    # ~1e-4: the tolerance is that measured noise, 1e-5 where the predictions are spread out.
    dev = predicted("dev")
    expected = pearsonr(dev, scores)[0]
    noise = abs(expected - pearsonr(predicted("dev", 2), scores)[0])
    assert metrics["pearson"] == pytest.approx(expected, abs=1e-5 + 10 * noise)
    assert metrics["spearmanr"] == pytest.approx(spearmanr(dev, scores)[0], abs=1e-5)
    lines = (out / "predictions" / "custom.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "index\tprediction"
    written = [float(line.split("\t")[1]) for line in lines[1:]]
    assert written == pytest.approx(predicted("test").tolist(), abs=1.5e-3)  # written as %.3f
    card = (out / "model" / "README.md").read_text(encoding="utf-8")
    metadata = yaml.safe_load(card.split("---")[1])
    assert metadata["base_model"] == "someone/bert-tiny" and metadata["license"] == "mit"


# ---------------------------------------------------------------- the trainer's options


@proves("finetune", "--lr", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-epsilon")
def test_the_optimizer_is_adamw_with_the_options_given(tiny_egbert_bert_dir, micro_data, tmp_path):
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--lr", "3e-4")
    argv += ["--weight-decay", "0.05", "--adam-beta1", "0.8", "--adam-beta2", "0.95"]
    built = build(*argv, "--adam-epsilon", "1e-7")
    optimizer, model = built.trainer.optimizer, built.trainer.model
    assert isinstance(optimizer.optimizer, torch.optim.AdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = set()
    for group in optimizer.param_groups:
        assert group["initial_lr"] == 3e-4 and group["betas"] == (0.8, 0.95)
        assert group["eps"] == 1e-7
        if group["weight_decay"]:
            assert group["weight_decay"] == 0.05
            decayed |= {names[id(p)] for p in group["params"]}
    # decay on matrices only (docs/training.md): never on biases and norms
    assert decayed == {
        name for name, p in model.named_parameters() if p.ndim >= 2 and "norm" not in name.lower()
    }


@proves("finetune", "--optim", "--muon-lr", "--muon-weight-decay", "--muon-momentum")
def test_muon_trains_the_encoders_matrices_and_adamw_the_classifier(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--optim", "muon")
    argv += ["--muon-lr", "0.02", "--muon-weight-decay", "0.04", "--muon-momentum", "0.9"]
    trainer = build(*argv, "--lr", "3e-4").trainer
    optimizer, model = trainer.optimizer.optimizer, trainer.model
    names = {id(p): name for name, p in model.named_parameters()}
    (group,) = optimizer.muon.param_groups
    assert (group["initial_lr"], group["weight_decay"], group["momentum"]) == (0.02, 0.04, 0.9)
    muon = {names[id(p)] for p in group["params"]}
    assert muon == {
        name
        for name, p in model.named_parameters()
        if p.ndim == 2 and name.startswith("bert.") and "embeddings" not in name
    }
    adamw = {names[id(p)] for group in optimizer.adamw.param_groups for p in group["params"]}
    assert "classifier.weight" in adamw and adamw == set(names.values()) - muon
    assert all(group["initial_lr"] == 3e-4 for group in optimizer.adamw.param_groups)


@proves("finetune", "--schedule", "--wsd-decay")
def test_wsd_holds_the_peak_until_its_decay_share(tiny_egbert_bert_dir, micro_data, tmp_path):
    """4 updates without warmup, the last half decaying: 1, 1, then (4 - step) / 2."""
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--max-steps", "4")
    argv += ["--schedule", "wsd", "--wsd-decay", "0.5", "--warmup-steps", "0"]
    assert multipliers(build(*argv).trainer, 4) == pytest.approx([1.0, 1.0, 1.0, 0.5])


def multipliers(trainer, steps: int) -> list[float]:
    """The lr of each of `steps` updates over the peak lr, as the trainer's scheduler moves."""
    scheduler = trainer.scheduler.scheduler  # the LambdaLR Accelerate wraps
    found = []
    for _ in range(steps):
        found.append(trainer.optimizer.param_groups[0]["lr"] / scheduler.base_lrs[0])
        scheduler.step()
    return found


def reference_multipliers(schedule, warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = schedule(optimizer, warmup, total)
    found = []
    for _ in range(total):
        found.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return found


@proves("finetune", "--batch-size", "--grad-accum", "--epochs", "--schedule", "--warmup-steps")
def test_epochs_of_accumulated_batches_follow_the_schedule_given(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """24 rows in batches of 4 are 6 batches, 2 updates of 3 batches an epoch: 2 epochs (the
    recipe's are 3) are 4 updates, the first 2 warming up, then transformers' cosine."""
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--batch-size", "4")
    argv += ["--grad-accum", "3", "--epochs", "2", "--schedule", "cosine", "--warmup-steps", "2"]
    trainer = build(*argv).trainer
    assert next(iter(trainer.train_loader))["input_ids"].shape[0] == 4
    assert trainer.total_steps == 2 * math.ceil(math.ceil(24 / 4) / 3) == 4
    expected = reference_multipliers(get_cosine_schedule_with_warmup, 2, 4)
    assert multipliers(trainer, 4) == pytest.approx(expected)


@proves("finetune", "--max-steps", "--warmup-steps")
def test_max_steps_and_a_warmup_ratio_set_a_linear_schedules_length(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--max-steps", "8")
    trainer = build(*argv, "--warmup-ratio", "0.25", "--schedule", "linear").trainer
    assert trainer.total_steps == 8
    expected = reference_multipliers(get_linear_schedule_with_warmup, 2, 8)
    assert multipliers(trainer, 8) == pytest.approx(expected)


@proves("finetune", "--budget-minutes", "--batch-ramp-to")
def test_a_budget_drives_the_schedule_and_the_batch_ramp(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """Half the budget spent is half the run (docs/training.md: progress is the larger of
    elapsed / budget and step / total steps): the linear schedule is at half its peak, and the
    ramp from 4 to 12 examples a step at 1 + round(2 * 0.5) = 2 batches."""
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--budget-minutes", "2")
    argv += ["--max-steps", "100", "--schedule", "linear", "--warmup-steps", "0"]
    trainer = build(*argv, "--batch-size", "4", "--batch-ramp-to", "12").trainer
    trainer.state.elapsed_seconds = 60.0
    assert trainer.scheduler.scheduler.lr_lambdas[0](0) == pytest.approx(0.5)
    batching, budget, total = trainer.batching, trainer.length.budget_minutes, trainer.total_steps
    assert batches_per_step(batching, budget, 0, 60.0, total) == 2
    assert batches_per_step(batching, budget, 0, 120.0, total) == 3


@proves("finetune", "--label-smoothing")
def test_label_smoothing_is_in_the_training_loss(tiny_egbert_bert_dir, micro_data, tmp_path):
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--label-smoothing", "0.2")
    trainer = build(*argv).trainer
    batch = first_examples(trainer, 8)
    # one label for all: with RTE's 4 and 4 and a head that gives every pair the same logits,
    # the smoothed mean equals the plain one (the smoothing terms cancel)
    batch["labels"] = torch.zeros_like(batch["labels"])
    model = trainer.model.eval()  # no dropout: the same logits twice
    with torch.no_grad():
        model.classifier.weight.mul_(1e3)  # logits far from even: smoothing shows
        outputs = model(**batch, **trainer.loss_arguments)  # what the training forward passes
    expected = F.cross_entropy(outputs.logits, batch["labels"], label_smoothing=0.2)
    torch.testing.assert_close(outputs.loss, expected)
    assert not torch.isclose(outputs.loss, F.cross_entropy(outputs.logits, batch["labels"]))


@proves("finetune", "--seed")
def test_the_seed_draws_the_new_heads_weights(tiny_egbert_bert_dir, micro_data, tmp_path):
    heads = {}
    for name, seed in (("a", "3"), ("again", "3"), ("other", "4")):
        argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / name, "--seed", seed)
        trainer = build(*argv).trainer
        heads[name] = trainer.model.classifier.weight.detach().clone()
        assert trainer.args.seed == int(seed)  # the trainer's data order and dropout
    assert torch.equal(heads["a"], heads["again"])
    assert not torch.equal(heads["a"], heads["other"])


@proves("finetune", "--bf16", "--use-cpu", "--ddp-find-unused-parameters", "--num-workers")
def test_precision_device_and_loader_options_reach_accelerate(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--bf16", "--use-cpu")
    trainer = build(*argv, "--ddp-find-unused-parameters", "--num-workers", "1").trainer
    accelerator = trainer.accelerator
    assert accelerator.mixed_precision == "bf16" and accelerator.device.type == "cpu"
    assert accelerator.state._cpu  # Accelerator(cpu=True): the CPU even where a GPU is
    assert accelerator.ddp_handler.find_unused_parameters is True
    assert trainer.train_loader.num_workers == 1


@proves("finetune", "--fp16", "--gradient-checkpointing", "--auto-find-batch-size")
def test_fp16_checkpointing_and_the_batch_finder_reach_the_trainer(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """fp16 on the CPU as on a GPU: float16 autocast and a GradScaler (torch's initial scale
    2**16); the backbone's layers checkpointed; an out-of-memory halves the batch of 8."""
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--fp16", "--use-cpu")
    argv += ["--batch-size", "8", "--gradient-checkpointing", "--auto-find-batch-size"]
    trainer = build(*argv).trainer
    accelerator = trainer.accelerator
    assert accelerator.mixed_precision == "fp16" and accelerator.native_amp
    assert accelerator.scaler.get_scale() == 2.0**16
    layers = [m for m in trainer.model.modules() if hasattr(m, "gradient_checkpointing")]
    assert layers and all(layer.gradient_checkpointing for layer in layers)
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert trainer.batch_fitter.halved(error, trainer.batching.batch_size) == 4


@proves("finetune", "--compile", "--compile-mode")
def test_compile_compiles_the_model_in_the_mode_given(
    tiny_egbert_bert_dir, micro_data, tmp_path, monkeypatch
):
    dynamo = torch._dynamo.config  # the trainer sets these; patch() puts them back after
    as_found = dynamo.patch(**{name: getattr(dynamo, name) for name in COMPILE_SETTINGS})
    compile_module, modes = torch.nn.Module.compile, []

    def recorded(module, *args, **options):  # compiles lazily: nothing runs here
        modes.append((module, options.get("mode")))
        return compile_module(module, *args, **options)

    monkeypatch.setattr(torch.nn.Module, "compile", recorded)
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--compile")
    with as_found:
        trainer = build(*argv, "--compile-mode", "max-autotune-no-cudagraphs").trainer
    assert modes == [(trainer.model, "max-autotune-no-cudagraphs")]
    assert trainer.model._compiled_call_impl is not None


@proves(
    "finetune", "--eval-every", "--eval-every-minutes", "--save-every", "--keep-checkpoints",
    "--log-every", "--skip-nonfinite", "--report-to", "--resume", "--resume-anyway",
    "--metric-for-best-model", "--greater-is-better", "--max-grad-norm", "--replay-clock",
)  # fmt: skip
def test_the_trainer_gets_the_intervals_and_rules_given(tiny_egbert_bert_dir, micro_data, tmp_path):
    """What the trainer reads only as it trains (tests/test_trainer_options.py and
    test_trainer.py prove what it does with each) is the trainer's as given: the command's
    values, not the recipe's."""
    done = tmp_path / "done"  # a finished run's clock
    done.mkdir()
    (done / "clock.json").write_text('{"elapsed_seconds": [0.5, 1.25]}', encoding="utf-8")
    given = {
        "eval_every": 2, "eval_every_minutes": 0.5, "save_every": 3, "keep_checkpoints": 4,
        "log_every": 1, "skip_nonfinite": 2, "resume": True, "resume_anyway": True,
        "metric_for_best_model": "loss", "greater_is_better": False, "max_grad_norm": 0.25,
        "replay_clock": str(done),
    }  # fmt: skip
    argv = []
    for name, value in given.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    trainer = build(*rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", *argv)).trainer
    assert {name: getattr(trainer.args, name) for name in given} == given
    assert trainer.checkpoints.keep == 4
    assert trainer.replayed_clock == [0.5, 1.25]
    assert trainer.accelerator.log_with == []  # --report-to none: no tracker
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "default")
    default = build(*argv[: argv.index("--report-to")]).trainer
    assert [str(tracker) for tracker in default.accelerator.log_with] == ["tensorboard"]


@proves("finetune", "--group-by-length")
def test_group_by_length_batches_examples_of_similar_length(
    tiny_egbert_bert_dir, micro_data, tmp_path
):
    """Fine-tuning's recipe groups its batches by length: each batch holds examples of nearly
    one length, so they pad less than shuffled ones (--no-group-by-length); each epoch has its
    own order, the same again when the epoch is replayed (resume)."""
    argv = rte(tiny_egbert_bert_dir, micro_data, tmp_path / "out", "--batch-size", "2")
    argv[argv.index("rte")] = "stsb"  # shorter than the tiny model's 64 positions, unlike RTE
    grouped, shuffled = build(*argv).trainer, build(*argv, "--no-group-by-length").trainer
    assert grouped.args.group_by_length and not shuffled.args.group_by_length

    def batches(trainer, epoch: int) -> list[list[int]]:  # each batch's real lengths
        trainer.train_loader.set_epoch(epoch)
        return [b["attention_mask"].sum(1).tolist() for b in trainer.train_loader]

    def padding(epoch_batches: list[list[int]]) -> int:
        return sum(max(lengths) * len(lengths) - sum(lengths) for lengths in epoch_batches)

    first, second = batches(grouped, 0), batches(grouped, 1)
    assert sorted(sum(first, [])) == sorted(sum(batches(shuffled, 0), []))  # the same examples
    assert first != second and batches(grouped, 0) == first
    # transformers' order: groups of 6 examples (24 // (2 x 4)), each sorted longest first,
    # and the longest example of all first (its place swapped with its group's first)
    for lengths in (sum(first, []), sum(second, [])):
        assert lengths[0] == max(lengths)
        for start in range(0, 24, 6):
            group = lengths[start + 1 : start + 6]
            assert group == sorted(group, reverse=True), (start, lengths)
    assert padding(first) < padding(batches(shuffled, 0)) / 2
