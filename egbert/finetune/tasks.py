"""The GLUE task registry and its readers: files, columns, labels and metric of every task.

Every reader returns a `datasets.Dataset` with the hub's column names (`nyu-mll/glue`): the
task's text columns, `label` (a ClassLabel, or a float for STS-B; absent on test splits) and
`idx` (the row's index, as GLUE's submission files need it). Two sources give the same result:

- the original GLUE layout on disk (`DATA_DIR/RTE/train.tsv`, ...), read with quoting off because
  fields hold raw quote characters; CoLA's train/dev files have no header, MRPC's header starts
  with a UTF-8 byte order mark, MNLI's dev sets may come as JSONL with text labels;
- the hub's `nyu-mll/glue` configs through `datasets`, when no data directory is given.

Custom tasks (`custom_task` + `read_task_file`) read CSV, TSV or JSONL files with a header.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from egbert.errors import ConfigError, DataError
from egbert.jsonl import jsonl_objects

HUB_DATASET = "nyu-mll/glue"
STANDARD_FILES = {"train": ("train.tsv",), "validation": ("dev.tsv",), "test": ("test.tsv",)}
COLA_COLUMNS = ("source", "label", "original_label", "sentence")  # CoLA train/dev: no header
# Text columns by the hub's names, and label sets as GLUE's files write them (class-id order).
SENTENCE = ("sentence",)
SENTENCE_PAIR = ("sentence1", "sentence2")
NLI_PAIR = ("premise", "hypothesis")
ENTAILMENT = ("entailment", "not_entailment")
MNLI_LABELS = ("entailment", "neutral", "contradiction")
# GLUE's MNLI files (and the diagnostic set's) name the premise and hypothesis columns this way.
NLI_SOURCE_COLUMNS = {"premise": "sentence1", "hypothesis": "sentence2"}


@dataclass(frozen=True)
class Task:
    """What fine-tuning needs to know about one task, and where its files are.

    `labels` are the label strings as GLUE's files write them (and as its submission format wants
    them back), in class-id order; `label_names` are the hub's names for the same classes (they
    become the model's id2label). Both are None for a regression task.
    `source_columns` maps a column's hub name to its name in the local files when they differ;
    `headerless` gives the column names of the splits whose files have no header row.
    """

    name: str
    text_columns: tuple[str, ...]
    labels: tuple[str, ...] | None
    metric: str  # a kind of the `glue` metric module: see egbert/finetune/metric_modules/glue.py
    label_names: tuple[str, ...] | None = None
    dir_name: str = ""
    files: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(STANDARD_FILES))
    source_columns: dict[str, str] = field(default_factory=dict)
    headerless: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hub_config: str | None = None
    submission: dict[str, str] = field(default_factory=dict)  # test split -> GLUE file stem
    trained_as: str | None = None  # ax has no training data: it is predicted by the mnli model

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def id2label(self) -> dict[int, str]:
        names = self.label_names or self.labels or ("score",)
        return dict(enumerate(names))

    @property
    def eval_splits(self) -> tuple[str, ...]:
        return tuple(split for split in self.files if split.startswith("validation"))

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(split for split in self.files if split.startswith("test"))


def _glue_task(
    name: str,
    dir_name: str,
    columns: tuple[str, ...],
    metric: str,
    labels: tuple[str, ...] | dict[str, str] | None,
    **kwargs,
) -> Task:
    """A GLUE task under its hub config's name. `labels`: the files' label strings, or a dict
    from each to the hub's name of its class; None for regression. Its test predictions go to
    GLUE's file named after its folder unless `submission` says otherwise."""
    if isinstance(labels, dict):
        kwargs["label_names"] = tuple(labels.values())
        labels = tuple(labels)
    kwargs.setdefault("submission", {"test": dir_name})
    return Task(
        name=name,
        text_columns=columns,
        labels=labels,
        metric=metric,
        dir_name=dir_name,
        hub_config=name,
        **kwargs,
    )


# name, GLUE folder, text columns, metric, labels; then where its files differ from the usual
# layout (train/dev/test.tsv with a header and the hub's column names).
GLUE_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        _glue_task(
            "cola",
            "CoLA",
            SENTENCE,
            "matthews_correlation",
            {"0": "unacceptable", "1": "acceptable"},
            headerless={"train": COLA_COLUMNS, "validation": COLA_COLUMNS},
        ),
        _glue_task("sst2", "SST-2", SENTENCE, "accuracy", {"0": "negative", "1": "positive"}),
        _glue_task(
            "mrpc",
            "MRPC",
            SENTENCE_PAIR,
            "accuracy_f1",
            {"0": "not_equivalent", "1": "equivalent"},
            source_columns={"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"},
        ),
        _glue_task(
            "stsb",
            "STS-B",
            SENTENCE_PAIR,
            "pearson_spearman",
            None,
            source_columns={"label": "score"},
        ),
        _glue_task(
            "qqp",
            "QQP",
            ("question1", "question2"),
            "accuracy_f1",
            {"0": "not_duplicate", "1": "duplicate"},
            source_columns={"label": "is_duplicate", "idx": "id"},
        ),
        _glue_task(
            "mnli",
            "MNLI",
            NLI_PAIR,
            "accuracy",
            MNLI_LABELS,
            files={
                "train": ("train.tsv",),
                "validation_matched": ("dev_matched.tsv", "dev_matched.jsonl"),
                "validation_mismatched": ("dev_mismatched.tsv", "dev_mismatched.jsonl"),
                "test_matched": ("test_matched.tsv",),
                "test_mismatched": ("test_mismatched.tsv",),
            },
            source_columns={**NLI_SOURCE_COLUMNS, "label": "gold_label"},
            submission={"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm"},
        ),
        _glue_task("qnli", "QNLI", ("question", "sentence"), "accuracy", ENTAILMENT),
        _glue_task("rte", "RTE", SENTENCE_PAIR, "accuracy", ENTAILMENT),
        _glue_task(
            "wnli", "WNLI", SENTENCE_PAIR, "accuracy", {"0": "not_entailment", "1": "entailment"}
        ),
        # The diagnostic set: MNLI-style pairs, test only, predicted with the model trained on mnli.
        _glue_task(
            "ax",
            "diagnostic",
            NLI_PAIR,
            "accuracy",
            MNLI_LABELS,
            files={"test": ("diagnostic.tsv",)},
            source_columns=dict(NLI_SOURCE_COLUMNS),
            submission={"test": "AX"},
            trained_as="mnli",
        ),
    )
}

# The nine tasks of the GLUE score (ax is diagnostic only).
SCORED_TASKS = tuple(name for name in GLUE_TASKS if name != "ax")


def get_task(name: str) -> Task:
    """The registered GLUE task called `name`; ConfigError naming the valid ones otherwise."""
    task = GLUE_TASKS.get(name.lower().replace("-", ""))
    if task is None:
        raise ConfigError(f"unknown task {name!r}; choose from {', '.join(GLUE_TASKS)} or all")
    return task


def custom_task(
    text_columns: Sequence[str],
    label_column: str,
    labels: Sequence[str] | None,
    name: str = "custom",
) -> Task:
    """A task read from your own files: classification over `labels`, or regression if None."""
    if not 1 <= len(text_columns) <= 2:
        raise ConfigError(f"--text-columns takes one or two column names, got {list(text_columns)}")
    return Task(
        name=name,
        text_columns=tuple(text_columns),
        labels=None if labels is None else tuple(labels),
        metric="pearson_spearman" if labels is None else "accuracy",
        files={},
        source_columns={"label": label_column},
    )


def labels_in_file(path: str | Path, label_column: str) -> list[str]:
    """The sorted distinct values of `label_column` in a CSV/TSV/JSONL file (a custom label set)."""
    path = Path(path)
    values = {_field(row, label_column, path, line) for line, row in _read_rows(path)}
    return sorted(values)


def split_file(task: Task, split: str, data_dir: str | Path) -> Path | None:
    """The local file of a task's split, or None when none of its usual names exists."""
    if split not in task.files:
        raise ConfigError(
            f"task {task.name} has no split {split!r}; choose from {list(task.files)}"
        )
    folder = Path(data_dir) / task.dir_name
    return next((folder / n for n in task.files[split] if (folder / n).is_file()), None)


def available_tasks(
    data_dir: str | Path, names: Sequence[str] | None = None, needs_train: bool = True
) -> list[str]:
    """The tasks of `names` (every GLUE task by default) whose first dev file and, with
    `needs_train`, train file are present under `data_dir`."""
    tasks = GLUE_TASKS.values() if names is None else map(get_task, names)
    return [
        task.name
        for task in tasks
        if task.eval_splits
        and (not needs_train or "train" in task.files)
        and all(split_file(task, split, data_dir) for split in _splits_needed(task, needs_train))
    ]


def _splits_needed(task: Task, needs_train: bool) -> tuple[str, ...]:
    return ("train", task.eval_splits[0]) if needs_train else task.eval_splits[:1]


def check_split_present(task: Task, split: str, data_dir: str | Path) -> Path:
    """The local file of a task's split; DataError naming the files expected when it is absent."""
    path = split_file(task, split, data_dir)
    if path is None:
        expected = " or ".join(str(Path(data_dir) / task.dir_name / n) for n in task.files[split])
        raise DataError(
            f"{task.name} {split} file not found: {expected}; pass the GLUE folder as --data-dir"
        )
    return path


def present_eval_splits(task: Task, data_dir: str | Path) -> list[str]:
    """The task's dev splits found under data_dir (MNLI: matched and, if there, mismatched);
    DataError when the first is absent."""
    check_split_present(task, task.eval_splits[0], data_dir)
    return [split for split in task.eval_splits if split_file(task, split, data_dir)]


def resolve_tasks(
    names: Sequence[str] | str,
    data_dir: str | Path | None,
    *,
    offered: Sequence[str] | None = None,
    not_offered: str = "{task} is not a task this command runs",
    needs_train: bool = True,
) -> list[Task]:
    """The GLUE tasks a command was asked for, each once, its files checked when `data_dir`
    is given (None: the hub's copy is read later).

    `names`: task names, or "all": those of `offered` (None: every GLUE task) whose files are in
    data_dir. A task outside `offered` is refused with `not_offered` (said of `{task}`).
    `needs_train`: the command fits something to the train split, so a task without one (ax)
    is refused and "all" picks only tasks with train and dev files; otherwise dev is enough.
    """
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ConfigError("no task given; pass --task (a task name, several, or all)")
    if "all" in names:
        names = _all_present(data_dir, offered, needs_train)
    tasks = list({task.name: task for task in map(get_task, names)}.values())
    for task in tasks:
        if offered is not None and task.name not in offered:
            raise ConfigError(
                f"{not_offered.format(task=task.name)}; choose from {', '.join(offered)} or all"
            )
        if needs_train and task.trained_as:
            raise ConfigError(
                f"{task.name} has no training data: its predictions come from the "
                f"{task.trained_as} model; pass --task {task.trained_as}"
            )
        if data_dir is not None:
            for split in _splits_needed(task, needs_train):
                check_split_present(task, split, data_dir)
    return tasks


def _all_present(
    data_dir: str | Path | None, offered: Sequence[str] | None, needs_train: bool
) -> list[str]:
    """What --task all means: the tasks whose files are in data_dir."""
    if data_dir is None:
        raise ConfigError("--task all runs the tasks whose files are in --data-dir; pass it")
    names = available_tasks(data_dir, offered, needs_train)
    if not names:
        files, example = (
            ("train and dev files", "RTE/train.tsv and ") if needs_train else ("dev file", "")
        )
        raise DataError(
            f"no GLUE task{'' if offered is None else ' of ' + ', '.join(offered)} has its "
            f"{files} in {data_dir}; expected e.g. {example}RTE/dev.tsv"
        )
    return names


def read_glue_split(
    task: str | Task, split: str, data_dir: str | Path | None = None
) -> datasets.Dataset:
    """One split ("train", "validation", "test", MNLI's "validation_matched", ...) of a GLUE task.

    With `data_dir` it reads the local GLUE layout `data_dir/<TASK>/<file>`; without, the hub's
    `nyu-mll/glue` config (which needs the network). Test splits carry no labels.
    """
    task = get_task(task) if isinstance(task, str) else task
    if data_dir is None:
        return _load_from_hub(task, split)
    path = check_split_present(task, split, data_dir)
    return read_task_file(task, path, with_labels=not split.startswith("test"), split=split)


def read_task_file(
    task: Task, path: str | Path, with_labels: bool = True, split: str = ""
) -> datasets.Dataset:
    """A task's examples from one CSV/TSV/JSONL file; DataError naming the file and line if bad."""
    path = Path(path)
    columns = [*task.text_columns, "label"] if with_labels else list(task.text_columns)
    parse_label = _label_parser(task)
    data: dict[str, list] = {name: [] for name in [*columns, "idx"]}
    for number, (line, row) in enumerate(_read_rows(path, task.headerless.get(split))):
        for name in columns:
            value = _field(row, task.source_columns.get(name, name), path, line, fallback=name)
            data[name].append(parse_label(value, path, line) if name == "label" else value)
        index = row.get(task.source_columns.get("idx", "index"), number)
        data["idx"].append(_parse_index(index, path, line))
    return datasets.Dataset.from_dict(data, features=_features(task, columns))


def _features(task: Task, columns: list[str]) -> datasets.Features:
    features = {name: datasets.Value("string") for name in task.text_columns}
    if "label" in columns:
        features["label"] = (
            datasets.Value("float32")
            if task.is_regression
            else datasets.ClassLabel(names=list(task.id2label.values()))
        )
    features["idx"] = datasets.Value("int32")
    return datasets.Features(features)


def _label_parser(task: Task):
    """A function (value, path, line) -> class id or score, accepting GLUE's strings or names."""
    if task.labels is None:

        def parse_score(value: str, path: Path, line: int) -> float:
            try:
                return float(value)
            except ValueError:
                raise DataError(f"{path}:{line}: label {value!r} is not a number") from None

        return parse_score

    ids = {label: i for i, label in enumerate(task.labels)}
    ids.update({name: i for i, name in enumerate(task.label_names or ())})

    def parse_class(value: str, path: Path, line: int) -> int:
        if value not in ids:
            raise DataError(
                f"{path}:{line}: label {value!r} is not one of {task.name}'s labels "
                f"{list(task.labels)}; fix the row or the label column"
            )
        return ids[value]

    return parse_class


def _parse_index(value, path: Path, line: int) -> int:
    try:
        index = int(value)
    except (TypeError, ValueError):
        index = None
    if index is None or not -(2**31) <= index < 2**31:
        raise DataError(f"{path}:{line}: index {value!r:.40} is not a 32-bit integer")
    return index


def _field(row: dict, name: str, path: Path, line: int, fallback: str | None = None) -> str:
    """Column `name` of a row (or `fallback`: JSONL files may use the hub's names)."""
    for key in (name, fallback):
        if key is not None and key in row:
            value = row[key]
            return value if isinstance(value, str) else str(value)
    raise DataError(f"{path}:{line}: no column {name!r}; the row has {list(row)}")


def _read_rows(
    path: Path, headerless_columns: tuple[str, ...] | None = None
) -> Iterator[tuple[int, dict]]:
    """(line number, row as a dict) for every data row of a TSV, CSV or JSONL file."""
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass a CSV, TSV or JSONL file")
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    found_any = False
    if path.suffix == ".jsonl":
        rows = jsonl_objects(path, _text_lines(path))
    else:
        rows = _table_rows(path, headerless_columns)
    for line, row in rows:
        found_any = True
        yield line, row
    if not found_any:
        raise DataError(f"{path} is empty (no data rows)")


def _text_lines(path: Path) -> Iterator[str]:
    """The file's lines (with their line ends) as UTF-8 text, a byte order mark dropped (MRPC's
    header has one); DataError naming the line and byte offset of an undecodable byte."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}:{number}: byte 0x{raw[error.start]:02x} at offset "
                    f"{offset + error.start} is not valid UTF-8; save the file as UTF-8 "
                    "(e.g. iconv -f latin1 -t utf-8)"
                ) from None
            offset += len(raw)
            yield text.removeprefix("\ufeff") if number == 1 else text


def _table_rows(
    path: Path, headerless_columns: tuple[str, ...] | None
) -> Iterator[tuple[int, dict]]:
    # GLUE's TSV fields hold unbalanced quote characters, so TSVs are read with quoting off;
    # CSV needs quoting to hold commas inside fields.
    tab = path.suffix != ".csv"
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tab else {}
    reader = csv.reader(_text_lines(path), **dialect)
    try:
        header = list(headerless_columns) if headerless_columns else next(reader, None)
        if header is None:
            return
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                separator = "tab" if tab else "comma"
                raise DataError(
                    f"{path}:{reader.line_num}: expected {len(header)} {separator}-separated "
                    f"fields ({', '.join(header)}), found {len(fields)}"
                )
            yield reader.line_num, dict(zip(header, fields, strict=True))
    except csv.Error as error:
        raise DataError(f"{path}:{reader.line_num}: {_csv_problem(error)}") from None


def _csv_problem(error: csv.Error) -> str:
    if "field limit" in str(error):
        return (
            f"a field is longer than {csv.field_size_limit():,} characters (a broken file, or a "
            "quote character that opens a field and never closes?)"
        )
    return f"{error}; is it a CSV/TSV text file?"


def _load_from_hub(task: Task, split: str) -> datasets.Dataset:
    if task.hub_config is None:
        raise ConfigError(f"task {task.name} is not on the hub; pass its files")
    if split not in task.files:
        raise ConfigError(
            f"task {task.name} has no split {split!r}; choose from {list(task.files)}"
        )
    try:
        dataset = datasets.load_dataset(HUB_DATASET, task.hub_config, split=split)
    except OSError as error:  # offline, no network, hub down: all are fixed by using local files
        raise DataError(
            f"cannot load {HUB_DATASET} config {task.hub_config!r} ({type(error).__name__}: "
            f"offline?); pass --data-dir with the GLUE files"
        ) from None
    # The hub marks missing test labels with -1; the local reader leaves the column out.
    return dataset.remove_columns("label") if split.startswith("test") else dataset
