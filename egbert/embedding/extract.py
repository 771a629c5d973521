"""`embed`: the one entry to embedding, from Python and (through `egbert embed`) the command
line."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from egbert.embedding.loading import check_lengths, resolve_layers, resolve_model
from egbert.embedding.options import EmbedLoading, EmbedOptions, last_layers
from egbert.embedding.vectors import TextOrPair, TokenEmbeddings, check_items, embed_items
from egbert.embedding.writers import COUNTED_SUFFIXES, STDOUT, check_output, open_writer
from egbert.errors import ConfigError, DataError
from egbert.training.runtime import requested_precision

CHUNK_BATCHES = 16  # with an output, this many batches are embedded and written at a time

DEFAULTS = EmbedOptions()


class TruncatedInputsWarning(UserWarning):
    """`embed` cut inputs longer than the model reads (and says how to embed all of them)."""


def embed(
    model_or_dir: str | os.PathLike | PreTrainedModel,
    texts_or_pairs: Iterable[TextOrPair],
    layers: Sequence[int] | None = DEFAULTS.layers,
    combine: str = DEFAULTS.combine,
    pool: str = DEFAULTS.pool,
    batch_size: int = DEFAULTS.batch_size,
    max_length: int | None = DEFAULTS.max_length,
    normalize: bool = DEFAULTS.normalize,
    word_level: bool = DEFAULTS.word_level,
    stride: int | None = DEFAULTS.stride,
    output: str | os.PathLike | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: str | torch.device | None = EmbedLoading.device,
    allow_pickle: bool = EmbedLoading.allow_pickle,
    bf16: bool = EmbedLoading.bf16,
    fp16: bool = EmbedLoading.fp16,
) -> np.ndarray | list[TokenEmbeddings] | Path:
    """Embed texts (or (a, b) pairs) with chosen layers of a model.

    Args:
        model_or_dir: a saved model directory (loaded with `load_model`, on `device`) or a loaded
            model, used where it is; its tokenizer is `tokenizer` or loaded from the model's
            directory (`model.name_or_path`).
        texts_or_pairs: texts, or (a, b) pairs of texts; any iterable (read in chunks when
            `output` is given).
        layers: indices into hidden_states = (embeddings, layer 1..N): -1 is the last layer,
            0 the embeddings; a layer the model lacks raises ConfigError. Default: the last
            four layers, or all of a model with fewer (`last_layers`).
        combine: 'concat' (in the order of `layers`), 'sum', 'mean', 'scalar-mix' (untrained:
            equal weights, gamma 1) or 'none' (exactly one layer).
        pool: 'mean' (average of the real tokens, so padding never changes a vector), 'cls'
            (first token), 'last' (last real token) or 'none' (per-token results).
        batch_size: inputs per forward pass (batched by length).
        max_length: truncate longer inputs to this many tokens (default: the model's maximum
            positions); the number truncated is reported with a warning.
        normalize: scale every output vector to unit L2 length.
        word_level: with pool='none', average the word pieces of each word.
        stride: instead of truncating, cut long single texts into windows of max_length tokens
            that overlap by `stride` tokens; each token's vector comes from the window where it
            has the most context on its shorter side, and pooling runs over the stitched tokens.
        output: write the results there instead of returning them, in chunks, so inputs of any
            size fit in memory: .npy or .safetensors (pooled vectors, one row per input; a
            safetensors file holds one "embeddings" tensor) or .jsonl (one record per input: a
            pooled vector, or tokens, offsets and vectors with pool='none'); "-" writes JSONL
            to stdout. A file is written to a temp file renamed at the end.
        allow_pickle: let `load_model` read a directory whose weights are a pickle
            (pytorch_model.bin, *.pt), with torch.load(weights_only=True).
        bf16, fp16: run the model under bf16 (or fp16, for GPUs without bf16) autocast; the
            vectors are float32 either way.

    Returns:
        pooled: a float32 array (inputs, dim); pool='none': one TokenEmbeddings per input, in the
        order given; with `output`: the path written.
    """
    options = EmbedOptions(
        None if layers is None else tuple(layers),
        combine,
        pool,
        batch_size,
        max_length,
        normalize,
        word_level,
        stride,
    )
    target = None if output is None else check_output(output, pool)
    texts_or_pairs = _checked_inputs(texts_or_pairs, target)
    model, tokenizer, was_training = resolve_model(model_or_dir, tokenizer, device, allow_pickle)
    name = str(getattr(model, "name_or_path", model_or_dir))
    try:
        with requested_precision(model, bf16, fp16):
            results, count, truncated, max_length = _embed_with(
                model, tokenizer, texts_or_pairs, options, target, name
            )
    finally:
        model.train(was_training)
    if truncated:
        warnings.warn(
            f"{truncated} of {count} inputs were longer than {max_length} tokens and were "
            "truncated; set stride (--stride) to embed them in overlapping windows",
            TruncatedInputsWarning,
            stacklevel=2,
        )
    return results


def _embed_with(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts_or_pairs: Iterable[TextOrPair],
    options: EmbedOptions,
    target: Path | None,
    model_name: str,
) -> tuple[np.ndarray | list[TokenEmbeddings] | Path, int, int, int | None]:
    """embed's work once the model is loaded: (results, inputs, inputs truncated, max length)."""
    depth = model.config.num_hidden_layers
    options = replace(options, layers=options.layers or last_layers(depth))
    positions = resolve_layers(options.layers, depth)
    max_length = check_lengths(model, tokenizer, options.max_length, options.stride)
    if target is None:
        items = check_items(list(texts_or_pairs))
        results, truncated = embed_items(model, tokenizer, items, positions, options, max_length)
        return results, len(items), truncated, max_length
    metadata = output_metadata(model_name, options)
    count, truncated = write_embeddings(
        model, tokenizer, texts_or_pairs, positions, options, max_length, target, metadata
    )
    return target, count, truncated, max_length


def _checked_inputs(
    texts_or_pairs: Iterable[TextOrPair], target: Path | None
) -> Iterable[TextOrPair]:
    """The inputs, made a list where they must be counted first (returned arrays, and outputs
    whose size is written before the vectors); DataError if there are none."""
    if isinstance(texts_or_pairs, str):
        raise ConfigError("texts_or_pairs is a single string; pass a list of texts")
    if target is None or target.suffix in COUNTED_SUFFIXES:
        texts_or_pairs = (
            texts_or_pairs if isinstance(texts_or_pairs, Sized) else list(texts_or_pairs)
        )
        if not len(texts_or_pairs):
            raise DataError("no texts to embed")
    return texts_or_pairs


def output_metadata(model_name: str, options: EmbedOptions) -> dict[str, str]:
    """What a .safetensors output's header says of the model and how its vectors were made."""
    return {
        "model": model_name,
        "layers": ",".join(map(str, options.layers)),
        "combine": options.combine,
        "pool": options.pool,
        "normalize": str(options.normalize).lower(),
    }


def write_embeddings(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts_or_pairs: Iterable[TextOrPair],
    positions: list[int],
    options: EmbedOptions,
    max_length: int | None,
    output: Path,
    metadata: dict[str, str],
) -> tuple[int, int]:
    """Embed chunk by chunk into `output`; returns (inputs embedded, inputs truncated)."""
    count = len(texts_or_pairs) if isinstance(texts_or_pairs, Sized) else None
    done = truncated = 0
    with (
        open_writer(output, count, metadata) as writer,
        tqdm(total=count, unit="text", disable=None) as bar,
    ):
        for chunk in _chunks(texts_or_pairs, options.batch_size * CHUNK_BATCHES):
            results, chunk_truncated = embed_items(
                model, tokenizer, check_items(chunk), positions, options, max_length, done + 1
            )
            writer.write(results)
            truncated += chunk_truncated
            done += len(chunk)
            bar.update(len(chunk))
        if done == 0:
            raise DataError(
                f"no texts to embed into {'stdout' if str(output) == STDOUT else output}"
            )
    return done, truncated


def _chunks(items: Iterable[TextOrPair], size: int) -> Iterator[list[TextOrPair]]:
    chunk: list[TextOrPair] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
