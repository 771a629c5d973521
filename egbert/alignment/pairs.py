"""Preference pairs, what `egbert reward` trains on: one row a pair, the `chosen` text preferred
over the `rejected` one, both continuing an optional `prompt` (TRL's "standard" preference
format). They come from

- a table file (.jsonl, .json, .csv, .parquet), a `save_to_disk` folder, a folder of such files
  or a Hub data set (`load_pairs`), or
- a labelled single-sentence GLUE task (`pairs_from_task`): each sentence of the chosen label
  paired with one of another label, drawn without repeats, so that the task's human labels serve
  as a preference set ("positive over negative" for SST-2).
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from egbert.errors import ConfigError, DataError
from egbert.finetune.tasks import Task, get_task, read_glue_split
from egbert.sources import TABLE_BUILDERS, is_saved_dataset, quiet_table_readers, read_error

PAIR_COLUMNS = ("chosen", "rejected")
PROMPT_COLUMN = "prompt"


def load_pairs(source: str, split: str = "train") -> Dataset:
    """The pairs of a file, a data set folder or a Hub data set (its `split`), with their
    prompt, chosen and rejected columns only; a one-line DataError naming the source when it
    cannot be read or lacks a column."""
    return checked_pairs(read_table(source, split, "pairs"), source)


def read_table(source: str, split: str, what: str) -> Dataset:
    """The rows of a table file (.jsonl, .json, .csv, .parquet), a save_to_disk folder or a Hub
    data set (its `split`), `what` they hold named in the one-line DataError of one that cannot
    be read."""
    path = Path(source)
    try:
        with quiet_table_readers():
            return _loaded(path, source, split, what)
    except ConnectionError:
        raise DataError(
            f"could not reach the hub for data set {source!r} (offline?); pass a local file"
        ) from None
    except FileNotFoundError:
        raise DataError(
            f"{source}: no such file, data set folder or Hub data set; pass .jsonl, .json, .csv "
            f"or .parquet {what}, or a data set"
        ) from None
    except (DatasetGenerationError, ValueError) as error:
        raise read_error(source, error) from None


def _loaded(path: Path, source: str, split: str, what: str) -> Dataset:
    if path.is_file():
        builder = TABLE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"{path}: unknown extension {path.suffix!r}; pass .jsonl, .json, .csv or "
                f".parquet {what}, or a data set folder"
            )
        if path.stat().st_size == 0:
            raise DataError(f"{path}: the file is empty; pass a file with {what} in it")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if is_saved_dataset(path):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, DatasetDict):
            if split not in loaded:
                raise DataError(f"{path}: no split {split!r}; it has {', '.join(loaded)}")
            loaded = loaded[split]
        return loaded
    return datasets.load_dataset(source, split=split)


def checked_pairs(loaded: Dataset, source: str) -> Dataset:
    """`loaded`'s prompt (where it has one), chosen and rejected columns, each text, no row
    without its chosen and rejected text."""
    columns = [c for c in (PROMPT_COLUMN, *PAIR_COLUMNS) if c in loaded.column_names]
    missing = [c for c in PAIR_COLUMNS if c not in columns]
    if missing:
        raise DataError(
            f"{source}: no {' or '.join(map(repr, missing))} column (it has "
            f"{', '.join(loaded.column_names) or 'none'}); preference pairs need chosen and "
            "rejected text columns, and may have a prompt column"
        )
    pairs = loaded.select_columns(columns)
    for column in columns:
        feature = pairs.features[column]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise DataError(
                f"{source}: column {column!r} holds {feature}, not text; egbert reward reads "
                "plain-text pairs (not conversations)"
            )
    if len(pairs) == 0:
        raise DataError(f"{source}: no pairs (no rows); pass a source with pairs in it")
    for number, row in enumerate(pairs.select_columns(list(PAIR_COLUMNS)), start=1):
        if not all(row[c] for c in PAIR_COLUMNS):
            raise DataError(f"{source}: pair {number} has no chosen or no rejected text")
    return pairs


def pair_task(name: str) -> Task:
    """The GLUE task `name`, refused in one line where its examples cannot make pairs."""
    task = get_task(name)
    if task.is_regression:
        raise ConfigError(
            f"--pairs-from-task {name}: a regression task has no labels to prefer; use a "
            "classification task such as sst2 or cola"
        )
    if len(task.text_columns) != 1:
        raise ConfigError(
            f"--pairs-from-task {name}: its examples are sentence pairs, and a preference pair "
            "compares two texts; use a single-sentence task such as sst2 or cola"
        )
    return task


def chosen_class(task: Task, label: str | None) -> int:
    """The class id of `label` (a name such as "positive", or the files' "1"); None: the
    task's last class (sst2's positive, cola's acceptable)."""
    if label is None:
        return task.num_labels - 1
    names = {name: i for i, name in task.id2label.items()}
    names |= {text: i for i, text in enumerate(task.labels or ())}
    if label not in names:
        raise ConfigError(
            f"--chosen-label {label!r} is not a label of {task.name}; use one of "
            f"{', '.join(task.id2label.values())}"
        )
    return names[label]


def pairs_from_task(
    name: str, split: str, data_dir: str | None, chosen_label: str | None, seed: int
) -> Dataset:
    """Pairs of the task's `split`: each sentence of the chosen label (in an order the seed
    draws) over a sentence of another label, as many pairs as the smaller side has sentences."""
    task = pair_task(name)
    wanted = chosen_class(task, chosen_label)
    rows = read_glue_split(task, split, data_dir)
    labels = np.asarray(rows["label"])
    texts = np.asarray(rows[task.text_columns[0]], dtype=object)
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(texts[labels == wanted])
    rejected = rng.permutation(texts[labels != wanted])
    count = min(len(chosen), len(rejected))
    if count == 0:
        raise DataError(
            f"{name} {split}: no pairs, its sentences are all of one side of "
            f"{task.id2label[wanted]!r}; pass a split with both"
        )
    return Dataset.from_dict({"chosen": list(chosen[:count]), "rejected": list(rejected[:count])})
