"""A pretraining corpus from a run's options: the sources loaded, tokenized and made into the
family's examples, with their collator. `egbert pretrain` builds them in memory (or streams
them); `egbert prepare` builds the same examples and stores them in a prepared folder. Each step
takes the family and the parts of the options it reads: the data's, the objective's
(egbert.pretrain.options).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from datasets import Dataset, IterableDataset, concatenate_datasets

from egbert import sources
from egbert.errors import ConfigError
from egbert.pretrain import collators, data
from egbert.pretrain.options import DataArguments, ObjectiveArguments

Documents = Dataset | IterableDataset

# Under this share of the corpus's tokens in the examples, prepare and pretrain warn.
MIN_SHARE_USED = 0.9


@dataclass(frozen=True)
class CorpusUse:
    """How much of a corpus its examples hold: its token positions (special tokens aside) and
    how many of them are in at least one example (bert's NotNext segments, drawn from other
    documents, are not counted again)."""

    corpus_tokens: int
    used_tokens: int

    @property
    def share(self) -> float:
        return self.used_tokens / self.corpus_tokens if self.corpus_tokens else 1.0

    def report(self, split: str) -> list[str]:
        """What a run says of it: one line, and a warning under MIN_SHARE_USED."""
        lines = [
            f"egbert: the {split} examples hold {self.share:.1%} of the corpus's "
            f"{self.corpus_tokens:,} tokens ({self.used_tokens:,})"
        ]
        if self.share < MIN_SHARE_USED:
            lines.append(
                f"egbert: warning: only {self.share:.1%} of the {split} corpus's tokens reach an "
                "example; the last partial block of each pack is dropped, so a corpus of few "
                "blocks loses much of itself: use a shorter --seq-len or more text"
            )
        return lines


def load_corpus(data_args: DataArguments, seed: int) -> tuple[Documents, Documents | None]:
    """The training documents and the validation documents (None without validation)."""
    options = {
        "text_column": data_args.text_column,
        "doc_boundary": data_args.doc_boundary,
        "encoding": data_args.encoding,
        "errors": data_args.encoding_errors,
        "streaming": data_args.streaming,
        "seed": seed,
    }
    train = sources.load_documents(
        data_args.train_files,
        dataset=data_args.dataset,
        dataset_config=data_args.dataset_config,
        split=data_args.split,
        weights=data_args.source_weights or None,
        **options,
    )
    if data_args.validation_files:
        return train, sources.load_documents(data_args.validation_files, **options)
    if data_args.validation_split is not None:
        validation = sources.load_hub_documents(
            data_args.dataset,
            data_args.text_column,
            data_args.validation_split,
            data_args.dataset_config,
            data_args.streaming,
        )
        return train, validation
    if data_args.validation_split_percentage is not None:
        return sources.split_validation(train, data_args.validation_split_percentage)
    return train, None


def build_examples(
    family: str,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    tokenizer,
    files: list[str],
    seed: int,
) -> tuple[Dataset | IterableDataset, Any]:
    """Files (the kinds --train-files takes) -> this family's examples, and their collator."""
    documents = sources.load_documents(
        files,
        text_column=data_args.text_column,
        doc_boundary=data_args.doc_boundary,
        encoding=data_args.encoding,
        errors=data_args.encoding_errors,
        streaming=data_args.streaming,
        seed=seed,
    )
    parts = (family, data_args, objective_args, tokenizer, documents, seed)
    examples, collator, _ = examples_from_documents(*parts)
    return examples, collator


def examples_from_documents(
    family: str,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    tokenizer,
    documents: Documents,
    seed: int,
) -> tuple[Dataset | IterableDataset, Any, CorpusUse | None]:
    """Documents -> token ids -> this family's examples, their collator, and the share of the
    corpus they hold (None for a stream: it is built as it is read)."""
    tokenized = tokenize_for_family(family, data_args, tokenizer, documents)
    parts = (family, data_args, objective_args, tokenizer, tokenized, seed)
    examples, use = examples_from_tokens(*parts)
    return examples, build_collator(family, objective_args, tokenizer, seed), use


def tokenize_for_family(
    family: str, data_args: DataArguments, tokenizer, documents: Documents
) -> Documents:
    """Documents -> token ids (one row per document: its sentences' ids for bert)."""
    check_special_tokens(family, data_args.tokenizer, tokenizer)
    return data.tokenize_documents(
        documents, tokenizer, split_sentences=family == "bert", num_proc=data_args.num_proc
    )


def examples_from_tokens(
    family: str,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    tokenizer,
    tokenized: Documents,
    seed: int,
) -> tuple[Dataset | IterableDataset, CorpusUse | None]:
    """Tokenized documents -> this family's examples (before the collator's dynamic masking),
    and the share of the corpus they hold (None for a stream)."""
    ids = {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id}
    if family != "bert":
        examples = data.pack_blocks(tokenized, data_args.seq_len, tokenizer.eos_token_id)
    elif objective_args.nsp:
        examples = data.build_nsp_examples(
            tokenized,
            data_args.seq_len,
            short_seq_prob=objective_args.short_seq_prob,
            dupe_factor=objective_args.dupe_factor,
            seed=seed,
            num_proc=data_args.num_proc,
            **ids,
        )
    else:
        examples = data.build_mlm_examples(tokenized, data_args.seq_len, **ids)
    examples, use = _measured_use(examples, tokenized)
    if objective_args.dupe_factor > 1:  # bert's alone (gpt and elmo refuse it)
        examples = _static_masked_copies(examples, objective_args, data_args, tokenizer, seed)
    return examples, use


def _measured_use(
    examples: Dataset | IterableDataset, tokenized: Documents
) -> tuple[Dataset | IterableDataset, CorpusUse | None]:
    """The examples without their NEW_CORPUS_TOKENS column, and its sum over the corpus's
    tokens (None for a stream: it is built as it is read)."""
    use = None
    if isinstance(examples, Dataset):
        used = pc.sum(examples.data.column(data.NEW_CORPUS_TOKENS)).as_py() or 0
        use = CorpusUse(data.corpus_token_count(tokenized), used)
    return examples.remove_columns(data.NEW_CORPUS_TOKENS), use


def _static_masked_copies(
    examples: Dataset,
    objective_args: ObjectiveArguments,
    data_args: DataArguments,
    tokenizer,
    seed: int,
) -> Dataset:
    """BERT's original data: --dupe-factor copies (NSP pairs are drawn anew in each pass
    already; packed blocks are copied here), each masked once, differently."""
    if not objective_args.nsp:
        examples = concatenate_datasets([examples] * objective_args.dupe_factor)
    return data.add_static_masks(
        examples,
        tokenizer,
        mlm_probability=objective_args.mlm_probability,
        whole_word_mask=objective_args.whole_word_mask,
        seed=seed,
        num_proc=data_args.num_proc,
    )


def build_collator(family: str, objective_args: ObjectiveArguments, tokenizer, seed: int) -> Any:
    """The family's collator: batches, and masks bert's examples anew each epoch."""
    if family != "bert":
        return collators.CausalLMCollator(tokenizer)
    return collators.MLMCollator(
        tokenizer,
        mlm_probability=objective_args.mlm_probability,
        whole_word_mask=objective_args.whole_word_mask,
        seed=seed,
    )


def check_special_tokens(family: str, tokenizer_name: str | None, tokenizer) -> None:
    needed = ("cls_token", "sep_token", "mask_token", "pad_token")
    if family != "bert":
        needed = ("eos_token",)  # joins the documents of packed blocks
    missing = [name for name in needed if getattr(tokenizer, name) is None]
    if missing:
        raise ConfigError(
            f"--tokenizer {tokenizer_name} has no {', '.join(missing)}, which --model "
            f"{family} needs; train one with `egbert tokenizer train`"
        )


def file_identities(files: list[str]) -> list[str]:
    """Each file's resolved path and size (or "folder", "missing"): what a resumed run or a
    second `egbert prepare` compares."""
    identities = []
    for name in files:
        path = Path(name).resolve()
        size = (
            f"{path.stat().st_size} bytes"
            if path.is_file()
            else "folder"
            if path.is_dir()
            else "missing"
        )
        identities.append(f"{path} ({size})")
    return identities
