"""k-shot prompting of a gpt model on GLUE tasks, as in GPT-2 and GPT-3 (`egbert prompt-eval`).

Each scored dev example is rendered with a per-task template (PROMPTS) after k demonstrations:
training examples rendered the same way with their answer, separated by a blank line. The score
of a label is the log-likelihood of its verbaliser, the sum of log p(token | everything before)
over the verbaliser's tokens; the prediction is the label with the highest score (Brown et al.
2020, section 2.4). No weights change.

- Demonstrations: for each k, one set drawn with the seed and shared by every scored example,
  balanced over the labels (k // labels of each, the rest from labels drawn at random) and then
  shuffled; a model that prefers the label it saw last or most (Zhao et al. 2021) is not handed
  one by the draw. When prompt + verbaliser exceed the model's positions, whole demonstrations
  are dropped from the front (the ones farthest from the example); the mean kept is reported.
- Tasks without a training split in --data-dir (QNLI in the shared data) draw their
  demonstrations from the dev split; those dev examples are then never scored.
- `--calibrate`: "Calibrate Before Use" (Zhao et al. 2021): the same demonstrations followed by a
  content-free example ("N/A" for each text) give the model's bias p_cf over the labels; each
  example's label probabilities are divided by p_cf before the argmax. Reported next to the raw
  scores, at the cost of one extra forward per distinct number of demonstrations kept.
- Text is encoded without special tokens, so a [CLS] ... [SEP] template of egbert's shared
  WordPiece tokenizer never lands inside a prompt; each piece (a demonstration, the example, a
  verbaliser) is encoded on its own and the ids are joined.

Usage:
    egbert prompt-eval --model runs/gpt-mini --task sst2 rte --shots 0 4 16 --calibrate \\
        --data-dir $EGBERT_DATA/glue --max-eval-samples 500 --output-dir runs/gpt-mini/prompts
    egbert convert --from $EGBERT_DATA/models/tiny-gpt2 --to runs/tiny-gpt2
    egbert prompt-eval --model runs/tiny-gpt2 --task all --shots 0 4 --data-dir $EGBERT_DATA/glue

Python:
    from egbert.evaluation import run_prompt_eval
    results = run_prompt_eval("runs/gpt-mini", ["sst2"], "data/glue", shots=[0, 4], calibrate=True)
    results["tasks"]["sst2"]["shots"]["4"]["calibrated"]["score"]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

import egbert.models.gpt  # noqa: F401  (registers egbert-gpt with the Auto classes)
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.evaluation import results
from egbert.families import CAUSAL_MODEL_TYPES
from egbert.finetune.metrics import format_metrics, task_score
from egbert.finetune.significance import dev_predictions
from egbert.finetune.tables import column, one_decimal, percent, results_table
from egbert.finetune.tasks import Task, read_glue_split, resolve_tasks, split_file
from egbert.model_files import ALLOW_PICKLE_HELP, load_pretrained, read_model_config
from egbert.outputs import check_output_folder
from egbert.tokenizer import check_vocab_matches, load_tokenizer

RESULTS_FILE = "prompt_eval_results.json"
DEMONSTRATION_SEPARATOR = "\n\n"
CONTENT_FREE_TEXT = "N/A"


@dataclass(frozen=True)
class PromptFormat:
    """How one task is asked: `template` (str.format over the task's text columns) ends where
    the answer goes; `verbalisers` are the answers in class-id order, each with the space that
    separates it from the prompt (GPT-2's byte-level BPE has a token for " positive")."""

    template: str
    verbalisers: tuple[str, ...]


# The GPT-3 paper's formats (appendix G) where it has one (RTE), its style for the others.
PROMPTS: dict[str, PromptFormat] = {
    "sst2": PromptFormat("Review: {sentence}\nSentiment:", (" negative", " positive")),
    "cola": PromptFormat(
        "Sentence: {sentence}\nQuestion: Is this sentence grammatical?\nAnswer:", (" no", " yes")
    ),
    "mrpc": PromptFormat(
        "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n"
        "Question: Do both sentences mean the same thing?\nAnswer:",
        (" no", " yes"),
    ),
    "rte": PromptFormat(
        "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:", (" True", " False")
    ),
    "qnli": PromptFormat(
        "Question: {question}\nSentence: {sentence}\n"
        "Question: Does the sentence answer the question?\nAnswer:",
        (" yes", " no"),
    ),
}


# ---------------------------------------------------------------------------------------------
# The model and its scores


def load_causal_model(
    model_dir: str | os.PathLike, device: str | None, allow_pickle: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A gpt model (egbert's, or a stock GPT-2) in eval mode, and its tokenizer."""
    path = Path(model_dir)
    model_type = read_model_config(path).get("model_type")
    if model_type not in CAUSAL_MODEL_TYPES:
        raise CheckpointError(
            f"{path} holds a {model_type!r} model; prompt-eval scores a left-to-right language "
            f"model's next-token probabilities: pass a gpt model ({', '.join(CAUSAL_MODEL_TYPES)})"
        )
    model = load_pretrained(AutoModelForCausalLM, path, allow_pickle=allow_pickle)
    tokenizer = load_tokenizer(path)
    check_vocab_matches(tokenizer, model.config.vocab_size, f"the model in {path}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


@torch.inference_mode()
def label_log_likelihoods(
    model: PreTrainedModel,
    contexts: Sequence[list[int]],
    verbalisers: Sequence[list[int]],
    batch_size: int = 16,
) -> np.ndarray:
    """(contexts, labels): for each context and verbaliser, the sum over the verbaliser's tokens
    of log p(token | context, the verbaliser's tokens before it)."""
    candidates = [(i, label) for i in range(len(contexts)) for label in range(len(verbalisers))]
    scores = np.zeros((len(contexts), len(verbalisers)))
    head = model.get_output_embeddings()
    for start in range(0, len(candidates), batch_size):
        batch = candidates[start : start + batch_size]
        sequences = [contexts[i] + verbalisers[label] for i, label in batch]
        input_ids = torch.zeros((len(batch), max(map(len, sequences))), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        rows, positions, targets = [], [], []
        for row, ((i, label), sequence) in enumerate(zip(batch, sequences, strict=True)):
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention_mask[row, : len(sequence)] = 1
            # position t predicts token t + 1: the verbaliser is predicted from its left
            first = len(contexts[i])
            rows += [row] * len(verbalisers[label])
            positions += range(first - 1, first - 1 + len(verbalisers[label]))
            targets += verbalisers[label]
        hidden = model.base_model(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            use_cache=False,
        ).last_hidden_state  # (batch, seq, hidden)
        # the LM head at the verbaliser positions only: (tokens, vocab), not (batch, seq, vocab)
        log_probs = head(hidden[rows, positions]).float().log_softmax(dim=-1)
        token_scores = log_probs[torch.arange(len(targets)), targets].cpu()
        sums = torch.zeros(len(batch), dtype=torch.float64)
        sums.index_add_(0, torch.tensor(rows), token_scores.double())
        for row, (i, label) in enumerate(batch):
            scores[i, label] = sums[row].item()
    return scores


def calibrated_scores(scores: np.ndarray, content_free_scores: np.ndarray) -> np.ndarray:
    """log(p / p_cf) per label, with p and p_cf normalized over the labels (Zhao et al. 2021:
    W = diag(p_cf)^-1, b = 0); its argmax is the calibrated prediction."""
    return _normalized_log(scores) - _normalized_log(content_free_scores)


def _normalized_log(scores: np.ndarray) -> np.ndarray:
    return scores - np.logaddexp.reduce(scores, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Prompts


def render(prompt: PromptFormat, example: dict[str, str], label: int | None = None) -> str:
    """The example in the task's format, followed by its answer when `label` is given."""
    text = prompt.template.format(**example)
    return text if label is None else text + prompt.verbalisers[label]


def draw_demonstrations(labels: np.ndarray, k: int, num_labels: int, seed: int) -> list[int]:
    """k indices into `labels`, balanced over the labels (k // num_labels of each, the rest from
    labels drawn at random), in random order; the draw depends on the seed and k only."""
    rng = np.random.default_rng([seed, k])
    counts = np.full(num_labels, k // num_labels)
    counts[rng.choice(num_labels, size=k % num_labels, replace=False)] += 1
    picked = []
    for label, count in enumerate(counts):
        pool = np.flatnonzero(labels == label)
        if len(pool) < count:
            raise DataError(
                f"{k} balanced demonstrations need {count} examples of label {label}; the "
                f"split holds {len(pool)}: pass fewer --shots"
            )
        picked += rng.choice(pool, size=count, replace=False).tolist()
    return rng.permutation(picked).tolist()


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def encode_verbalisers(tokenizer: PreTrainedTokenizerBase, prompt: PromptFormat) -> list[list[int]]:
    ids = encode(tokenizer, list(prompt.verbalisers))
    if any(not tokens for tokens in ids) or len({tuple(tokens) for tokens in ids}) < len(ids):
        raise CheckpointError(
            f"the model's tokenizer encodes the answers {list(prompt.verbalisers)} as {ids}: "
            "each needs its own, non-empty tokens"
        )
    return ids


def fitted_context(
    demonstrations: Sequence[list[int]], query: list[int], room: int
) -> tuple[list[int], int]:
    """(ids, demonstrations kept): as many of the last demonstrations as fit with the query in
    `room` positions, whole ones only."""
    kept, length = 0, len(query)
    while kept < len(demonstrations) and length + len(demonstrations[-1 - kept]) <= room:
        length += len(demonstrations[-1 - kept])
        kept += 1
    return joined(demonstrations[len(demonstrations) - kept :], query, room), kept


def joined(demonstrations: Sequence[list[int]], query: list[int], room: int) -> list[int]:
    """The demonstrations' ids, then the query's, cut to the last `room`: a query too long on
    its own keeps its end, where the question is."""
    return ([token for demonstration in demonstrations for token in demonstration] + query)[-room:]


# ---------------------------------------------------------------------------------------------
# Tasks and runs


def check_prompt_options(shots: Sequence[int], max_eval_samples: int | None, batch_size: int):
    if not shots:
        raise ConfigError("--shots is empty; give one or more numbers of demonstrations, e.g. 0 4")
    if min(shots) < 0:
        raise ConfigError(f"--shots must be >= 0, got {list(shots)}")
    results.check_positive("--max-eval-samples", max_eval_samples)
    results.check_positive("--batch-size", batch_size)


@dataclass
class EncodedPrompts:
    """A task's prompt pieces as token ids, ready to be joined."""

    verbalisers: list[list[int]]  # per label
    queries: list[list[int]]  # per scored example, rendered without its answer
    content_free: list[int]  # the content-free example, without an answer
    demonstrations: dict[int, list[int]]  # demo pool index -> the example, its answer, the gap


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompt: PromptFormat,
    columns: Sequence[str],
    examples: list[dict[str, str]],
    demonstrations: dict[int, tuple[dict[str, str], int]],
) -> EncodedPrompts:
    """`demonstrations`: pool index -> (example, label)."""
    rendered = [
        render(prompt, example, label) + DEMONSTRATION_SEPARATOR
        for example, label in demonstrations.values()
    ]
    content_free = render(prompt, dict.fromkeys(columns, CONTENT_FREE_TEXT))
    return EncodedPrompts(
        verbalisers=encode_verbalisers(tokenizer, prompt),
        queries=encode(tokenizer, [render(prompt, example) for example in examples]),
        content_free=encode(tokenizer, [content_free])[0],
        demonstrations=dict(zip(demonstrations, encode(tokenizer, rendered), strict=True)),
    )


def shot_scores(
    model: PreTrainedModel,
    prompts: EncodedPrompts,
    demonstrations: list[int],
    calibrate: bool,
    batch_size: int,
) -> dict[str, Any]:
    """Label scores (examples, labels) of every scored example after `demonstrations` (indices
    into the demo pool), the demonstrations kept per example and, with `calibrate`, the
    calibrated scores."""
    room = model.config.max_position_embeddings - max(map(len, prompts.verbalisers))
    blocks = [prompts.demonstrations[i] for i in demonstrations]
    fitted = [fitted_context(blocks, query, room) for query in prompts.queries]
    kept = [count for _, count in fitted]
    contexts = [ids for ids, _ in fitted]
    run = {"scores": label_log_likelihoods(model, contexts, prompts.verbalisers, batch_size)}
    run["kept"] = kept
    if calibrate:
        # one content-free prompt per number of demonstrations kept, with those same ones
        counts = sorted(set(kept))
        content_free = [
            joined(blocks[len(blocks) - count :], prompts.content_free, room) for count in counts
        ]
        free_scores = label_log_likelihoods(model, content_free, prompts.verbalisers, batch_size)
        bias = free_scores[[counts.index(count) for count in kept]]  # (examples, labels)
        run["calibrated"] = calibrated_scores(run["scores"], bias)
    return run


def scored_and_demonstrations(
    task: Task, data_dir: Path, shots: Sequence[int], max_eval_samples: int | None, seed: int
) -> tuple[Any, Any, dict[int, list[int]], str]:
    """(scored dev examples, demonstration pool, k -> demo indices into the pool, pool split)."""
    eval_split = task.eval_splits[0]
    dev = read_glue_split(task, eval_split, data_dir)
    has_train = split_file(task, "train", data_dir) is not None
    pool = read_glue_split(task, "train", data_dir) if has_train else dev
    pool_labels = np.asarray(pool["label"])
    draws = {k: draw_demonstrations(pool_labels, k, task.num_labels, seed) for k in shots}
    used = set() if has_train else {i for draw in draws.values() for i in draw}
    candidates = np.array([i for i in range(len(dev)) if i not in used])  # never score a demo
    chosen = results.sample_indices(len(candidates), max_eval_samples, np.random.default_rng(seed))
    return dev.select(candidates[chosen]), pool, draws, "train" if has_train else eval_split


def prompt_task(
    task: Task,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data_dir: Path,
    shots: Sequence[int],
    calibrate: bool,
    max_eval_samples: int | None,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Score (a sample of) the task's first dev split after each number of demonstrations."""
    prompt, eval_split = PROMPTS[task.name], task.eval_splits[0]
    dev, pool, draws, pool_split = scored_and_demonstrations(
        task, data_dir, shots, max_eval_samples, seed
    )
    demo_indices = sorted({i for draw in draws.values() for i in draw})
    demonstrations = {i: (_row(pool, i, task.text_columns), pool[i]["label"]) for i in demo_indices}
    examples = _rows(dev, task.text_columns)
    prompts = encode_prompts(tokenizer, prompt, task.text_columns, examples, demonstrations)
    references = list(dev["label"])
    majority = results.majority_label(list(pool["label"]))
    result: dict[str, Any] = {
        "n_eval": len(references),
        "demonstrations_from": pool_split,
        "majority_score": results.majority_score(task, majority, references),
        "majority_label": majority,
        "template": prompt.template,
        "verbalisers": list(prompt.verbalisers),
        "shots": {},
    }
    if pool_split != "train":
        result["note"] = (
            f"no {task.name} train file in {data_dir}: the demonstrations come from the "
            f"{pool_split} split and those examples are left out of the scored ones"
        )
    for k in shots:
        start = time.perf_counter()
        run = shot_scores(model, prompts, draws[k], calibrate, batch_size)
        predictions = run["scores"].argmax(axis=1)
        metrics = {eval_split: results.scored(task, predictions, references)}
        entry = {
            "metrics": metrics,
            "score": task_score(metrics),
            "mean_demonstrations": float(np.mean(run["kept"])),
            "dev_predictions": dev_predictions(eval_split, references, predictions),
        }
        if calibrate:
            predictions = run["calibrated"].argmax(axis=1)
            calibrated = {eval_split: results.scored(task, predictions, references)}
            entry["calibrated"] = {"metrics": calibrated, "score": task_score(calibrated)}
        entry["seconds"] = round(time.perf_counter() - start, 2)
        result["shots"][str(k)] = entry
    return result


def _row(dataset, index: int, columns: Sequence[str]) -> dict[str, str]:
    row = dataset[int(index)]
    return {name: row[name] for name in columns}


def _rows(dataset, columns: Sequence[str]) -> list[dict[str, str]]:
    values = zip(*(list(dataset[name]) for name in columns), strict=True)
    return [dict(zip(columns, row, strict=True)) for row in values]


@dataclass
class PromptEvalArguments:
    """The options of `egbert prompt-eval`, the arguments of `run_prompt_eval`."""

    _argument_group_name = None  # among the parser's own options

    model_dir: Path = results.model_dir_field()
    tasks: list[str] = results.tasks_field(
        f"task(s) with a prompt format ({', '.join(PROMPTS)}), or all"
    )
    data_dir: Path = results.data_dir_field()
    shots: tuple[int, ...] = field(
        default=(0,), metadata={"help": "numbers of demonstrations, each scored separately"}
    )
    calibrate: bool = field(
        default=False,
        metadata={"help": 'also report scores calibrated against a content-free "N/A" input'},
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "score a seeded random sample of this many dev examples (default: all)"},
    )
    batch_size: int = field(default=16, metadata={"help": "sequences per forward"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    output_dir: Path | None = results.output_dir_field(RESULTS_FILE)
    device: str | None = field(default=None, metadata={"help": results.DEVICE_HELP})
    bf16: bool | None = field(default=None, metadata={"help": results.BF16_HELP})
    fp16: bool = field(default=False, metadata={"help": results.FP16_HELP})
    allow_pickle: bool = field(default=False, metadata={"help": ALLOW_PICKLE_HELP})


def run_prompt_eval(
    model_dir: str | os.PathLike,
    tasks: Sequence[str] | str,
    data_dir: str | os.PathLike,
    *,
    shots: Sequence[int] = PromptEvalArguments.shots,
    calibrate: bool = PromptEvalArguments.calibrate,
    max_eval_samples: int | None = PromptEvalArguments.max_eval_samples,
    batch_size: int = PromptEvalArguments.batch_size,
    seed: int = PromptEvalArguments.seed,
    output_dir: str | os.PathLike | None = PromptEvalArguments.output_dir,
    device: str | None = PromptEvalArguments.device,
    bf16: bool | None = PromptEvalArguments.bf16,
    fp16: bool = PromptEvalArguments.fp16,
    allow_pickle: bool = PromptEvalArguments.allow_pickle,
) -> dict[str, Any]:
    """k-shot prompting of a gpt model on GLUE tasks; returns (and with output_dir writes) the
    results.

    Args:
        model_dir: an egbert gpt directory or a stock GPT-2 one (`egbert convert` output too),
            with its tokenizer; a bert or elmo model is refused.
        tasks: names from PROMPTS (sst2, cola, mrpc, rte, qnli), or "all" for those whose dev
            file is in data_dir.
        shots: the numbers of demonstrations to try, e.g. (0, 4, 16).
        calibrate: also report contextual calibration (Zhao et al. 2021).
        max_eval_samples: score a seeded random sample of this many dev examples (None: all).
        batch_size: sequences (example x label) per forward.
        output_dir: where prompt_eval_results.json goes (nothing is written when None).
        bf16: autocast the model to bf16; None: where the device runs it faster than fp32.
        fp16: autocast the model to fp16 instead (GPUs without bf16).

    Returns:
        {"model", "options", "tasks": {name: {"n_eval", "demonstrations_from", "majority_score",
        "template", "verbalisers", "shots": {"k": {"metrics": {split: {metric: value}},
        "score", "mean_demonstrations", "seconds", "calibrated": {"metrics", "score"}}}}}}.
    """
    shots = list(dict.fromkeys(shots))
    check_prompt_options(shots, max_eval_samples, batch_size)
    if output_dir is not None:
        check_output_folder(output_dir, "--output-dir")
    data_dir = results.check_data_dir(data_dir)
    task_list = resolve_tasks(
        tasks,
        data_dir,
        offered=tuple(PROMPTS),
        not_offered="prompt-eval has no prompt format for {task}",
        needs_train=False,
    )
    model, tokenizer = load_causal_model(model_dir, device, allow_pickle)
    options = {
        "shots": shots,
        "calibrate": calibrate,
        "max_eval_samples": max_eval_samples,
        "seed": seed,
        "demonstrations": "balanced over the labels, one seeded draw per k for every example",
    }
    report = results.evaluate_tasks(
        model_dir,
        model,
        bf16,
        options,
        task_list,
        lambda task: prompt_task(
            task,
            model,
            tokenizer,
            data_dir,
            shots,
            calibrate,
            max_eval_samples,
            batch_size,
            seed,
        ),
        fp16=fp16,
    )
    if output_dir is not None:
        results.write_results(report, output_dir, RESULTS_FILE)
    return report


@dataclass(frozen=True)
class PromptRow:
    """A line of `egbert prompt-eval`'s table: a task after k demonstrations, raw or calibrated."""

    task: str = column("task")
    shots: str = column("shots")  # k, or "k, calibrated"
    mean_demonstrations: float = column("demonstrations kept", one_decimal, numeric=True)
    metrics: dict[str, dict[str, float]] = column("dev metrics", format_metrics)
    score: float = column("score", percent, numeric=True)
    majority_score: float = column("majority", percent, numeric=True)
    n_eval: int = column("examples", numeric=True)


def prompt_table(results: dict[str, Any]) -> str:
    """A Markdown table: one row per task and number of shots (and calibrated rows)."""
    rows = []
    for name, task in results["tasks"].items():
        for k, entry in task["shots"].items():
            scores = [(k, entry)]
            if "calibrated" in entry:
                scores.append((f"{k}, calibrated", entry["calibrated"]))
            rows += [
                PromptRow(
                    name,
                    label,
                    entry["mean_demonstrations"],
                    result["metrics"],
                    result["score"],
                    task["majority_score"],
                    task["n_eval"],
                )
                for label, result in scores
            ]
    return results_table(PromptRow, rows)
