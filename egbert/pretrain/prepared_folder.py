"""Prepared folders: a family's pretraining examples tokenized once, in memory-mapped shards.

    egbert prepare --model gpt --tokenizer tok/ --train-files wiki.train.tokens \\
        --validation-files wiki.valid.tokens --doc-boundary wikitext --output-dir data/wiki-gpt
    egbert pretrain --model gpt --data data/wiki-gpt --output-dir runs/gpt --max-steps 1000

or `egbert.prepare_corpus(...)` (`egbert.pretrain.prepare`). This module reads and checks such
folders, for `egbert pretrain --data DIR` and `egbert prepare --verify`.

A folder holds:
    manifest.json   what made the examples (tokenizer hash, family, seq_len, the options and
                    sources), what they are (dtype, counts per split and shard, each shard
                    file's size and sha256), egbert's version
    tokenizer/      the tokenizer the ids come from (save_pretrained)
    train/, validation/   shards; shard k of a split is
        k.input_ids.bin            the examples' ids end to end, uint16 when every id fits
                                   (vocabulary <= 65,536), else uint32
        k.offsets.npy              one more than examples: example i is
                                   input_ids[offsets[i]:offsets[i + 1]] (uint32 while a shard
                                   holds < 2**32 tokens, as it does unless one example is longer)
        k.segment_b_start.npy      bert NSP: where segment B starts (token_type_ids 1 from there)
        k.next_sentence_label.npy  bert NSP: int8, 0 IsNext, 1 NotNext
        k.labels.bin               bert with --dupe-factor > 1: the static masks' labels (int32)
Flat numpy arrays rather than Arrow: reading one example is a slice of a memory map (about a
microsecond), the pages belong to the page cache rather than the process, and any tool can read
them (`np.memmap(path, dtype)`). docs/data.md has the measurements.

Opening a folder checks, before anything trains on it or is written, its tokenizer's files
(sha256), each shard file's size and that the counts agree with the files (a truncated shard or
an edited count would train on short or shifted examples, or fail mid-run); folders prepared
before the sizes were recorded, the counts alone. `egbert prepare --verify` hashes every file.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset as TorchDataset

from egbert.errors import ConfigError, DataError
from egbert.pretrain.corpus import CorpusUse
from egbert.pretrain.options import DataArguments, ObjectiveArguments, example_options
from egbert.tokenizer import load_tokenizer

FORMAT = "egbert-prepared/1"
MANIFEST = "manifest.json"
HASH_BLOCK_BYTES = 16 * 2**20


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the files `save_pretrained` writes for the tokenizer (names and contents)."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return files_hash(Path(folder))


def files_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sha256_of_file(path: Path) -> Any:
    """hashlib's sha256 of a file, read in 16 MB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK_BYTES):
            digest.update(block)
    return digest


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DataError(f"{folder}: no {MANIFEST} there; make the folder with `egbert prepare`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else ""
        raise DataError(f"{path}: not valid JSON{where}; {_damaged(folder)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DataError(f"{path}: format {found!r}, this egbert reads {FORMAT!r}; prepare it again")
    return manifest


def manifest_value(folder: str | os.PathLike | None, name: str) -> Any:
    """Field `name` of the manifest in `folder`, or None where there is none to read (opening
    the folder says what is wrong): what the options' defaults take from a folder."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        return manifest.get(name)
    except (TypeError, OSError, ValueError, AttributeError):
        return None


def _damaged(folder: str | os.PathLike) -> str:
    return f"the folder {folder} is damaged: delete it and run `egbert prepare` again"


class PreparedFolder:
    """A folder of `egbert prepare`: its manifest, tokenizer and splits, checked when opened
    (the tokenizer's files, every shard file's size and the counts: see the module doc)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        try:
            self.family, self.seq_len = self.manifest["family"], self.manifest["seq_len"]
            self.dtype: type[np.unsignedinteger] = np.dtype(self.manifest["dtype"]).type
            self._check_tokenizer_files()
            for split in self.manifest["splits"]:
                self._check_split(split)
        except (KeyError, TypeError, ValueError, AttributeError) as error:  # an edited field
            raise DataError(
                f"{self.folder / MANIFEST}: a field is missing or malformed ({error!r}); "
                f"{_damaged(self.folder)}"
            ) from None

    def _check_tokenizer_files(self) -> None:
        folder = self.folder / "tokenizer"
        if not folder.is_dir() or files_hash(folder) != self.manifest["tokenizer"]["sha256"]:
            raise DataError(
                f"{folder}: not the tokenizer the examples were made with (its files are "
                f"missing or changed); {_damaged(self.folder)}"
            )

    def _check_split(self, split: str) -> None:
        """The split's counts against its shards', and each shard's files against both."""
        counts = self.manifest["splits"][split]
        shards = counts["shards"]
        for key in ("examples", "tokens"):
            total = sum(shard[key] for shard in shards)
            if counts[key] != total:
                raise DataError(
                    f"{self.folder / MANIFEST}: {split} has {counts[key]:,} {key}, its shards "
                    f"{total:,}; {_damaged(self.folder)}"
                )
        for index, shard in enumerate(shards):
            for name, record in shard.get("files", {}).items():
                _check_size(self.folder / split / name, record["bytes"], self.folder)
            self._check_shard_counts(self.folder / split / f"{index:05d}", shard)

    def _check_shard_counts(self, prefix: Path, shard: dict[str, int]) -> None:
        """The shard's files hold as many tokens and examples as the manifest says (what a
        folder written before the files were recorded is checked by)."""
        examples, tokens = shard["examples"], shard["tokens"]
        options = self.manifest["options"]
        item = np.dtype(self.dtype).itemsize
        _check_size(Path(f"{prefix}.input_ids.bin"), tokens * item, self.folder)
        if options.get("dupe_factor", 1) > 1:  # bert's static masks: int32 labels
            _check_size(Path(f"{prefix}.labels.bin"), tokens * 4, self.folder)
        per_example = ["segment_b_start", "next_sentence_label"] if options.get("nsp") else []
        for name, length in (("offsets", examples + 1), *((n, examples) for n in per_example)):
            path = Path(f"{prefix}.{name}.npy")
            array = _load_npy(path, self.folder)
            if array.shape != (length,) or (name == "offsets" and int(array[-1]) != tokens):
                raise DataError(
                    f"{path}: {array.size:,} entries, where the manifest's {examples:,} examples "
                    f"and {tokens:,} tokens need {length:,}; {_damaged(self.folder)}"
                )

    def verify_checksums(self) -> int:
        """Hash every shard file and compare with the manifest; returns how many were checked.
        A folder prepared before the hashes were recorded is refused: it has none to check."""
        checked = 0
        for split, counts in self.manifest["splits"].items():
            for shard in counts["shards"]:
                if "files" not in shard:  # prepared before the hashes were recorded
                    raise DataError(
                        f"{self.folder / MANIFEST} records no checksums (an older egbert wrote "
                        "it); to verify every byte, delete the folder and prepare it again"
                    )
                for name, record in shard["files"].items():
                    path = self.folder / split / name
                    if sha256_of_file(path).hexdigest() != record.get("sha256"):
                        raise DataError(
                            f"{path}: its sha256 is not the one the manifest records (the file "
                            f"changed after `egbert prepare` wrote it); {_damaged(self.folder)}"
                        )
                    checked += 1
        return checked

    def corpus_use(self, split: str) -> CorpusUse | None:
        """The share of the corpus the split's examples hold, as `egbert prepare` measured it
        (None for a folder prepared before it was recorded)."""
        counts = self.manifest["splits"][split]
        if "corpus_tokens_used" not in counts:
            return None
        return CorpusUse(counts["corpus_tokens"], counts["corpus_tokens_used"])

    def has_split(self, split: str) -> bool:
        return split in self.manifest["splits"]

    def examples(self, split: str) -> PreparedExamples:
        return PreparedExamples(self.folder / split, self.manifest["splits"][split], self.dtype)

    def identity(self) -> dict[str, str]:
        """What a resumed run must find again: the folder and its manifest's hash."""
        manifest = (self.folder / MANIFEST).read_bytes()
        return {
            "prepared": str(self.folder.resolve()),
            "manifest_sha256": hashlib.sha256(manifest).hexdigest()[:16],
        }

    def check_run(
        self, family: str, args: DataArguments, objective_args: ObjectiveArguments
    ) -> None:
        """Refuse a run whose options would build other examples than the folder holds."""
        given = [f"--{name.replace('_', '-')}" for name in ("train_files", "validation_files")]
        if args.train_files or args.validation_files or args.dataset or args.streaming:
            raise ConfigError(
                f"--data {self.folder} holds the training and validation examples; leave out "
                f"{', '.join(given)}, --dataset and --streaming"
            )
        if family != self.family:
            raise ConfigError(
                f"--data {self.folder} holds {self.family} examples, not {family}; pass "
                f"--model {self.family} or prepare it again"
            )
        wanted = {"seq_len": args.seq_len, **example_options(family, objective_args)}
        held = {"seq_len": self.seq_len}
        held |= {k: v for k, v in self.manifest["options"].items() if k != "seed"}
        differences = [
            f"{name} {held.get(name, '(unset)')} there, {wanted.get(name, '(unset)')} here"
            for name in sorted(held.keys() | wanted.keys())
            if held.get(name) != wanted.get(name)
        ]
        if differences:
            fix = "pass the folder's options or prepare it again"
            if args.seq_len != self.seq_len:
                fix = f"leave out --seq-len (a run takes the folder's {self.seq_len}) or {fix}"
            raise ConfigError(
                f"--data {self.folder} was prepared with other options ({'; '.join(differences)});"
                f" {fix}"
            )

    def load_tokenizer(self, given: str | None):
        """The folder's tokenizer; a --tokenizer given as well must be the same one."""
        tokenizer = load_tokenizer(self.folder / "tokenizer")
        expected = self.manifest["tokenizer"]["sha256"]
        if given is not None and tokenizer_hash(load_tokenizer(given)) != expected:
            raise ConfigError(
                f"--tokenizer {given} is not the tokenizer {self.folder} was prepared with "
                f"(sha256 {expected[:12]}...); leave --tokenizer out to use the folder's"
            )
        return tokenizer


def _check_size(path: Path, expected: int, folder: Path) -> None:
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        found = (
            "missing" if size is None else f"{size:,} bytes, where the manifest says {expected:,}"
        )
        raise DataError(f"{path}: {found}; {_damaged(folder)}")


def _load_npy(path: Path, folder: Path) -> np.ndarray:
    """A shard's .npy, memory-mapped (only its header is read here)."""
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError) as error:
        found = "missing" if not path.is_file() else f"not a readable .npy ({error})"
        raise DataError(f"{path}: {found}; {_damaged(folder)}") from None


def folder_for_run(
    family: str, data_args: DataArguments, objective_args: ObjectiveArguments
) -> PreparedFolder:
    """The --data folder of a pretraining run, checked against its options."""
    folder = PreparedFolder(data_args.data)
    folder.check_run(family, data_args, objective_args)
    return folder


class PreparedExamples(TorchDataset):
    """A split of a prepared folder as a map-style dataset: example i is a dict of int64
    arrays (input_ids, and token_type_ids / labels) and an int next_sentence_label, read from
    memory-mapped shards opened on first use (in each loader worker: they are not pickled)."""

    def __init__(self, folder: Path, split: dict[str, Any], dtype: type) -> None:
        self.folder, self.dtype = folder, dtype
        counts = [shard["examples"] for shard in split["shards"]]
        self.starts = [0, *itertools.accumulate(counts)]
        self._shards: dict[int, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        arrays = self._shard(shard)
        local = index - self.starts[shard]
        start, end = int(arrays["offsets"][local]), int(arrays["offsets"][local + 1])
        example: dict[str, Any] = {"input_ids": arrays["input_ids"][start:end].astype(np.int64)}
        if "labels" in arrays:
            example["labels"] = arrays["labels"][start:end].astype(np.int64)
        if "segment_b_start" in arrays:
            token_type_ids = np.zeros(end - start, dtype=np.int64)
            token_type_ids[int(arrays["segment_b_start"][local]) :] = 1
            example["token_type_ids"] = token_type_ids
        if "next_sentence_label" in arrays:
            example["next_sentence_label"] = int(arrays["next_sentence_label"][local])
        return example

    def _shard(self, index: int) -> dict[str, np.ndarray]:
        if index not in self._shards:
            prefix = self.folder / f"{index:05d}"
            arrays = {"input_ids": np.memmap(f"{prefix}.input_ids.bin", self.dtype, mode="r")}
            if Path(f"{prefix}.labels.bin").is_file():
                arrays["labels"] = np.memmap(f"{prefix}.labels.bin", np.int32, mode="r")
            for name in ("offsets", "segment_b_start", "next_sentence_label"):
                if Path(f"{prefix}.{name}.npy").is_file():
                    arrays[name] = np.load(f"{prefix}.{name}.npy", mmap_mode="r")
            # plain ndarray views of the same maps: indexing a np.memmap costs several times more
            self._shards[index] = {name: array.view(np.ndarray) for name, array in arrays.items()}
        return self._shards[index]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": {}}
