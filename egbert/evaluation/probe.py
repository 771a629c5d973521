"""Frozen-feature probe: what a model's sentence vectors already hold about a task (`egbert probe`).

The feature-based evaluation of ELMo (Peters et al. 2018) and SentEval (Conneau and Kiela 2018):
the model stays frozen and every example becomes one vector, pooled from chosen layers; a linear
model is trained on the training split's vectors and scored on dev with GLUE's metric. Works for
egbert's bert, gpt and elmo models and for stock BERT / GPT-2 directories that `egbert embed`
loads; the vectors come from `egbert.embed` (no grad, batched by length).

- `--features`: `last` (the last layer), `last4-concat` / `last4-sum` (the last four entries of
  `hidden_states`, top first, as the fine-tuning heads take them; all of them for a model with
  fewer) or `all-mean` (every entry, embeddings included, averaged: ELMo's scalar mix with equal
  weights, since a frozen probe has no weights to learn them with).
- `--pool`: `mean` over the real tokens (default: a frozen pretrained [CLS] is a weak sentence
  vector, Reimers and Gurevych 2019), or `cls`, the family's summary position as the heads
  define it: BERT's first token ([CLS], its hidden state, not the NSP pooler), GPT's last real
  token (the only one that has read the whole input), ELMo's forward state at the last token next
  to its backward state at the first. Each layer is pooled before the layers are combined.
- Pairs (MRPC, STS-B, RTE, ...): each sentence is encoded on its own and the pair becomes
  SentEval's [u, v, |u - v|, u * v].
- Classification: scikit-learn's LogisticRegression on standardized vectors, fitted by
  Newton-CG (`logistic_probe` says why); its inverse regularization strength C is chosen from
  C_GRID by the task's own GLUE score on a held-out fifth of the training vectors
  (stratified), then refit on all of them. One split rather than k-fold cross-validation: seven
  fits instead of thirty-five, and a few thousand held-out examples already tell the grid's
  points apart.
- Regression (STS-B): RidgeCV, whose efficient leave-one-out error picks alpha from ALPHA_GRID
  at the cost of a single fit.

Usage:
    egbert probe --model runs/bert-mini --task sst2 rte --data-dir $EGBERT_DATA/glue
    egbert probe --model runs/elmo-tiny --task all --data-dir $EGBERT_DATA/glue \\
        --features all-mean --pool cls --output-dir runs/elmo-tiny/probe

Python:
    from egbert.evaluation import run_probe
    results = run_probe("runs/bert-mini", ["sst2", "stsb"], "data/glue", features="last4-concat")
    results["tasks"]["sst2"]["score"]
"""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression, RidgeCV
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from egbert.embedding import TruncatedInputsWarning, embed, load_model
from egbert.errors import ConfigError, DataError
from egbert.evaluation import results
from egbert.families import FAMILY_OF_MODEL_TYPE
from egbert.finetune.metrics import format_metrics, glue_average, task_score
from egbert.finetune.significance import dev_predictions
from egbert.finetune.tables import column, one_decimal, percent, results_table
from egbert.finetune.tasks import (
    GLUE_TASKS,
    Task,
    present_eval_splits,
    read_glue_split,
    resolve_tasks,
)
from egbert.model_files import ALLOW_PICKLE_HELP
from egbert.models.heads import CLASSIFIER_POOLS, LAST4_FEATURES, LAST_LAYERS
from egbert.outputs import check_output_folder

# --features, each with how `embed` combines its layers; the last4 ones as the heads take them
FEATURE_COMBINES = {"last": "none", **LAST4_FEATURES, "all-mean": "mean"}
FEATURES = tuple(FEATURE_COMBINES)
RESULTS_FILE = "probe_results.json"
C_GRID = tuple(float(c) for c in np.logspace(-4, 2, 7))  # 1e-4 ... 100
ALPHA_GRID = tuple(float(a) for a in np.logspace(-2, 5, 8))  # 0.01 ... 1e5
HOLDOUT_FRACTION = 0.2
# the tasks with a training split to fit the probe on (ax has none)
PROBED_TASKS = tuple(name for name, task in GLUE_TASKS.items() if not task.trained_as)

# Where each family sums a sentence up, as its fine-tuning head does (egbert.models.heads), in
# terms of `embed`'s pools: BERT's first token, GPT's last real token, and for ELMo the forward
# half of each layer at the last token next to the backward half at the first token.
# Stock BERT / GPT-2 checkpoints, which `load_model` reads as they are, count as their family.
SUMMARY_POOLS: dict[str, tuple[str, ...]] = {
    "bert": ("cls",),
    "gpt": ("last",),
    "elmo": ("last", "cls"),
}


# ---------------------------------------------------------------------------------------------
# Sentence vectors


def feature_layers(features: str, num_layers: int) -> tuple[list[int], str]:
    """(indices into hidden_states, how `embed` combines them) for a --features choice."""
    combine = FEATURE_COMBINES[features]
    if features == "last":
        return [-1], combine
    if features == "all-mean":
        return list(range(num_layers + 1)), combine
    top_first = [-i for i in range(1, min(LAST_LAYERS, num_layers + 1) + 1)]
    return top_first, combine


def summary_pools(config: PretrainedConfig) -> tuple[str, ...]:
    family = FAMILY_OF_MODEL_TYPE.get(config.model_type)
    if family is None:
        raise ConfigError(
            f"--pool cls: egbert knows no summary position for model_type "
            f"{config.model_type!r} (it knows {', '.join(FAMILY_OF_MODEL_TYPE)}); use --pool mean"
        )
    return SUMMARY_POOLS[family]


def sentence_vectors(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[str | tuple[str, str]],
    features: str,
    pool: str,
    batch_size: int,
) -> np.ndarray:
    """One float32 vector per text or pair: (inputs, dim)."""
    layers, combine = feature_layers(features, model.config.num_hidden_layers)
    options = dict(layers=layers, combine=combine, batch_size=batch_size, tokenizer=tokenizer)
    pools = ("mean",) if pool == "mean" else summary_pools(model.config)
    # Pooling is linear, so pooling the combined layers equals combining the pooled layers.
    with warnings.catch_warnings():
        # The probe reads a sentence up to the model's length, as fine-tuning does; embed's
        # advice on the rest (--stride) is not an option of the probe.
        warnings.simplefilter("ignore", TruncatedInputsWarning)
        pooled = [embed(model, items, pool=name, **options) for name in pools]
    if len(pooled) == 1:
        return pooled[0]
    # ELMo: every layer is [forward; backward]; take the forward halves at the last token and
    # the backward halves at the first, layer by layer when the layers are concatenated.
    blocks = len(layers) if combine == "concat" else 1
    at_last, at_first = (vectors.reshape(len(items), blocks, 2, -1) for vectors in pooled)
    ends = np.concatenate([at_last[:, :, :1], at_first[:, :, 1:]], axis=2)
    return ends.reshape(len(items), -1)


def task_vectors(
    task: Task,
    dataset,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    features: str,
    pool: str,
    batch_size: int,
) -> np.ndarray:
    """One vector per example: its sentence's, or for a pair (u, v) of sentences, each encoded
    on its own, SentEval's [u, v, |u - v|, u * v] (the relation of the two is what pair tasks
    ask about, and a linear probe cannot form products of one joint vector's parts)."""
    columns = [list(dataset[name]) for name in task.text_columns]
    vectors = [
        sentence_vectors(model, tokenizer, column, features, pool, batch_size) for column in columns
    ]
    if len(vectors) == 1:
        return vectors[0]
    u, v = vectors
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


# ---------------------------------------------------------------------------------------------
# The linear probe


def logistic_probe(c: float) -> Pipeline:
    """Newton-CG, not lbfgs: at the grid's weak penalties (C >= 10) a model's features often
    nearly separate the training examples (an untrained elmo's: 768 columns of rank ~600, 128 of
    them copies, since its layer 0 is [e; e]), so the optimum lies far out on a flat loss; lbfgs
    took 1,000 to over 2,000 iterations there (a ConvergenceWarning in quickstart's twin probe),
    Newton-CG 6 to 15 at every C, in about the same time."""
    return make_pipeline(StandardScaler(), LogisticRegression(C=c, solver="newton-cg"))


def choose_c(task: Task, vectors: np.ndarray, labels: np.ndarray, seed: int) -> float:
    """The C of C_GRID with the best GLUE score on a stratified held-out part of the training
    vectors; ties go to the smaller C (the stronger regularization)."""
    counts = Counter(labels.tolist())
    if len(counts) < task.num_labels or min(counts.values()) < 2:
        found = {task.id2label[label]: count for label, count in sorted(counts.items())}
        raise DataError(
            f"{task.name}: the probe needs two training examples of every label; the "
            f"{len(labels)} drawn hold {found}; raise --max-train-samples"
        )
    holdout = max(len(counts), round(HOLDOUT_FRACTION * len(labels)))
    fit_x, held_x, fit_y, held_y = train_test_split(
        vectors, labels, test_size=holdout, stratify=labels, random_state=seed
    )
    best_c, best_score = C_GRID[0], -np.inf
    for c in C_GRID:
        predictions = logistic_probe(c).fit(fit_x, fit_y).predict(held_x)
        score = task_score({"holdout": results.scored(task, predictions, held_y)})
        if score > best_score:
            best_c, best_score = c, score
    return best_c


def fit_probe(
    task: Task, vectors: np.ndarray, labels: np.ndarray, seed: int
) -> tuple[Pipeline, dict[str, float]]:
    """The fitted probe and the regularization it chose ({"C": ...} or {"alpha": ...})."""
    if task.is_regression:
        probe = make_pipeline(StandardScaler(), RidgeCV(alphas=ALPHA_GRID)).fit(vectors, labels)
        return probe, {"alpha": float(probe[-1].alpha_)}
    c = choose_c(task, vectors, labels, seed)
    return logistic_probe(c).fit(vectors, labels), {"C": c}


# ---------------------------------------------------------------------------------------------
# Tasks, runs, the table


def check_probe_options(features: str, pool: str, max_train_samples: int | None, batch_size: int):
    if features not in FEATURES:
        raise ConfigError(f"--features {features!r} is not one of {', '.join(FEATURES)}")
    if pool not in CLASSIFIER_POOLS:
        raise ConfigError(f"--pool {pool!r} is not one of {', '.join(CLASSIFIER_POOLS)}")
    results.check_positive("--max-train-samples", max_train_samples)
    results.check_positive("--batch-size", batch_size)


def probe_task(
    task: Task,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data_dir: Path,
    features: str,
    pool: str,
    max_train_samples: int | None,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Fit the probe on (a sample of) the task's training split; score it on every dev split."""
    start = time.perf_counter()
    train = read_glue_split(task, "train", data_dir)
    rng = np.random.default_rng(seed)
    train = train.select(results.sample_indices(len(train), max_train_samples, rng))
    labels = np.asarray(train["label"])
    vectors = task_vectors(task, train, model, tokenizer, features, pool, batch_size)
    probe, regularization = fit_probe(task, vectors, labels, seed)
    metrics, dev_labels, predicted = {}, [], {}
    for split in present_eval_splits(task, data_dir):
        dev = read_glue_split(task, split, data_dir)
        dev_vectors = task_vectors(task, dev, model, tokenizer, features, pool, batch_size)
        predictions = probe.predict(dev_vectors)
        metrics[split] = results.scored(task, predictions, dev["label"])
        predicted |= dev_predictions(split, dev["label"], predictions)
        dev_labels += list(dev["label"])
    majority = None if task.is_regression else results.majority_label(labels)
    return {
        "metrics": metrics,
        "score": task_score(metrics),
        "majority_score": (
            None if majority is None else results.majority_score(task, majority, dev_labels)
        ),
        "majority_label": majority,
        "n_train": len(train),
        "n_dev": len(dev_labels),
        "feature_size": int(vectors.shape[1]),
        "regularization": regularization,
        "seconds": round(time.perf_counter() - start, 2),
        "dev_predictions": predicted,
    }


@dataclass
class ProbeArguments:
    """The options of `egbert probe`, the arguments of `run_probe`."""

    _argument_group_name = None  # among the parser's own options

    model_dir: Path = results.model_dir_field()
    tasks: list[str] = results.tasks_field(
        f"GLUE task(s) ({', '.join(PROBED_TASKS)}), or all: those with train and dev files in "
        "--data-dir"
    )
    data_dir: Path = results.data_dir_field()
    features: str = field(
        default="last",
        metadata={
            "help": "last layer; last four concatenated or summed; all layers averaged",
            "choices": FEATURES,
        },
    )
    pool: str = field(
        default="mean",
        metadata={
            "help": "mean over real tokens, or cls: the family's summary position (BERT's [CLS], "
            "GPT's last token, ELMo's two sentence ends)",
            "choices": CLASSIFIER_POOLS,
        },
    )
    max_train_samples: int | None = field(
        default=4000,
        metadata={"help": "fit on a seeded random draw of this many training examples"},
    )
    batch_size: int = field(default=64, metadata={"help": "examples per forward"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    output_dir: Path | None = results.output_dir_field(RESULTS_FILE)
    device: str | None = field(default=None, metadata={"help": results.DEVICE_HELP})
    bf16: bool | None = field(default=None, metadata={"help": results.BF16_HELP})
    fp16: bool = field(default=False, metadata={"help": results.FP16_HELP})
    allow_pickle: bool = field(default=False, metadata={"help": ALLOW_PICKLE_HELP})


def run_probe(
    model_dir: str | os.PathLike,
    tasks: Sequence[str] | str,
    data_dir: str | os.PathLike,
    *,
    features: str = ProbeArguments.features,
    pool: str = ProbeArguments.pool,
    max_train_samples: int | None = ProbeArguments.max_train_samples,
    batch_size: int = ProbeArguments.batch_size,
    seed: int = ProbeArguments.seed,
    output_dir: str | os.PathLike | None = ProbeArguments.output_dir,
    device: str | None = ProbeArguments.device,
    bf16: bool | None = ProbeArguments.bf16,
    fp16: bool = ProbeArguments.fp16,
    allow_pickle: bool = ProbeArguments.allow_pickle,
) -> dict[str, Any]:
    """Probe a frozen model on GLUE tasks; returns (and with output_dir writes) the results.

    Args:
        model_dir: a saved model directory with its tokenizer (egbert bert/gpt/elmo, or a stock
            BERT / GPT-2 one).
        tasks: GLUE task names, or "all" for every task with train and dev files in data_dir.
        data_dir: the GLUE folder (data_dir/SST-2/train.tsv, ...).
        features: one of FEATURES; pool: one of POOLS (see the module docstring).
        max_train_samples: fit on at most this many training examples (a seeded random draw);
            None: all of them. The dev splits are always scored in full.
        output_dir: where probe_results.json goes (nothing is written when None).
        bf16: autocast the model to bf16; None: where the device runs it faster than fp32.
        fp16: autocast the model to fp16 instead (GPUs without bf16).

    Returns:
        {"model", "options", "tasks": {name: {"metrics": {split: {metric: value}}, "score",
        "majority_score", "n_train", "n_dev", "feature_size", "regularization", "seconds"}},
        "glue_average": {"score", "tasks"}}; metric values and scores are fractions.
    """
    check_probe_options(features, pool, max_train_samples, batch_size)
    if output_dir is not None:
        check_output_folder(output_dir, "--output-dir")
    data_dir = results.check_data_dir(data_dir)
    task_list = resolve_tasks(tasks, data_dir)
    model, tokenizer = load_model(model_dir, device, allow_pickle)
    if pool == "cls":
        summary_pools(model.config)  # refuse an unknown family before any work
    options = {
        "features": features,
        "pool": pool,
        "max_train_samples": max_train_samples,
        "seed": seed,
        "classifier": "logistic regression (C by held-out GLUE score) / ridge (alpha by LOO)",
    }
    report = results.evaluate_tasks(
        model_dir,
        model,
        bf16,
        options,
        task_list,
        lambda task: probe_task(
            task,
            model,
            tokenizer,
            data_dir,
            features,
            pool,
            max_train_samples,
            batch_size,
            seed,
        ),
        fp16=fp16,
    )
    # never None: every task the probe takes is GLUE-scored (ax, with no training split, is not)
    average = glue_average({name: result["score"] for name, result in report["tasks"].items()})
    report["glue_average"] = {"score": average.score, "tasks": list(average.tasks)}
    if output_dir is not None:
        results.write_results(report, output_dir, RESULTS_FILE)
    return report


def regularization_cell(regularization: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.3g}" for name, value in regularization.items())


@dataclass(frozen=True)
class ProbeRow:
    """A task's line in `egbert probe`'s table."""

    task: str = column("task")
    metrics: dict[str, dict[str, float]] = column("dev metrics", format_metrics)
    score: float = column("score", percent, numeric=True)
    majority_score: float | None = column("majority", percent, numeric=True)
    n_train: int = column("train examples", numeric=True)
    regularization: dict[str, float] = column("regularization", regularization_cell)
    seconds: float = column("seconds", one_decimal, numeric=True)


def probe_table(results: dict[str, Any]) -> str:
    """A Markdown table of the probe's dev results (percentages), with their GLUE average."""
    rows = [
        ProbeRow(
            name,
            r["metrics"],
            r["score"],
            r["majority_score"],
            r["n_train"],
            r["regularization"],
            r["seconds"],
        )
        for name, r in results["tasks"].items()
    ]
    average = glue_average({row.task: row.score for row in rows})
    return results_table(ProbeRow, rows, average, "average")
