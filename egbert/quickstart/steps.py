"""quickstart's steps: find the data, train the tokenizer, save a model's twin at its random
initial weights, fine-tune once (reusing a finished run), the fine-tuning options by model type.
Each step reuses what a finished earlier run left. The steps are quickstart's own; `egbert`
exports two for whoever runs quickstart's experiments with other models: `save_untrained` and
`finetune_options`."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase, set_seed

from egbert.config import TrainingArguments, load_recipe, pretraining_recipe
from egbert.errors import ConfigError, DataError
from egbert.families import FAMILY_OF_MODEL_TYPE
from egbert.finetune import run as finetune_run
from egbert.finetune.tasks import GLUE_TASKS, available_tasks, get_task, split_file
from egbert.pretrain import run as pretrain_run
from egbert.pretrain.options import ModelArguments, ObjectiveArguments
from egbert.quickstart.options import (
    DEFAULT_DATA,
    GUTENBERG,
    HEAD_OPTIONS,
    WIKITEXT,
)
from egbert.report import read_train_results
from egbert.sources import load_hub_documents
from egbert.tokenizer import (
    format_stats,
    load_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)


class RunStopped(Exception):
    """A signal stopped a training run; its checkpoint is saved (the same command goes on)."""


# ---------------------------------------------------------------- data


def find_data(path: str | os.PathLike | None) -> Path:
    """The data folder: --data, else $EGBERT_DATA, else ../shared/data beside the checkout."""
    data = Path(path or os.environ.get("EGBERT_DATA") or DEFAULT_DATA)
    corpus = data / WIKITEXT / "wiki.train.tokens"
    if not corpus.is_file():
        raise DataError(
            f"{corpus}: not found; point --data (or EGBERT_DATA) at a folder with "
            "corpus/wikitext-2/wiki.{train,valid}.tokens and glue/<TASK>/ files, or pass "
            "--from-hub to download WikiText-2 and GLUE through `datasets`"
        )
    return data


def corpus_files(data: Path) -> tuple[list[Path], list[Path]]:
    """Pretraining files (WikiText-2 train + any Gutenberg books) and validation files."""
    train = [data / WIKITEXT / "wiki.train.tokens", *sorted((data / GUTENBERG).glob("*.txt"))]
    valid = [path for path in [data / WIKITEXT / "wiki.valid.tokens"] if path.is_file()]
    return train, valid


def corpus_tokens(
    tokenizer: PreTrainedTokenizerBase, files: Sequence[Path], sample_bytes: int = 1 << 18
) -> int:
    """The corpus's size in the tokenizer's tokens, from the tokens per byte of each file's first
    `sample_bytes` (a quarter of a megabyte: a few seconds for the whole corpus, within a few
    percent of a full count)."""
    total = 0.0
    for path in files:
        with path.open("rb") as handle:
            sample = handle.read(sample_bytes)
        if not sample:
            continue
        text = sample.decode("utf-8", errors="replace")
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        total += tokens / len(sample) * path.stat().st_size
    return round(total)


def export_hub_corpus(target: Path, name: str = "wikitext", config: str = "wikitext-2-v1") -> Path:
    """Write a hub text data set's train and validation splits as the local WikiText-2 files
    under `target` (a data folder), so every later step reads local files; returns `target`."""
    folder = target / WIKITEXT
    for split, file_name in (("train", "wiki.train.tokens"), ("validation", "wiki.valid.tokens")):
        path = folder / file_name
        if path.is_file():
            continue
        documents = load_hub_documents(name, split=split, config_name=config)
        folder.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(".partial")
        with temp.open("w", encoding="utf-8") as out:
            for row in documents:
                out.write(row["text"].rstrip("\n") + "\n")
        temp.replace(path)
    return target


def local_glue_tasks(requested: Sequence[str], glue: Path | None) -> list[str]:
    """The tasks to fine-tune on: those asked for, else every task with local train+dev files."""
    if requested:
        names = [get_task(name).name for name in requested]  # unknown names raise
        unusable = [n for n in names if "train" not in GLUE_TASKS[n].files]
        if unusable:
            raise ConfigError(f"--tasks {', '.join(unusable)}: no training split in GLUE")
        if glue is not None:
            present = set(available_tasks(glue))
            missing = [n for n in names if n not in present]
            if missing:
                raise DataError(
                    f"{glue}: no train and dev files for {', '.join(missing)}; "
                    f"present: {', '.join(sorted(present)) or 'none'}"
                )
        return names
    if glue is None:
        return ["cola", "sst2", "mrpc", "stsb", "rte"]
    names = available_tasks(glue) if glue.is_dir() else []
    if not names:
        raise DataError(
            f"{glue}: no GLUE task with train and dev files (e.g. RTE/train.tsv and "
            "RTE/dev.tsv); point --data at a folder with glue/<TASK>/ or pass --tasks with "
            "--from-hub"
        )
    return names


# ---------------------------------------------------------------- training runs


def prepare_tokenizer(
    output_dir: Path, corpus: Sequence[Path], vocab_size: int, **options: Any
) -> PreTrainedTokenizerBase:
    """The WordPiece tokenizer in output_dir/tokenizer, trained on the `corpus` files unless it
    is there (`options`: `train_tokenizer`'s others, with its defaults, e.g. encoding_errors)."""
    tokenizer_dir = output_dir / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"  reusing {tokenizer_dir}", flush=True)
        return load_tokenizer(tokenizer_dir)
    files = str(corpus[0]) if len(corpus) == 1 else f"{len(corpus)} files"
    print(f"  training WordPiece ({vocab_size:,}) on {files}", flush=True)
    start = time.perf_counter()
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size, out_dir=tokenizer_dir, **options)
    print(f"  trained in {time.perf_counter() - start:.1f} s, saved to {tokenizer_dir}")
    # Measured on the first file, the main corpus (tokenizer_stats decodes strictly).
    print(format_stats(tokenizer_stats(tokenizer, corpus[:1])), flush=True)
    return tokenizer


def is_finished(run_dir: Path) -> bool:
    """A training run's final model is written only after a run that was not interrupted."""
    model = run_dir / "model"
    return (model / "model.safetensors").is_file() and (model / "config.json").is_file()


def save_untrained(model, tokenizer, run_dir: Path) -> Path:
    """Save a model at its random initial weights like a pretrained one, as run_dir/model (all
    at once: a run killed meanwhile leaves nothing a rerun would take for a finished one)."""
    staging = run_dir / ".model.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(run_dir / "model")
    print(f"  {run_dir.name}: saved random weights to {run_dir}", flush=True)
    return run_dir


def quickstart_pretraining(family: str) -> dict[str, Any]:
    """quickstart's pretraining options of a family over `egbert pretrain`'s defaults: the
    quickstart-pretrain section of its recipe (bert: masked LM alone)."""
    return load_recipe(family, "quickstart-pretrain")


def pretraining_recipe_of(family: str) -> dict[str, Any]:
    """quickstart's pretraining options of `family` by name: `egbert pretrain`'s recipe with
    quickstart_pretraining over it (the options' fields hold the rest)."""
    return {**pretraining_recipe({"model": family}), **quickstart_pretraining(family)}


def pretraining_default(family: str, name: str) -> Any:
    """A trainer option of quickstart's pretraining of `family` before the plan scales it (lr,
    batch_size): its recipe's value, else its field's default."""
    return pretraining_recipe_of(family).get(name, getattr(TrainingArguments, name))


def pretraining_model_options(
    family: str, preset: str
) -> tuple[ModelArguments, ObjectiveArguments]:
    """The model's and the objective's options of quickstart's pretraining of `family` at
    `preset`: what `build_model` takes."""
    chosen = {**pretraining_recipe_of(family), "model": family, "preset": preset}

    def options_of(cls: type) -> dict[str, Any]:
        return {spec.name: chosen[spec.name] for spec in fields(cls) if spec.name in chosen}

    model_args = ModelArguments(**options_of(ModelArguments))
    return model_args, ObjectiveArguments(**options_of(ObjectiveArguments))


def save_twin(family: str, preset: str, seed: int, tokenizer, run_dir: Path) -> Path:
    """The family's model as quickstart's pretraining starts it (the preset with its options,
    pretraining's seed): its random initial weights."""
    if is_finished(run_dir):
        return run_dir
    set_seed(seed)
    model, _ = pretrain_run.build_model(*pretraining_model_options(family, preset), tokenizer)
    return save_untrained(model, tokenizer, run_dir)


@dataclass(frozen=True)
class PretrainingSummary:
    """A finished pretraining run: steps, tokens, minutes and its final validation metrics."""

    steps: int
    tokens: int | None
    minutes: float
    eval: dict[str, float]


def pretraining_summary(run_dir: Path) -> PretrainingSummary:
    """The summary of the finished pretraining run in run_dir."""
    results = read_train_results(run_dir)
    return PretrainingSummary(
        steps=results.get("step", 0),
        tokens=results.get("tokens"),
        minutes=round(results.get("elapsed_seconds", 0.0) / 60, 2),
        eval=results.get("metrics", {}),
    )


def finetune_once(run_dir: Path, **options: Any) -> tuple[dict[str, Any], bool]:
    """(eval results, whether it trained now): `run_finetuning` of one task into run_dir, or
    its eval_results.json if it finished; resumes a run that was stopped. Raises RunStopped when a
    signal stops it again."""
    results = run_dir / "eval_results.json"
    if results.is_file():
        return json.loads(results.read_text(encoding="utf-8")), False
    resume = (run_dir / "checkpoints").is_dir()
    output = finetune_run.run_finetuning(output_dir=str(run_dir), resume=resume, **options)
    if output.interrupted:
        raise RunStopped
    return output.results[0], True


def train_size(task: str, glue: Path | None) -> int:
    """Lines in a local GLUE task's training file (0 where the data comes from the hub)."""
    path = None if glue is None else split_file(get_task(task), "train", glue)
    if path is None:
        return 0
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def finetune_options(
    model_dir: Path,
    task: str,
    head: str,
    seed: int,
    glue: Path | None,
    bf16: bool,
    fp16: bool = False,
) -> dict[str, Any]:
    """`run_finetuning`'s options for one run (the budget's minutes are added by the caller):
    the quickstart-finetune recipe of the model's family with the head's options, or for the
    summary-vector head the family's own head where its recipe has one."""
    config = json.loads((model_dir / "model" / "config.json").read_text(encoding="utf-8"))
    recipe = load_recipe(FAMILY_OF_MODEL_TYPE.get(config["model_type"]), "quickstart-finetune")
    features = head.removesuffix("-frozen")
    if features != "cls":
        recipe = {name: value for name, value in recipe.items() if name not in HEAD_OPTIONS}
    return {
        "task": task,
        "model": str(model_dir),
        "data_dir": None if glue is None else str(glue),
        "seed": seed,
        "bf16": bf16,
        "fp16": fp16,
        "predict": False,
        "features": features,
        "freeze": head.endswith("-frozen"),
        **recipe,
    }
