"""Corpus sources -> documents: text files, table files, saved data sets, Hub data sets, mixed.

Every source becomes a `datasets` data set of documents, one row each, in one column "text"
(a `Dataset` in the Arrow cache, or with `streaming=True` an `IterableDataset` read as it trains).

    read_documents(files, doc_boundary="blank", encoding="utf-8", errors="strict",
                   streaming=False, shard_bytes=SHARD_BYTES)
        plain-text files, also compressed (.gz .bz2 .xz, .zst with the zstandard package):
        doc_boundary "blank" (blank lines separate documents), "wikitext" (a ` = Title = `
        line starts an article; heading lines are dropped), "line" (one document per line) or
        "file" (one document per file). Streamed, a file with "line" or "blank" documents is
        cut into byte ranges of about `shard_bytes` (each document in exactly one), so that
        several processes can each read their own part of it.
    load_hub_documents(name, text_column=None, split="train", config_name=None, streaming=False)
        a Hub data set, a local data set folder (its files, as `datasets.load_dataset(path)`
        reads them) or a `save_to_disk` folder; each non-empty row is a document.
    load_documents(paths, dataset=None, ..., weights=None, streaming=False)
        what `egbert pretrain` trains on and `egbert tokenizer train` learns from: local paths
        by extension (.txt and other text, .jsonl .json .csv .parquet, a data set folder) and
        a Hub data set, concatenated, or with `weights` mixed by `datasets.interleave_datasets`
        (load_sources and mix_sources, its two halves; text_batches reads one source through).
    split_validation(documents, percentage) -> (train, validation)
        a held-out share of the documents, chosen by a hash of each document's text.

The text column of a table is the one named, else the only string column, else one named
text, content or document. A missing column, an unknown extension or an empty source raises a
DataError naming the file and the fix.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import importlib.util
import io
import json
import logging
import lzma
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
from datasets import Dataset, Features, IterableDataset, Value
from datasets.exceptions import DatasetGenerationError
from datasets.table import CastError

from egbert.errors import ConfigError, DataError, EgbertError

DOC_BOUNDARIES = ("blank", "wikitext", "line", "file")
DECODE_ERRORS = ("strict", "replace", "ignore", "backslashreplace")
ENCODING_ERRORS_HELP = "on undecodable bytes: strict (stop and say where) | replace | ignore"
TEXT_FEATURES = Features({"text": Value("string")})
# Streamed text files are cut into ranges of this many bytes: a 1 GB file gives 64 shards, enough
# for a node of 8 processes x 8 loader workers; WikiText-2's 11 MB stay one shard.
SHARD_BYTES = 16 * 2**20
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zst": None}
TABLE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TEXT_SUFFIXES = (".txt", ".text", ".tokens", ".raw", ".md", "")
TEXT_COLUMN_NAMES = ("text", "content", "document")
# Mixed sources: each is drawn with its weight until every one has been read to its end once;
# the smaller ones repeat meanwhile, so the weights hold for the whole epoch and no document of
# any source is left out ("first_exhausted" would stop at the end of the smallest source).
MIX_STOPPING_STRATEGY = "all_exhausted"
# Held-out documents: a hash of the text in 10,000 buckets, so 0.01% steps of a percentage.
HOLDOUT_BUCKETS = 10_000


# ---------------------------------------------------------------- text files


def check_encoding(encoding: str, errors: str = "strict") -> None:
    """ConfigError unless `encoding` is a text encoding Python knows and `errors` one of
    DECODE_ERRORS."""
    try:
        b"a".decode(encoding, "ignore")  # also refuses codecs of no text (base64, rot13)
    except LookupError:
        raise ConfigError(
            f"unknown --encoding {encoding!r}; use a text encoding such as utf-8 or latin-1"
        ) from None
    # Not surrogateescape & co: their lone surrogates are no valid text to store or tokenize.
    if errors not in DECODE_ERRORS:
        raise ConfigError(
            f"unknown --encoding-errors {errors!r}; use one of {', '.join(DECODE_ERRORS)}"
        )


def read_documents(
    files: Sequence[str | os.PathLike],
    doc_boundary: str = "blank",
    encoding: str = "utf-8",
    errors: str = "strict",
    streaming: bool = False,
    shard_bytes: int = SHARD_BYTES,
) -> Dataset | IterableDataset:
    """Read text files into one row per document (column "text", lines joined with newlines)."""
    if doc_boundary not in DOC_BOUNDARIES:
        raise ConfigError(
            f"unknown doc_boundary {doc_boundary!r}; choose one of {', '.join(DOC_BOUNDARIES)}"
        )
    check_encoding(encoding, errors)
    paths = check_text_files(files)
    # (path, size, mtime, start, end): the mtime makes an edited file miss the Arrow cache.
    ranges = []
    for path in paths:
        if streaming and _can_cut(path, doc_boundary, encoding):
            ranges.extend(_byte_ranges(path, shard_bytes))
        else:
            ranges.append((str(path), *_size_and_mtime(path), 0, None))
    gen_kwargs = {
        "ranges": ranges,
        "doc_boundary": doc_boundary,
        "encoding": encoding,
        "errors": errors,
    }
    if streaming:  # a list in gen_kwargs: `datasets` makes each range a shard of the stream
        return IterableDataset.from_generator(
            _document_rows, features=TEXT_FEATURES, gen_kwargs=gen_kwargs
        )
    return cached_from_generator(_document_rows, TEXT_FEATURES, gen_kwargs)


def cached_from_generator(
    generator: Callable, features: Features, gen_kwargs: dict, fingerprint: str | None = None
) -> Dataset:
    """`Dataset.from_generator`, raising the generator's own EgbertError (one line) when it
    fails with one."""
    try:
        return Dataset.from_generator(
            generator, features=features, gen_kwargs=gen_kwargs, fingerprint=fingerprint
        )
    except DatasetGenerationError as error:
        # `datasets` wraps whatever the generator raised; give the user our one-line message.
        if isinstance(error.__cause__, EgbertError):
            raise error.__cause__ from None
        raise


def check_text_files(
    files: str | os.PathLike | Sequence[str | os.PathLike], option: str = "--train-files"
) -> list[Path]:
    """The corpus files as paths; DataError for none (naming `option`), a missing or empty one."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if not files:
        raise DataError(f"no text files given; pass at least one with {option}")
    paths = [Path(file) for file in files]
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise DataError(f"{path}: the file is empty; pass a file with text in it")
    return paths


def _size_and_mtime(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _can_cut(path: Path, doc_boundary: str, encoding: str) -> bool:
    """Byte ranges need documents that end at line breaks found byte by byte: an uncompressed
    file, "line" or "blank" documents, an encoding that writes a newline as the byte 0x0a."""
    return (
        doc_boundary in ("line", "blank")
        and path.suffix not in COMPRESSIONS
        and "\n".encode(encoding) == b"\n"
    )


def _byte_ranges(path: Path, shard_bytes: int) -> list[tuple[str, int, int, int, int | None]]:
    size, mtime = _size_and_mtime(path)
    starts = range(0, size, max(shard_bytes, 1))
    return [(str(path), size, mtime, start, start + shard_bytes) for start in starts]


def _document_rows(
    ranges: list[tuple[str, int, int, int, int | None]],
    doc_boundary: str,
    encoding: str,
    errors: str,
) -> Iterator[dict[str, str]]:
    for path, size, _mtime, start, end in ranges:
        found = False
        lines = _decoded_lines(path, encoding, errors, start, end, doc_boundary)
        for lines_of_document in _split_documents(lines, doc_boundary):
            found = True
            yield {"text": "\n".join(lines_of_document)}
        whole_file = start == 0 and (end is None or end >= size)
        if not found and whole_file:
            raise DataError(f"{path}: no text in the file (only blank or heading lines)")


def _open_binary(path: str):
    compression = Path(path).suffix
    if compression == ".zst":
        _check_zstandard(path)
        # Optional (pip install egbert[zstd]): imported by name, only when a .zst file is read.
        zstandard = importlib.import_module("zstandard")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return COMPRESSIONS.get(compression, open)(path, "rb")


def _check_zstandard(path: str | Path) -> None:
    if Path(path).suffix == ".zst" and importlib.util.find_spec("zstandard") is None:
        raise DataError(
            f"{path}: reading .zst files needs the zstandard package; pip install zstandard, "
            "or decompress the file"
        )


def _decoded_lines(
    path: str,
    encoding: str,
    errors: str,
    start: int = 0,
    end: int | None = None,
    doc_boundary: str = "file",
) -> Iterator[str]:
    """The lines of the documents that start in bytes [start, end) of the file, stripped;
    reading bytes lets a decode error name its byte offset. A range other than the first
    begins at its first document boundary (a line break for "line" documents, a blank line for
    "blank" ones) and ends before the first boundary at or after `end`."""
    with _open_binary(path) as handle:
        offset = start
        if start > 0:
            handle.seek(start - 1)
            offset = start - 1 + len(handle.readline())  # now at the first line from `start`
        begun = start == 0
        for raw in handle:
            boundary = doc_boundary == "line" or not raw.strip()
            if end is not None and offset >= end and boundary:
                return
            begun = begun or boundary
            if begun:
                yield _decoded(raw, path, offset, encoding, errors)
            offset += len(raw)


def decode_line(raw: bytes, path: str | Path, offset: int, encoding: str, errors: str) -> str:
    """A line of `path` starting at byte `offset`, decoded; a bad byte is named by its offset."""
    try:
        return raw.decode(encoding, errors)
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: byte 0x{raw[error.start]:02x} at offset {offset + error.start} is "
            f"not valid {encoding}; pass the file's encoding (--encoding latin-1, for "
            "example) or replace such bytes (--encoding-errors replace)"
        ) from None


def _decoded(raw: bytes, path: str, offset: int, encoding: str, errors: str) -> str:
    line = decode_line(raw, path, offset, encoding, errors)
    if offset == 0:
        line = line.lstrip("\ufeff")  # a byte-order mark is not text
    return line.strip()


def _split_documents(lines: Iterable[str], doc_boundary: str) -> Iterator[list[str]]:
    """Group non-blank lines into documents according to `doc_boundary`."""
    if doc_boundary == "wikitext":
        yield from _wikitext_articles(lines)
        return
    document: list[str] = []
    for line in lines:
        if not line:
            if doc_boundary == "blank" and document:
                yield document
                document = []
        elif doc_boundary == "line":
            yield [line]
        else:
            document.append(line)
    if document:
        yield document


def _wikitext_articles(lines: Iterable[str]) -> Iterator[list[str]]:
    """WikiText articles: ` = Title = ` starts one, heading lines are dropped.

    A heading stands between blank lines; that tells it from table rows that look like one
    (` = Played , W = `). This finds WikiText-2's 600 / 60 / 60 train / valid / test articles.
    ` = = Section = = ` (two or more signs) is a heading inside an article.
    """
    document: list[str] = []
    previous = ""
    lines = iter(lines)
    line = next(lines, None)
    while line is not None:
        following = next(lines, None)
        heading = not previous and not following and line.startswith("= ") and line.endswith(" =")
        if heading and not line.startswith("= =") and document:
            yield document
            document = []
        elif line and not heading:
            document.append(line)
        previous, line = line, following
    if document:
        yield document


# ---------------------------------------------------------------- tables, folders, the Hub


def load_hub_documents(
    name: str,
    text_column: str | None = None,
    split: str = "train",
    config_name: str | None = None,
    streaming: bool = False,
) -> Dataset | IterableDataset:
    """A Hub data set, a local data set folder or a `save_to_disk` folder as documents, one per
    non-empty row of its text column (`text_column`, or found: see the module doc)."""
    if is_saved_dataset(Path(name)):
        return _saved_documents(Path(name), text_column, split, streaming)
    try:
        with quiet_table_readers():
            loaded = datasets.load_dataset(name, config_name, split=split, streaming=streaming)
    except ConnectionError:
        raise DataError(
            f"could not reach the hub for data set {name!r} (offline?); pass local text files "
            "with --train-files instead"
        ) from None
    except FileNotFoundError:
        if Path(name).is_dir():
            raise DataError(
                f"{name}: a folder with no data files `datasets` reads (.parquet, .jsonl, .csv, "
                ".txt, ...) and no save_to_disk data set; pass its files instead"
            ) from None
        raise DataError(
            f"no data set {name!r} on the hub or on disk; check the name or pass local text files"
        ) from None
    except DatasetGenerationError as error:  # a local folder whose files are not one table
        raise read_error(name, error) from None
    except ValueError as error:  # an unknown split or config
        raise DataError(f"data set {name!r}: {error}") from None
    return _text_documents(loaded, name, text_column)


def is_saved_dataset(path: Path) -> bool:
    # What save_to_disk writes: a Dataset's state.json, or a DatasetDict's dataset_dict.json.
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _saved_documents(
    path: Path, text_column: str | None, split: str, streaming: bool
) -> Dataset | IterableDataset:
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f"{path}: no split {split!r}; it has {', '.join(loaded)}: pass one with --split"
            )
        loaded = loaded[split]
    documents = _text_documents(loaded, str(path), text_column)
    if streaming:  # row ranges as shards, enough for several processes
        return documents.to_iterable_dataset(num_shards=max(1, min(len(documents), 64)))
    return documents


def _table_documents(
    files: list[Path], text_column: str | None, streaming: bool
) -> Dataset | IterableDataset:
    builder = TABLE_BUILDERS[_table_suffix(files[0])]
    for path in files:
        _check_zstandard(path)
        if _only_whitespace(path):
            raise DataError(f"{path}: only blank lines, no rows; pass a file with rows in it")
    data_files = [str(path) for path in files]
    try:
        with quiet_table_readers():
            loaded = datasets.load_dataset(
                builder, data_files=data_files, split="train", streaming=streaming
            )
    except (DatasetGenerationError, ValueError) as error:
        raise read_error(files, error) from None
    return _text_documents(loaded, str(files[0]), text_column)


def _only_whitespace(path: Path) -> bool:
    """An uncompressed file of blank lines (`datasets` reads it as no split at all)."""
    if path.suffix in COMPRESSIONS:
        return False
    with path.open("rb") as handle:
        while block := handle.read(2**20):
            if block.strip():
                return False
    return True


@contextlib.contextmanager
def quiet_table_readers() -> Iterator[None]:
    """Keep `datasets`' table builders from logging a file's read error on stderr: the error
    reaches the user once, as egbert's one line (`read_error`)."""
    logger = logging.getLogger("datasets.packaged_modules")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def read_error(source: object, error: BaseException) -> DataError:
    """The one-line error of a source `datasets` failed to read: the file and line of a row of
    JSON lines that is not JSON, the parquet file that is not one, else the reader's reason."""
    files = [Path(f) for f in source] if isinstance(source, (list, tuple)) else [Path(str(source))]
    for path in files:
        found = _first_unreadable(path)
        if found:
            return DataError(f"{found}; fix or remove it")
    cause = error.__cause__ or error
    if isinstance(cause, CastError):
        reason = "its files or rows do not share one table's columns"
    else:
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
    what = " ".join(map(str, files))
    kind = "a data set" if files[0].is_dir() else TABLE_BUILDERS.get(_table_suffix(files[0]) or "")
    return DataError(
        f"{what}: not readable as {kind or 'a data set'} ({reason}); check the file(s), or "
        "pass a save_to_disk folder, a folder of one table's files, or the corpus files"
    )


def _first_unreadable(path: Path) -> str | None:
    """`FILE:LINE: what is wrong` for the first bad line of a JSON lines file, `FILE: what`
    for a parquet file without a readable footer; None where neither is found."""
    suffix = _table_suffix(path) if path.is_file() else None
    if suffix == ".parquet":
        try:
            pq.read_metadata(path)
        except Exception as error:  # pyarrow's ArrowInvalid, OSError
            return f"{path}: not a readable parquet file ({str(error).splitlines()[0][:200]})"
    if suffix == ".json":  # one JSON document, or JSON lines (its second value "Extra data")
        with _open_binary(str(path)) as handle:
            try:
                json.loads(handle.read())
                return None
            except json.JSONDecodeError as error:
                if error.msg != "Extra data":
                    return f"{path}:{error.lineno}: not valid JSON ({error.msg})"
            except ValueError:  # not UTF-8: the lines say where
                pass
    if suffix in (".jsonl", ".json"):
        with _open_binary(str(path)) as handle:
            for number, line in enumerate(handle, start=1):
                try:
                    if line.strip():
                        json.loads(line)
                except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
                    reason = getattr(error, "msg", None) or str(error)
                    return f"{path}:{number}: not a JSON object ({reason})"
    return None


def _text_documents(
    loaded: Dataset | IterableDataset, source: str, text_column: str | None
) -> Dataset | IterableDataset:
    """The source's text column as "text", its empty rows dropped."""
    column = _text_column(loaded, source, text_column)
    documents = loaded.select_columns([column])
    if column != "text":
        documents = documents.rename_column(column, "text")
    if documents.features != TEXT_FEATURES:  # e.g. large_string: sources must concatenate
        documents = documents.cast(TEXT_FEATURES)
    return documents.filter(_has_text, batched=True)


def _text_column(loaded: Dataset | IterableDataset, source: str, named: str | None) -> str:
    features = loaded.features
    if features is None:  # some streamed data sets: their first row tells
        with reading(source):
            first = next(iter(loaded), {})
        features = Features.from_arrow_schema(datasets.Dataset.from_list([first]).data.schema)
    columns = list(features)
    strings = [
        name
        for name, feature in features.items()
        if isinstance(feature, Value) and feature.dtype in ("string", "large_string")
    ]
    if named is not None:
        if named not in columns:
            raise DataError(
                f"{source}: no column {named!r}; its columns are {', '.join(columns)}: pass "
                "one with --text-column"
            )
        if named not in strings:
            kind = getattr(features[named], "dtype", type(features[named]).__name__)
            raise DataError(
                f"{source}: column {named!r} holds {kind}, not text; pass a text column with "
                f"--text-column ({', '.join(strings) or 'it has none'})"
            )
        return named
    if len(strings) == 1:
        return strings[0]
    for name in TEXT_COLUMN_NAMES:
        if name in strings:
            return name
    raise DataError(
        f"{source}: which column holds the text? its columns are {', '.join(columns)}; "
        "pass one with --text-column"
    )


def _has_text(batch: dict[str, list]) -> list[bool]:
    return [bool(text and text.strip()) for text in batch["text"]]


# ---------------------------------------------------------------- a corpus of several sources


def load_documents(
    paths: Sequence[str | os.PathLike] = (), *, seed: int = 0, **options: Any
) -> Dataset | IterableDataset:
    """The documents of local paths (by extension; see the module doc) and a Hub data set
    (`options`: load_sources' dataset, dataset_config, split, text_column, weights,
    doc_boundary, encoding, errors, streaming).

    Without `weights` the sources follow one another (text files of one kind read together, so
    that a stream has one shard per file or byte range). With `weights`, one per source (each
    path, then the data set), each document comes from a source drawn with probability
    weight / sum(weights) (`datasets.interleave_datasets`, seeded; MIX_STOPPING_STRATEGY).
    """
    named = load_sources(paths, **options)
    for documents, source in named:
        _check_not_empty(documents, source)
    return mix_sources([documents for documents, _ in named], options.get("weights"), seed)


def load_sources(
    paths: Sequence[str | os.PathLike] = (),
    *,
    dataset: str | None = None,
    dataset_config: str | None = None,
    split: str = "train",
    text_column: str | None = None,
    weights: Sequence[float] | None = None,
    doc_boundary: str = "blank",
    encoding: str = "utf-8",
    errors: str = "strict",
    streaming: bool = False,
) -> list[tuple[Dataset | IterableDataset, Path | str]]:
    """`load_documents`' sources before they are mixed: (documents, the path or data set they
    come from) each, text files of one kind as one source unless `weights` are given."""
    sources = [Path(path) for path in paths]
    count = len(sources) + (dataset is not None)
    if count == 0:
        raise ConfigError("no training data: pass --train-files, --dataset or both")
    if weights is not None and len(weights) != count:
        raise ConfigError(
            f"--source-weights has {len(weights)} weights for {count} sources (each of "
            "--train-files, then --dataset); give one weight per source"
        )
    # > 0: every source is read through once (MIX_STOPPING_STRATEGY), never if never drawn
    if weights is not None and not all(math.isfinite(weight) and weight > 0 for weight in weights):
        raise ConfigError(
            f"--source-weights {' '.join(f'{w:g}' for w in weights)}: give finite weights > 0 "
            "(leave out a source not to read it)"
        )
    groups = [[path] for path in sources] if weights is not None else _same_kind_runs(sources)
    options = {"doc_boundary": doc_boundary, "encoding": encoding, "errors": errors}
    named: list[tuple[Dataset | IterableDataset, Path | str]] = [
        (_local_documents(group, text_column, streaming, **options), group[0]) for group in groups
    ]
    if dataset is not None:
        hub = load_hub_documents(dataset, text_column, split, dataset_config, streaming)
        named.append((hub, dataset))
    return named


def mix_sources(
    parts: list[Dataset | IterableDataset], weights: Sequence[float] | None, seed: int = 0
) -> Dataset | IterableDataset:
    """The sources one after the other, or with `weights` interleaved (see load_documents)."""
    if len(parts) == 1:
        return parts[0]
    if weights is None:
        return datasets.concatenate_datasets(parts)
    return datasets.interleave_datasets(
        parts,
        probabilities=[weight / sum(weights) for weight in weights],
        seed=seed,
        stopping_strategy=MIX_STOPPING_STRATEGY,
    )


def _kind(path: Path) -> str:
    if path.is_dir():
        return f"folder {path}"  # each folder is its own source
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    table = _table_suffix(path)
    if table:
        return TABLE_BUILDERS[table]
    plain = path.suffix if path.suffix not in COMPRESSIONS else Path(path.stem).suffix
    if plain.lower() in TEXT_SUFFIXES:
        return "text"
    raise DataError(
        f"{path}: unknown extension {path.suffix!r}; pass text (.txt, .tokens, also .gz .bz2 "
        ".xz .zst), .jsonl, .json, .csv or .parquet files, or a data set folder (rename a text "
        "file to .txt)"
    )


def _table_suffix(path: Path) -> str | None:
    """.jsonl / .json / .csv / .parquet, also under a compression suffix (`datasets` reads
    those compressed); None for anything else."""
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes and suffixes[-1] in TABLE_BUILDERS else None


def _same_kind_runs(paths: list[Path]) -> list[list[Path]]:
    runs: list[list[Path]] = []
    for path in paths:
        if runs and _kind(runs[-1][-1]) == _kind(path):
            runs[-1].append(path)
        else:
            runs.append([path])
    return runs


def _local_documents(
    paths: list[Path], text_column: str | None, streaming: bool, **text_options
) -> Dataset | IterableDataset:
    kind = _kind(paths[0])
    if kind == "text":
        return read_documents(paths, streaming=streaming, **text_options)
    if kind in TABLE_BUILDERS.values():
        for path in paths:
            if path.stat().st_size == 0:
                raise DataError(f"{path}: the file is empty; pass a file with rows in it")
        return _table_documents(paths, text_column, streaming)
    return load_hub_documents(str(paths[0]), text_column, streaming=streaming)


def _check_not_empty(documents: Dataset | IterableDataset, source: object) -> None:
    if isinstance(documents, Dataset):
        empty = len(documents) == 0
    elif isinstance(source, Path) and _kind(source) == "text":
        return  # checked as they are read: an empty text file raises then, naming itself
    else:  # a stream: its first document, if any
        empty = next(text_batches(documents.take(1), source), None) is None
    if empty:
        raise DataError(f"{source}: no documents (no rows with text); pass a source with text")


def text_batches(
    documents: Dataset | IterableDataset, source: object, batch_size: int = 1000
) -> Iterator[list[str]]:
    """The documents' texts, in batches, as they are read (see `reading`)."""
    with reading(source):
        yield from (batch["text"] for batch in documents.iter(batch_size=batch_size))


@contextlib.contextmanager
def reading(source: object) -> Iterator[None]:
    """Read from `source`: if it turns out unreadable (a corrupt table, a row that is not JSON),
    the one-line `read_error` naming it, and nothing on stderr from `datasets`' builders."""
    with quiet_table_readers():
        try:
            yield
        except EgbertError:
            raise
        except Exception as error:  # pyarrow's and the table builders' own errors
            raise read_error(source, error) from None


# ---------------------------------------------------------------- validation


def split_validation(
    documents: Dataset | IterableDataset, percentage: float
) -> tuple[Dataset | IterableDataset, Dataset | IterableDataset]:
    """(train, validation): about `percentage`% of the documents held out, chosen by a hash of
    each one's text. The same documents are held out streamed or not, on any number of
    processes, and copies of one document all land on the same side."""
    if not 0 < percentage < 100:
        raise ConfigError(
            f"--validation-split-percentage {percentage} must be above 0 and below 100"
        )
    threshold = round(percentage / 100 * HOLDOUT_BUCKETS)
    held_out = {"fn_kwargs": {"threshold": threshold, "held_out": True}, "batched": True}
    kept = {"fn_kwargs": {"threshold": threshold, "held_out": False}, "batched": True}
    return documents.filter(_in_holdout, **kept), documents.filter(_in_holdout, **held_out)


def _in_holdout(batch: dict[str, list], threshold: int, held_out: bool) -> list[bool]:
    buckets = [
        int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        % HOLDOUT_BUCKETS
        for text in batch["text"]
    ]
    return [(bucket < threshold) == held_out for bucket in buckets]
