"""Embedding extraction: sentence and token vectors from chosen layers of a saved model.

Library: `embed(model_or_dir, texts_or_pairs, layers=..., combine=..., pool=...)`; command line:
`egbert embed --model DIR --input FILE --output FILE` (see `main`). Works for egbert's bert, gpt
and elmo models and for stock transformers checkpoints that `AutoModel` loads (BERT, GPT-2).

Layers are indices into the model's `hidden_states` = (embeddings, layer 1, ..., layer N): -1 is
the last layer, -2 the one below it, 0 the embedding layer. The chosen layers are combined per
token ('concat' in the order given, 'sum', 'mean', 'scalar-mix', or 'none' for a single layer),
then optionally pooled into one vector per input over its real tokens ('cls': the first token,
'mean': the average, 'last': the last real token, natural for left-to-right models).

'scalar-mix' is ELMo's gamma * sum_j softmax(s)_j * h_j with the weights left untrained: s = 0 and
gamma = 1, so every layer gets the same weight (numerically the same as 'mean'). A task-specific
mix is trained by the fine-tuning heads, not here.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Encoding
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from egbert.arguments import ArgumentParser, BooleanFlag
from egbert.checkpoints import ALLOW_PICKLE_HELP, first_line, load_pretrained, resolve_model_dir
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.tokenizer import check_encoding, check_vocab_matches

COMBINES = ("concat", "sum", "mean", "scalar-mix", "none")
POOLS = ("none", "cls", "mean", "last")
OUTPUT_SUFFIXES = (".npy", ".safetensors", ".jsonl")
PAIR_SEPARATOR = "|||"  # in .txt input: "first text ||| second text"
CHUNK_BATCHES = 16  # the CLI embeds this many batches at a time (sorted by length within a chunk)

TextOrPair = str | tuple[str, str]


@dataclass
class TokenEmbeddings:
    """The per-token (or, with word_level=True, per-word) vectors of one input.

    offsets are character spans in the input's own text (the first or the second text of a pair,
    as sequence_ids says); special tokens have sequence id None and offsets (0, 0).
    """

    tokens: list[str]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]
    vectors: np.ndarray  # (tokens, dim), float32


@dataclass
class _Sequence:
    """One tokenized input after stitching its windows: what `_finish` turns into a result."""

    vectors: torch.Tensor  # (tokens, dim)
    tokens: list[str]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]
    word_ids: list[int | None]


# ---------------------------------------------------------------------------------------------
# Loading and checking options


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
    if not layers:
        raise ConfigError("layers is empty; pick at least one layer, for example -1")
    positions = []
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ConfigError(
                f"layer {layer} does not exist in a model with {num_layers} layers: use "
                f"0..{num_layers} (0 = embeddings) or -1..-{num_layers + 1} (-1 = last layer)"
            )
        positions.append(layer % (num_layers + 1))
    return positions


def _check_options(combine: str, pool: str, layers: Sequence[int], word_level: bool) -> None:
    if combine not in COMBINES:
        raise ConfigError(f"combine={combine!r} is not one of {', '.join(COMBINES)}")
    if pool not in POOLS:
        raise ConfigError(f"pool={pool!r} is not one of {', '.join(POOLS)}")
    if combine == "none" and len(layers) != 1:
        raise ConfigError(
            f"combine='none' takes exactly one layer, got {len(layers)}; "
            "pass one layer or choose concat, sum, mean or scalar-mix"
        )
    if word_level and pool != "none":
        raise ConfigError("word_level=True gives per-word vectors: it needs pool='none'")


def _model_max_length(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The longest input the model takes: its position table, capped by the tokenizer's limit."""
    limits = [getattr(model.config, "max_position_embeddings", None)]
    # Tokenizers without a saved limit report a huge sentinel (int(1e30)): not a real limit.
    limits.append(tokenizer.model_max_length if tokenizer.model_max_length < 1e6 else None)
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None  # None: recurrent models (elmo) have no limit


def _check_lengths(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    stride: int | None,
) -> int | None:
    limit = _model_max_length(model, tokenizer)
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


def _check_items(items: Sequence[TextOrPair]) -> list[TextOrPair]:
    checked: list[TextOrPair] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            checked.append(item)
        elif (
            isinstance(item, tuple | list)
            and len(item) == 2
            and all(isinstance(part, str) for part in item)
        ):
            checked.append((item[0], item[1]))
        else:
            raise DataError(
                f"input {index} is {item!r:.60}; pass a text or an (a, b) pair of texts"
            )
    return checked


# ---------------------------------------------------------------------------------------------
# Tokenizing, running the model, combining layers


def _tokenize(
    tokenizer: PreTrainedTokenizerBase,
    items: list[TextOrPair],
    max_length: int | None,
    stride: int | None,
    first_number: int,
) -> tuple[list[Encoding], list[list[int]], int]:
    """Tokenize; return the windows, each input's window indices and how many were truncated."""
    windowed = stride is not None and max_length is not None
    if windowed and any(isinstance(item, tuple) for item in items):
        raise ConfigError("stride windows work on single texts; pairs are truncated instead")
    encoded = tokenizer(
        items,
        truncation=max_length is not None,
        max_length=max_length,
        stride=stride or 0,
        return_overflowing_tokens=windowed,
    )
    windows = encoded.encodings
    owners = encoded["overflow_to_sample_mapping"] if windowed else range(len(items))
    windows_of_input: list[list[int]] = [[] for _ in items]
    for window, owner in enumerate(owners):
        windows_of_input[owner].append(window)
        if not windows[window].ids:
            raise DataError(
                f"text {first_number + owner} of the input has no tokens (an empty line?); "
                "remove it"
            )
    truncated = 0 if windowed else sum(1 for window in windows if window.overflowing)
    return windows, windows_of_input, truncated


def _pad_batch(
    windows: list[Encoding], pad_id: int, with_token_types: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """Right-pad a batch: the models expect real tokens first, attention_mask 0 on padding."""
    length = max(len(window.ids) for window in windows)
    input_ids = torch.full((len(windows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(windows), length), dtype=torch.long)
    token_type_ids = torch.zeros((len(windows), length), dtype=torch.long)
    for row, window in enumerate(windows):
        n = len(window.ids)
        input_ids[row, :n] = torch.tensor(window.ids)
        attention_mask[row, :n] = 1
        token_type_ids[row, :n] = torch.tensor(window.type_ids)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_token_types:
        inputs["token_type_ids"] = token_type_ids
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _combine_layers(
    hidden_states: Sequence[torch.Tensor], positions: list[int], combine: str
) -> torch.Tensor:
    """(batch, seq, dim) per layer -> (batch, seq, dim or dim * layers for concat)."""
    selected = [hidden_states[position] for position in positions]
    if combine in ("concat", "none"):
        return torch.cat(selected, dim=-1)
    stacked = torch.stack(selected)  # (layers, batch, seq, dim)
    if combine == "sum":
        return stacked.sum(0)
    if combine == "mean":
        return stacked.mean(0)
    # scalar-mix, untrained: softmax of zero scalars gives equal weights, gamma = 1
    weights = torch.softmax(torch.zeros(len(selected), device=stacked.device), dim=0)
    gamma = 1.0
    return gamma * torch.einsum("l,lbsd->bsd", weights.to(stacked.dtype), stacked)


def _forward_longest_first(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    windows: list[Encoding],
    positions: list[int],
    combine: str,
    batch_size: int,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (window index, (tokens, dim) vectors), batching windows of similar length."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    accepted = inspect.signature(model.forward).parameters
    # GPT-2 style models accept token_type_ids but embed them with the word table, so pass them
    # only when the tokenizer, too, says the model was trained with them.
    with_token_types = (
        "token_type_ids" in accepted and "token_type_ids" in tokenizer.model_input_names
    )
    # a key/value cache costs time and memory and is of no use when nothing is generated
    options = {"use_cache": False} if "use_cache" in accepted else {}
    order = sorted(range(len(windows)), key=lambda index: len(windows[index].ids), reverse=True)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = _pad_batch([windows[i] for i in batch], pad_id, with_token_types, model.device)
        outputs = model(**inputs, **options, output_hidden_states=True, return_dict=True)
        if outputs.hidden_states is None:
            raise CheckpointError(f"{type(model).__name__} returns no hidden_states")
        combined = _combine_layers(outputs.hidden_states, positions, combine).float().cpu()
        for row, index in enumerate(batch):
            yield index, combined[row, : len(windows[index].ids)]  # real tokens only


# ---------------------------------------------------------------------------------------------
# Stitching windows, pooling, word averages


def _as_sequence(window: Encoding, vectors: torch.Tensor) -> _Sequence:
    return _Sequence(vectors, window.tokens, window.offsets, window.sequence_ids, window.word_ids)


def _stitch_windows(windows: list[Encoding], vectors: list[torch.Tensor], step: int) -> _Sequence:
    """Rebuild one long input from its overlapping windows.

    Window j holds text tokens j*step ... j*step + n_j - 1 (the tokenizer's stride overlap). Each
    text token is taken from the window where it has the most context on its shorter side (the
    rule of BERT's SQuAD windows; ties go to the earlier window); the leading special tokens come
    from the first window and the trailing ones from the last.
    """
    spans = []  # per window: (first text position, last text position)
    for window in windows:
        text = [p for p, sequence_id in enumerate(window.sequence_ids) if sequence_id is not None]
        spans.append((text[0], text[-1]))
    length = (len(windows) - 1) * step + spans[-1][1] - spans[-1][0] + 1
    best_context = [-1] * length
    source = [(0, 0)] * length  # (window, position in window)
    for j, (first, last) in enumerate(spans):
        count = last - first + 1
        for t in range(count):
            context = min(t, count - 1 - t)
            if context > best_context[j * step + t]:
                best_context[j * step + t] = context
                source[j * step + t] = (j, first + t)
    head = [(0, p) for p in range(spans[0][0])]
    tail = [(len(windows) - 1, p) for p in range(spans[-1][1] + 1, len(windows[-1].ids))]
    picks = head + source + tail
    return _Sequence(
        vectors=torch.stack([vectors[j][p] for j, p in picks]),
        tokens=[windows[j].tokens[p] for j, p in picks],
        offsets=[windows[j].offsets[p] for j, p in picks],
        sequence_ids=[windows[j].sequence_ids[p] for j, p in picks],
        word_ids=[windows[j].word_ids[p] for j, p in picks],
    )


def _pool(vectors: torch.Tensor, pool: str) -> torch.Tensor:
    """(tokens, dim) over real tokens only -> (dim,)."""
    if pool == "cls":
        return vectors[0]
    if pool == "last":
        return vectors[-1]
    return vectors.mean(0)


def _average_words(sequence: _Sequence, texts: tuple[str, ...]) -> _Sequence:
    """Average the word pieces of each word (tokenizer word_ids); special tokens are dropped."""
    pieces: dict[tuple[int, int], list[int]] = {}
    for position, (sequence_id, word_id) in enumerate(
        zip(sequence.sequence_ids, sequence.word_ids, strict=True)
    ):
        if sequence_id is not None and word_id is not None:
            pieces.setdefault((sequence_id, word_id), []).append(position)
    words, offsets, sequence_ids, rows = [], [], [], []
    for (sequence_id, _), positions in pieces.items():
        start, end = sequence.offsets[positions[0]][0], sequence.offsets[positions[-1]][1]
        text = texts[sequence_id]
        # byte-level BPE offsets include the space before a word: leave it out of the word
        while start < end and text[start].isspace():
            start += 1
        words.append(text[start:end])
        offsets.append((start, end))
        sequence_ids.append(sequence_id)
        rows.append(sequence.vectors[positions].mean(0))
    dim = sequence.vectors.shape[-1]
    vectors = torch.stack(rows) if rows else sequence.vectors.new_zeros((0, dim))
    return _Sequence(vectors, words, offsets, sequence_ids, [None] * len(words))


def _finish(
    sequence: _Sequence, item: TextOrPair, pool: str, normalize: bool, word_level: bool
) -> torch.Tensor | TokenEmbeddings:
    if pool != "none":
        vector = _pool(sequence.vectors, pool)
        return F.normalize(vector, dim=-1) if normalize else vector
    if word_level:
        sequence = _average_words(sequence, (item,) if isinstance(item, str) else item)
    vectors = F.normalize(sequence.vectors, dim=-1) if normalize else sequence.vectors
    return TokenEmbeddings(
        tokens=list(sequence.tokens),
        offsets=[tuple(span) for span in sequence.offsets],
        sequence_ids=list(sequence.sequence_ids),
        vectors=vectors.numpy().copy(),  # copy: a view would keep the whole batch alive
    )


# ---------------------------------------------------------------------------------------------
# The library function


def _embed_items(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: list[TextOrPair],
    positions: list[int],
    combine: str,
    pool: str,
    batch_size: int,
    max_length: int | None,
    normalize: bool,
    word_level: bool,
    stride: int | None,
    first_number: int = 1,
) -> tuple[np.ndarray | list[TokenEmbeddings], int]:
    """Embed checked items with checked options; return the results and the truncated count."""
    windows, windows_of_input, truncated = _tokenize(
        tokenizer, items, max_length, stride, first_number
    )
    step = 0  # text tokens from one window's start to the next's, when windowing
    if stride is not None and max_length is not None:
        step = max_length - tokenizer.num_special_tokens_to_add(pair=False) - stride
    owner = {window: i for i, indices in enumerate(windows_of_input) for window in indices}
    waiting = [len(indices) for indices in windows_of_input]
    done: dict[int, torch.Tensor] = {}
    results: list = [None] * len(items)
    with torch.inference_mode():
        for window, vectors in _forward_longest_first(
            model, tokenizer, windows, positions, combine, batch_size
        ):
            i = owner[window]
            done[window] = vectors
            waiting[i] -= 1
            if waiting[i]:
                continue
            indices = windows_of_input[i]
            if len(indices) == 1:
                sequence = _as_sequence(windows[window], done.pop(window))
            else:
                parts = [done.pop(index) for index in indices]
                sequence = _stitch_windows([windows[index] for index in indices], parts, step)
            results[i] = _finish(sequence, items[i], pool, normalize, word_level)
    if pool != "none":
        return torch.stack(results).numpy(), truncated
    return results, truncated


def embed(
    model_or_dir: str | os.PathLike | PreTrainedModel,
    texts_or_pairs: Iterable[TextOrPair],
    layers: Sequence[int] = (-1, -2, -3, -4),
    combine: str = "concat",
    pool: str = "none",
    batch_size: int = 32,
    max_length: int | None = None,
    normalize: bool = False,
    word_level: bool = False,
    stride: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: str | torch.device | None = None,
    allow_pickle: bool = False,
) -> np.ndarray | list[TokenEmbeddings]:
    """Embed texts (or (a, b) pairs) with chosen layers of a model.

    Args:
        model_or_dir: a saved model directory (loaded with `load_model`, on `device`) or a loaded
            model, used where it is; its tokenizer is `tokenizer` or loaded from the model's
            directory (`model.name_or_path`).
        layers: indices into hidden_states = (embeddings, layer 1..N): -1 is the last layer,
            0 the embeddings; a layer the model lacks raises ConfigError.
        combine: 'concat' (in the order of `layers`), 'sum', 'mean', 'scalar-mix' (untrained:
            equal weights, gamma 1) or 'none' (exactly one layer).
        pool: 'none' (per-token results), 'cls' (first token), 'mean' (average of the real
            tokens, so padding never changes a vector) or 'last' (last real token).
        max_length: truncate longer inputs to this many tokens (default: the model's maximum
            positions); the number truncated is reported with a warning.
        normalize: scale every output vector to unit L2 length.
        word_level: with pool='none', average the word pieces of each word.
        stride: instead of truncating, cut long single texts into windows of max_length tokens
            that overlap by `stride` tokens; each token's vector comes from the window where it
            has the most context on its shorter side, and pooling runs over the stitched tokens.
        allow_pickle: let `load_model` read a directory whose weights are a pickle
            (pytorch_model.bin, *.pt), with torch.load(weights_only=True).

    Returns:
        pooled: a float32 array (inputs, dim); pool='none': one TokenEmbeddings per input, in the
        order given (inputs are batched by length internally).
    """
    if isinstance(texts_or_pairs, str):
        raise ConfigError("texts_or_pairs is a single string; pass a list of texts")
    items = _check_items(list(texts_or_pairs))
    if not items:
        raise DataError("no texts to embed")
    _check_options(combine, pool, layers, word_level)
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1")
    model, tokenizer, was_training = _resolve_model(model_or_dir, tokenizer, device, allow_pickle)
    try:
        positions = resolve_layers(layers, model.config.num_hidden_layers)
        max_length = _check_lengths(model, tokenizer, max_length, stride)
        results, truncated = _embed_items(
            model, tokenizer, items, positions, combine, pool, batch_size, max_length,
            normalize, word_level, stride,
        )  # fmt: skip
    finally:
        model.train(was_training)
    if truncated:
        warnings.warn(_truncation_message(truncated, len(items), max_length), stacklevel=2)
    return results


def _resolve_model(
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


def _truncation_message(truncated: int, total: int, max_length: int | None) -> str:
    return (
        f"{truncated} of {total} inputs were longer than {max_length} tokens and were truncated; "
        "use stride to embed them in overlapping windows"
    )


# ---------------------------------------------------------------------------------------------
# Command line: streamed input, chunked output written to a temp file and renamed at the end


def _read_txt(path: Path, encoding: str) -> Iterator[TextOrPair]:
    """One text per line ("a ||| b" for a pair); an empty line is an empty text (rows = lines)."""
    with path.open(encoding=encoding) as handle:
        for line in handle:
            text = line.rstrip("\r\n")
            if PAIR_SEPARATOR in text:
                first, second = text.split(PAIR_SEPARATOR, 1)
                yield first.strip(), second.strip()
            else:
                yield text


def _read_jsonl(
    path: Path, encoding: str, text_field: str, pair_field: str | None
) -> Iterator[TextOrPair]:
    """One JSON object per line; blank lines are skipped."""
    with path.open(encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path} line {number}: not valid JSON ({error.msg})") from error
            fields = [text_field] if pair_field is None else [text_field, pair_field]
            for field in fields:
                if not isinstance(record, dict) or not isinstance(record.get(field), str):
                    raise DataError(
                        f"{path} line {number}: no text field {field!r}; "
                        "name the field with --text-field / --pair-field"
                    )
            yield (
                record[text_field]
                if pair_field is None
                else (record[text_field], record[pair_field])
            )


def _count_records(path: Path, encoding: str, jsonl: bool) -> int:
    with path.open(encoding=encoding) as handle:
        return sum(1 for line in handle if not jsonl or line.strip())


def _chunks(items: Iterable[TextOrPair], size: int) -> Iterator[list[TextOrPair]]:
    chunk: list[TextOrPair] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@contextmanager
def _atomic_output(output: Path) -> Iterator[Path]:
    """A temp path next to `output`, renamed onto it on success and removed on any failure."""
    temp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        yield temp
        os.replace(temp, output)
    finally:
        temp.unlink(missing_ok=True)


class _NpyWriter:
    """Rows into a (count, dim) float32 .npy opened as a memory map once dim is known."""

    def __init__(self, path: Path, count: int, metadata: dict[str, str]):
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

    def __init__(self, path: Path, count: int, metadata: dict[str, str]):
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
    """One JSON record per input: {"vector"} pooled, or {"tokens", "offsets", ..., "vectors"}."""

    def __init__(self, path: Path, count: int, metadata: dict[str, str]):
        self.handle = path.open("w", encoding="utf-8")

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
        self.handle.close()


WRITERS = {".npy": _NpyWriter, ".safetensors": _SafetensorsWriter, ".jsonl": _JsonlWriter}


def _parse_layers(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as error:
        raise ConfigError(
            f"--layers {value!r}: give comma-separated integers such as -1,-2,-3,-4"
        ) from error


def _attach_layers_value(argv: list[str]) -> list[str]:
    # argparse reads "-1,-2" as an unknown option, so "--layers -1,-2" would fail: glue the
    # value on as "--layers=-1,-2".
    glued: list[str] = []
    for arg in argv:
        if glued and glued[-1] == "--layers" and arg.startswith("-"):
            glued[-1] = f"--layers={arg}"
        else:
            glued.append(arg)
    return glued


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        "egbert embed",
        description=(
            "Extract sentence or token embeddings from chosen layers of a saved model (egbert "
            "bert/gpt/elmo or a stock transformers BERT/GPT-2 directory). The input is streamed "
            "and the output written in chunks to a temp file renamed at the end."
        ),
    )
    parser.add_argument("--model", required=True, help="model directory (with its tokenizer)")
    parser.add_argument(
        "--input",
        required=True,
        help='.jsonl (one object per line) or text, one input per line ("a ||| b" for a pair)',
    )
    parser.add_argument(
        "--output",
        required=True,
        help=".npy or .safetensors (pooled vectors, one row per input) or .jsonl (one record "
        "per input: a pooled vector, or tokens, offsets and vectors with --pool none)",
    )
    parser.add_argument(
        "--layers",
        default="-1,-2,-3,-4",
        help="comma-separated layer indices: -1 last layer, 0 embeddings (default: %(default)s)",
    )
    parser.add_argument(
        "--combine",
        choices=COMBINES,
        default="concat",
        help="per token: concat (in --layers order), sum, mean, scalar-mix (untrained: equal "
        "weights, gamma 1) or none (one layer) (default: %(default)s)",
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default="mean",
        help="cls: first token, mean: average of the real tokens, last: last real token, "
        "none: per-token vectors, .jsonl only (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument(
        "--max-length", type=int, help="truncate to N tokens (default: model maximum)"
    )
    parser.add_argument("--normalize", action=BooleanFlag, help="unit-length vectors")
    parser.add_argument(
        "--word-level", action=BooleanFlag, help="average word pieces per word (--pool none)"
    )
    parser.add_argument(
        "--stride",
        type=int,
        help="embed long texts in windows overlapping by N tokens instead of truncating them",
    )
    parser.add_argument("--text-field", default="text", help="text field of .jsonl input")
    parser.add_argument("--pair-field", help="second text field of .jsonl input, for pairs")
    parser.add_argument("--encoding", default="utf-8", help="input file encoding")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--allow-pickle", action=BooleanFlag, help=ALLOW_PICKLE_HELP)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(_attach_layers_value(sys.argv[1:] if argv is None else argv))
    output, source = Path(args.output), Path(args.input)
    if output.suffix not in WRITERS:
        raise ConfigError(
            f"--output {output}: unknown extension {output.suffix!r}; "
            f"use one of {', '.join(OUTPUT_SUFFIXES)}"
        )
    if args.pool == "none" and output.suffix != ".jsonl":
        raise ConfigError(
            f"--output {output}: per-token vectors (--pool none) go to .jsonl; "
            "pool them (--pool mean|cls|last) for .npy or .safetensors"
        )
    if not output.parent.is_dir():
        raise ConfigError(
            f"--output folder {output.parent} does not exist; create it or choose another --output"
        )
    if not source.is_file():
        raise DataError(f"--input {source} not found")
    check_encoding(args.encoding)
    layers = _parse_layers(args.layers)
    _check_options(args.combine, args.pool, layers, args.word_level)
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size} must be at least 1")
    jsonl = source.suffix == ".jsonl"
    try:
        count = _count_records(source, args.encoding, jsonl)
    except UnicodeDecodeError as error:
        raise DataError(
            f"--input {source} is not {args.encoding} (byte {error.start}); pass --encoding"
        ) from error
    if count == 0:
        raise DataError(f"--input {source} is empty: nothing to embed")
    model, tokenizer = load_model(args.model, args.device, args.allow_pickle)
    positions = resolve_layers(layers, model.config.num_hidden_layers)
    max_length = _check_lengths(model, tokenizer, args.max_length, args.stride)
    if jsonl:
        items = _read_jsonl(source, args.encoding, args.text_field, args.pair_field)
    else:
        items = _read_txt(source, args.encoding)
    metadata = {
        "model": str(args.model),
        "layers": ",".join(map(str, layers)),
        "combine": args.combine,
        "pool": args.pool,
        "normalize": str(args.normalize).lower(),
    }
    done = truncated = 0
    with _atomic_output(output) as temp, tqdm(total=count, unit="text", disable=None) as bar:
        writer = WRITERS[output.suffix](temp, count, metadata)
        try:
            for chunk in _chunks(items, args.batch_size * CHUNK_BATCHES):
                results, chunk_truncated = _embed_items(
                    model, tokenizer, _check_items(chunk), positions, args.combine, args.pool,
                    args.batch_size, max_length, args.normalize, args.word_level, args.stride,
                    first_number=done + 1,
                )  # fmt: skip
                writer.write(results)
                truncated += chunk_truncated
                done += len(chunk)
                bar.update(len(chunk))
        finally:
            writer.close()
    if truncated:
        message = _truncation_message(truncated, count, max_length).replace("stride", "--stride")
        print(f"egbert embed: warning: {message}", file=sys.stderr)
    print(f"egbert embed: wrote {count} embeddings to {output}", file=sys.stderr)
