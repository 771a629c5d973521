"""Pretraining data: text files or a hub data set -> documents -> token ids -> examples -> batches.

Every step goes through `datasets`, so results live in the Arrow cache and are reused by
fingerprint; `streaming=True` gives `IterableDataset`s for corpora larger than memory or disk.
Each example builder is a pure function of (tokenized documents, options, seed).

Documents (one row per document, column "text"):
    read_documents(files, doc_boundary="blank", encoding="utf-8", errors="strict",
                   streaming=False)
        doc_boundary: "blank" (blank lines separate documents), "wikitext" (a ` = Title = `
        line starts an article; heading lines are dropped), "line" (one document per line)
        or "file" (one document per file). Undecodable bytes or a file without text raise
        DataError naming the file (and the byte offset).
    load_hub_documents(name, text_column="text", split="train", config_name=None,
                       streaming=False)
        a hub data set name or a local data set path; each row is a document.

Token ids (one row per document, column "input_ids": list of segments, each a list of ids):
    tokenize_documents(docs, tokenizer, split_sentences=True, num_proc=None, batch_size=1000)
        segments are sentences (lines split after . ! ? before a capital), or the whole
        document when split_sentences=False; no special tokens are added.

Examples:
    build_nsp_examples(tokenized, max_seq_length=128, *, cls_id, sep_id, short_seq_prob=0.1,
                       nsp_probability=0.5, dupe_factor=1, seed=0, num_proc=None)
        BERT pairs `[CLS] A [SEP] B [SEP]`: columns input_ids, token_type_ids,
        next_sentence_label (0 = IsNext, 1 = NotNext, as transformers' BertForPreTraining).
    build_mlm_examples(tokenized, max_seq_length=128, *, cls_id, sep_id)
        single-segment packed `[CLS] ... [SEP]` blocks for MLM without NSP.
    pack_blocks(tokenized, block_size, eos_id)
        GPT / ELMo: documents joined by the end-of-text token, cut into block_size blocks
        (only the last partial block is dropped; DataError if not even one block fits).
    add_static_masks(examples, tokenizer, mlm_probability=0.15, max_predictions=None,
                     whole_word_mask=False, seed=0, num_proc=None)
        BERT's static masking (use with dupe_factor > 1): adds a "labels" column.

Masking and batches:
    mask_tokens_for_mlm(input_ids, *, special_ids, mask_id, vocab_size, rng,
                        mlm_probability=0.15, max_predictions=None, word_continuation=None)
        -> (masked input_ids, labels) as torch.LongTensors.
    wordpiece_continuations(tokenizer) -> bool array over the vocabulary ("##" pieces).
    MLMCollator(tokenizer, mlm_probability=0.15, max_predictions=None, whole_word_mask=False,
                seed=0): pads (right), adds attention_mask where a row is padded, masks
                dynamically unless the examples carry static "labels"; call set_epoch(epoch)
                every epoch.
    CausalLMCollator(tokenizer): pads, attention_mask where a row is padded, labels =
                input_ids (-100 on padding).
    padding_mask(rows) -> {"attention_mask": ...} when the rows differ in length, else {}.

Data sets come back unshuffled, in document order: the trainer's sampler shuffles.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from pathlib import Path

import datasets
import numpy as np
import torch
from datasets import Dataset, Features, IterableDataset, List, Value
from datasets.exceptions import DatasetGenerationError
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from egbert.errors import ConfigError, DataError, EgbertError
from egbert.tokenizer import check_encoding

DOC_BOUNDARIES = ("blank", "wikitext", "line", "file")
TokenizedDocs = Dataset | IterableDataset

TEXT_FEATURES = Features({"text": Value("string")})
TOKENIZED_FEATURES = Features({"input_ids": List(List(Value("int32")))})
BLOCK_FEATURES = Features({"input_ids": List(Value("int32"))})
NSP_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "token_type_ids": List(Value("int8")),
        "next_sentence_label": Value("int8"),
    }
)

# A sentence ends at . ! or ? followed by whitespace and a capital. A heuristic, but BERT only
# needs plausible sentence units to choose its A/B split points from.
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# How many recent documents a streaming NSP builder draws its random "NotNext" segments from.
STREAMING_DOCUMENT_POOL = 1000


# ---------------------------------------------------------------- documents


def read_documents(
    files: Sequence[str | os.PathLike],
    doc_boundary: str = "blank",
    encoding: str = "utf-8",
    errors: str = "strict",
    streaming: bool = False,
) -> Dataset | IterableDataset:
    """Read text files into one row per document (column "text", lines joined with newlines)."""
    if doc_boundary not in DOC_BOUNDARIES:
        raise ConfigError(
            f"unknown doc_boundary {doc_boundary!r}; choose one of {', '.join(DOC_BOUNDARIES)}"
        )
    check_encoding(encoding, errors)
    # (path, size, mtime) so that an edited file misses the Arrow cache instead of reusing it.
    stamped = [(str(path), *_size_and_mtime(path)) for path in _check_files(files)]
    gen_kwargs = {
        "files": stamped,
        "doc_boundary": doc_boundary,
        "encoding": encoding,
        "errors": errors,
    }
    if streaming:
        return IterableDataset.from_generator(
            _document_rows, features=TEXT_FEATURES, gen_kwargs=gen_kwargs
        )
    return _cached_from_generator(_document_rows, TEXT_FEATURES, gen_kwargs)


def _cached_from_generator(
    generator: Callable, features: Features, gen_kwargs: dict, fingerprint: str | None = None
) -> Dataset:
    try:
        return Dataset.from_generator(
            generator, features=features, gen_kwargs=gen_kwargs, fingerprint=fingerprint
        )
    except DatasetGenerationError as error:
        # `datasets` wraps whatever the generator raised; give the user our one-line message.
        if isinstance(error.__cause__, EgbertError):
            raise error.__cause__ from None
        raise


def _check_files(files: Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if not files:
        raise DataError("no training text files given; pass at least one with --train-files")
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


def _document_rows(
    files: list[tuple[str, int, int]], doc_boundary: str, encoding: str, errors: str
) -> Iterator[dict[str, str]]:
    for path, _size, _mtime in files:
        found = False
        for lines in _split_documents(_decoded_lines(path, encoding, errors), doc_boundary):
            found = True
            yield {"text": "\n".join(lines)}
        if not found:
            raise DataError(f"{path}: no text in the file (only blank or heading lines)")


def _decoded_lines(path: str, encoding: str, errors: str) -> Iterator[str]:
    """The file's lines, stripped; reading bytes lets a decode error name its byte offset."""
    offset = 0
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                line = raw.decode(encoding, errors)
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}: byte 0x{raw[error.start]:02x} at offset {offset + error.start} is "
                    f"not valid {encoding}; pass the file's encoding (e.g. encoding='latin-1', "
                    "--encoding latin-1) or errors='replace'"
                ) from None
            if offset == 0:
                line = line.lstrip("\ufeff")  # a byte-order mark is not text
            offset += len(raw)
            yield line.strip()


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


def load_hub_documents(
    name: str,
    text_column: str = "text",
    split: str = "train",
    config_name: str | None = None,
    streaming: bool = False,
) -> Dataset | IterableDataset:
    """Load a hub data set (or a local data set directory) as documents, one per non-empty row."""
    try:
        loaded = datasets.load_dataset(name, config_name, split=split, streaming=streaming)
    except ConnectionError:
        raise DataError(
            f"could not reach the hub for data set {name!r} (offline?); pass local text files "
            "with --train-files instead"
        ) from None
    except FileNotFoundError:
        raise DataError(
            f"no data set {name!r} on the hub or on disk; check the name or pass local text files"
        ) from None
    except ValueError as error:  # an unknown split or config
        raise DataError(f"data set {name!r}: {error}") from None
    columns = loaded.column_names  # None for some streamed data sets: checked when read
    if columns is not None and text_column not in columns:
        raise DataError(
            f"data set {name!r} has no column {text_column!r}; its columns are "
            f"{', '.join(columns)}: pass one as the text column"
        )
    documents = loaded.select_columns([text_column])
    if text_column != "text":
        documents = documents.rename_column(text_column, "text")
    return documents.filter(_has_text, batched=True)


def _has_text(batch: dict[str, list]) -> list[bool]:
    return [bool(text and text.strip()) for text in batch["text"]]


# ---------------------------------------------------------------- tokens


def tokenize_documents(
    docs: Dataset | IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    split_sentences: bool = True,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> Dataset | IterableDataset:
    """Token ids of each document's segments (sentences, or the whole text), without specials.

    Documents and segments with no tokens are dropped. Parallel with `num_proc` processes and
    cached by fingerprint (of the documents, the tokenizer and the options).
    """
    options = {
        "fn_kwargs": {"tokenizer": tokenizer, "split_sentences": split_sentences},
        "batched": True,
        "batch_size": batch_size,
        "remove_columns": ["text"],
        "features": TOKENIZED_FEATURES,
    }
    if isinstance(docs, IterableDataset):
        return docs.map(_tokenize_batch, **options)
    return docs.map(_tokenize_batch, num_proc=num_proc, desc="tokenizing", **options)


def _tokenize_batch(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, split_sentences: bool
) -> dict[str, list]:
    segments = [_segments(text, split_sentences) for text in batch["text"]]
    flat = [segment for document in segments for segment in document]
    ids = (
        tokenizer(
            flat,
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,  # whole documents exceed model_max_length; that is fine here
        )["input_ids"]
        if flat
        else []
    )
    tokenized, start = [], 0
    for document in segments:
        kept = [segment for segment in ids[start : start + len(document)] if segment]
        start += len(document)
        if kept:
            tokenized.append(kept)
    return {"input_ids": tokenized}


def _segments(text: str, split_sentences: bool) -> list[str]:
    if not split_sentences:
        return [text]
    return [
        sentence
        for line in text.split("\n")
        for sentence in SENTENCE_BREAK.split(line)
        if sentence.strip()
    ]


# ---------------------------------------------------------------- BERT: sentence pairs with NSP


def build_nsp_examples(
    tokenized: TokenizedDocs,
    max_seq_length: int = 128,
    *,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    dupe_factor: int = 1,
    seed: int = 0,
    num_proc: int | None = None,
) -> Dataset | IterableDataset:
    """BERT's `[CLS] A [SEP] B [SEP]` pairs with next-sentence labels, as google-research/bert's
    create_pretraining_data builds them (before masking).

    Sentences accumulate into a chunk until it reaches the target length (`max_seq_length - 3`,
    or with probability `short_seq_prob` a random length from 2). A is the chunk's first k
    sentences; B is the rest (IsNext, label 0) or, with probability `nsp_probability`, a span
    from another document (NotNext, label 1) and the chunk's unused sentences start the next
    chunk. A chunk of one sentence is cut at a random token for IsNext (BERT would make it
    NotNext, unbalancing the labels when sentences are long). The longer of A and B loses
    tokens from a random end until the pair fits the target length (BERT: the maximum).
    `dupe_factor` passes give different pairs.
    The result depends only on (documents, options, seed), not on `num_proc`.
    """
    if max_seq_length < 5:
        raise ConfigError(f"max_seq_length {max_seq_length} is too small for a pair; use >= 5")
    options = {
        "max_seq_length": max_seq_length,
        "cls_id": cls_id,
        "sep_id": sep_id,
        "short_seq_prob": short_seq_prob,
        "nsp_probability": nsp_probability,
        "dupe_factor": dupe_factor,
        "seed": seed,
    }
    if isinstance(tokenized, IterableDataset):
        return IterableDataset.from_generator(
            _streaming_nsp_examples,
            features=NSP_FEATURES,
            gen_kwargs={"tokenized": tokenized, **options},
        )
    documents = tokenized.with_format(None)
    return documents.map(
        _nsp_batch,
        batched=True,
        with_indices=True,
        fn_kwargs={"documents": documents, **options},
        remove_columns=documents.column_names,
        features=NSP_FEATURES,
        num_proc=num_proc,
        desc="building NSP pairs",
    )


def _nsp_batch(
    batch: dict[str, list], indices: list[int], documents: Dataset, **options
) -> dict[str, list]:
    def other_document(index: int, rng: random.Random) -> list[list[int]]:
        # Uniform over the other documents. BERT's 10 random tries can all hit this one (one
        # in 1,024 with two documents), making a NotNext pair from the same document; only a
        # one-document corpus has to use its own text.
        if len(documents) == 1:
            return documents[0]["input_ids"]
        other = rng.randrange(len(documents) - 1)
        return documents[other + (other >= index)]["input_ids"]

    examples = _empty_nsp_columns()
    for document, index in zip(batch["input_ids"], indices, strict=True):
        _add_pairs_of_document(document, index, other_document, examples, **options)
    return examples


def _streaming_nsp_examples(tokenized: IterableDataset, **options) -> Iterator[dict]:
    """Streaming variant: NotNext segments come from a pool of recently seen documents."""
    pool: deque[list[list[int]]] = deque(maxlen=STREAMING_DOCUMENT_POOL)
    for index, row in enumerate(tokenized):
        document = row["input_ids"]
        pool.append(document)

        def other_document(_index: int, rng: random.Random) -> list[list[int]]:
            # The newest pool entry is this document; skip it unless it is all there is.
            return pool[rng.randrange(len(pool) - 1)] if len(pool) > 1 else pool[0]

        examples = _empty_nsp_columns()
        _add_pairs_of_document(document, index, other_document, examples, **options)
        for input_ids, token_type_ids, label in zip(*examples.values(), strict=True):
            yield {
                "input_ids": input_ids,
                "token_type_ids": token_type_ids,
                "next_sentence_label": label,
            }


def _empty_nsp_columns() -> dict[str, list]:
    return {"input_ids": [], "token_type_ids": [], "next_sentence_label": []}


def _add_pairs_of_document(
    document: list[list[int]],
    index: int,
    other_document: Callable[[int, random.Random], list[list[int]]],
    examples: dict[str, list],
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float,
    nsp_probability: float,
    dupe_factor: int,
    seed: int,
) -> None:
    for dupe in range(dupe_factor):
        # One generator per (seed, pass, document): the pairs do not depend on how the corpus
        # is split among processes. A string seed is hashed with SHA-512, stable everywhere.
        rng = random.Random(f"{seed}/{dupe}/{index}")
        pairs = _sentence_pairs(
            document,
            lambda rng=rng: other_document(index, rng),
            rng,
            max_num_tokens=max_seq_length - 3,
            short_seq_prob=short_seq_prob,
            nsp_probability=nsp_probability,
        )
        for tokens_a, tokens_b, label in pairs:
            examples["input_ids"].append([cls_id, *tokens_a, sep_id, *tokens_b, sep_id])
            examples["token_type_ids"].append([0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1))
            examples["next_sentence_label"].append(label)


def _sentence_pairs(
    document: list[list[int]],
    other_document: Callable[[], list[list[int]]],
    rng: random.Random,
    max_num_tokens: int,
    short_seq_prob: float,
    nsp_probability: float,
) -> list[tuple[list[int], list[int], int]]:
    """(A, B, label) pairs from one document's sentences; label 1 means B is random (NotNext)."""
    pairs = []
    chunk: list[list[int]] = []
    chunk_length = 0
    target_length = _target_length(max_num_tokens, short_seq_prob, rng)
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            random_next = rng.random() < nsp_probability
            if len(chunk) == 1 and (random_next or len(chunk[0]) < 2):
                random_next = True
            elif len(chunk) == 1:
                # One long sentence and IsNext: BERT would pair it with a random B anyway, which
                # skews the labels towards NotNext (70% on WikiText at length 64). Cutting the
                # sentence at a random token gives a genuine continuation instead.
                chunk = _split_sentence(chunk[0], rng)
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
            if random_next:
                tokens_b = _random_span(other_document(), target_length - len(tokens_a), rng)
                i -= len(chunk) - a_end  # the unused sentences go back: the next chunk starts there
            else:
                tokens_b = [token for sentence in chunk[a_end:] for token in sentence]
            # To the target, not (as BERT) to max_num_tokens: long sentences would otherwise
            # overshoot a short target and short_seq_prob would give few short pairs.
            _truncate_pair(tokens_a, tokens_b, target_length, rng)
            pairs.append((tokens_a, tokens_b, int(random_next)))
            chunk, chunk_length = [], 0
            # Drawn per chunk (BERT draws once per document), so that short_seq_prob is the
            # share of short examples, which is how the paper describes it.
            target_length = _target_length(max_num_tokens, short_seq_prob, rng)
        i += 1
    return pairs


def _split_sentence(sentence: list[int], rng: random.Random) -> list[list[int]]:
    cut = rng.randint(1, len(sentence) - 1)
    return [sentence[:cut], sentence[cut:]]


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    # Some short sequences, so that the model also sees the lengths of fine-tuning inputs.
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_num_tokens)
    return max_num_tokens


def _random_span(document: list[list[int]], target_length: int, rng: random.Random) -> list[int]:
    """Consecutive sentences of `document` from a random one until `target_length` tokens."""
    tokens: list[int] = []
    for sentence in document[rng.randrange(len(document)) :]:
        tokens.extend(sentence)
        if len(tokens) >= target_length:
            break
    return tokens


def _truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random):
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        # From either end at random, as BERT does, so no end of a sentence is always kept.
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


# ---------------------------------------------------------------- packed blocks


def pack_blocks(tokenized: TokenizedDocs, block_size: int, eos_id: int) -> TokenizedDocs:
    """GPT / ELMo examples: all documents joined, each followed by the end-of-text token, and cut
    into `block_size`-token blocks. Only the final remainder (< block_size tokens) is dropped."""
    return _packed(tokenized, block_size, eos_id, prefix=(), suffix=())


def build_mlm_examples(
    tokenized: TokenizedDocs, max_seq_length: int = 128, *, cls_id: int, sep_id: int
) -> TokenizedDocs:
    """Single-segment MLM examples (no NSP): documents joined by [SEP], packed into
    `[CLS] ... [SEP]` blocks of `max_seq_length` tokens, like RoBERTa's full-sentence inputs."""
    return _packed(tokenized, max_seq_length - 2, sep_id, prefix=(cls_id,), suffix=(sep_id,))


def _packed(
    tokenized: TokenizedDocs,
    block_size: int,
    separator_id: int,
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> TokenizedDocs:
    if block_size < 1:
        raise ConfigError(f"block size {block_size} leaves no room for text; use a larger one")
    # Tuples, not lists: `datasets` reads a list in gen_kwargs as shards to split among workers.
    gen_kwargs = {
        "tokenized": tokenized,
        "block_size": block_size,
        "separator_id": separator_id,
        "prefix": prefix,
        "suffix": suffix,
    }
    if isinstance(tokenized, IterableDataset):
        return IterableDataset.from_generator(
            _packed_rows, features=BLOCK_FEATURES, gen_kwargs=gen_kwargs
        )
    # Packing is sequential (a block spans documents), so it runs as one generator; its cache
    # key is the input's fingerprint and the options, not a hash of the whole input.
    fingerprint = Hasher.hash(
        [_packed_rows, tokenized._fingerprint, block_size, separator_id, prefix, suffix]
    )
    return _cached_from_generator(_packed_rows, BLOCK_FEATURES, gen_kwargs, fingerprint)


def _packed_rows(
    tokenized: TokenizedDocs,
    block_size: int,
    separator_id: int,
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> Iterator[dict[str, list[int]]]:
    buffer: list[int] = []
    blocks = 0
    for batch in tokenized.with_format(None).iter(batch_size=1000):
        for document in batch["input_ids"]:
            for segment in document:
                buffer.extend(segment)
            buffer.append(separator_id)
            full = len(buffer) // block_size
            for start in range(0, full * block_size, block_size):
                yield {"input_ids": [*prefix, *buffer[start : start + block_size], *suffix]}
            blocks += full
            del buffer[: full * block_size]
    if blocks == 0:
        raise DataError(
            f"the corpus has {len(buffer)} tokens, less than one block of {block_size}; "
            "give it more text or use a shorter sequence length"
        )


# ---------------------------------------------------------------- masking


def mask_tokens_for_mlm(
    input_ids: torch.Tensor | np.ndarray | Sequence,
    *,
    special_ids: Iterable[int],
    mask_id: int,
    vocab_size: int,
    rng: np.random.Generator,
    mlm_probability: float = 0.15,
    max_predictions: int | None = None,
    word_continuation: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of one sequence or a (batch, seq) batch; returns (input_ids, labels).

    In each sequence exactly `min(max_predictions, max(1, round(mlm_probability * n)))`
    positions are chosen, n counting the tokens that are not special (specials, padding
    included, are never chosen); `max_predictions=None` means no cap (BERT used 20 at length
    128 and 80 at 512). Of the chosen tokens 80% become `mask_id`, 10% a random non-special
    token, 10% stay. Labels hold the original id at chosen positions, -100 elsewhere.
    With `word_continuation` (a bool per vocabulary id, True for WordPiece "##" pieces; see
    `wordpiece_continuations`) whole words are chosen together, and the count is at most the
    number above, since a word is never split.
    """
    if not 0.0 < mlm_probability <= 1.0:
        raise ConfigError(f"mlm_probability {mlm_probability} must be in (0, 1]")
    ids = np.array(input_ids, dtype=np.int64)  # a copy: the caller's ids stay as they were
    rows = ids.reshape(-1, ids.shape[-1])
    labels = np.full_like(rows, -100)
    is_special = np.zeros(vocab_size, dtype=bool)  # a lookup table: faster than np.isin
    is_special[list(special_ids)] = True
    for row, row_labels in zip(rows, labels, strict=True):
        _mask_sequence(
            row,
            row_labels,
            is_special,
            mask_id=mask_id,
            rng=rng,
            mlm_probability=mlm_probability,
            max_predictions=max_predictions,
            word_continuation=word_continuation,
        )
    return torch.from_numpy(ids), torch.from_numpy(labels.reshape(ids.shape))


def _mask_sequence(
    ids: np.ndarray,
    labels: np.ndarray,
    is_special: np.ndarray,
    mask_id: int,
    rng: np.random.Generator,
    mlm_probability: float,
    max_predictions: int | None,
    word_continuation: np.ndarray | None,
) -> None:
    """Mask `ids` in place and write the originals of the chosen positions into `labels`."""
    candidates = np.flatnonzero(~is_special[ids])
    if len(candidates) == 0:
        return
    count = max(1, round(mlm_probability * len(candidates)))
    if max_predictions is not None:
        count = min(count, max_predictions)
    if word_continuation is None:
        chosen = rng.choice(candidates, size=count, replace=False)
    else:
        chosen = _whole_word_positions(candidates, word_continuation[ids[candidates]], count, rng)
    labels[chosen] = ids[chosen]
    # 80% [MASK]; 10% a random token, so the model cannot trust unmasked inputs blindly; 10%
    # unchanged, so it also learns representations for the tokens it actually sees.
    roll = rng.random(len(chosen))
    ids[chosen[roll < 0.8]] = mask_id
    randomized = chosen[(roll >= 0.8) & (roll < 0.9)]
    ids[randomized] = _random_non_special(len(randomized), is_special, rng)


def _whole_word_positions(
    candidates: np.ndarray, continues: np.ndarray, count: int, rng: np.random.Generator
) -> np.ndarray:
    """Whole words in random order while they fit in `count` (BERT skips a word that would not)."""
    starts = ~continues
    starts[0] = True
    starts[1:] |= np.diff(candidates) != 1  # a piece after a special token starts a word
    words = np.split(candidates, np.flatnonzero(starts)[1:])
    chosen: list[int] = []
    for word in rng.permutation(len(words)):
        if len(chosen) + len(words[word]) <= count:
            chosen.extend(words[word])
        if len(chosen) == count:
            break
    return np.array(chosen, dtype=np.int64)


def _random_non_special(size: int, is_special: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # Rejection sampling: the specials are a handful of ids, so redraws are rare.
    tokens = rng.integers(0, len(is_special), size=size)
    while (redraw := is_special[tokens]).any():
        tokens[redraw] = rng.integers(0, len(is_special), size=int(redraw.sum()))
    return tokens


def wordpiece_continuations(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """True for each vocabulary id whose token continues a word (WordPiece "##" pieces)."""
    continuation = np.zeros(len(tokenizer), dtype=bool)
    for token, index in tokenizer.get_vocab().items():
        continuation[index] = token.startswith("##")
    if not continuation.any():
        raise ConfigError(
            "whole-word masking needs a WordPiece tokenizer ('##' pieces); this one has none"
        )
    return continuation


def _masking_options(
    tokenizer: PreTrainedTokenizerBase,
    mlm_probability: float,
    max_predictions: int | None,
    whole_word_mask: bool,
) -> dict:
    if tokenizer.mask_token_id is None:
        raise ConfigError("masked LM needs a tokenizer with a mask token ([MASK])")
    return {
        "special_ids": tokenizer.all_special_ids,
        "mask_id": tokenizer.mask_token_id,
        "vocab_size": len(tokenizer),
        "mlm_probability": mlm_probability,
        "max_predictions": max_predictions,
        "word_continuation": wordpiece_continuations(tokenizer) if whole_word_mask else None,
    }


def add_static_masks(
    examples: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    mlm_probability: float = 0.15,
    max_predictions: int | None = None,
    whole_word_mask: bool = False,
    seed: int = 0,
    num_proc: int | None = None,
) -> Dataset:
    """Mask every example once, as BERT's create_pretraining_data does (with dupe_factor copies
    getting different masks): input_ids masked, a "labels" column added. Row i's mask depends
    only on (seed, i, its ids)."""
    return examples.with_format(None).map(
        _static_mask_batch,
        batched=True,
        with_indices=True,
        fn_kwargs={
            "seed": seed,
            **_masking_options(tokenizer, mlm_probability, max_predictions, whole_word_mask),
        },
        num_proc=num_proc,
        desc="masking",
    )


def _static_mask_batch(
    batch: dict[str, list], indices: list[int], seed: int, **masking
) -> dict[str, list]:
    masked, labels = [], []
    for ids, index in zip(batch["input_ids"], indices, strict=True):
        new_ids, new_labels = mask_tokens_for_mlm(
            ids, rng=np.random.default_rng([seed, index]), **masking
        )
        masked.append(new_ids.tolist())
        labels.append(new_labels.tolist())
    return {"input_ids": masked, "labels": labels}


# ---------------------------------------------------------------- collators


class MLMCollator:
    """Pads a list of examples into a batch (right padding) and masks it for MLM.

    Masks are dynamic (new each epoch, BERT-style 80/10/10; see `mask_tokens_for_mlm`) unless
    the examples carry static "labels" (`add_static_masks`), which are then padded with -100.
    Each example's mask is drawn from a generator seeded by (seed, epoch, the example's ids):
    reproducible, independent of batch size, process count and of batches skipped on resume.
    Call `set_epoch(epoch)` at the start of every epoch.
    Returns input_ids, labels, attention_mask when some example is padded (`padding_mask`), and
    token_type_ids / next_sentence_label when the examples have them, all as int64 tensors.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mlm_probability: float = 0.15,
        max_predictions: int | None = None,
        whole_word_mask: bool = False,
        seed: int = 0,
    ) -> None:
        self.pad_id = tokenizer.pad_token_id
        self.masking = _masking_options(
            tokenizer, mlm_probability, max_predictions, whole_word_mask
        )
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        rows = [np.asarray(example["input_ids"], dtype=np.int64) for example in examples]
        if "labels" in examples[0]:
            labels = [np.asarray(example["labels"], dtype=np.int64) for example in examples]
        else:
            labels = []
            for index, ids in enumerate(rows):
                rows[index], row_labels = mask_tokens_for_mlm(
                    ids, rng=self._example_rng(ids), **self.masking
                )
                labels.append(row_labels)
        batch = {
            "input_ids": _pad(rows, self.pad_id),
            **padding_mask(rows),
            "labels": _pad(labels, -100),
        }
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = _pad([example["token_type_ids"] for example in examples], 0)
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = torch.tensor(
                [int(example["next_sentence_label"]) for example in examples], dtype=torch.long
            )
        return batch

    def _example_rng(self, ids: np.ndarray) -> np.random.Generator:
        digest = hashlib.blake2b(ids.tobytes(), digest_size=8).digest()
        return np.random.default_rng([self.seed, self.epoch, int.from_bytes(digest, "little")])


class CausalLMCollator:
    """Pads examples into a batch for GPT / ELMo: input_ids, labels (a copy of input_ids with
    -100 on padding; the models shift the labels themselves) and, when some example is padded,
    attention_mask (`padding_mask`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        pad_id = tokenizer.pad_token_id
        self.pad_id = tokenizer.eos_token_id if pad_id is None else pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        rows = [example["input_ids"] for example in examples]
        input_ids = _pad(rows, self.pad_id)
        batch = {"input_ids": input_ids, **padding_mask(rows)}
        if "attention_mask" in batch:
            batch["labels"] = input_ids.masked_fill(batch["attention_mask"] == 0, -100)
        else:
            batch["labels"] = input_ids.clone()
        return batch


def padding_mask(rows: Sequence[Sized]) -> dict[str, torch.Tensor]:
    """{"attention_mask": 1 on real tokens, 0 on padding} when the rows differ in length, {}
    when none needs padding. Decided here, on the host, so that the models take SDPA's unmasked
    (or is_causal) kernels without asking the device in every forward (a stall, and a break in
    a compiled graph; layers.self_attention_mask)."""
    lengths = [len(row) for row in rows]
    if min(lengths) == max(lengths):
        return {}
    return {"attention_mask": _pad([np.ones(length, dtype=np.int64) for length in lengths], 0)}


def _pad(rows: Sequence[Sequence[int] | np.ndarray | torch.Tensor], value: int) -> torch.Tensor:
    """Right-pad rows of ids into a (batch, longest) int64 tensor."""
    padded = np.full((len(rows), max(len(row) for row in rows)), value, dtype=np.int64)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = row
    return torch.from_numpy(padded)
