"""A pretraining corpus from a run's options: the sources loaded, tokenized and made into the
family's examples, with their collator. `egbert pretrain` builds them in memory (or streams
them); `egbert prepare` builds the same examples and stores them in a prepared folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset, concatenate_datasets

from egbert.config import PretrainArguments
from egbert.errors import ConfigError
from egbert.pretrain import collators, data, sources

Documents = Dataset | IterableDataset


def load_corpus(args: PretrainArguments, seed: int) -> tuple[Documents, Documents | None]:
    """The training documents and the validation documents (None without validation)."""
    options = {
        "text_column": args.text_column,
        "doc_boundary": args.doc_boundary,
        "encoding": args.encoding,
        "errors": args.encoding_errors,
        "streaming": args.streaming,
        "seed": seed,
    }
    train = sources.load_documents(
        args.train_files,
        dataset=args.dataset,
        dataset_config=args.dataset_config,
        split=args.split,
        weights=args.source_weights or None,
        **options,
    )
    if args.validation_files:
        return train, sources.load_documents(args.validation_files, **options)
    if args.validation_split is not None:
        validation = sources.load_hub_documents(
            args.dataset,
            args.text_column,
            args.validation_split,
            args.dataset_config,
            args.streaming,
        )
        return train, validation
    if args.validation_split_percentage is not None:
        return sources.split_validation(train, args.validation_split_percentage)
    return train, None


def build_examples(
    args: PretrainArguments, tokenizer, files: list[str], seed: int
) -> tuple[Dataset | IterableDataset, Any]:
    """Files (the kinds --train-files takes) -> this family's examples, and their collator."""
    documents = sources.load_documents(
        files,
        text_column=args.text_column,
        doc_boundary=args.doc_boundary,
        encoding=args.encoding,
        errors=args.encoding_errors,
        streaming=args.streaming,
        seed=seed,
    )
    return examples_from_documents(args, tokenizer, documents, seed)


def examples_from_documents(
    args: PretrainArguments, tokenizer, documents: Documents, seed: int
) -> tuple[Dataset | IterableDataset, Any]:
    """Documents -> token ids -> this family's examples, and the collator for them."""
    tokenized = tokenize_for_family(args, tokenizer, documents)
    examples = examples_from_tokens(args, tokenizer, tokenized, seed)
    return examples, build_collator(args, tokenizer, seed)


def tokenize_for_family(args: PretrainArguments, tokenizer, documents: Documents) -> Documents:
    """Documents -> token ids (one row per document: its sentences' ids for bert)."""
    check_special_tokens(args, tokenizer)
    return data.tokenize_documents(
        documents, tokenizer, split_sentences=args.model == "bert", num_proc=args.num_proc
    )


def examples_from_tokens(
    args: PretrainArguments, tokenizer, tokenized: Documents, seed: int
) -> Dataset | IterableDataset:
    """Tokenized documents -> this family's examples (before the collator's dynamic masking)."""
    if args.model != "bert":
        return data.pack_blocks(tokenized, args.seq_len, tokenizer.eos_token_id)
    ids = {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id}
    if args.nsp:
        examples = data.build_nsp_examples(
            tokenized,
            args.seq_len,
            short_seq_prob=args.short_seq_prob,
            dupe_factor=args.dupe_factor,
            seed=seed,
            num_proc=args.num_proc,
            **ids,
        )
    else:
        examples = data.build_mlm_examples(tokenized, args.seq_len, **ids)
        if args.dupe_factor > 1:  # copies of the blocks, each masked differently below
            examples = concatenate_datasets([examples] * args.dupe_factor)
    if args.dupe_factor > 1:  # static masks, one set per duplicate, as BERT's original data
        examples = data.add_static_masks(
            examples,
            tokenizer,
            mlm_probability=args.mlm_probability,
            whole_word_mask=args.whole_word_mask,
            seed=seed,
            num_proc=args.num_proc,
        )
    return examples


def build_collator(args: PretrainArguments, tokenizer, seed: int) -> Any:
    """The family's collator: batches, and masks bert's examples anew each epoch."""
    if args.model != "bert":
        return collators.CausalLMCollator(tokenizer)
    return collators.MLMCollator(
        tokenizer,
        mlm_probability=args.mlm_probability,
        whole_word_mask=args.whole_word_mask,
        seed=seed,
    )


def check_special_tokens(args: PretrainArguments, tokenizer) -> None:
    needed = ("cls_token", "sep_token", "mask_token", "pad_token")
    if args.model != "bert":
        needed = ("eos_token",)  # joins the documents of packed blocks
    missing = [name for name in needed if getattr(tokenizer, name) is None]
    if missing:
        raise ConfigError(
            f"--tokenizer {args.tokenizer} has no {', '.join(missing)}, which --model "
            f"{args.model} needs; train one with `egbert tokenizer train`"
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
