"""`egbert prepare`: a family's pretraining examples tokenized once into a prepared folder.

    egbert prepare --model gpt --tokenizer tok/ --train-files wiki.train.tokens \\
        --validation-files wiki.valid.tokens --doc-boundary wikitext --output-dir data/wiki-gpt
    egbert pretrain --model gpt --data data/wiki-gpt --output-dir runs/gpt --max-steps 1000

or `egbert.prepare_corpus(model="gpt", tokenizer="tok/", ...)`. `prepare` takes pretrain's
options (sources, tokenizer, family, sequence length, NSP and --dupe-factor) and builds the
examples exactly as `egbert pretrain` builds them in memory, then stores them (`shard_writer`);
every later run, on any machine, reads them from the folder (`prepared_folder`, whose doc says
what a folder holds) and masks bert's examples per step as before.

The tokenization runs in a `datasets` cache inside the folder being written, removed when the
shards are done: nothing of the corpus stays in ~/.cache. The folder appears whole or not at all
(written under a temporary name, then renamed). `egbert prepare --verify` hashes every file of
a folder instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets

from egbert import __version__
from egbert.arguments import arguments_from_options, parse_args
from egbert.config import MODEL_FAMILIES, pretraining_recipe
from egbert.errors import ConfigError, Interrupted
from egbert.outputs import check_output_folder
from egbert.pretrain.corpus import (
    examples_from_tokens,
    file_identities,
    load_corpus,
    tokenize_for_family,
)
from egbert.pretrain.options import (
    PREPARE_ARGUMENTS,
    DataArguments,
    ModelArguments,
    ObjectiveArguments,
    PrepareArguments,
    PrepareOptions,
    check_pretraining_options,
    example_options,
)
from egbert.pretrain.prepared_folder import (
    FORMAT,
    MANIFEST,
    PreparedFolder,
    manifest_value,
    tokenizer_hash,
)
from egbert.pretrain.shard_writer import token_dtype, write_examples, write_manifest
from egbert.tokenizer import load_tokenizer

# pretrain's options that shape only the model or the run: prepare accepts them, so that one
# --config file serves both commands, and ignores them (its --help says so).
IGNORED_OPTIONS = frozenset(
    {"preset", "init_from", "config_overrides", "allow_pickle", "max_eval_samples", "objective"}
    | {"max_train_samples", "card_datasets", "license"}
)
# Its options that change neither the examples nor where they come from.
NOT_DATA_OPTIONS = IGNORED_OPTIONS | {"num_proc", "data", "tokenizer"}

DESCRIPTION = (
    "Tokenize a corpus once into a folder of memory-mapped shards of a family's examples, for "
    "`egbert pretrain --data DIR`. Takes pretrain's data, tokenizer, family and sequence options "
    "(with the same family defaults); the options that shape only the model or the run are "
    "accepted, so that one --config file serves both commands, and ignored (their help says so). "
    "With --verify, checks the folder in --output-dir instead: every file against its manifest."
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
    family = manifest_value(folder, "family")
    return family if family in MODEL_FAMILIES else None


def prepare(
    model_args: ModelArguments,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    prepare_args: PrepareArguments,
) -> dict[str, Any]:
    """Build the examples as `egbert pretrain` would and write them to `output_dir` (nothing
    to do if it already holds them; an error naming what differs if it holds other ones).
    With `verify`: check every file of the folder in `output_dir` instead (`prepared_folder`)."""
    target = Path(prepare_args.output_dir)
    if prepare_args.verify:
        return verify_folder(target)
    _check_prepare_options(data_args)
    check_output_folder(target, "--output-dir")
    family = model_args.model  # prepare's one option of the model: the examples' family
    tokenizer = load_tokenizer(data_args.tokenizer)
    recipe = _recipe(family, data_args, objective_args, prepare_args.seed, tokenizer)
    if target.exists():
        return _existing(target, recipe)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    temporary = _temporary_folder(target, os.getpid())
    temporary.mkdir()
    left = f"nothing written to {target} (its temporary folder {temporary} removed)"
    restore_signals = _raise_on_signals(f"{left}; run the command again to prepare it")
    try:
        dtype = token_dtype(len(tokenizer))
        splits = {}
        with _datasets_cache_in(temporary / "cache"):
            train, validation = load_corpus(data_args, prepare_args.seed)
            for split, documents in (("train", train), ("validation", validation)):
                if documents is None:
                    continue
                tokenized = tokenize_for_family(family, data_args, tokenizer, documents)
                examples, use = examples_from_tokens(
                    family, data_args, objective_args, tokenizer, tokenized, prepare_args.seed
                )
                splits[split] = {
                    "documents": len(tokenized),
                    "corpus_tokens": use.corpus_tokens,
                    "corpus_tokens_used": use.used_tokens,
                    "corpus_share_used": round(use.share, 6),
                    **write_examples(examples, temporary / split, dtype),
                }
                if split == "train":
                    print(*use.report(split), sep="\n", flush=True)
                del tokenized, examples, documents  # their cache files go with the cache folder
            del train, validation
        shutil.rmtree(temporary / "cache")
        tokenizer.save_pretrained(temporary / "tokenizer")
        manifest = {**recipe, "dtype": dtype.__name__, "splits": splits}
        write_manifest(temporary, manifest)
        temporary.rename(target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        restore_signals()
    return {**manifest, "folder": str(target)}


def _temporary_folder(target: Path, pid: int) -> Path:
    """Where process `pid` writes `target` before renaming it."""
    return target.parent / f".{target.name}.tmp-{pid}"


def _remove_stale_temporaries(target: Path) -> None:
    """The temporary folders of `target` that no running process writes: left by a run that was
    killed (SIGKILL, a power cut) or one of this process id."""
    for folder in target.parent.glob(f".{target.name}.tmp-*"):
        pid = folder.name.rpartition("-")[2]
        if pid.isdigit() and (int(pid) == os.getpid() or not _process_runs(int(pid))):
            shutil.rmtree(folder, ignore_errors=True)


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process is there
    except ProcessLookupError:
        return False
    except PermissionError:  # there, and another user's
        pass
    return True


def _raise_on_signals(left: str) -> Callable[[], None]:
    """From now on SIGTERM and SIGINT raise `Interrupted` (its message: the signal, then `left`)
    instead of ending the process where it stands, so that the caller's cleanup runs; a second
    signal acts as before. Returns what puts the handlers before back."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        return lambda: None
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def stop(signum: int, frame: object) -> None:
        restore()
        raise Interrupted(f"stopped by {signal.Signals(signum).name}; {left}", signum)

    for signum in previous:
        signal.signal(signum, stop)
    return restore


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
