"""The fine-tuning job (`egbert finetune`): train a classifier on a GLUE or custom task, evaluate
it on dev after every epoch, keep the best epoch, and write GLUE submission files.

    egbert finetune --task rte --model runs/bert-mini --data-dir $EGBERT_DATA/glue --output-dir out

The output directory gets the best model (`save_pretrained`, with its tokenizer),
`eval_results.json`, `predictions/<TASK>.tsv` for each test split present (GLUE's format:
`index<TAB>prediction`, labels as GLUE's files write them), the trainer's `metrics.jsonl`,
loss curve and model card. `--task all` runs every task whose train and dev files are present,
each in `OUTPUT_DIR/<task>/`, and prints one Markdown table with the GLUE average.

A checkpoint is written after every epoch (`--save-every N`: every N steps); after a kill,
SIGTERM or Ctrl-C the same command with `--resume` goes on from it, to the same result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)

import egbert.models.heads  # noqa: F401  (registers egbert's classifiers with the Auto classes)
from egbert.checkpoints import ALLOW_PICKLE_HELP, first_line, load_pretrained, read_model_config
from egbert.config import apply_config_overrides
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.finetune.metrics import compute_task_metrics, glue_score, task_score
from egbert.finetune.tasks import (
    GLUE_TASKS,
    SCORED_TASKS,
    Task,
    available_tasks,
    custom_task,
    get_task,
    labels_in_file,
    read_glue_split,
    read_task_file,
    split_file,
)
from egbert.models.convert import convert_checkpoint
from egbert.models.heads import CLASSIFIER_FEATURES, CLASSIFIER_POOLS
from egbert.tokenizer import check_vocab_matches, load_tokenizer
from egbert.trainer import Trainer, TrainingArguments

# Stock transformers checkpoints that egbert converts to its own classes before fine-tuning.
STOCK_MODEL_TYPES = ("bert", "gpt2")
# The columns a classifier's forward takes; everything else is dropped before batching.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")
DEFAULT_MAX_SEQ_LENGTH = 128


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egbert finetune",
        description="Fine-tune and evaluate a model on a GLUE task (or all of them, or your own "
        "files); keeps the best epoch on dev and writes GLUE submission files.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""examples:
  egbert finetune --task rte --model runs/bert-mini --data-dir $EGBERT_DATA/glue \\
      --output-dir runs/rte
  egbert finetune --task all --model runs/bert-mini --data-dir $EGBERT_DATA/glue \\
      --output-dir runs/glue --features last4-concat --freeze
  egbert finetune --train-file train.csv --validation-file dev.csv --text-columns review \\
      --label-column stars --model runs/bert-mini --output-dir runs/stars

OUTPUT_DIR gets the best model with its tokenizer, eval_results.json, predictions/<TASK>.tsv
(GLUE's submission format), metrics.jsonl, loss_curve.png and a model card.""",
    )
    tasks = ", ".join(name for name in GLUE_TASKS if name != "ax")
    data = parser.add_argument_group("task and data")
    data.add_argument(
        "--task",
        help=f"a GLUE task ({tasks}) or all (every task whose train and dev files are in "
        "--data-dir); with --train-file it is not needed",
    )
    data.add_argument(
        "--data-dir",
        type=Path,
        metavar="GLUE_DIR",
        help="the GLUE folder (CoLA/train.tsv, RTE/dev.tsv, ...); without it the data comes "
        "from the hub's nyu-mll/glue, which needs the network",
    )
    data.add_argument(
        "--train-file", type=Path, metavar="FILE", help="custom task: CSV, TSV or JSONL with header"
    )
    data.add_argument(
        "--validation-file", type=Path, metavar="FILE", help="custom task: the dev file"
    )
    data.add_argument(
        "--test-file", type=Path, metavar="FILE", help="custom task: a file to predict (optional)"
    )
    data.add_argument(
        "--text-columns", nargs="+", metavar="COLUMN", help="custom task: one or two text columns"
    )
    data.add_argument(
        "--label-column",
        default="label",
        metavar="COLUMN",
        help="custom task: the label column (default: %(default)s)",
    )
    data.add_argument(
        "--regression", action="store_true", help="custom task: labels are scores, not classes"
    )
    data.add_argument(
        "--max-train-samples",
        type=int,
        metavar="N",
        help="train on the first N training examples only (quick runs)",
    )
    data.add_argument(
        "--max-seq-length",
        type=int,
        metavar="N",
        help=f"tokens per example, longer ones truncated (default: {DEFAULT_MAX_SEQ_LENGTH}, or "
        "the model's max_position_embeddings if smaller)",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        required=True,
        type=Path,
        metavar="DIR",
        help="an egbert model directory (bert, gpt or elmo) or a stock transformers BERT/GPT-2 "
        "checkpoint (converted on the fly), with its tokenizer",
    )
    model.add_argument(
        "--features",
        choices=CLASSIFIER_FEATURES,
        default="cls",
        help="what the classifier reads: the model's summary vector ([CLS] pooler for bert), "
        "the last 4 layers concatenated or summed, or a learned scalar mix of all layers "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--pool",
        choices=CLASSIFIER_POOLS,
        default="cls",
        help="how layer features become one vector, with --features last4-*/scalar-mix: "
        "the summary position or the mean over tokens (default: %(default)s)",
    )
    model.add_argument(
        "--layer-norm",
        action="store_true",
        help="normalize each pooled layer (zero mean, unit variance) before the layers are "
        "combined, ELMo's option for layers of very different scales",
    )
    model.add_argument(
        "--freeze", action="store_true", help="feature-based: train only the classifier head"
    )
    model.add_argument(
        "--config-overrides",
        metavar="KEY=VALUE,...",
        help="change fields of the model's config for fine-tuning, e.g. "
        "'hidden_dropout_prob=0.1' (the format of run_mlm.py's --config_overrides)",
    )
    model.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)

    train = parser.add_argument_group("training")
    train.add_argument("--output-dir", required=True, type=Path, metavar="DIR")
    options = (
        ("--epochs", int, 3, "passes over the training data; dev is evaluated after each"),
        ("--lr", float, 5e-5, "peak learning rate of the linear schedule"),
        ("--batch-size", int, 32, "examples per batch"),
        ("--warmup-ratio", float, 0.1, "share of the steps that warm the learning rate up"),
        ("--weight-decay", float, 0.01, "AdamW weight decay (not on biases and norms)"),
        ("--seed", int, 42, "seed of the head's initialisation and the data order"),
    )
    for flag, kind, default, text in options:
        train.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default})")
    train.add_argument("--bf16", action="store_true", help="bf16 mixed precision (CPU or GPU)")
    train.add_argument(
        "--no-predict",
        action="store_true",
        help="skip the test-set predictions (GLUE submission files); dev is still evaluated",
    )
    train.add_argument(
        "--save-every",
        type=int,
        metavar="N",
        help="checkpoint every N steps (default: after every epoch)",
    )
    train.add_argument(
        "--resume", action="store_true", help="continue an interrupted run in --output-dir"
    )
    train.add_argument(
        "--resume-anyway", action="store_true", help="resume even if the run's options changed"
    )
    train.add_argument(
        "--skip-nonfinite",
        type=int,
        default=0,
        metavar="N",
        help="skip up to N steps with a non-finite loss instead of stopping (default: 0)",
    )
    return parser


# ---------------------------------------------------------------- data


def load_splits(task: Task, args: argparse.Namespace) -> dict[str, datasets.Dataset]:
    """train, the dev splits and the test splits there are: {split name: dataset}."""
    if task.name == "custom":
        splits = {"train": args.train_file, "validation": args.validation_file}
        if args.test_file and not args.no_predict:
            splits["test"] = args.test_file
        return {
            split: read_task_file(task, path, with_labels=split != "test")
            for split, path in splits.items()
        }
    wanted = ["train", *task.eval_splits, *([] if args.no_predict else task.test_splits)]
    if args.data_dir is not None:
        # A dev or test split may be missing locally (MNLI mismatched, a test set): skip it. Train
        # and the first dev split are always read, so that their absence is reported.
        required = {"train", task.eval_splits[0]}
        wanted = [s for s in wanted if s in required or split_file(task, s, args.data_dir)]
    return {split: read_glue_split(task, split, args.data_dir) for split in wanted}


def extra_test_sets(task: Task, data_dir: Path | None) -> dict[str, tuple[Task, datasets.Dataset]]:
    """Test sets predicted by this task's model (MNLI's also predicts AX): {file stem: (their
    task, dataset)}."""
    found = {}
    for other in GLUE_TASKS.values():
        if other.trained_as != task.name:
            continue
        for split, stem in other.submission.items():
            if data_dir is None or split_file(other, split, data_dir):
                found[stem] = (other, read_glue_split(other, split, data_dir))
    return found


def tokenize(
    dataset: datasets.Dataset,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    description: str,
) -> datasets.Dataset:
    """Text columns -> input ids (pairs as [CLS] A [SEP] B [SEP]); keeps `label` as `labels`."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = [batch[column] for column in task.text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_length)

    encoded = dataset.map(
        encode,
        batched=True,
        desc=f"tokenizing {description}",
        new_fingerprint=encoding_fingerprint(dataset, task, tokenizer, max_length),
    )
    if "label" in encoded.column_names:
        encoded = encoded.rename_column("label", "labels")
    return encoded.remove_columns([c for c in encoded.column_names if c not in MODEL_INPUTS])


def encoding_fingerprint(
    dataset: datasets.Dataset, task: Task, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> str | None:
    """What names the tokenized dataset (and its cache file, for hub data): left to `datasets`,
    the fingerprint pickles the whole tokenizer, about a second per split on a small task.
    None (datasets' own hashing) for a tokenizer without a fast backend to describe it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    described = json.loads(backend.to_str())
    del described["truncation"], described["padding"]  # set by each call, from max_length
    parts = [dataset._fingerprint, *task.text_columns, str(max_length), json.dumps(described)]
    parts += tokenizer.model_input_names
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- model


def set_label_statistics(config: PretrainedConfig, train: datasets.Dataset, task: Task) -> None:
    """A regression task's training-label mean and standard deviation, the config fields its
    head standardizes its targets with (egbert/models/heads.py). A regression model fine-tuned
    further keeps the ones its head has learned in."""
    if not task.is_regression or getattr(config, "regression_target_mean", None) is not None:
        return
    labels = np.asarray(train["label"], dtype=np.float64)
    config.regression_target_mean = float(labels.mean())
    config.regression_target_std = float(labels.std()) or 1.0


def load_classifier(model_dir: Path, task: Task, args: argparse.Namespace) -> PreTrainedModel:
    """The model directory's backbone under a fresh classification head for the task; stock
    BERT / GPT-2 checkpoints are converted to egbert first so every head option works."""
    model_type = read_model_config(model_dir).get("model_type")
    if model_type in STOCK_MODEL_TYPES:
        with tempfile.TemporaryDirectory(prefix="egbert-convert-") as converted:
            convert_checkpoint(model_dir, converted, allow_pickle=args.allow_pickle)
            return _classifier_from(Path(converted), task, args)
    return _classifier_from(model_dir, task, args)


def _classifier_from(model_dir: Path, task: Task, args: argparse.Namespace) -> PreTrainedModel:
    try:
        config = AutoConfig.from_pretrained(
            model_dir,
            num_labels=task.num_labels,
            id2label=task.id2label,
            label2id={label: i for i, label in task.id2label.items()},
            problem_type="regression" if task.is_regression else "single_label_classification",
        )
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(
            f"cannot load a model config from {model_dir}: {first_line(error)}"
        ) from None
    apply_config_overrides(config, args.config_overrides)
    config.classifier_features = args.features
    config.classifier_pool = args.pool
    config.classifier_layer_norm = args.layer_norm
    config.freeze_backbone = args.freeze
    # A classifier fine-tuned for another label set gets a new head of the right size.
    return load_pretrained(
        AutoModelForSequenceClassification,
        model_dir,
        allow_pickle=args.allow_pickle,
        config=config,
        ignore_mismatched_sizes=True,
    )


def sequence_length(args: argparse.Namespace, model: PreTrainedModel) -> int:
    """--max-seq-length, refused above the model's position table; by default 128 or less."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if args.max_seq_length is None:
        return min(DEFAULT_MAX_SEQ_LENGTH, positions or DEFAULT_MAX_SEQ_LENGTH)
    if positions is not None and args.max_seq_length > positions:
        raise ConfigError(
            f"--max-seq-length {args.max_seq_length} is above the model's "
            f"max_position_embeddings ({positions}); use --max-seq-length {positions} or less"
        )
    return args.max_seq_length


def load_task_tokenizer(model_dir: Path, model: PreTrainedModel) -> PreTrainedTokenizerBase:
    tokenizer = load_tokenizer(model_dir)
    check_vocab_matches(tokenizer, model.config.vocab_size, str(model_dir))
    if tokenizer.pad_token is None:  # GPT-2's tokenizer has none; pad with end-of-text
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


# ---------------------------------------------------------------- prediction and scoring


@torch.no_grad()
def predict(
    model: PreTrainedModel,
    dataset: datasets.Dataset,
    collator: DataCollatorWithPadding,
    batch_size: int,
    description: str,
) -> np.ndarray:
    """Class ids (or scores, for regression) for every example of a tokenized dataset."""
    device = next(model.parameters()).device
    inputs = dataset.remove_columns("labels") if "labels" in dataset.column_names else dataset
    loader = DataLoader(inputs, batch_size=batch_size, collate_fn=collator)
    was_training = model.training
    model.eval()
    outputs = []
    for batch in tqdm(loader, desc=description, leave=False, dynamic_ncols=True):
        logits = model(**{name: value.to(device) for name, value in batch.items()}).logits
        outputs.append(logits.float().cpu())
    model.train(was_training)
    logits = torch.cat(outputs)
    return logits[:, 0].numpy() if model.config.num_labels == 1 else logits.argmax(-1).numpy()


def evaluate_dev(
    model: PreTrainedModel,
    task: Task,
    dev_sets: dict[str, datasets.Dataset],
    collator: DataCollatorWithPadding,
    batch_size: int,
) -> dict[str, dict[str, float]]:
    """{dev split: the task's metrics} (MNLI has a matched and a mismatched dev set)."""
    return {
        split: compute_task_metrics(
            task,
            predict(model, dataset, collator, batch_size, f"evaluating {split}").tolist(),
            dataset["labels"],
        )
        for split, dataset in dev_sets.items()
    }


def flat_metrics(metrics_by_split: dict[str, dict[str, float]]) -> dict[str, float]:
    """One flat dict for the trainer's log: `accuracy`, or `validation_matched_accuracy`, ...,
    plus the task score that picks the best epoch."""
    single = len(metrics_by_split) == 1
    flat = {
        name if single else f"{split}_{name}": value
        for split, metrics in metrics_by_split.items()
        for name, value in metrics.items()
    }
    return {**flat, "score": task_score(metrics_by_split)}


def write_predictions(path: Path, task: Task, indices: list[int], predicted: np.ndarray) -> None:
    """GLUE's submission format: a header, then `index<TAB>prediction` per test example."""
    if task.is_regression:
        values = [f"{float(score):.3f}" for score in predicted]
    else:
        values = [task.labels[int(label)] for label in predicted]
    lines = ["index\tprediction", *(f"{i}\t{v}" for i, v in zip(indices, values, strict=True))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- one task


def run_task(
    task: Task, args: argparse.Namespace, output_dir: Path, predictions_dir: Path
) -> dict | None:
    """Fine-tune on one task; returns (and writes) its eval_results.json, or None when a
    signal stopped the run (a checkpoint to --resume from is saved)."""
    start = time.perf_counter()
    set_seed(args.seed)  # the new head's initial weights
    splits = load_splits(task, args)
    train = splits.pop("train")
    if args.max_train_samples:
        train = train.select(range(min(args.max_train_samples, len(train))))
    dev_names = [s for s in splits if s.startswith("validation")]

    model = load_classifier(args.model, task, args)
    set_label_statistics(model.config, train, task)
    tokenizer = load_task_tokenizer(args.model, model)
    max_length = sequence_length(args, model)
    train_set = tokenize(train, task, tokenizer, max_length, "train")
    dev_sets = {s: tokenize(splits[s], task, tokenizer, max_length, s) for s in dev_names}
    collator = DataCollatorWithPadding(tokenizer)

    dev_results: dict[int, dict[str, dict[str, float]]] = {}  # step -> {dev split: metrics}

    def evaluate(model: PreTrainedModel) -> dict[str, float]:
        metrics_by_split = evaluate_dev(model, task, dev_sets, collator, args.batch_size)
        dev_results[trainer.state.step] = metrics_by_split
        return flat_metrics(metrics_by_split)

    training_args = training_arguments(args, output_dir)
    trainer = Trainer(
        model,
        training_args,
        train_dataset=train_set,
        data_collator=collator,
        eval_fn=evaluate,
        run_config={"task": task.name, "model": str(args.model), "head": _head_options(args)},
        tokenizer=tokenizer,
    )
    steps_per_epoch = math.ceil(len(trainer.train_loader) / training_args.grad_accum)
    training_args.eval_every = steps_per_epoch  # evaluate on dev after every epoch
    training_args.save_every = args.save_every or steps_per_epoch
    outcome = trainer.train()
    if outcome.interrupted:  # a signal: the trainer saved a checkpoint and said so
        return None
    # a resumed run evaluated only its own epochs: the others are in the trainer's log
    dev_results = {**logged_dev_results(trainer, dev_names), **dev_results}
    best_step = trainer.state.best_step
    best = trainer.accelerator.unwrap_model(trainer.model)  # the trainer reloaded the best epoch
    predictions = {}
    if not args.no_predict:
        predictions = predict_test_sets(
            task, splits, best, tokenizer, max_length, args, predictions_dir
        )
    results = {
        "task": task.name,
        "model": str(args.model),
        "metrics": dev_results[best_step],
        "score": task_score(dev_results[best_step]),
        "best_epoch": best_step // steps_per_epoch,
        "epochs": args.epochs,
        "train_examples": len(train_set),
        "train_seconds": round(outcome.elapsed_seconds, 1),
        "seconds": round(time.perf_counter() - start, 1),
        "history": [
            {"epoch": step // steps_per_epoch, "score": task_score(m), "metrics": m}
            for step, m in sorted(dev_results.items())
        ],
        "predictions": predictions,
        "options": {**_head_options(args), **_training_options(args)},
    }
    (output_dir / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def logged_dev_results(trainer: Trainer, dev_names: list[str]) -> dict[int, dict]:
    """{step: {dev split: metrics}} of the evaluations in the trainer's metrics.jsonl (the
    inverse of `flat_metrics`)."""
    results = {}
    for record in trainer.read_metrics():
        if record["split"] != "eval":
            continue
        flat = {k: v for k, v in record.items() if k not in ("split", "step", "score")}
        if len(dev_names) == 1:
            results[record["step"]] = {dev_names[0]: flat}
            continue
        results[record["step"]] = {
            split: {
                name.removeprefix(f"{split}_"): value
                for name, value in flat.items()
                if name.startswith(f"{split}_")
            }
            for split in dev_names
        }
    return results


def predict_test_sets(
    task: Task,
    splits: dict[str, datasets.Dataset],
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    args: argparse.Namespace,
    predictions_dir: Path,
) -> dict[str, str]:
    """Write a submission file per test set; returns {file stem: path}."""
    test_sets = {
        task.submission.get(split, task.name): (task, dataset)
        for split, dataset in splits.items()
        if split.startswith("test")
    }
    if task.name != "custom":
        test_sets |= extra_test_sets(task, args.data_dir)
    written = {}
    for stem, (owner, dataset) in test_sets.items():
        encoded = tokenize(dataset, owner, tokenizer, max_length, stem)
        collator = DataCollatorWithPadding(tokenizer)
        predicted = predict(model, encoded, collator, args.batch_size, f"predicting {stem}")
        path = predictions_dir / f"{stem}.tsv"
        write_predictions(path, owner, dataset["idx"], predicted)
        written[stem] = str(path)
    return written


def training_arguments(args: argparse.Namespace, output_dir: Path) -> TrainingArguments:
    """The trainer's options for one task (their checks run before any data is read)."""
    return TrainingArguments(
        output_dir=str(output_dir),
        lr=args.lr,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        epochs=args.epochs,
        schedule="linear",
        warmup_steps=args.warmup_ratio,
        bf16=args.bf16,
        seed=args.seed,
        metric_for_best_model="score",
        greater_is_better=True,
        keep_checkpoints=1,
        skip_nonfinite=args.skip_nonfinite,
        resume=args.resume,
        resume_anyway=args.resume_anyway,
    )


def _head_options(args: argparse.Namespace) -> dict[str, Any]:
    names = ("features", "pool", "layer_norm", "freeze")
    return {name: getattr(args, name) for name in names}


def _training_options(args: argparse.Namespace) -> dict[str, Any]:
    names = ("epochs", "lr", "batch_size", "max_seq_length", "warmup_ratio", "weight_decay")
    names += ("seed", "max_train_samples", "bf16")
    return {name: getattr(args, name) for name in names}


# ---------------------------------------------------------------- tables and main


def format_metrics(metrics_by_split: dict[str, dict[str, float]]) -> str:
    short = {"accuracy": "acc", "matthews_correlation": "mcc", "spearmanr": "spearman"}
    parts = []
    for split, metrics in metrics_by_split.items():
        tag = split.removeprefix("validation").strip("_")
        text = " / ".join(f"{short.get(name, name)} {100 * v:.2f}" for name, v in metrics.items())
        parts.append(f"{tag} {text}" if tag else text)
    return "; ".join(parts)


def results_table(results: list[dict]) -> str:
    """A Markdown table of dev results, with the GLUE average over the GLUE tasks run."""
    lines = [
        "| task | dev metrics | score | best epoch | train examples | minutes |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['task']} | {format_metrics(r['metrics'])} | {100 * r['score']:.2f} "
            f"| {r['best_epoch']} | {r['train_examples']} | {r['seconds'] / 60:.1f} |"
        )
    scored = {r["task"]: r["score"] for r in results if r["task"] in SCORED_TASKS}
    if len(scored) > 1:
        note = "all nine tasks" if len(scored) == len(SCORED_TASKS) else ", ".join(scored)
        lines.append(f"| GLUE average ({note}) | | {100 * glue_score(scored):.2f} | | | |")
    return "\n".join(lines)


def resolve_tasks(args: argparse.Namespace) -> list[Task]:
    if args.train_file or args.validation_file:
        return [build_custom_task(args)]
    if not args.task:
        raise ConfigError("give --task (a GLUE task or all), or --train-file for a custom task")
    if args.task != "all":
        task = get_task(args.task)
        if task.trained_as:
            raise ConfigError(
                f"{task.name} has no training data: its predictions come from the "
                f"{task.trained_as} model; run --task {task.trained_as}"
            )
        return [task]
    if args.data_dir is None:
        raise ConfigError("--task all runs the tasks whose files are in --data-dir; pass it")
    names = available_tasks(args.data_dir)
    if not names:
        raise DataError(
            f"no GLUE task has its train and dev files in {args.data_dir}; "
            "expected e.g. RTE/train.tsv and RTE/dev.tsv"
        )
    return [GLUE_TASKS[name] for name in names]


def build_custom_task(args: argparse.Namespace) -> Task:
    if not (args.train_file and args.validation_file and args.text_columns):
        raise ConfigError(
            "a custom task needs --train-file, --validation-file and --text-columns "
            "(and --label-column if it is not 'label')"
        )
    labels = None if args.regression else labels_in_file(args.train_file, args.label_column)
    if labels is not None and len(labels) < 2:
        raise DataError(
            f"{args.train_file}: column {args.label_column!r} has one label {labels}; a "
            "classifier needs two or more (or pass --regression for scores)"
        )
    return custom_task(args.text_columns, args.label_column, labels)


def check_args(args: argparse.Namespace) -> None:
    if not args.model.is_dir():
        raise CheckpointError(f"--model {args.model}: no such model directory")
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise DataError(f"--data-dir {args.data_dir}: no such folder; pass the GLUE folder")
    if args.max_seq_length is not None and args.max_seq_length < 8:
        raise ConfigError(f"--max-seq-length must be >= 8, got {args.max_seq_length}")
    if args.save_every is not None and args.save_every < 1:
        raise ConfigError(f"--save-every must be >= 1, got {args.save_every}")
    if args.max_train_samples is not None and args.max_train_samples < 1:
        raise ConfigError(f"--max-train-samples must be >= 1, got {args.max_train_samples}")
    if args.pool == "mean" and args.features == "cls":
        raise ConfigError(
            "--pool mean pools layer features: use it with --features last4-concat, last4-sum "
            "or scalar-mix (--features cls is the model's own summary vector)"
        )
    if not 0 <= args.warmup_ratio < 1:
        raise ConfigError(f"--warmup-ratio must be in [0, 1), got {args.warmup_ratio}")
    training_arguments(args, args.output_dir)  # --lr, --epochs, --batch-size, ...


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check_args(args)
    tasks = resolve_tasks(args)
    several = len(tasks) > 1
    results = []
    for task in tasks:
        output_dir = args.output_dir / task.name if several else args.output_dir
        print(f"egbert finetune: {task.name} -> {output_dir}", flush=True)
        result = run_task(task, args, output_dir, args.output_dir / "predictions")
        if result is None:
            return
        results.append(result)
    table = results_table(results)
    if several:
        summary = {"tasks": {r["task"]: r for r in results}, "table": table}
        scored = {r["task"]: r["score"] for r in results if r["task"] in SCORED_TASKS}
        if scored:
            summary |= {"glue_average": glue_score(scored), "glue_average_tasks": list(scored)}
        (args.output_dir / "eval_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table)
