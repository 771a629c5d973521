"""Pretraining sources: table files, saved and Hub-style data sets, compressed text, byte-range
shards, mixing with weights, held-out validation, and the one-line errors of bad sources."""

from __future__ import annotations

import bz2
import collections
import gzip
import json
import lzma
import sys
from pathlib import Path

import datasets
import pytest
import zstandard
from datasets import Dataset

from egbert import sources
from egbert.errors import ConfigError, DataError

DOCUMENTS = [f"Document {i} says something . It has a second sentence {i} ." for i in range(40)]


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each test's Arrow files in a folder of its own, read by no other test (conftest keeps
    the suite's out of the user's cache)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def write_jsonl(path: Path, texts: list[str], column: str = "text", **other) -> Path:
    rows = [{column: text, **other} for text in texts]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def texts(documents) -> list[str]:
    return [row["text"] for row in documents]


# ---------------------------------------------------------------- each kind of source


def test_table_files_are_read_by_extension_and_their_text_column_found(tmp_path: Path):
    frame = Dataset.from_dict({"id": list(range(40)), "content": DOCUMENTS})
    frame.to_parquet(str(tmp_path / "a.parquet"))
    frame.to_csv(str(tmp_path / "a.csv"), index=False)
    write_jsonl(tmp_path / "a.jsonl", DOCUMENTS, column="body", id=1)  # the only string column
    (tmp_path / "a.json").write_text(json.dumps([{"text": t, "title": "x"} for t in DOCUMENTS]))
    for name in ("a.parquet", "a.csv", "a.jsonl", "a.json"):
        for streaming in (False, True):
            found = sources.load_documents([tmp_path / name], streaming=streaming)
            assert texts(found) == DOCUMENTS, (name, streaming)


def test_compressed_text_reads_like_the_plain_file(tmp_path: Path):
    plain = "\n\n".join(DOCUMENTS).encode()
    (tmp_path / "c.txt").write_bytes(plain)
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(plain))
    (tmp_path / "c.bz2").write_bytes(bz2.compress(plain))
    (tmp_path / "c.tokens.xz").write_bytes(lzma.compress(plain))
    (tmp_path / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
    write_jsonl(tmp_path / "j.jsonl", DOCUMENTS)
    (tmp_path / "j.jsonl.gz").write_bytes(gzip.compress((tmp_path / "j.jsonl").read_bytes()))
    names = ("c.txt", "c.txt.gz", "c.bz2", "c.tokens.xz", "c.txt.zst", "j.jsonl.gz")
    for name in names:
        assert texts(sources.load_documents([tmp_path / name])) == DOCUMENTS, name
        assert texts(sources.load_documents([tmp_path / name], streaming=True)) == DOCUMENTS


def test_zstandard_text_without_the_package_is_refused_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "c.txt.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress("\n\n".join(DOCUMENTS).encode()))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as where it is not installed
    for streaming in (False, True):
        with pytest.raises(DataError, match=r"c\.txt\.zst: .*needs the zstandard package") as error:
            texts(sources.load_documents([path], streaming=streaming))
        assert "\n" not in str(error.value)


def test_saved_data_set_and_a_local_folder_as_the_hub_name(tmp_path: Path):
    Dataset.from_dict({"text": DOCUMENTS, "n": list(range(40))}).save_to_disk(tmp_path / "saved")
    datasets.DatasetDict(
        {"train": Dataset.from_dict({"text": DOCUMENTS[:30]}),
         "validation": Dataset.from_dict({"text": DOCUMENTS[30:]})}
    ).save_to_disk(tmp_path / "saved-dict")  # fmt: skip
    hub_copy = tmp_path / "hub-copy"
    hub_copy.mkdir()
    write_jsonl(hub_copy / "train.jsonl", DOCUMENTS)
    assert texts(sources.load_documents([tmp_path / "saved"])) == DOCUMENTS
    assert texts(sources.load_documents(dataset=str(tmp_path / "saved"), streaming=True)) == (
        DOCUMENTS
    )
    validation = sources.load_hub_documents(str(tmp_path / "saved-dict"), split="validation")
    assert texts(validation) == DOCUMENTS[30:]
    assert texts(sources.load_documents(dataset=str(hub_copy))) == DOCUMENTS
    with pytest.raises(DataError, match=r"saved-dict: no split 'test'.*--split"):
        sources.load_hub_documents(str(tmp_path / "saved-dict"), split="test")


@pytest.mark.parametrize("boundary", ["line", "blank"])
def test_a_streamed_file_cut_into_byte_ranges_keeps_every_document_once(
    tmp_path: Path, boundary: str
):
    separator = "\n" if boundary == "line" else "\n\n"
    path = tmp_path / "big.txt"
    path.write_text(separator.join(DOCUMENTS) + "\n", encoding="utf-8")
    for shard_bytes in (1, 7, 100, 10**6):
        stream = sources.read_documents(
            [path], doc_boundary=boundary, streaming=True, shard_bytes=shard_bytes
        )
        assert stream.num_shards == -(-path.stat().st_size // shard_bytes)
        assert texts(stream) == DOCUMENTS, shard_bytes


# ---------------------------------------------------------------- mixing and validation


def test_sources_mix_with_their_weights_until_every_one_is_read_through(tmp_path: Path):
    big = write_jsonl(tmp_path / "big.jsonl", [f"big {i}" for i in range(300)])
    small = write_jsonl(tmp_path / "small.jsonl", [f"small {i}" for i in range(30)])
    for streaming in (False, True):
        mixed = texts(sources.load_documents([big, small], weights=[3, 1], streaming=streaming))
        seen = collections.Counter(text.split()[0] for text in mixed)
        assert set(mixed) == {f"big {i}" for i in range(300)} | {f"small {i}" for i in range(30)}
        assert 2.3 < seen["big"] / seen["small"] < 3.9, seen  # the small one repeats
    concatenated = texts(sources.load_documents([big, small]))
    assert concatenated == [f"big {i}" for i in range(300)] + [f"small {i}" for i in range(30)]
    with pytest.raises(ConfigError, match="2 weights for 3 sources"):
        sources.load_documents([big, small], dataset=str(tmp_path), weights=[1, 2])


def test_held_out_validation_is_the_same_share_streamed_or_not(tmp_path: Path):
    many = [f"document number {i} ." for i in range(2000)]
    path = write_jsonl(tmp_path / "many.jsonl", many)
    splits = {}
    for streaming in (False, True):
        documents = sources.load_documents([path], streaming=streaming)
        train, validation = sources.split_validation(documents, 5)
        splits[streaming] = (texts(train), texts(validation))
    train, validation = splits[False]
    assert splits[True] == splits[False]
    assert not set(train) & set(validation) and sorted(train + validation) == sorted(many)
    assert 60 < len(validation) < 140  # about 5% of 2,000
    with pytest.raises(ConfigError, match="validation-split-percentage 100"):
        sources.split_validation(documents, 100)


# ---------------------------------------------------------------- bad sources: one line each


def test_bad_sources_are_one_line_naming_the_file_and_the_fix(tmp_path: Path):
    two_strings = write_jsonl(tmp_path / "two.jsonl", DOCUMENTS, column="body", title="t")
    empty_rows = write_jsonl(tmp_path / "blank.jsonl", ["", "  "])
    (tmp_path / "corpus.docx").write_bytes(b"PK")
    (tmp_path / "empty.csv").write_text("")
    cases = [
        (
            lambda: sources.load_documents([two_strings]),
            r"two\.jsonl: which column .*--text-column",
        ),
        (
            lambda: sources.load_documents([two_strings], text_column="text"),
            r"two\.jsonl: no column 'text'; its columns are body, title.*--text-column",
        ),
        (
            lambda: sources.load_documents([tmp_path / "corpus.docx"]),
            r"corpus\.docx: unknown extension '\.docx'; pass text .*\.parquet",
        ),
        (lambda: sources.load_documents([empty_rows]), r"blank\.jsonl: no documents"),
        (
            lambda: sources.load_documents([empty_rows], streaming=True),
            r"blank\.jsonl: no documents",
        ),
        (
            lambda: sources.load_documents([tmp_path / "empty.csv"]),
            r"empty\.csv: the file is empty",
        ),
        (lambda: sources.load_documents([tmp_path / "nope.jsonl"]), r"nope\.jsonl: no such file"),
    ]
    for call, pattern in cases:
        with pytest.raises(DataError, match=pattern) as error:
            call()
        assert "\n" not in str(error.value)


# ---------------------------------------------------------------- `egbert pretrain --help`


def test_pretrain_help_lists_the_source_options(capsys: pytest.CaptureFixture):
    from egbert.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["pretrain", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for option in ("--dataset ", "--text-column", "--source-weights", "--validation-split ",
                   "--validation-split-percentage", "--shuffle-buffer"):  # fmt: skip
        assert option in shown, option
