"""The shared tokenizer: train WordPiece or byte-level BPE, load it from any route, report stats.

One tokenizer serves bert, gpt and elmo so their results are comparable. It is saved as a
`PreTrainedTokenizerFast`, so `transformers.AutoTokenizer.from_pretrained(DIR)` loads it offline.
It can also be built from a stock BERT `vocab.txt` or from GPT-2's `vocab.json` + `merges.txt`.
Every model folder holds the tokenizer made for its family by `tokenizer_for_family` (the same
vocabulary, the special tokens that family's models were pretrained with, their length limit).

CLI: `egbert tokenizer train ...` and `egbert tokenizer stats ...` (see `--help`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerFast

from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.families import FAMILY_OF_MODEL_TYPE, MODEL_FAMILIES
from egbert.model_files import hub_id_note, resolve_model_dir
from egbert.outputs import check_output_folder
from egbert.sources import (
    DECODE_ERRORS,
    ENCODING_ERRORS_HELP,
    check_encoding,
    check_text_files,
    decode_line,
    load_sources,
    mix_sources,
    text_batches,
)

PAD, UNK, CLS, SEP, MASK, EOT = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK, EOT]
# Token type ids are listed explicitly: transformers 5 drops them for a tokenizer built from a
# `tokenizers` object unless `model_input_names` names them, and BERT's NSP needs them.
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
SPECIAL_ROLES = (
    "pad_token",
    "unk_token",
    "cls_token",
    "sep_token",
    "mask_token",
    "bos_token",
    "eos_token",
)
# elmo's LSTMs have no position table, so no hard limit: this one bounds what `truncation=True`
# lets through to them. BERT's length: 8x elmo's 64-token pretraining blocks, 4x fine-tuning's
# default 128; `egbert embed`, which holds inputs to the tokenizer's limit, rarely meets it.
RECURRENT_MAX_LENGTH = 512
KINDS = ("wordpiece", "bpe")
ENCODING_HELP = "the files' encoding"


@dataclass
class TokenizerTrainArguments:
    """The options of `egbert tokenizer train`, the arguments of `train_tokenizer` (--out is its
    out_dir)."""

    _argument_group_name = None  # among the parser's own options

    files: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "corpus files, read as pretrain's --train-files: text (.txt, .tokens, ...; "
            "also .gz .bz2 .xz .zst; each non-blank line a text), .jsonl/.json/.csv/.parquet "
            "(each row a text), or a data set folder (save_to_disk, or files load_dataset reads)"
        },
    )
    dataset: str | None = field(
        default=None, metadata={"help": "a Hub data set (or its local copy), as pretrain's"}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "--dataset's configuration"})
    split: str = field(default="train", metadata={"help": "--dataset's split"})
    text_column: str | None = field(
        default=None,
        metadata={
            "help": "the column of the text in tables and data sets (default: the only string "
            "column, else one named text, content or document)"
        },
    )
    source_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "mix the sources (each of --files, then --dataset) with these weights, as "
            "pretrain"
        },
    )
    kind: str = field(
        default="wordpiece", metadata={"help": "the tokenizer's model", "choices": KINDS}
    )
    vocab_size: int = field(default=30522, metadata={"help": "tokens in the vocabulary"})
    lowercase: bool = field(default=False, metadata={"help": "lowercase (and strip accents)"})
    min_frequency: int = field(default=2, metadata={"help": "fewer occurrences: not a token"})
    encoding: str = field(default="utf-8", metadata={"help": ENCODING_HELP})
    encoding_errors: str = field(
        default="strict", metadata={"help": ENCODING_ERRORS_HELP, "choices": DECODE_ERRORS}
    )
    out: str = field(kw_only=True, metadata={"help": "output directory"})


@dataclass
class TokenizerStatsArguments:
    """The options of `egbert tokenizer stats`: `tokenizer_stats`'s arguments (--tokenizer: the
    folder it is loaded from), and how they are printed."""

    _argument_group_name = None  # among the parser's own options

    tokenizer: str = field(metadata={"help": "tokenizer or model directory"})
    files: list[str] = field(metadata={"help": "text files, one text per line"})
    encoding: str = field(default="utf-8", metadata={"help": ENCODING_HELP})
    encoding_errors: str = field(
        default="strict", metadata={"help": ENCODING_ERRORS_HELP, "choices": DECODE_ERRORS}
    )
    json: bool = field(default=False, metadata={"help": "print the statistics as JSON"})


def iter_lines(
    files: Sequence[str | os.PathLike], encoding: str = "utf-8", errors: str = "strict"
) -> Iterator[str]:
    """Yield the non-blank lines of each file, streaming; a decode error names the byte offset
    (with errors="strict"; "replace" substitutes U+FFFD for undecodable bytes instead)."""
    check_encoding(encoding, errors)
    for file in files:
        offset = 0
        with open(file, "rb") as handle:
            for raw in handle:
                line = decode_line(raw, file, offset, encoding, errors)
                offset += len(raw)
                if line.strip():
                    yield line.rstrip("\r\n")


def _wordpiece_pipeline(model: models.WordPiece, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _byte_level_pipeline(model: models.BPE, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _add_bert_template(tokenizer: Tokenizer, cls: str = CLS, sep: str = SEP) -> None:
    """`[CLS] A [SEP]` for one text, `[CLS] A [SEP] B [SEP]` with type ids 0/1 for a pair."""
    cls_id, sep_id = tokenizer.token_to_id(cls), tokenizer.token_to_id(sep)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )


def _add_document_template(tokenizer: Tokenizer, eos: str | None) -> None:
    """A text as it is (pretraining packs documents with no other specials); a pair as two
    documents, `A <|endoftext|> B`, the separator pretraining put between them."""
    if eos is None:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
        return
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A", pair=f"$A {eos} $B:1", special_tokens=[(eos, tokenizer.token_to_id(eos))]
    )


def _wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a `tokenizers` object, naming whichever of egbert's special tokens its vocab has."""
    roles = {
        "pad_token": PAD,
        "unk_token": UNK,
        "cls_token": CLS,
        "sep_token": SEP,
        "mask_token": MASK,
        "eos_token": EOT,
        "bos_token": EOT,
    }
    present = {
        role: token for role, token in roles.items() if tokenizer.token_to_id(token) is not None
    }
    if "pad_token" not in present and "eos_token" in present:
        present["pad_token"] = EOT  # GPT-2 has no pad token; padding is masked out anyway
    if "unk_token" not in present and "eos_token" in present:
        present["unk_token"] = EOT
    model_input_names = MODEL_INPUT_NAMES if "cls_token" in present else MODEL_INPUT_NAMES[::2]
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_input_names=model_input_names, **present
    )


def train_tokenizer(
    files: Sequence[str | os.PathLike] = TokenizerTrainArguments.files,
    kind: str = TokenizerTrainArguments.kind,
    vocab_size: int = TokenizerTrainArguments.vocab_size,
    lowercase: bool = TokenizerTrainArguments.lowercase,
    out_dir: str | os.PathLike | None = None,
    min_frequency: int = TokenizerTrainArguments.min_frequency,
    encoding: str = TokenizerTrainArguments.encoding,
    show_progress: bool = True,
    encoding_errors: str = TokenizerTrainArguments.encoding_errors,
    dataset: str | None = TokenizerTrainArguments.dataset,
    dataset_config: str | None = TokenizerTrainArguments.dataset_config,
    split: str = TokenizerTrainArguments.split,
    text_column: str | None = TokenizerTrainArguments.text_column,
    source_weights: Sequence[float] | None = TokenizerTrainArguments.source_weights,
) -> PreTrainedTokenizerFast:
    """Train the shared tokenizer on a corpus and optionally save it.

    The corpus is read as pretraining reads it (egbert.sources): `files` of every kind
    --train-files takes (text, also compressed; .jsonl .json .csv .parquet: `text_column`; data
    set folders) and a Hub `dataset` (or its local copy), mixed by `source_weights`, streamed
    (nothing is cached); each non-blank line of a text file, each row of a table, is one text.
    WordPiece uses BERT's normalization and pre-tokenization; "bpe" is GPT-2-style byte-level BPE.
    Every tokenizer has `[PAD] [UNK] [CLS] [SEP] [MASK]` and `<|endoftext|>` (the document
    separator for causal LM packing), and encodes pairs as `[CLS] A [SEP] B [SEP]`.
    """
    _check_training_options(kind, vocab_size, min_frequency)
    if not files and dataset is None:
        raise DataError("no corpus given; pass files with --files, a data set with --dataset")
    if out_dir is not None:
        check_output_folder(out_dir, "--out")
    sources = load_sources(
        files,
        dataset=dataset,
        dataset_config=dataset_config,
        split=split,
        text_column=text_column,
        weights=source_weights or None,
        doc_boundary="line",
        encoding=encoding,
        errors=encoding_errors,
        streaming=True,
    )
    # A first pass reads every source through, so a bad byte or row fails (naming its file)
    # before minutes of training, and gives the trainer's progress bar its length.
    texts = sum(_count_texts(documents, source) for documents, source in sources)
    corpus = mix_sources([documents for documents, _ in sources], source_weights or None)
    batches = text_batches(corpus, [source for _, source in sources])
    options = {"vocab_size": vocab_size, "min_frequency": min_frequency}
    options |= {"special_tokens": SPECIAL_TOKENS, "show_progress": show_progress}
    length = None if source_weights else texts
    if kind == "wordpiece":
        tokenizer = _train_wordpiece(batches, lowercase, options, length)
    else:
        tokenizer = _byte_level_pipeline(models.BPE(), lowercase)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, **options)
        tokenizer.train_from_iterator(batches, trainer=trainer, length=length)
    _add_bert_template(tokenizer)
    wrapped = _wrap(tokenizer)
    if out_dir is not None:
        save_tokenizer(wrapped, out_dir)
    return wrapped


def _check_training_options(kind: str, vocab_size: int, min_frequency: int) -> None:
    if kind not in KINDS:
        raise ConfigError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    if min_frequency < 0:
        raise ConfigError(f"--min-frequency must be >= 0, got {min_frequency}")
    minimum = len(SPECIAL_TOKENS) + (256 if kind == "bpe" else 1)
    if vocab_size < minimum:
        raise ConfigError(
            f"--vocab-size {vocab_size} is too small for a {kind} tokenizer: it needs at least "
            f"{minimum} entries (the special tokens{', plus 256 bytes' if kind == 'bpe' else ''})"
        )


def _count_texts(documents, source: object) -> int:
    count = sum(len(batch) for batch in text_batches(documents, source))
    if count == 0:
        raise DataError(f"{source}: no text (only blank lines or empty rows)")
    return count


# huggingface/tokenizers#1794 (open; the fix, PR #2066, is in no release): WordPieceTrainer numbers
# the `##` pieces in the order of a hash map, and breaks ties between merges of equal counts by id,
# so two trainings on the same texts give different vocabularies. The characters of the base
# alphabet are numbered in sorted order, though. So each character after a word's first is
# spelled as a character of its own, its code point moved up into the supplementary private-use
# planes (U+F0000 up), a plain BPE learns those words, and its pieces are read back as WordPiece's:
# a piece that starts with a moved character is a `##` piece.
CONTINUING_OFFSET = 0xF0000
MOVABLE_LIMIT = 0x110000 - CONTINUING_OFFSET  # code points below this fit in the planes


class _ContinuingSpelling(dict):
    """A `str.translate` table: a character inside a word -> its stand-in above U+F0000. The
    few characters beyond U+1FFFF stay as they are (in `unmoved`); they get their `##` piece
    after training. `fresh` holds the characters met for the first time inside a word: WordPiece's
    alphabet has each character both ways, so they are also given to the trainer as words of one
    character, which adds them to its alphabet and to no pair's count."""

    def __init__(self) -> None:
        super().__init__()
        self.unmoved: set[str] = set()
        self.fresh: list[str] = []

    def __missing__(self, code: int) -> int:
        self.fresh.append(chr(code))
        if code < MOVABLE_LIMIT:
            self[code] = CONTINUING_OFFSET + code
        else:
            self.unmoved.add(chr(code))
            self[code] = code
        return self[code]

    def text(self, words: Iterator[str]) -> str:
        spelled = " ".join(word[:1] + word[1:].translate(self) for word in words)
        if self.fresh:
            spelled = " ".join([spelled, *self.fresh])
            self.fresh.clear()
        return spelled


def _as_wordpiece(piece: str) -> str:
    """A piece of the spelled words -> WordPiece's spelling (`##` for a piece inside a word; the
    special tokens, which were never spelled, as they are)."""
    plain = "".join(
        chr(ord(c) - CONTINUING_OFFSET) if ord(c) >= CONTINUING_OFFSET else c for c in piece
    )
    return f"##{plain}" if piece and ord(piece[0]) >= CONTINUING_OFFSET else plain


def _words(pre_tokenizer: pre_tokenizers.PreTokenizer, text: str) -> Iterator[str]:
    """The pre-tokenizer's words of a normalized text. BERT's pre-tokenizer splits at whitespace
    and punctuation, so a word of letters and digits alone is asked of it no further (five times
    faster on WikiText than asking it each whole text)."""
    for word in text.split():
        if word.isalnum():
            yield word
        else:
            yield from (piece for piece, _ in pre_tokenizer.pre_tokenize_str(word))


def _train_wordpiece(
    batches: Iterator[list[str]], lowercase: bool, options: dict, length: int | None
) -> Tokenizer:
    """WordPieceTrainer's vocabulary, learnt in the same order in every process (see above)."""
    reader = _wordpiece_pipeline(models.WordPiece(unk_token=UNK), lowercase)
    normalizer, pre_tokenizer = reader.normalizer, reader.pre_tokenizer
    spelling = _ContinuingSpelling()

    def spelled(batch: list[str]) -> list[str]:
        return [spelling.text(_words(pre_tokenizer, normalizer.normalize_str(t))) for t in batch]

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(**options)
    learner.train_from_iterator(map(spelled, batches), trainer=trainer, length=length)
    learnt = learner.get_vocab()
    pieces = [_as_wordpiece(piece) for piece in sorted(learnt, key=learnt.get)]
    unmoved = [f"##{char}" for char in sorted(spelling.unmoved)]
    # their room is taken from the last merges, as the stock trainer's alphabet would have taken it
    merges = sum(len(piece) > 1 for piece in learnt) - len(SPECIAL_TOKENS)
    over = min(merges, max(0, len(pieces) + len(unmoved) - options["vocab_size"]))
    pieces = pieces[: len(pieces) - over] + unmoved
    vocab = {piece: index for index, piece in enumerate(pieces)}
    tokenizer = _wordpiece_pipeline(models.WordPiece(vocab, unk_token=UNK), lowercase)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | os.PathLike) -> None:
    """Save through a temporary folder, so a failure leaves no half-written tokenizer in `out_dir`
    (files already there from another run are only replaced at the end)."""
    out = Path(out_dir)
    staging = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        tokenizer.save_pretrained(staging)
        out.mkdir(exist_ok=True)
        for file in staging.iterdir():
            os.replace(file, out / file.name)
    except OSError as error:
        reason = error.strerror or str(error)
        raise CheckpointError(f"cannot write the tokenizer to {out}: {reason}") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def tokenizer_for_family(
    tokenizer: PreTrainedTokenizerFast, family: str, max_length: int
) -> PreTrainedTokenizerFast:
    """A copy of `tokenizer` that encodes text the way `family`'s models were pretrained on it,
    with `max_length` as its model_max_length (what `truncation=True` cuts to).

    bert: `[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`, and token_type_ids among the model inputs.
    gpt and elmo: the text alone, as pretraining packs it (egbert.pretrain.data.pack_blocks:
    documents each followed by `<|endoftext|>`, no other specials), a pair as `A <|endoftext|> B`;
    no token_type_ids (they have no segments, and stock GPT-2 would add them as word embeddings).
    So `pipeline("text-generation")` prompts a gpt model with exactly the prompt's tokens.
    """
    if family not in MODEL_FAMILIES:
        raise ConfigError(
            f"unknown model family {family!r}; choose one of {', '.join(MODEL_FAMILIES)}"
        )
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    if family == "bert":
        if tokenizer.cls_token is None or tokenizer.sep_token is None:
            raise CheckpointError(
                "the tokenizer has no [CLS]/[SEP] tokens, which every bert input starts and ends "
                "with; train one with `egbert tokenizer train`"
            )
        _add_bert_template(backend, tokenizer.cls_token, tokenizer.sep_token)
        input_names = MODEL_INPUT_NAMES
    else:
        _add_document_template(backend, tokenizer.eos_token)
        input_names = [name for name in MODEL_INPUT_NAMES if name != "token_type_ids"]
    roles = {role: getattr(tokenizer, role) for role in SPECIAL_ROLES}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_input_names=input_names,
        model_max_length=max_length,
        clean_up_tokenization_spaces=tokenizer.clean_up_tokenization_spaces,
        **{role: token for role, token in roles.items() if token is not None},
    )


def tokenizer_for_model(
    tokenizer: PreTrainedTokenizerFast, config: PretrainedConfig, sequence_length: int | None = None
) -> PreTrainedTokenizerFast:
    """`tokenizer_for_family` for the model `config` describes: the family from its model_type,
    the length from its position table (elmo has none: the longer of RECURRENT_MAX_LENGTH and
    `sequence_length`, the length it was pretrained on)."""
    family = FAMILY_OF_MODEL_TYPE.get(config.model_type)
    if family is None:
        raise CheckpointError(
            f"no tokenizer rules for a {config.model_type!r} model; egbert knows "
            f"{', '.join(FAMILY_OF_MODEL_TYPE)}"
        )
    max_length = getattr(config, "max_position_embeddings", None)
    if max_length is None:
        max_length = max(RECURRENT_MAX_LENGTH, sequence_length or 0)
    return tokenizer_for_family(tokenizer, family, max_length)


def _vocab_is_lowercase(vocab: dict[str, int]) -> bool:
    return not any(token.lower() != token for token in vocab if not token.startswith("["))


def _from_wordpiece_vocab(vocab_file: Path) -> PreTrainedTokenizerFast:
    vocab = models.WordPiece.read_file(str(vocab_file))
    missing = [token for token in (PAD, UNK, CLS, SEP, MASK) if token not in vocab]
    if missing:
        raise CheckpointError(f"{vocab_file}: not a BERT vocab, it lacks {', '.join(missing)}")
    tokenizer = _wordpiece_pipeline(
        models.WordPiece(vocab, unk_token=UNK), lowercase=_vocab_is_lowercase(vocab)
    )
    _add_bert_template(tokenizer)
    return _wrap(tokenizer)


def _from_bpe_files(vocab_file: Path, merges_file: Path) -> PreTrainedTokenizerFast:
    vocab, merges = models.BPE.read_file(str(vocab_file), str(merges_file))
    tokenizer = _byte_level_pipeline(models.BPE(vocab, merges), lowercase=False)
    if CLS in vocab and SEP in vocab:
        _add_bert_template(tokenizer)
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return _wrap(tokenizer)


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a tokenizer from a saved directory (egbert's or any with `tokenizer.json`), a stock
    BERT `vocab.txt` (file or directory), or GPT-2's `vocab.json` + `merges.txt` directory; a
    training run's directory stands for its model/ folder."""
    path = resolve_model_dir(path)
    if path.is_file() and path.suffix == ".txt":
        return _from_wordpiece_vocab(path)
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: no such tokenizer directory; train one with "
            "`egbert tokenizer train` or pass a model directory" + hub_id_note(path)
        )
    if (path / "tokenizer.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as error:  # the Rust parser raises a bare Exception on a broken file
            message = str(error).strip().splitlines()[0] if str(error).strip() else "unreadable"
            raise CheckpointError(
                f"{path / 'tokenizer.json'} cannot be read ({message}); save the tokenizer "
                "again or train one with `egbert tokenizer train`"
            ) from None
        # A saved BERT template whose token_type_ids a save lost; a gpt or elmo tokenizer keeps
        # [CLS] in its vocabulary but not in its template, and its models take no segments.
        starts_with_cls = tokenizer("")["input_ids"][:1] == [tokenizer.cls_token_id]
        if starts_with_cls and "token_type_ids" not in tokenizer.model_input_names:
            tokenizer.model_input_names = MODEL_INPUT_NAMES
        return tokenizer
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return _from_bpe_files(path / "vocab.json", path / "merges.txt")
    if (path / "vocab.txt").is_file():
        return _from_wordpiece_vocab(path / "vocab.txt")
    raise CheckpointError(
        f"{path}: no tokenizer found; expected tokenizer.json, vocab.txt or vocab.json+merges.txt"
    )


def check_vocab_matches(
    tokenizer: PreTrainedTokenizerFast, vocab_size: int, model_name: str
) -> None:
    """Refuse a tokenizer with ids the model's embedding table does not have (they would index
    out of range, or train into NaNs on some backends)."""
    if len(tokenizer) > vocab_size:
        raise CheckpointError(
            f"the tokenizer has {len(tokenizer)} tokens but {model_name} has vocab_size "
            f"{vocab_size}; use the tokenizer the model was trained with"
        )


def tokenizer_stats(
    tokenizer: PreTrainedTokenizerFast,
    files: Sequence[str | os.PathLike],
    encoding: str = TokenizerStatsArguments.encoding,
    batch_lines: int = 10_000,
    encoding_errors: str = TokenizerStatsArguments.encoding_errors,
) -> dict[str, float]:
    """Tokens per word, unknown-token rate, per-line length percentiles and encoding throughput."""
    backend = tokenizer.backend_tokenizer
    unk_id = tokenizer.unk_token_id
    lengths: list[int] = []
    words = unknown = text_bytes = 0
    seconds = 0.0

    def encode(batch: list[str]) -> None:
        nonlocal words, unknown, text_bytes, seconds
        start = time.perf_counter()
        encodings = backend.encode_batch(batch, add_special_tokens=False)
        seconds += time.perf_counter() - start
        text_bytes += sum(len(line.encode("utf-8")) for line in batch)
        words += sum(len(line.split()) for line in batch)
        for encoding_ in encodings:
            lengths.append(len(encoding_.ids))
            unknown += encoding_.ids.count(unk_id) if unk_id is not None else 0

    batch: list[str] = []
    paths = check_text_files(files, "--files")
    lines = iter_lines(paths, encoding, encoding_errors)
    for line in tqdm(lines, desc="encoding", unit=" lines"):
        batch.append(line)
        if len(batch) == batch_lines:
            encode(batch)
            batch = []
    if batch:
        encode(batch)
    if not lengths:
        raise DataError(f"{', '.join(map(str, files))}: no text (only blank lines)")
    tokens = int(np.sum(lengths))
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {
        "vocab_size": len(tokenizer),
        "lines": len(lengths),
        "words": words,
        "tokens": tokens,
        "tokens_per_word": tokens / max(words, 1),
        "unknown_rate": unknown / max(tokens, 1),
        "length_p50": float(p50),
        "length_p90": float(p90),
        "length_p99": float(p99),
        "length_max": int(np.max(lengths)),
        "encode_mb_per_s": text_bytes / 1e6 / max(seconds, 1e-9),
    }


def format_stats(stats: dict[str, float]) -> str:
    width = max(len(key) for key in stats)
    return "\n".join(
        f"{key:<{width}}  {value:,.4f}"
        if isinstance(value, float)
        else f"{key:<{width}}  {value:,}"
        for key, value in stats.items()
    )
