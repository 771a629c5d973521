"""Writing a prepared folder's shards and manifest (the layout is in `prepared_folder`'s doc)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from egbert.errors import DataError
from egbert.pretrain.prepared_folder import MANIFEST, sha256_of_file

# Tokens per shard (200 MB of uint16 ids; an example longer than that gets a shard of its own):
# files a user can copy and a loader can map one at a time.
MAX_SHARD_TOKENS = 100_000_000
WRITE_BATCH_EXAMPLES = 10_000


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """uint16 when every id fits in two bytes (ids 0 .. vocab_size - 1), else uint32."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """The folder's manifest.json: what made the examples and what the shards hold."""
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def write_examples(
    examples: datasets.Dataset,
    folder: Path,
    dtype: type[np.unsignedinteger],
    max_shard_tokens: int = MAX_SHARD_TOKENS,
) -> dict[str, Any]:
    """Write `examples` (input_ids, and token_type_ids / next_sentence_label / labels where
    present) as shards in `folder`; returns the split's counts and its shards'."""
    folder.mkdir(parents=True)
    shards: list[dict[str, int]] = []
    writer = None
    for table in examples.with_format("arrow").iter(batch_size=WRITE_BATCH_EXAMPLES):
        while table.num_rows:
            if writer is None:
                writer = _ShardWriter(folder, len(shards), dtype)
            lengths = np.cumsum(pc.list_value_length(table.column("input_ids")).to_numpy())
            fit = int(np.searchsorted(lengths, max_shard_tokens - writer.tokens, side="right"))
            if fit == 0 and writer.tokens:  # the next example opens a new shard
                shards.append(writer.close())
                writer = None
                continue
            fit = max(fit, 1)  # an example longer than a shard gets one of its own
            writer.add(table.slice(0, fit))
            table = table.slice(fit)
    if writer is not None:
        shards.append(writer.close())
    return {
        "examples": sum(shard["examples"] for shard in shards),
        "tokens": sum(shard["tokens"] for shard in shards),
        "shards": shards,
    }


class _ShardWriter:
    """One shard: appends batches of examples to its .bin files, writes the .npy at close."""

    def __init__(self, folder: Path, index: int, dtype: type[np.unsignedinteger]) -> None:
        self.prefix = folder / f"{index:05d}"
        self.dtype = dtype
        self.tokens = 0
        self.lengths: list[np.ndarray] = []
        self.per_example: dict[str, list[np.ndarray]] = {}
        self.files: dict[str, Any] = {}
        self.digests: dict[str, Any] = {}  # the .bin files' sha256, updated as they are written

    def add(self, table: pa.Table) -> None:
        unknown = set(table.column_names) - {
            "input_ids",
            "token_type_ids",
            "next_sentence_label",
            "labels",
        }
        if unknown:
            raise DataError(f"a prepared folder cannot hold the column(s) {sorted(unknown)}")
        ids = table.column("input_ids").combine_chunks()
        lengths = pc.list_value_length(ids).to_numpy().astype(np.int64)
        self._append("input_ids", pc.list_flatten(ids).to_numpy().astype(self.dtype))
        if "labels" in table.column_names:
            labels = pc.list_flatten(table.column("labels").combine_chunks())
            self._append("labels", labels.to_numpy().astype(np.int32))
        if "token_type_ids" in table.column_names:
            self._keep("segment_b_start", _segment_b_starts(table, lengths))
        if "next_sentence_label" in table.column_names:
            labels = table.column("next_sentence_label").to_numpy().astype(np.int8)
            self._keep("next_sentence_label", labels)
        self.lengths.append(lengths)
        self.tokens += int(lengths.sum())

    def _append(self, name: str, values: np.ndarray) -> None:
        if name not in self.files:
            self.files[name] = open(f"{self.prefix}.{name}.bin", "wb")  # noqa: SIM115
            self.digests[name] = hashlib.sha256()
        values = np.ascontiguousarray(values)
        values.tofile(self.files[name])
        self.digests[name].update(values)

    def _keep(self, name: str, values: np.ndarray) -> None:
        self.per_example.setdefault(name, []).append(values)

    def close(self) -> dict[str, Any]:
        """Close the shard's files; returns its counts and its files' sizes and sha256."""
        files = {}
        for name, handle in self.files.items():
            files[f"{self.prefix.name}.{name}.bin"] = _file_record(
                handle.tell(), self.digests[name]
            )
            handle.close()
        lengths = np.concatenate(self.lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        arrays = {"offsets": _smallest_unsigned(offsets)}
        arrays |= {name: np.concatenate(parts) for name, parts in self.per_example.items()}
        for name, array in arrays.items():
            path = Path(f"{self.prefix}.{name}.npy")
            np.save(path, array)
            files[path.name] = _file_record(path.stat().st_size, sha256_of_file(path))
        return {"examples": len(lengths), "tokens": self.tokens, "files": files}


def _file_record(size: int, digest) -> dict[str, Any]:
    return {"bytes": size, "sha256": digest.hexdigest()}


def _smallest_unsigned(values: np.ndarray) -> np.ndarray:
    """`values` (>= 0) as uint16 or uint32 where they fit: the reader takes the .npy's dtype."""
    for dtype in (np.uint16, np.uint32):
        if values.max(initial=0) <= np.iinfo(dtype).max:
            return values.astype(dtype)
    return values.astype(np.int64)


def _segment_b_starts(table: pa.Table, lengths: np.ndarray) -> np.ndarray:
    """Where each example's token_type_ids turn from 0 to 1 (BERT pairs: 0 on [CLS] A [SEP],
    1 on B [SEP]); refuses any other pattern, which one number could not give back."""
    types = pc.list_flatten(table.column("token_type_ids").combine_chunks()).to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    b_starts = lengths - np.add.reduceat(types.astype(np.int64), starts)
    position = np.arange(len(types)) - np.repeat(starts, lengths)
    if not np.array_equal(types, position >= np.repeat(b_starts, lengths)):
        raise DataError("token_type_ids that are not 0s then 1s cannot be stored")
    return _smallest_unsigned(b_starts)
