"""Prepared folders: a family's pretraining examples tokenized once, in memory-mapped shards.

    egbert prepare --model gpt --tokenizer tok/ --train-files wiki.train.tokens \\
        --validation-files wiki.valid.tokens --doc-boundary wikitext --output-dir data/wiki-gpt
    egbert pretrain --model gpt --data data/wiki-gpt --output-dir runs/gpt --max-steps 1000

or `egbert.prepare_corpus(model="gpt", tokenizer="tok/", ...)`. `prepare` takes pretrain's
options (sources, tokenizer, family, sequence length, NSP and --dupe-factor) and builds the
examples exactly as `egbert pretrain` builds them in memory, then stores them; every later run,
on any machine, reads them from the folder and masks bert's examples per step as before.

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

The tokenization runs in a `datasets` cache inside the folder being written, removed when the
shards are done: nothing of the corpus stays in ~/.cache. The folder appears whole or not at all
(written under a temporary name, then renamed).

Opening a folder checks, before anything trains on it or is written, its tokenizer's files
(sha256), each shard file's size and that the counts agree with the files (a truncated shard or
an edited count would train on short or shifted examples, or fail mid-run); folders prepared
before the sizes were recorded, the counts alone. `egbert prepare --verify` hashes every file.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import Dataset as TorchDataset

from egbert import __version__
from egbert.arguments import arguments_from_options, parse_args
from egbert.config import MODEL_FAMILIES, PrepareArguments, pretraining_recipe
from egbert.errors import ConfigError, DataError
from egbert.pretrain.corpus import (
    examples_from_tokens,
    file_identities,
    load_corpus,
    tokenize_for_family,
)
from egbert.pretrain.options import (
    DataArguments,
    ModelArguments,
    ObjectiveArguments,
    check_pretraining_options,
    example_options,
)
from egbert.tokenizer import load_tokenizer

FORMAT = "egbert-prepared/1"
MANIFEST = "manifest.json"
# Tokens per shard (200 MB of uint16 ids; an example longer than that gets a shard of its own):
# files a user can copy and a loader can map one at a time.
MAX_SHARD_TOKENS = 100_000_000
WRITE_BATCH_EXAMPLES = 10_000
HASH_BLOCK_BYTES = 16 * 2**20
# pretrain's options that shape only the model or the run: prepare accepts them, so that one
# --config file serves both commands, and ignores them (its --help says so).
IGNORED_OPTIONS = frozenset(
    {"preset", "init_from", "config_overrides", "allow_pickle", "max_eval_samples", "objective"}
    | {"max_train_samples", "card_datasets", "license"}
)
# Its options that change neither the examples nor where they come from.
NOT_DATA_OPTIONS = IGNORED_OPTIONS | {"num_proc", "data", "tokenizer"}
# `egbert prepare`'s options: pretrain's but the trainer's, then where it writes.
PREPARE_ARGUMENTS = (ModelArguments, DataArguments, ObjectiveArguments, PrepareArguments)
PrepareOptions = tuple[ModelArguments, DataArguments, ObjectiveArguments, PrepareArguments]

DESCRIPTION = (
    "Tokenize a corpus once into a folder of memory-mapped shards of a family's examples, for "
    "`egbert pretrain --data DIR`. Takes pretrain's data, tokenizer, family and sequence options "
    "(with the same family defaults); the options that shape only the model or the run are "
    "accepted, so that one --config file serves both commands, and ignored (their help says so). "
    "With --verify, checks the folder in --output-dir instead: every file against its manifest."
)


# ---------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> None:
    manifest = prepare(*parse_prepare_args(argv))
    splits = manifest["splits"]
    train, validation = splits["train"], splits.get("validation", {}).get("examples")
    print(
        f"egbert: {manifest['family']} examples in {manifest['folder']}: "
        f"{train['examples']:,} for training ({train['tokens']:,} {manifest['dtype']} tokens "
        f"from {train['documents']:,} documents)"
        + (f", {validation:,} for validation" if validation is not None else ""),
        flush=True,
    )


def prepare_corpus(**options: Any) -> dict[str, Any]:
    """`egbert prepare` from Python: the keyword arguments are the command's options
    (PREPARE_ARGUMENTS fields such as model, tokenizer, train_files, seq_len, and output_dir,
    seed); returns the folder's manifest (with "folder": its path)."""
    return prepare(*prepare_arguments(**options))


def prepare_arguments(**options: Any) -> PrepareOptions:
    """The options of `prepare_corpus` as its dataclasses, the family's recipe under them."""
    types, check = PREPARE_ARGUMENTS, check_pretraining_options
    return arguments_from_options(types, options, examples_recipe(options), check=check)


def parse_prepare_args(argv: list[str] | None) -> PrepareOptions:
    """`egbert prepare`'s options: the command line over the --config file over the family's
    pretraining recipe, parsed once."""
    return parse_args(
        PREPARE_ARGUMENTS,
        argv,
        "egbert prepare",
        DESCRIPTION,
        recipe=examples_recipe,
        recipe_keys=("model", "init_from", "output_dir"),
        recipe_choices={"model": MODEL_FAMILIES},
        notes=dict.fromkeys(IGNORED_OPTIONS, "prepare ignores it: it shapes the model or the run"),
        check=check_pretraining_options,
    )


def examples_recipe(options: dict[str, Any]) -> dict[str, Any]:
    """The family's pretraining recipe, less the trainer's options (prepare builds examples);
    without --model, the family in --output-dir's manifest (so --verify needs no more)."""
    family = options.get("model") or _manifest_family(options.get("output_dir"))
    known = {name for cls in PREPARE_ARGUMENTS for name in cls.__dataclass_fields__}
    recipe = pretraining_recipe({**options, "model": family})
    for name in set(recipe) - known:
        del recipe[name]
    if family:  # from --output-dir's manifest where no --model says it
        recipe["model"], recipe.origins["model"] = family, f"{MANIFEST} in --output-dir"
    return recipe


def _manifest_family(folder: str | None) -> str | None:
    """The family a prepared folder's manifest names (None where it names none: opening the
    folder says what is wrong)."""
    try:
        family = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))["family"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    return family if family in MODEL_FAMILIES else None


def prepare(
    model_args: ModelArguments,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    prepare_args: PrepareArguments,
) -> dict[str, Any]:
    """Build the examples as `egbert pretrain` would and write them to `output_dir` (nothing
    to do if it already holds them; an error naming what differs if it holds other ones).
    With `verify`: check every file of the folder in `output_dir` instead (see the module doc)."""
    target = Path(prepare_args.output_dir)
    if prepare_args.verify:
        return verify_folder(target)
    _check_prepare_options(data_args)
    family = model_args.model  # prepare's one option of the model: the examples' family
    tokenizer = load_tokenizer(data_args.tokenizer)
    recipe = _recipe(family, data_args, objective_args, prepare_args.seed, tokenizer)
    if target.exists():
        return _existing(target, recipe)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)  # left by a killed run of this process id
    temporary.mkdir()
    try:
        dtype = token_dtype(len(tokenizer))
        splits = {}
        with _datasets_cache_in(temporary / "cache"):
            train, validation = load_corpus(data_args, prepare_args.seed)
            for split, documents in (("train", train), ("validation", validation)):
                if documents is None:
                    continue
                tokenized = tokenize_for_family(family, data_args, tokenizer, documents)
                examples = examples_from_tokens(
                    family, data_args, objective_args, tokenizer, tokenized, prepare_args.seed
                )
                splits[split] = {
                    **_corpus_counts(tokenized),
                    **write_examples(examples, temporary / split, dtype),
                }
                del tokenized, examples, documents  # their cache files go with the cache folder
            del train, validation
        shutil.rmtree(temporary / "cache")
        tokenizer.save_pretrained(temporary / "tokenizer")
        manifest = {**recipe, "dtype": dtype.__name__, "splits": splits}
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        temporary.rename(target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return {**manifest, "folder": str(target)}


def _check_prepare_options(args: DataArguments) -> None:
    if args.data:
        raise ConfigError("egbert prepare writes a folder: give --output-dir, not --data")
    if args.streaming:
        raise ConfigError(
            "egbert prepare reads the corpus once through the `datasets` cache; leave out "
            "--streaming (it is for `egbert pretrain` on corpora it reads as it trains)"
        )
    if args.tokenizer is None:
        raise ConfigError("egbert prepare needs --tokenizer DIR (egbert tokenizer train)")


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """uint16 when every id fits in two bytes (ids 0 .. vocab_size - 1), else uint32."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the files `save_pretrained` writes for the tokenizer (names and contents)."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return _files_hash(Path(folder))


def _files_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _recipe(
    family: str, data_args: DataArguments, objective_args: ObjectiveArguments, seed: int, tokenizer
) -> dict[str, Any]:
    """The manifest's part that decides the examples: a second prepare compares it."""
    sources = {
        name: file_identities(value) if name.endswith("_files") else value
        for name, value in asdict(data_args).items()
        if name not in NOT_DATA_OPTIONS | {"seq_len"}
    }
    return {
        "format": FORMAT,
        "egbert_version": __version__,
        "family": family,
        "seq_len": data_args.seq_len,
        "tokenizer": {"sha256": tokenizer_hash(tokenizer), "size": len(tokenizer)},
        "options": example_options(family, objective_args, seed),
        "sources": sources,
    }


def verify_folder(target: Path) -> dict[str, Any]:
    """`egbert prepare --verify`: the folder's checks, and every shard file's sha256."""
    folder = PreparedFolder(target)
    checked = folder.verify_checksums()
    print(f"egbert: {target} is intact ({checked} files checked against their sha256)", flush=True)
    return {**folder.manifest, "folder": str(target)}


def _existing(target: Path, recipe: dict[str, Any]) -> dict[str, Any]:
    manifest_path = target / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(
            f"--output-dir {target} exists and is not a prepared folder (no {MANIFEST}); "
            "choose a new folder"
        )
    manifest = PreparedFolder(target).manifest  # refuses a damaged folder
    differences = _differences({k: manifest.get(k) for k in recipe}, recipe)
    if differences:
        raise ConfigError(
            f"--output-dir {target} was prepared with other options ({'; '.join(differences)}); "
            "choose a new folder or delete it"
        )
    print(f"egbert: {target} already holds these examples; nothing to do", flush=True)
    return {**manifest, "folder": str(target)}


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for each (nested) key whose value differs."""
    found = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, "(unset)"), new.get(key, "(unset)")
        if isinstance(before, dict) and isinstance(after, dict):
            found += _differences(before, after, f"{prefix}{key}.")
        elif before != after:
            found.append(f"{prefix}{key}: {before} -> {after}")
    return found


@contextlib.contextmanager
def _datasets_cache_in(folder: Path):
    """Point `datasets`' cache (read when each data set is built) at `folder` for a while."""
    saved = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = folder
    try:
        yield
    finally:
        datasets.config.HF_DATASETS_CACHE = saved


def _corpus_counts(tokenized: datasets.Dataset) -> dict[str, int]:
    segments = pc.list_flatten(tokenized.data.column("input_ids"))
    tokens = pc.sum(pc.list_value_length(segments)).as_py() or 0
    return {"documents": len(tokenized), "corpus_tokens": tokens}


# ---------------------------------------------------------------- writing shards


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
            files[path.name] = _file_record(path.stat().st_size, _sha256_of(path))
        return {"examples": len(lengths), "tokens": self.tokens, "files": files}


def _file_record(size: int, digest) -> dict[str, Any]:
    return {"bytes": size, "sha256": digest.hexdigest()}


def _sha256_of(path: Path) -> Any:
    """hashlib's sha256 of a file, read in 16 MB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK_BYTES):
            digest.update(block)
    return digest


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


# ---------------------------------------------------------------- reading


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
        if not folder.is_dir() or _files_hash(folder) != self.manifest["tokenizer"]["sha256"]:
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
                    if _sha256_of(path).hexdigest() != record.get("sha256"):
                        raise DataError(
                            f"{path}: its sha256 is not the one the manifest records (the file "
                            f"changed after `egbert prepare` wrote it); {_damaged(self.folder)}"
                        )
                    checked += 1
        return checked

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
            raise ConfigError(
                f"--data {self.folder} was prepared with other options ({'; '.join(differences)});"
                " pass the folder's options or prepare it again"
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
