"""Hypothesis fuzz of the readers that take user files: the task readers (custom TSV/CSV/JSONL
files, the GLUE layout) and the pretraining corpus reader. Whatever the bytes, a reader returns
rows or raises an EgbertError subclass, never another exception; well-formed files read back
exactly what was written."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egbert.errors import EgbertError
from egbert.finetune.tasks import custom_task, get_task, labels_in_file, read_task_file
from egbert.sources import DOC_BOUNDARIES, read_documents

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
LABELS = ("neg", "pos")
CUSTOM = custom_task(["text"], "label", LABELS)
# Text as users write it; no surrogates (no file can hold them).
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def table_bytes(columns: tuple[str, ...], header: bool = True) -> st.SearchStrategy[bytes]:
    """TSV files for `columns`: mostly well-shaped rows of fuzzed fields (labels, indexes and
    free text among them, so the fuzz reaches the label and index parsers), some rows of the
    wrong length, a header now and then missing, encodings that are not UTF-8, and raw bytes."""
    field = st.one_of(
        st.sampled_from([*LABELS, "entailment", "not_entailment", "0", "1", "-1", "2e40", ""]),
        st.integers(-(2**40), 2**40).map(str),
        ANY_TEXT,
    )
    width = len(columns)
    shaped = st.lists(field, min_size=width, max_size=width)
    row = st.one_of(shaped, shaped, shaped, st.lists(field, max_size=width + 1))
    rows = st.lists(row.map("\t".join), min_size=1, max_size=5)
    first = st.sampled_from([["\t".join(columns)]] if header else [[]]) | st.just([])
    text = st.tuples(first, rows).map(lambda parts: "\n".join(parts[0] + parts[1]))
    encoded = st.tuples(st.sampled_from(["utf-8", "utf-8-sig", "latin-1"]), text).map(
        lambda pair: pair[1].encode(pair[0], "replace")
    )
    return st.one_of(encoded, encoded, st.binary(max_size=200))


def jsonl_bytes() -> st.SearchStrategy[bytes]:
    value = st.one_of(
        st.sampled_from(LABELS), ANY_TEXT, st.integers(), st.floats(), st.none(), st.booleans()
    )
    keys = st.sampled_from(["text", "label", "idx", "other"])
    row = st.one_of(
        st.fixed_dictionaries({"text": value, "label": value}), st.dictionaries(keys, value)
    )
    broken = ["[1]", "{", '"\\ud800"', "9" * 5000, '{"text": "\\udc80", "label": "pos"}']
    line = st.one_of(row.map(json.dumps), row.map(json.dumps), st.sampled_from(broken))
    lines = st.lists(line, min_size=1, max_size=5)
    return st.one_of(lines.map("\n".join).map(str.encode), st.binary(max_size=200))


def reads_or_refuses(read):
    """`read()`'s rows, or the EgbertError it refused with (any other exception fails)."""
    try:
        return read()
    except EgbertError as error:
        assert "\n" not in str(error), str(error)
        return error


# ---------------------------------------------------------------- task files


@FUZZ
@given(content=table_bytes(("text", "label")), suffix=st.sampled_from([".tsv", ".csv"]))
def test_custom_table_files_read_or_refuse(content, suffix, folder):
    path = folder / f"custom{suffix}"
    path.write_bytes(content.replace(b"\t", b",") if suffix == ".csv" else content)
    reads_or_refuses(lambda: labels_in_file(path, "label"))
    reads_or_refuses(lambda: read_task_file(CUSTOM, path, with_labels=True))
    reads_or_refuses(lambda: read_task_file(CUSTOM, path, with_labels=False))


@FUZZ
@given(content=jsonl_bytes())
def test_custom_jsonl_files_read_or_refuse(content, folder):
    path = folder / "custom.jsonl"
    path.write_bytes(content)
    reads_or_refuses(lambda: labels_in_file(path, "label"))
    reads_or_refuses(lambda: read_task_file(CUSTOM, path))


GLUE_FILES = {  # task, split -> the columns of its file (CoLA's train file has no header)
    ("rte", "train"): ("index", "sentence1", "sentence2", "label"),
    ("cola", "train"): ("source", "label", "original_label", "sentence"),
    ("stsb", "test"): ("index", "sentence1", "sentence2"),
}


@FUZZ
@given(data=st.data(), task_and_split=st.sampled_from(list(GLUE_FILES)))
def test_glue_files_read_or_refuse(data, task_and_split, folder):
    """RTE (header, labels), CoLA (no header), STS-B test (no labels)."""
    name, split = task_and_split
    task = get_task(name)
    content = data.draw(table_bytes(GLUE_FILES[task_and_split], header=name != "cola"))
    path = folder / f"{name}-{split}.tsv"
    path.write_bytes(content)
    reads_or_refuses(lambda: read_task_file(task, path, not split.startswith("test"), split))


# one line's fields: no tab or line break inside them (TSV has no quoting)
TSV_FIELD = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\t\n\r"))


@FUZZ
@given(rows=st.lists(st.tuples(TSV_FIELD, st.sampled_from(LABELS)), min_size=1, max_size=8))
def test_written_tsv_rows_read_back_equal(rows, folder):
    path = folder / "roundtrip.tsv"
    lines = ["text\tlabel", *(f"{text}\t{label}" for text, label in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_task_file(CUSTOM, path).to_dict() == {
        "text": [text for text, _ in rows],
        "label": [LABELS.index(label) for _, label in rows],
        "idx": list(range(len(rows))),
    }


@FUZZ
@given(rows=st.lists(st.tuples(ANY_TEXT, st.sampled_from(LABELS)), min_size=1, max_size=8))
def test_written_csv_and_jsonl_rows_read_back_equal(rows, folder):
    """CSV written by the csv module (quotes, commas, line breaks inside fields) and JSONL."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows([("text", "label"), *rows])
    (folder / "roundtrip.csv").write_text(buffer.getvalue(), encoding="utf-8", newline="")
    jsonl = [json.dumps({"text": text, "label": label}) for text, label in rows]
    (folder / "roundtrip.jsonl").write_text("\n".join(jsonl), encoding="utf-8")
    for name in ("roundtrip.csv", "roundtrip.jsonl"):
        read = read_task_file(CUSTOM, folder / name).to_dict()
        assert read["text"] == [text for text, _ in rows], name
        assert read["label"] == [LABELS.index(label) for _, label in rows], name


# ---------------------------------------------------------------- the corpus reader


def documents(path: Path, **options) -> list[str]:
    # streaming: the reader's own generator, without writing an Arrow cache per example
    return [row["text"] for row in read_documents([path], streaming=True, **options)]


@FUZZ
@given(
    content=st.one_of(st.binary(max_size=300), ANY_TEXT.map(str.encode)),
    doc_boundary=st.sampled_from(DOC_BOUNDARIES),
    encoding=st.sampled_from(["utf-8", "latin-1"]),
)
def test_corpus_files_read_or_refuse(content, doc_boundary, encoding, folder):
    path = folder / "corpus.txt"
    path.write_bytes(content)
    read = reads_or_refuses(lambda: documents(path, doc_boundary=doc_boundary, encoding=encoding))
    if isinstance(read, list):
        assert read and all(text.strip() for text in read)
    elif encoding == "latin-1":  # every byte is a Latin-1 character: no decoding error
        assert "empty" in str(read) or "no text" in str(read), str(read)


# a corpus line as the reader keeps it: no line break, no space or control character at its ends
LINE = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp")), min_size=1, max_size=20
).filter(lambda line: line == line.strip() and line)


@FUZZ
@given(docs=st.lists(st.lists(LINE, min_size=1, max_size=4), min_size=1, max_size=5))
def test_written_documents_read_back_equal(docs, folder):
    path = folder / "documents.txt"
    path.write_text("\n\n".join("\n".join(lines) for lines in docs) + "\n", encoding="utf-8")
    assert documents(path, doc_boundary="blank") == ["\n".join(lines) for lines in docs]
    assert documents(path, doc_boundary="line") == [line for lines in docs for line in lines]
    assert documents(path, doc_boundary="file") == ["\n".join(sum(docs, []))]
