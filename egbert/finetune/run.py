"""The fine-tuning job (`egbert finetune`): train a classifier on a GLUE or custom task, evaluate
it on dev after every epoch, keep the best epoch, and write GLUE submission files.

    egbert finetune --task rte --model runs/bert-mini --data-dir $EGBERT_DATA/glue --output-dir out

or from Python, with the same options as keyword arguments:

    egbert.run_finetuning(task="rte", model="runs/bert-mini", data_dir=..., output_dir="out")

It reads one way: the tokenizer (from the model's folder), then the data (tokenized to a length
the model's config allows, and the label statistics of a regression task), then the model built
with what those two determined, then the shared trainer, which evaluates the dev sets with the
task's GLUE metric and predicts the test sets.

The output directory gets model/ (the best epoch's model with its tokenizer and a model card
whose model-index holds the dev results), `eval_results.json`, `predictions/<TASK>.tsv` for each
test split present (GLUE's format: `index<TAB>prediction`, labels as GLUE's files write them),
and the trainer's logs and checkpoints beside them. `--task all` runs every task whose train and
dev files are present, each in `OUTPUT_DIR/<task>/`, and prints one Markdown table with the
GLUE average. Every option can also come from a YAML/JSON file given with --config.

Dev is evaluated and a checkpoint written after every epoch (`--eval-every N`, `--save-every N`:
every N steps instead); after a kill,
SIGTERM or Ctrl-C the same command with `--resume` goes on from it, to the same result.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from accelerate import PartialState
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    EvalPrediction,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)

import egbert.models.heads  # noqa: F401  (registers egbert's classifiers with the Auto classes)
from egbert.arguments import arguments_from_options, parse_args
from egbert.config import (
    SCRIPT_HINTS,
    TrainingArguments,
    apply_config_overrides,
    load_recipe,
    model_family,
)
from egbert.errors import CheckpointError, ConfigError, DataError, first_line
from egbert.finetune.metrics import compute_task_metrics, format_metrics, glue_average, task_score
from egbert.finetune.options import FinetuneArguments
from egbert.finetune.significance import dev_predictions
from egbert.finetune.tables import column, one_decimal, percent, results_table
from egbert.finetune.tasks import (
    GLUE_TASKS,
    HUB_DATASET,
    Task,
    custom_task,
    labels_in_file,
    read_glue_split,
    read_task_file,
    resolve_tasks,
    split_file,
)
from egbert.lora import (
    CLASSIFIER_HEAD_MODULES,
    LoraArguments,
    check_adaptable,
    trainable_parameters,
    with_adapters,
)
from egbert.model_files import (
    hub_id_note,
    load_pretrained,
    read_model_config,
    resolve_model_dir,
)
from egbert.models.convert import convert_checkpoint
from egbert.outputs import check_output_folder
from egbert.report import ModelCardInfo
from egbert.tokenizer import check_vocab_matches, load_tokenizer
from egbert.training.batches import TrainingData
from egbert.training.evaluator import EvalMetrics
from egbert.training.model_saving import SavedWithModel
from egbert.training.runtime import check_trackers_installed
from egbert.training.trainer import Trainer

# Stock transformers checkpoints that egbert converts to its own classes before fine-tuning.
STOCK_MODEL_TYPES = ("bert", "gpt2")
# The columns a classifier's forward takes; everything else is dropped before batching.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")
DEFAULT_MAX_SEQ_LENGTH = 128
EPILOG = """examples:
  egbert finetune --task rte --model runs/bert-mini --data-dir $EGBERT_DATA/glue \\
      --output-dir runs/rte
  egbert finetune --task all --model runs/bert-mini --data-dir $EGBERT_DATA/glue \\
      --output-dir runs/glue --features last4-concat --freeze
  egbert finetune --train-file train.csv --validation-file dev.csv --text-columns review \\
      --label-column stars --model runs/bert-mini --output-dir runs/stars

OUTPUT_DIR gets model/ (the best epoch's model, its tokenizer and card), eval_results.json,
predictions/<TASK>.tsv (GLUE's submission format), metrics.jsonl, train.log and loss_curve.png.
Each epoch's end is evaluated on dev and checkpointed, however many steps it took (with
--batch-ramp-to too); --eval-every N and --save-every N: every N steps instead."""


@dataclass
class FinetuneOutput:
    """What `finetune` returns: one eval_results dict per task run, the Markdown table of them,
    and whether a signal stopped the run (a checkpoint to --resume from is saved)."""

    results: list[dict[str, Any]] = field(default_factory=list)
    table: str = ""
    interrupted: bool = False


DESCRIPTION = (
    "Fine-tune and evaluate a model on a GLUE task (or all of them, or your own files); keeps "
    "the best epoch on dev and writes GLUE submission files. The defaults are fine-tuning's "
    "recipe (egbert/configs/recipes/); --print-config shows every resolved option."
)


def run_finetuning(**options: Any) -> FinetuneOutput:
    """`egbert finetune` from Python: the keyword arguments are the command's options
    (FinetuneArguments and TrainingArguments fields, e.g. task="rte", model="runs/bert",
    data_dir=..., output_dir=..., epochs=3), with fine-tuning's recipe under them."""
    types = (FinetuneArguments, TrainingArguments, LoraArguments)
    return finetune(*arguments_from_options(types, options, finetuning_recipe(options)))


def parse_finetune_args(
    argv: list[str] | None,
) -> tuple[FinetuneArguments, TrainingArguments, LoraArguments]:
    """`egbert finetune`'s options: the command line over the --config file over the recipe."""
    types = (FinetuneArguments, TrainingArguments, LoraArguments)
    return parse_args(
        types,
        argv,
        "egbert finetune",
        DESCRIPTION,
        epilog=EPILOG,
        recipe=finetuning_recipe,
        hints=SCRIPT_HINTS,
    )


def finetuning_recipe(options: dict[str, Any]) -> dict[str, Any]:
    """Fine-tuning's defaults for the family of options["model"] (where its config says it)."""
    return load_recipe(model_family(options.get("model")), "finetune")


def finetune(
    args: FinetuneArguments, training: TrainingArguments, lora: LoraArguments | None = None
) -> FinetuneOutput:
    """Fine-tune on each task asked for (with `lora`: LoRA adapters, see egbert.lora); returns
    the results and their table."""
    lora = lora or LoraArguments()
    check_paths(args)
    check_lora_options(args, lora)
    check_output_folder(training.output_dir, "--output-dir")  # before the data is tokenized
    check_trackers_installed(training.report_to)
    tasks = tasks_to_run(args)
    output_dir = Path(training.output_dir)
    output = FinetuneOutput()
    for task in tasks:
        task_dir = output_dir / task.name if len(tasks) > 1 else output_dir
        result = run_task(task, args, training, task_dir, output_dir / "predictions", lora)
        if result is None:
            output.interrupted = True
            return output
        output.results.append(result)
    average = glue_average({r["task"]: r["score"] for r in output.results})
    rows = [FinetuneRow.of(result) for result in output.results]
    output.table = results_table(FinetuneRow, rows, average, "GLUE average")
    if len(tasks) > 1 and PartialState().is_main_process:
        summary = {"tasks": {r["task"]: r for r in output.results}, "table": output.table}
        if average:
            summary |= {"glue_average": average.score, "glue_average_tasks": list(average.tasks)}
        (output_dir / "eval_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return output


# ---------------------------------------------------------------- tokenizer and data


def read_backbone_config(model_dir: Path) -> PretrainedConfig:
    """The model folder's config; a one-line CheckpointError if it is not a model transformers
    or egbert knows."""
    read_model_config(model_dir)  # a missing or broken config.json or model type, said plainly
    try:
        return AutoConfig.from_pretrained(model_dir)
    # AttributeError, TypeError: a config.json that is JSON but not an object of fields
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as error:
        raise CheckpointError(
            f"cannot load a model config from {model_dir}: {first_line(error)}"
        ) from None


def load_task_tokenizer(model_dir: Path, config: PretrainedConfig) -> PreTrainedTokenizerBase:
    """The model folder's tokenizer, padding with end-of-text where it has no pad token
    (GPT-2's)."""
    tokenizer = load_tokenizer(model_dir)
    check_vocab_matches(tokenizer, config.vocab_size, str(model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def sequence_length(args: FinetuneArguments, config: PretrainedConfig) -> int:
    """--max-seq-length, refused above the model's position table; by default 128 or less."""
    positions = getattr(config, "max_position_embeddings", None)
    if args.max_seq_length is None:
        return min(DEFAULT_MAX_SEQ_LENGTH, positions or DEFAULT_MAX_SEQ_LENGTH)
    if positions is not None and args.max_seq_length > positions:
        raise ConfigError(
            f"--max-seq-length {args.max_seq_length} is above the model's "
            f"max_position_embeddings ({positions}); use --max-seq-length {positions} or less"
        )
    return args.max_seq_length


def load_splits(task: Task, args: FinetuneArguments) -> dict[str, datasets.Dataset]:
    """train, the dev splits and the test splits there are: {split name: dataset}."""
    if task.name == "custom":
        splits = {"train": args.train_file, "validation": args.validation_file}
        if args.test_file and args.predict:
            splits["test"] = args.test_file
        return {
            split: read_task_file(task, Path(path), with_labels=split != "test")
            for split, path in splits.items()
        }
    wanted = ["train", *task.eval_splits, *(task.test_splits if args.predict else [])]
    if args.data_dir is not None:
        # A dev or test split may be missing locally (MNLI mismatched, a test set): skip it. Train
        # and the first dev split are always read, so that their absence is reported.
        required = {"train", task.eval_splits[0]}
        wanted = [s for s in wanted if s in required or split_file(task, s, args.data_dir)]
    return {split: read_glue_split(task, split, args.data_dir) for split in wanted}


def extra_test_sets(task: Task, data_dir: str | None) -> dict[str, tuple[Task, datasets.Dataset]]:
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


def label_statistics(train: datasets.Dataset, task: Task) -> dict[str, float]:
    """A regression task's training-label mean and standard deviation, the config fields its
    head standardizes its targets with (egbert/models/heads.py); {} for a classifier."""
    if not task.is_regression:
        return {}
    labels = np.asarray(train["label"], dtype=np.float64)
    return {
        "regression_target_mean": float(labels.mean()),
        "regression_target_std": float(labels.std()) or 1.0,
    }


# ---------------------------------------------------------------- model


def load_classifier(
    model_dir: Path,
    backbone: PretrainedConfig,
    task: Task,
    args: FinetuneArguments,
    config_fields: dict[str, Any],
) -> PreTrainedModel:
    """The model directory's backbone (its config read already) under a fresh classification
    head for the task, its config given `config_fields` (pad token, label statistics); stock
    BERT / GPT-2 checkpoints are converted to egbert first so every head option works."""
    if backbone.model_type in STOCK_MODEL_TYPES:
        with tempfile.TemporaryDirectory(prefix="egbert-convert-") as converted:
            convert_checkpoint(model_dir, converted, allow_pickle=args.allow_pickle)
            egbert_backbone = read_backbone_config(Path(converted))
            return load_classifier(Path(converted), egbert_backbone, task, args, config_fields)
    config = classifier_config(backbone, task, args)
    for name, value in config_fields.items():
        # a regression model fine-tuned further keeps the label statistics its head learned in
        if getattr(config, name, None) is None:
            setattr(config, name, value)
    # A classifier fine-tuned for another label set gets a new head of the right size.
    return load_pretrained(
        AutoModelForSequenceClassification,
        model_dir,
        allow_pickle=args.allow_pickle,
        config=config,
        ignore_mismatched_sizes=True,
    )


def classifier_config(
    backbone: PretrainedConfig, task: Task, args: FinetuneArguments
) -> PretrainedConfig:
    """The backbone's config with the task's labels, --config-override and the head options."""
    config = copy.deepcopy(backbone)
    config.id2label = task.id2label  # num_labels follows
    config.label2id = {label: i for i, label in task.id2label.items()}
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    apply_config_overrides(config, args.config_overrides)
    config.classifier_features = args.features
    config.classifier_pool = args.pool
    config.classifier_layer_norm = args.layer_norm
    config.freeze_backbone = args.freeze
    return config


# ---------------------------------------------------------------- metrics and predictions


def predictions_of(task: Task, logits: np.ndarray) -> np.ndarray:
    """Class ids (or scores, for regression) from a classifier's logits."""
    return logits[:, 0] if task.is_regression else logits.argmax(-1)


def by_split(flat: dict[str, float], dev_names: list[str], names: set[str]) -> dict[str, dict]:
    """{dev split: its metrics among `names`} from the trainer's flat metrics (one dev set:
    `accuracy`; several: `validation_matched_accuracy`, ...)."""
    if len(dev_names) == 1:
        return {dev_names[0]: {k: v for k, v in flat.items() if k in names}}
    return {
        split: {
            name.removeprefix(f"{split}_"): value
            for name, value in flat.items()
            if name.startswith(f"{split}_") and name.removeprefix(f"{split}_") in names
        }
        for split in dev_names
    }


def write_predictions(path: Path, task: Task, indices: list[int], predicted: np.ndarray) -> None:
    """GLUE's submission format: a header, then `index<TAB>prediction` per test example."""
    if task.is_regression:
        values = [f"{float(score):.3f}" for score in predicted]
    else:
        values = [task.labels[int(label)] for label in predicted]
    lines = ["index\tprediction", *(f"{i}\t{v}" for i, v in zip(indices, values, strict=True))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def model_card_info(task: Task, args: FinetuneArguments) -> ModelCardInfo:
    glue = task.name != "custom"
    evaluation = None
    if glue:
        evaluation = {
            "task_type": "text-classification",
            "dataset_type": HUB_DATASET,
            "dataset_name": f"GLUE {task.dir_name}",
            "dataset_config": task.hub_config,
            "dataset_split": "validation",
        }
    return ModelCardInfo(
        pipeline_tag="text-classification",
        license=args.license,
        datasets=[HUB_DATASET] if glue else [],
        base_model=args.base_model_id,
        evaluation=evaluation,
        description=f"`{resolve_model_dir(args.model).name}` fine-tuned with `egbert finetune` "
        f"on {'GLUE ' + task.dir_name if glue else 'a custom task'} (features "
        f"{args.features}, pool {args.pool}{', frozen' if args.freeze else ''}).",
    )


# ---------------------------------------------------------------- one task


@dataclass
class TaskTrainer:
    """One task's trainer, ready to train (`finetuning_trainer`), and what its results need:
    the dev and test splits as read, the dev splits tokenized, their names, the names of the
    metrics computed, the tokenizer, the sequence length and the number of training examples."""

    trainer: Trainer
    splits: dict[str, datasets.Dataset]
    dev_sets: dict[str, datasets.Dataset]  # tokenized
    dev_names: list[str]
    metric_names: set[str]
    tokenizer: PreTrainedTokenizerBase
    max_length: int
    train_examples: int

    @property
    def trainable_parameters(self) -> int:
        """The weights training changes (--lora: the adapters and the head)."""
        return trainable_parameters(self.trainer.model)


def finetuning_trainer(
    task: Task,
    args: FinetuneArguments,
    training: TrainingArguments,
    output_dir: Path,
    lora: LoraArguments | None = None,
) -> TaskTrainer:
    """The task's trainer over the model, the data and the options named (what `run_task`
    trains; the tests read each option's effect off it)."""
    lora = lora or LoraArguments()
    model_dir = resolve_model_dir(args.model)
    backbone = read_backbone_config(model_dir)
    tokenizer = load_task_tokenizer(model_dir, backbone)
    max_length = sequence_length(args, backbone)
    splits = load_splits(task, args)
    train = splits.pop("train")
    if args.max_train_samples:
        train = train.select(range(min(args.max_train_samples, len(train))))
    dev_names = [s for s in splits if s.startswith("validation")]
    train_set = tokenize(train, task, tokenizer, max_length, "train")
    dev_sets = {s: tokenize(splits[s], task, tokenizer, max_length, s) for s in dev_names}

    set_seed(training.seed)  # the new head's initial weights
    fields = {"pad_token_id": tokenizer.pad_token_id, **label_statistics(train, task)}
    model = load_classifier(model_dir, backbone, task, args, fields)
    heads = [name for name in CLASSIFIER_HEAD_MODULES if getattr(model, name, None) is not None]
    model = with_adapters(model, lora, model_dir, modules_to_save=heads)
    metric_names: set[str] = set()

    def dev_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predicted = predictions_of(task, prediction.predictions)
        metrics = compute_task_metrics(task, predicted.tolist(), prediction.label_ids.tolist())
        metric_names.update(metrics)
        return metrics

    def with_score(flat: dict[str, float]) -> dict[str, float]:
        return {**flat, "score": task_score(by_split(flat, dev_names, metric_names))}

    training = TrainingArguments(**{**asdict(training), "output_dir": str(output_dir)})
    trainer = Trainer(
        model,
        TrainingData(
            train=train_set,
            collator=DataCollatorWithPadding(tokenizer),
            eval=dev_sets if len(dev_sets) > 1 else dev_sets[dev_names[0]],
        ),
        training,
        metrics=EvalMetrics(compute_metrics=dev_metrics, finalize_metrics=with_score),
        saved_with_model=SavedWithModel(
            run_config={"options": asdict(args), "lora": asdict(lora), "task": task.name},
            tokenizer=tokenizer,
            card=model_card_info(task, args),
        ),
        epoch_ends=True,  # evaluate on dev and checkpoint after every epoch, unless asked
    )
    return TaskTrainer(
        trainer, splits, dev_sets, dev_names, metric_names, tokenizer, max_length, len(train_set)
    )


def run_task(
    task: Task,
    args: FinetuneArguments,
    training: TrainingArguments,
    output_dir: Path,
    predictions_dir: Path,
    lora: LoraArguments,
) -> dict | None:
    """Fine-tune on one task; returns (and writes) its eval_results.json, or None when a
    signal stopped the run (a checkpoint to --resume from is saved)."""
    start = time.perf_counter()
    built = finetuning_trainer(task, args, training, output_dir, lora)
    trainer, dev_names, metric_names = built.trainer, built.dev_names, built.metric_names
    trainer.accelerator.print(f"egbert finetune: {task.name} -> {output_dir}", flush=True)
    outcome = trainer.train()
    if outcome.interrupted:  # a signal: the trainer saved a checkpoint and said so
        return None
    # every epoch's evaluation, a resumed run's earlier ones included
    history = [record for record in outcome.history if record["split"] == "eval"]
    dev = predict_dev_sets(task, built)
    predictions = {}
    if args.predict:  # the trainer holds the best epoch's model
        predictions = predict_test_sets(
            task, built.splits, trainer, built.tokenizer, built.max_length, args
        )
        if trainer.accelerator.is_main_process:
            predictions = write_test_predictions(predictions, predictions_dir)
    results = {
        "task": task.name,
        "model": str(args.model),
        "metrics": by_split(outcome.metrics, dev_names, metric_names),
        "score": outcome.metrics["score"],
        "best_epoch": next(r["epoch"] for r in history if r["step"] == outcome.best_step),
        "epochs": training.epochs,
        "train_examples": built.train_examples,
        "train_seconds": round(outcome.elapsed_seconds, 1),
        "steps": outcome.step,
        "trainable_parameters": built.trainable_parameters,
        "seconds": round(time.perf_counter() - start, 1),
        "history": [
            {
                "epoch": record["epoch"],
                "score": record["score"],
                "metrics": by_split(record, dev_names, metric_names),
            }
            for record in history
        ],
        "predictions": predictions,
        "options": {
            **head_options(args),
            **training_options(args, training),
            **(asdict(lora) if lora.lora else {}),  # --lora's settings
        },
        "dev_predictions": dev,
    }
    if trainer.accelerator.is_main_process:
        (output_dir / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def predict_dev_sets(task: Task, built: TaskTrainer) -> dict[str, dict[str, list]]:
    """The kept model's prediction for every dev example, with its label (see
    egbert.evaluation.significance: what two runs are compared on)."""
    found = {}
    for split in built.dev_names:
        logits = built.trainer.predict(built.dev_sets[split]).predictions
        labels = built.splits[split]["label"]
        found |= dev_predictions(split, labels, predictions_of(task, logits))
    return found


def predict_test_sets(
    task: Task,
    splits: dict[str, datasets.Dataset],
    trainer: Trainer,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    args: FinetuneArguments,
) -> dict[str, tuple[Task, list[int], np.ndarray]]:
    """{file stem: (task, indices, predictions)} for every test set of the task."""
    test_sets = {
        task.submission.get(split, task.name): (task, dataset)
        for split, dataset in splits.items()
        if split.startswith("test")
    }
    if task.name != "custom":
        test_sets |= extra_test_sets(task, args.data_dir)
    predicted = {}
    for stem, (owner, dataset) in test_sets.items():
        encoded = tokenize(dataset, owner, tokenizer, max_length, stem)
        logits = trainer.predict(encoded).predictions
        predicted[stem] = (owner, dataset["idx"], predictions_of(owner, logits))
    return predicted


def write_test_predictions(
    predicted: dict[str, tuple[Task, list[int], np.ndarray]], predictions_dir: Path
) -> dict[str, str]:
    """Write a submission file per test set; returns {file stem: path}."""
    written = {}
    for stem, (owner, indices, values) in predicted.items():
        path = predictions_dir / f"{stem}.tsv"
        write_predictions(path, owner, indices, values)
        written[stem] = str(path)
    return written


def head_options(args: FinetuneArguments) -> dict[str, Any]:
    names = ("features", "pool", "layer_norm", "freeze")
    return {name: getattr(args, name) for name in names}


def training_options(args: FinetuneArguments, training: TrainingArguments) -> dict[str, Any]:
    names = ("epochs", "lr", "batch_size", "warmup_steps", "weight_decay", "seed", "bf16")
    options = {name: getattr(training, name) for name in names}
    return options | {
        "max_seq_length": args.max_seq_length,
        "max_train_samples": args.max_train_samples,
    }


def check_lora_options(args: FinetuneArguments, lora: LoraArguments) -> None:
    """--lora's refusals before any data is read: with --freeze, of a model it cannot adapt."""
    if not lora.lora:
        return
    if args.freeze:
        raise ConfigError(
            "--lora with --freeze: --freeze trains the head alone, --lora adapters in the "
            "backbone beside it; choose one"
        )
    check_adaptable(read_model_config(resolve_model_dir(args.model)).get("model_type"))


# ---------------------------------------------------------------- tasks and tables


@dataclass(frozen=True)
class FinetuneRow:
    """A task's line in `egbert finetune`'s table."""

    task: str = column("task")
    metrics: dict[str, dict[str, float]] = column("dev metrics", format_metrics)
    score: float = column("score", percent, numeric=True)
    best_epoch: int = column("best epoch", numeric=True)
    train_examples: int = column("train examples", numeric=True)
    minutes: float = column("minutes", one_decimal, numeric=True)

    @classmethod
    def of(cls, result: dict[str, Any]) -> FinetuneRow:
        """The row of a task's eval_results."""
        return cls(
            result["task"],
            result["metrics"],
            result["score"],
            result["best_epoch"],
            result["train_examples"],
            result["seconds"] / 60,
        )


def tasks_to_run(args: FinetuneArguments) -> list[Task]:
    """The custom task of --train-file, or the GLUE tasks of --task."""
    if args.train_file or args.validation_file:
        return [build_custom_task(args)]
    if not args.task:
        raise ConfigError("give --task (a GLUE task or all), or --train-file for a custom task")
    return resolve_tasks(args.task, args.data_dir)


def build_custom_task(args: FinetuneArguments) -> Task:
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


def check_paths(args: FinetuneArguments) -> None:
    if not Path(args.model).is_dir():
        raise CheckpointError(
            f"--model {args.model}: no such model directory" + hub_id_note(args.model)
        )
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise DataError(f"--data-dir {args.data_dir}: no such folder; pass the GLUE folder")
