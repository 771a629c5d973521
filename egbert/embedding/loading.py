"""Loading a model to embed with, and the checks that need the model: its layers, its length."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from egbert.errors import CheckpointError, ConfigError, first_line
from egbert.model_files import load_pretrained, resolve_model_dir
from egbert.tokenizer import check_vocab_matches


def load_model(
    model_dir: str | os.PathLike,
    device: str | torch.device | None = None,
    allow_pickle: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the base model (AutoModel) and its fast tokenizer (AutoTokenizer) from one directory.

    The model is put in eval mode on `device` (default: cuda when available, else cpu). Weights
    are read from safetensors; a pickle checkpoint (pytorch_model.bin, *.pt) needs
    `allow_pickle=True` and is then read with torch.load(weights_only=True).
    """
    path = resolve_model_dir(Path(model_dir).expanduser())
    model = load_pretrained(AutoModel, path, allow_pickle=allow_pickle)
    tokenizer = load_model_tokenizer(path)
    check_vocab_matches(tokenizer, model.config.vocab_size, f"the model in {path}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def load_model_tokenizer(model_dir: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The fast tokenizer saved next to a model (fast: embed needs its offsets and word ids)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as error:  # also the bare Exception of the Rust parser on a broken file
        raise CheckpointError(
            f"cannot load a tokenizer from {model_dir} ({first_line(error)}); save it next to "
            "the model with tokenizer.save_pretrained(dir)"
        ) from None
    if not tokenizer.is_fast:
        raise CheckpointError(
            f"{model_dir} has no fast tokenizer (tokenizer.json), which embed needs for "
            "character offsets; save a tokenizers-backed tokenizer there"
        )
    return tokenizer


def resolve_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """Map layer indices (-1 = last layer, 0 = embeddings) to positions in `hidden_states`."""
    positions = []
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ConfigError(
                f"layer {layer} does not exist in a model with {num_layers} layers: use "
                f"0..{num_layers} (0 = embeddings) or -1..-{num_layers + 1} (-1 = last layer)"
            )
        positions.append(layer % (num_layers + 1))
    return positions


def model_max_length(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The longest input the model takes: its position table, capped by the tokenizer's limit."""
    limits = [getattr(model.config, "max_position_embeddings", None)]
    # Tokenizers without a saved limit report a huge sentinel (int(1e30)): not a real limit.
    limits.append(tokenizer.model_max_length if tokenizer.model_max_length < 1e6 else None)
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None  # None: recurrent models (elmo) have no limit


def check_lengths(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    stride: int | None,
) -> int | None:
    limit = model_max_length(model, tokenizer)
    if max_length is None:
        max_length = limit
    elif limit is not None and max_length > limit:
        raise ConfigError(f"max_length={max_length} exceeds the model's limit of {limit} tokens")
    specials = tokenizer.num_special_tokens_to_add(pair=False)
    if max_length is not None and max_length <= specials:
        raise ConfigError(f"max_length={max_length} leaves no room next to {specials} specials")
    if stride is not None:
        if max_length is None:
            raise ConfigError("stride windows need max_length (this model has no length limit)")
        if not 0 <= stride < max_length - specials:
            raise ConfigError(
                f"stride={stride} must be >= 0 and below the {max_length - specials} text tokens "
                f"that fit in a window of max_length={max_length}"
            )
    return max_length


def resolve_model(
    model_or_dir: str | os.PathLike | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    device: str | torch.device | None,
    allow_pickle: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, bool]:
    """The model in eval mode, its tokenizer and whether the model was training before."""
    if not isinstance(model_or_dir, PreTrainedModel):
        model, loaded_tokenizer = load_model(model_or_dir, device, allow_pickle)
        return model, tokenizer or loaded_tokenizer, False
    model = model_or_dir
    if tokenizer is None:
        if not model.name_or_path or not Path(model.name_or_path).is_dir():
            raise ConfigError("this model was not loaded from a directory: pass tokenizer=...")
        tokenizer = load_model_tokenizer(model.name_or_path)
    was_training = model.training
    model.eval()
    return model, tokenizer, was_training
