"""Saved model directories: finding one, reading its config, and loading its weights safely.

Unpickling a file (`pytorch_model.bin`, `*.pt`) can run any code its author put in it, so every
egbert command that loads a model goes through `load_pretrained`: a directory with safetensors
weights loads as usual; one with only a pickle checkpoint is refused unless the user passes
`--allow-pickle` (`allow_pickle=True`), and even then the file is read with
`torch.load(weights_only=True)`, which rebuilds tensors and plain containers and nothing else.
No loader in egbert lets a model directory bring its own Python code (transformers' remote-code
option is never set). A training run's directory stands for the model in its `model/` folder.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from transformers import PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from egbert.errors import CheckpointError, first_line

SAFE_SUFFIXES = (".safetensors", ".safetensors.index.json")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
# The pickle names `from_pretrained` itself looks for; other pickles are converted first.
TRANSFORMERS_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
ALLOW_PICKLE_HELP = (
    "also load a pickle checkpoint (pytorch_model.bin, *.pt) when the model directory has no "
    "safetensors weights, with torch.load(weights_only=True); only for files you trust"
)
# Where a training run puts its final model, beside its checkpoints and logs.
RUN_MODEL_DIR = "model"
# A Hub id as the Hub spells one: `name` or `owner/name`, no leading `.` or `/`.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# What loading a broken or mismatched checkpoint raises inside transformers and torch.
LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, SafetensorError, pickle.PickleError)


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model directory, or the training run directory that holds one as `model/` (what
    `egbert pretrain` and `egbert finetune` write): the folder with the config.json."""
    path = Path(path)
    if not (path / "config.json").is_file() and (path / RUN_MODEL_DIR / "config.json").is_file():
        return path / RUN_MODEL_DIR
    return path


def hub_id_note(path: str | os.PathLike) -> str:
    """For a folder that is not there but whose name reads as a Hub id (`bert-base-uncased`,
    `org/name`): that egbert reads folders there, not the Hub (the empty string otherwise)."""
    name = str(path)
    if Path(name).exists() or not HUB_ID.fullmatch(name):
        return ""
    return (
        f" ({name} reads as a Hugging Face Hub id: egbert does not download models or "
        f"tokenizers here; fetch it with `huggingface-cli download {name} --local-dir DIR` and "
        "pass DIR)"
    )


def read_model_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The `config.json` of a saved model directory (or of a run directory's model);
    CheckpointError if missing or unreadable."""
    path = resolve_model_dir(model_dir)
    config_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(
            f"model directory {path} not found; pass a directory written by save_pretrained"
            + hub_id_note(model_dir)
        )
    if not config_file.is_file():
        raise CheckpointError(f"{path} has no config.json: pass a saved model directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"{config_file} is not valid JSON ({first_line(error)}); the model directory is "
            "damaged: save the model again"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_file} is not a JSON object; save the model again")
    model_type = config.get("model_type")
    # Checked here, before transformers reads the folder: for a type it does not know, it would
    # ask whether to run the folder's own code (its auto_map) instead of saying so. (Without a
    # type or an auto_map, each loader says what it misses.)
    if (model_type is not None or "auto_map" in config) and model_type not in CONFIG_MAPPING:
        raise CheckpointError(
            f"{config_file}: unknown model_type {model_type!r} (not one of egbert's or "
            "transformers' model types); set the model's own type there, or pass a folder "
            "saved by egbert or transformers"
        )
    return config


def pickle_files(model_dir: str | os.PathLike) -> list[Path]:
    """The files of a directory that hold (or index) pickled weights."""
    return sorted(
        path
        for path in Path(model_dir).iterdir()
        if path.is_file()
        and (path.name.endswith(PICKLE_SUFFIXES) or path.name in TRANSFORMERS_PICKLES)
    )


def load_pretrained(
    model_class: Any, model_dir: str | os.PathLike, allow_pickle: bool = False, **kwargs: Any
) -> PreTrainedModel:
    """`model_class.from_pretrained(model_dir, **kwargs)` reading safetensors weights only.

    A directory whose only weights are a pickle is refused with a CheckpointError unless
    `allow_pickle`; then it is read with `torch.load(weights_only=True)`. Any failure to load
    (damaged files, shapes that do not fit the config) is a one-line CheckpointError.
    """
    path = resolve_model_dir(model_dir)
    config = read_model_config(path)
    # config.json may itself name the weights file (transformers' `transformers_weights`).
    named = config.get("transformers_weights")
    if (named and str(named).endswith(SAFE_SUFFIXES)) or (
        not named and any((path / name).is_file() for name in SAFE_WEIGHTS)
    ):
        return _from_pretrained(model_class, path, path, use_safetensors=True, **kwargs)
    pickled = path / named if named else _only_pickle(path)
    if not allow_pickle:
        raise CheckpointError(
            f"{path} holds a pickle checkpoint ({pickled.name}), which can run code when "
            "loaded; pass --allow-pickle (allow_pickle=True) if you trust it, or convert it "
            "to safetensors"
        )
    if named or pickled.name in TRANSFORMERS_PICKLES:
        return _from_pretrained(
            model_class, path, path, use_safetensors=False, weights_only=True, **kwargs
        )
    with _as_safetensors_dir(path, pickled) as converted:
        model = _from_pretrained(model_class, converted, path, use_safetensors=True, **kwargs)
    model.name_or_path = str(path)
    return model


def _only_pickle(path: Path) -> Path:
    found = pickle_files(path)
    if not found:
        raise CheckpointError(
            f"{path} has no model weights (model.safetensors); pass a directory written by "
            "save_pretrained"
        )
    in_transformers_order = [p for name in TRANSFORMERS_PICKLES for p in found if p.name == name]
    if in_transformers_order:
        return in_transformers_order[0]
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise CheckpointError(f"{path} has several pickle files ({names}); keep only the model's")
    return found[0]


@contextmanager
def quiet_warnings(*loggers: str) -> Iterator[None]:
    """The warnings of these loggers left unsaid, unless their verbosity was raised to info or
    more: transformers' load report (at every load: egbert's loads, of a backbone under a new
    head or a base model out of a pretraining one, expect its missing and unexpected weights)
    and accelerate's "Removed shared tensor" (at every save of a plain module with tied
    weights; egbert's models are saved untangled, one storage a tensor).

    A filter, not a higher level: transformers checks a model's tensor-parallel plan whenever
    modeling_utils' logger has a level of its own at WARNING or above (transformers 5.24,
    `_load_pretrained_model`), and for a model without a plan, as every egbert model is, warns
    "The following layers were not sharded: ..." with every layer named."""
    quieted = [
        logging.getLogger(name)
        for name in loggers
        if logging.getLogger(name).getEffectiveLevel() >= logging.WARNING
    ]
    for logger in quieted:
        logger.addFilter(_errors_only)
    try:
        yield
    finally:
        for logger in quieted:
            logger.removeFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


LOAD_REPORT = "transformers.modeling_utils"
SHARED_TENSORS_NOTE = "accelerate.utils.other"


def _from_pretrained(
    model_class: Any, directory: Path, named: Path, **kwargs: Any
) -> PreTrainedModel:
    """`from_pretrained(directory)`; a failure is a CheckpointError naming the user's `named`."""
    try:
        with quiet_warnings(LOAD_REPORT):
            return model_class.from_pretrained(directory, **kwargs)
    except LOAD_ERRORS as error:
        raise CheckpointError(f"cannot load the model in {named}: {first_line(error)}") from None


@contextmanager
def _as_safetensors_dir(path: Path, pickled: Path) -> Iterator[Path]:
    """A temporary model directory holding `pickled`'s state dict as model.safetensors."""
    try:
        state = torch.load(pickled, map_location="cpu", weights_only=True)
    except LOAD_ERRORS as error:
        raise CheckpointError(f"cannot load {pickled}: {first_line(error)}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # the layout of many training scripts' checkpoints
    if not isinstance(state, dict) or not all(
        isinstance(value, torch.Tensor) for value in state.values()
    ):
        raise CheckpointError(f"{pickled} is not a state dict (names -> tensors)")
    with tempfile.TemporaryDirectory(prefix="egbert-unpickled-") as folder:
        converted = Path(folder)
        shutil.copyfile(path / "config.json", converted / "config.json")
        # clones: tied weights share storage, which safetensors refuses to write twice
        tensors = {name: tensor.detach().clone().contiguous() for name, tensor in state.items()}
        save_file(tensors, converted / "model.safetensors", metadata={"format": "pt"})
        yield converted
