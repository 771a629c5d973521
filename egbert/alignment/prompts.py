"""Prompts, what `egbert rlhf` continues: one text a row, the start of a completion the policy
writes and the scoring model scores (TRL's "standard" prompt-only format). They come from

- a text file, one prompt a line, or a table file (.jsonl, .json, .csv, .parquet), a
  `save_to_disk` folder or a Hub data set with a `prompt` column (`load_prompts`), or
- a single-sentence GLUE task (`prompts_from_task`): the first few words of each sentence
  ("the film is" of an SST-2 review), so that the task's scoring model has something to judge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import Dataset

from egbert.alignment.pairs import PROMPT_COLUMN, read_table
from egbert.errors import ConfigError, DataError
from egbert.finetune.tasks import Task, get_task, read_glue_split

LINE_FILES = (".txt", ".text")


def load_prompts(source: str, split: str = "train") -> Dataset:
    """The prompts of a text file (one a line) or of a table or data set's `prompt` column; a
    one-line DataError naming the source when it cannot be read or holds no prompt."""
    path = Path(source)
    if path.is_file() and path.suffix.lower() in LINE_FILES:
        with path.open(encoding="utf-8", errors="replace") as lines:
            prompts = [line.rstrip("\n") for line in lines]
        loaded = Dataset.from_dict({PROMPT_COLUMN: [p for p in prompts if p.strip()]})
    else:
        loaded = read_table(source, split, "prompts (or a .txt file, one prompt a line)")
        if PROMPT_COLUMN not in loaded.column_names:
            raise DataError(
                f"{source}: no 'prompt' column (it has {', '.join(loaded.column_names) or 'none'})"
                "; pass prompts in a prompt column, or a .txt file with one prompt a line"
            )
        loaded = loaded.select_columns([PROMPT_COLUMN])
        if getattr(loaded.features[PROMPT_COLUMN], "dtype", None) not in ("string", "large_string"):
            raise DataError(
                f"{source}: column 'prompt' holds {loaded.features[PROMPT_COLUMN]}, not text; "
                "egbert rlhf reads plain-text prompts (not conversations)"
            )
        loaded = loaded.filter(lambda row: bool(row[PROMPT_COLUMN] and row[PROMPT_COLUMN].strip()))
    if len(loaded) == 0:
        raise DataError(f"{source}: no prompts (no line or row with text); pass prompts")
    return loaded


def word_range(text: str) -> tuple[int, int]:
    """--prompt-words "2-8" (or "4"): the fewest and most words of a prompt."""
    low, _, high = text.partition("-")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1]:
        raise ConfigError(
            f"--prompt-words {text!r}: give the words a prompt keeps as LOW-HIGH (2-8) or N, "
            "at least 1"
        )
    return bounds


def prompt_task(name: str) -> Task:
    """The GLUE task `name`, refused in one line where its examples are sentence pairs."""
    task = get_task(name)
    if len(task.text_columns) != 1:
        raise ConfigError(
            f"--prompts-from-task {name}: its examples are sentence pairs; use a single-sentence "
            "task such as sst2 or cola"
        )
    return task


def prompts_from_task(
    name: str, split: str, data_dir: str | None, words: tuple[int, int], seed: int
) -> Dataset:
    """The first words of each sentence of the task's `split`, as many as the seed draws
    between words[0] and words[1] (a sentence that short or shorter kept whole but its last
    word: a prompt leaves something to complete)."""
    task = prompt_task(name)
    sentences = read_glue_split(task, split, data_dir)[task.text_columns[0]]
    counts = np.random.default_rng(seed).integers(words[0], words[1] + 1, size=len(sentences))
    prompts = []
    for sentence, count in zip(sentences, counts, strict=True):
        split_words = sentence.split()
        kept = split_words[: min(int(count), len(split_words) - 1)]
        if kept:
            prompts.append(" ".join(kept))
    if not prompts:
        raise DataError(f"{name} {split}: no sentence of two or more words to take a prompt from")
    return Dataset.from_dict({PROMPT_COLUMN: prompts})
