"""The GLUE registry and readers: official row counts on the shared data, and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egbert.errors import ConfigError, DataError
from egbert.finetune.tasks import (
    GLUE_TASKS,
    available_tasks,
    custom_task,
    get_task,
    labels_in_file,
    read_glue_split,
    read_task_file,
    resolve_tasks,
)

OFFICIAL_ROWS = {
    ("cola", "train"): 8551,
    ("cola", "validation"): 1043,
    ("cola", "test"): 1063,
    ("sst2", "train"): 67349,
    ("sst2", "validation"): 872,
    ("sst2", "test"): 1821,
    ("mrpc", "train"): 3668,
    ("mrpc", "validation"): 408,
    ("mrpc", "test"): 1725,
    ("stsb", "train"): 5749,
    ("stsb", "validation"): 1500,
    ("stsb", "test"): 1379,
    ("qnli", "validation"): 5463,
    ("qnli", "test"): 5463,
    ("rte", "train"): 2490,
    ("rte", "validation"): 277,
    ("rte", "test"): 3000,
    ("wnli", "train"): 635,
    ("wnli", "validation"): 71,
    ("wnli", "test"): 146,
    ("mnli", "validation_matched"): 9815,
}


@pytest.fixture(scope="module")
def glue_dir(data_dir: Path) -> Path:
    return data_dir / "glue"


@pytest.mark.parametrize(("task", "split"), list(OFFICIAL_ROWS))
def test_reader_gives_official_row_counts(glue_dir: Path, task: str, split: str) -> None:
    dataset = read_glue_split(task, split, glue_dir)
    assert len(dataset) == OFFICIAL_ROWS[task, split]
    spec = GLUE_TASKS[task]
    assert set(spec.text_columns) <= set(dataset.column_names)
    assert ("label" in dataset.column_names) == (not split.startswith("test"))
    assert all(dataset[0][column].strip() for column in spec.text_columns)
    if split.startswith("test"):
        assert dataset["idx"] == list(range(len(dataset)))  # GLUE's test files count from 0


def test_labels_map_to_the_hub_class_ids(glue_dir: Path) -> None:
    rte = read_glue_split("rte", "validation", glue_dir)
    assert rte.features["label"].names == ["entailment", "not_entailment"]
    assert rte[0]["label"] == 1  # the first dev pair is "not_entailment"
    mnli = read_glue_split("mnli", "validation_matched", glue_dir)
    assert mnli[0]["label"] == 1  # JSONL text label "neutral"
    assert sorted(set(mnli["label"])) == [0, 1, 2]
    stsb = read_glue_split("stsb", "validation", glue_dir)
    assert stsb[1]["label"] == pytest.approx(4.75)
    cola = read_glue_split("cola", "train", glue_dir)  # no header: the first row is data
    assert cola[0]["sentence"].startswith("Our friends won't buy this analysis")


def test_mrpc_header_with_byte_order_mark_and_raw_quotes(glue_dir: Path) -> None:
    mrpc = read_glue_split("mrpc", "validation", glue_dir)
    # A field that opens a quote it never closes: read with quoting off, it stays one field.
    assert mrpc[0]["sentence2"].startswith('"The foodservice pie business')
    assert mrpc[0]["label"] == 1


def test_available_tasks_needs_train_and_dev(glue_dir: Path) -> None:
    assert available_tasks(glue_dir) == ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]


def test_resolve_tasks_names_each_task_once_and_all_means_those_with_their_files(
    glue_dir: Path,
) -> None:
    def names(*args, **kwargs) -> list[str]:
        return [task.name for task in resolve_tasks(*args, **kwargs)]

    assert names(["rte", "RTE", "sst2"], glue_dir) == ["rte", "sst2"]
    assert names("all", glue_dir) == available_tasks(glue_dir)
    offered = ("sst2", "qnli", "rte")  # qnli has a dev file and no train file here
    assert names("all", glue_dir, offered=offered) == ["sst2", "rte"]
    assert names("all", glue_dir, offered=offered, needs_train=False) == list(offered)
    assert names("qnli", None) == ["qnli"]  # no folder: the hub's copy, read later
    with pytest.raises(DataError, match="qnli train file not found"):
        resolve_tasks("qnli", glue_dir)
    with pytest.raises(ConfigError, match="ax has no training data.*pass --task mnli"):
        resolve_tasks("ax", None)
    with pytest.raises(ConfigError, match="no format for cola; choose from sst2, qnli, rte or all"):
        resolve_tasks("cola", glue_dir, offered=offered, not_offered="no format for {task}")
    with pytest.raises(ConfigError, match="--task all .* --data-dir"):
        resolve_tasks("all", None)
    with pytest.raises(ConfigError, match="no task given"):
        resolve_tasks([], glue_dir)


def test_unknown_task_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown task 'glu'.*cola, sst2, mrpc"):
        get_task("glu")
    assert get_task("SST-2").name == "sst2"


def test_missing_split_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"rte train file not found: .*RTE/train\.tsv"):
        read_glue_split("rte", "train", tmp_path)


def test_hub_fails_fast_offline() -> None:
    # conftest.py sets HF_DATASETS_OFFLINE=1: without --data-dir the reader must say what to do.
    with pytest.raises(DataError, match="offline.*pass --data-dir"):
        read_glue_split("rte", "train")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_label_outside_the_label_set_names_file_and_line(tmp_path: Path) -> None:
    rows = "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tc\td\tmaybe\n"
    path = _write(tmp_path / "RTE" / "train.tsv", rows)
    with pytest.raises(DataError, match=rf"{path}:3: label 'maybe' is not one of rte's labels"):
        read_glue_split("rte", "train", tmp_path)


def test_wrong_column_count_names_file_and_line(tmp_path: Path) -> None:
    rows = "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tc\tentailment\n"
    path = _write(tmp_path / "RTE" / "dev.tsv", rows)
    with pytest.raises(DataError, match=rf"{path}:3: expected 4 tab-separated fields.*found 3"):
        read_glue_split("rte", "validation", tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "SST-2" / "train.tsv", "")
    with pytest.raises(DataError, match=rf"{path} is empty"):
        read_glue_split("sst2", "train", tmp_path)
    _write(path, "sentence\tlabel\n")
    with pytest.raises(DataError, match="is empty"):
        read_glue_split("sst2", "train", tmp_path)


def test_custom_csv_and_jsonl_files(tmp_path: Path) -> None:
    csv_path = _write(
        tmp_path / "train.csv", 'text,topic\n"hello, world",greeting\nbye now,farewell\n'
    )
    labels = labels_in_file(csv_path, "topic")
    assert labels == ["farewell", "greeting"]
    task = custom_task(["text"], "topic", labels)
    train = read_task_file(task, csv_path)
    assert train["text"] == ["hello, world", "bye now"]
    assert train["label"] == [1, 0]

    rows = [{"a": "x", "b": "y", "score": 1.5}, {"a": "z", "b": "w", "score": 3}]
    jsonl_path = _write(tmp_path / "dev.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    regression = custom_task(["a", "b"], "score", None)
    dev = read_task_file(regression, jsonl_path)
    assert dev["label"] == [1.5, 3.0]

    bad = _write(tmp_path / "bad.jsonl", '{"a": "x", "b": "y", "score": 1}\n{"a": "z"}\n')
    with pytest.raises(DataError, match=rf"{bad}:2: no column 'b'"):
        read_task_file(regression, bad)
    with pytest.raises(DataError, match=rf"{csv_path}:2: label 'greeting' is not one of"):
        read_task_file(custom_task(["text"], "topic", ["farewell"]), csv_path)
