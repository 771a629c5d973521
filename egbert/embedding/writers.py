"""Where `embed(..., output=...)` writes: .npy, .safetensors or .jsonl, written in chunks to a temp
file renamed onto the output at the end (so a failure leaves no partial file), or JSONL on
stdout for "-"."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from egbert.embedding.vectors import TokenEmbeddings
from egbert.errors import ConfigError
from egbert.outputs import check_output_file

OUTPUT_SUFFIXES = (".npy", ".safetensors", ".jsonl")
STDOUT = "-"  # output="-": JSONL records on stdout
# the formats whose header holds the row count: their input is counted (or listed) first
COUNTED_SUFFIXES = (".npy", ".safetensors")


def check_output(output: str | os.PathLike, pool: str) -> Path:
    """The output path, refused (ConfigError naming the fix) when its extension is unknown, when
    per-token vectors (pool "none") would go elsewhere than JSONL, or when it cannot be written
    (egbert.outputs)."""
    path = Path(output)
    if str(output) == STDOUT:
        return path
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ConfigError(
            f"--output {path}: unknown extension {path.suffix!r}; "
            f"use one of {', '.join(OUTPUT_SUFFIXES)} (or - for JSONL on stdout)"
        )
    if pool == "none" and path.suffix != ".jsonl":
        raise ConfigError(
            f"--output {path}: per-token vectors (--pool none) go to .jsonl; "
            "pool them (--pool mean|cls|last) for .npy or .safetensors"
        )
    return check_output_file(path, "--output")  # its folder is made when the file is written


@contextmanager
def open_writer(output: Path, count: int | None, metadata: dict[str, str]) -> Iterator:
    """A writer (`write(results)`) of `count` rows into `output`, as check_output allowed it."""
    if str(output) == STDOUT:
        writer = _JsonlWriter(None, count, metadata)
        try:
            yield writer
        finally:
            writer.close()
        return
    with _atomic_output(output) as temp:
        writer = WRITERS[output.suffix](temp, count, metadata)
        try:
            yield writer
        finally:
            writer.close()


@contextmanager
def _atomic_output(output: Path) -> Iterator[Path]:
    """A temp path next to `output` (its folder made, as pretrain makes its --output-dir),
    renamed onto it on success and removed on any failure."""
    output.parent.mkdir(parents=True, exist_ok=True)
    temp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        yield temp
        os.replace(temp, output)
    finally:
        temp.unlink(missing_ok=True)


class _NpyWriter:
    """Rows into a (count, dim) float32 .npy opened as a memory map once dim is known."""

    def __init__(self, path: Path, count: int | None, metadata: dict[str, str]):
        self.path, self.count, self.rows, self.array = path, count, 0, None

    def write(self, vectors: np.ndarray) -> None:
        if self.array is None:
            shape = (self.count, vectors.shape[1])
            self.array = np.lib.format.open_memmap(self.path, "w+", np.float32, shape)
        self.array[self.rows : self.rows + len(vectors)] = vectors
        self.rows += len(vectors)

    def close(self) -> None:
        if self.array is not None:
            self.array.flush()
            self.array = None  # drop the memory map so the file can be renamed


class _SafetensorsWriter:
    """One "embeddings" tensor (count, dim) float32, its header written before the first rows.

    The safetensors layout: 8-byte little-endian header size, a JSON header (padded with spaces
    to a multiple of 8 so the data stays aligned), then the raw little-endian data.
    """

    def __init__(self, path: Path, count: int | None, metadata: dict[str, str]):
        self.path, self.count, self.metadata, self.handle = path, count, metadata, None

    def write(self, vectors: np.ndarray) -> None:
        if self.handle is None:
            self.handle = self.path.open("wb")
            size = self.count * vectors.shape[1] * 4
            header = {
                "__metadata__": self.metadata,
                "embeddings": {
                    "dtype": "F32",
                    "shape": [self.count, vectors.shape[1]],
                    "data_offsets": [0, size],
                },
            }
            encoded = json.dumps(header).encode()
            encoded += b" " * (-len(encoded) % 8)
            self.handle.write(len(encoded).to_bytes(8, "little") + encoded)
        self.handle.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


class _JsonlWriter:
    """One JSON record per input: {"vector"} pooled, or {"tokens", "offsets", ..., "vectors"}; to
    a file, or to a stream (stdout) left open."""

    def __init__(self, path: Path | None, count: int | None, metadata: dict[str, str]):
        self.handle = sys.stdout if path is None else path.open("w", encoding="utf-8")

    def write(self, results: np.ndarray | list[TokenEmbeddings]) -> None:
        for result in results:
            if isinstance(result, TokenEmbeddings):
                record = {
                    "tokens": result.tokens,
                    "offsets": [list(span) for span in result.offsets],
                    "sequence_ids": result.sequence_ids,
                    "vectors": result.vectors.tolist(),
                }
            else:
                record = {"vector": result.tolist()}
            self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self.handle is sys.stdout:
            self.handle.flush()
        else:
            self.handle.close()


WRITERS = {".npy": _NpyWriter, ".safetensors": _SafetensorsWriter, ".jsonl": _JsonlWriter}
