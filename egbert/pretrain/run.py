"""`egbert pretrain`: config -> tokenizer, data, model -> the shared trainer.

    egbert pretrain --model bert --preset tiny --tokenizer tok/ --train-files wiki.train.tokens \\
        --validation-files wiki.valid.tokens --doc-boundary wikitext --output-dir runs/bert-tiny \\
        --max-steps 1000 --eval-every 200 --save-every 200

or from Python, with the same options as keyword arguments:

    egbert.run_pretraining(model="bert", preset="tiny", tokenizer="tok/", ...)

The output directory ends up with model/ (model.safetensors, config.json, the tokenizer and a
model card: loadable with `from_pretrained`), checkpoints/step-N/, metrics.jsonl, train.log,
train_results.json, logs/ for the trackers and loss_curve.png.
Evaluation reports, per family: bert MLM loss, MLM accuracy and NSP accuracy (with --objective
rtd: the generator's MLM loss, the detection loss and accuracy, and the share of replaced tokens);
gpt loss and perplexity; elmo forward, backward and mean perplexity.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from datasets import Dataset, IterableDataset
from transformers import PreTrainedModel

from egbert.checkpoints import load_pretrained, read_model_config
from egbert.config import (
    PretrainArguments,
    TrainingArguments,
    apply_config_overrides,
    arguments_from_options,
    load_preset,
    parse_args,
)
from egbert.errors import CheckpointError, ConfigError
from egbert.models.bert import (
    EgbertBertConfig,
    EgbertBertForMaskedLM,
    EgbertBertForPreTraining,
    EgbertBertForReplacedTokenDetection,
)
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.pretrain import data
from egbert.report import ModelCardInfo
from egbert.tokenizer import check_vocab_matches, load_tokenizer, tokenizer_for_model
from egbert.trainer import Trainer, TrainOutput

CONFIG_CLASSES = {"bert": EgbertBertConfig, "gpt": EgbertGPTConfig, "elmo": EgbertElmoConfig}

# Options whose default differs by family, where the trainer's default leaves that family's
# language model worse at a fixed budget (docs/experiments/recipe-compare.md; old against new
# defaults: docs/defaults.md).
# bert: the recipe comparison's choices, masked LM + next-sentence prediction kept as BERT's
# objective: attention heads that start on fixed neighbours (local_attention_init: leaves the
# unigram plateau of the MLM loss early), no dropout while pretraining (fine-tuning puts 0.1
# back), 40% masking, batch 16, lr 1e-3 with 6% warmup; 25 minutes on the mini preset: MLM loss
# 4.2 against the stock recipe's 6.65.
# gpt: lr 1e-3 and no dropout while pretraining: perplexity 70.7 against 92.6 with the trainer's
# lr 5e-4 and dropout 0.1 (tiny, 25 CPU-minutes; 138 against 194 after 5; docs/defaults.md).
# elmo: perplexity 221 with lr and dropout set against 483 without (mini, 25 minutes); its LSTMs
# cost about the same per token at any block length, so 64-token blocks give it twice the
# updates of 128 in the same time (in fp32: a lower LM loss, 5.41 against 5.83).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": {
        "lr": 1e-3,
        "batch_size": 16,
        "warmup_steps": 0.06,
        "mlm_probability": 0.4,
        "config_overrides": "local_attention_init=true,hidden_dropout_prob=0,"
        "attention_probs_dropout_prob=0",
    },
    "gpt": {"lr": 1e-3, "config_overrides": "hidden_dropout_prob=0,attention_probs_dropout_prob=0"},
    "elmo": {"lr": 5e-3, "config_overrides": "hidden_dropout_prob=0", "seq_len": 64},
}


def family_defaults_text() -> str:
    """FAMILY_DEFAULTS as command-line options, e.g. "elmo: --lr 0.005, ..." (for --help)."""
    families = []
    for family, options in FAMILY_DEFAULTS.items():
        flags = [f"--{name.replace('_', '-')} {value}" for name, value in options.items()]
        families.append(f"{family}: {', '.join(flags)}")
    return "; ".join(families)


DESCRIPTION = (
    "Pretrain a bert (MLM + NSP), gpt (causal LM) or elmo (biLM) model on plain-text files. "
    "Every option can also be set in a YAML/JSON file given with --config. "
    f"Family defaults: {family_defaults_text()}."
)


# What each family's model is for on the Hub (the card's pipeline_tag).
PIPELINE_TAGS = {"bert": "fill-mask", "gpt": "text-generation", "elmo": "feature-extraction"}


def main(argv: list[str] | None = None) -> None:
    pretrain(*parse_pretrain_args(argv))


def run_pretraining(**options: Any) -> TrainOutput:
    """`egbert pretrain` from Python: the keyword arguments are the command's options
    (PretrainArguments and TrainingArguments fields, e.g. model="gpt", train_files=[...],
    output_dir="runs/gpt", max_steps=1000), with the same family defaults under them."""
    return pretrain(*pretrain_arguments(**options))


def pretrain_arguments(**options: Any) -> tuple[PretrainArguments, TrainingArguments]:
    """The options of `run_pretraining` as its dataclasses, the family's defaults
    (FAMILY_DEFAULTS) under them."""
    defaults = dict(FAMILY_DEFAULTS.get(options.get("model"), {}))
    if options.get("init_from"):  # a model from --init-from keeps its own config
        defaults.pop("config_overrides", None)
    return arguments_from_options((PretrainArguments, TrainingArguments), options, defaults)


def parse_pretrain_args(argv: list[str] | None) -> tuple[PretrainArguments, TrainingArguments]:
    """`egbert pretrain`'s options, with the family's defaults (FAMILY_DEFAULTS) under the
    command line and the --config file."""

    def parse(defaults: dict[str, Any] | None = None) -> tuple[Any, ...]:
        types = (PretrainArguments, TrainingArguments)
        return parse_args(types, argv, "egbert pretrain", DESCRIPTION, defaults)

    pretrain_args, training_args = parse()
    defaults = dict(FAMILY_DEFAULTS.get(pretrain_args.model, {}))
    if pretrain_args.init_from:  # a model from --init-from keeps its own config
        defaults.pop("config_overrides", None)
    return parse(defaults) if defaults else (pretrain_args, training_args)


def model_flops_per_token(model: PreTrainedModel, args: PretrainArguments) -> Callable | None:
    """seq_len -> training FLOPs per real token for the log's MFU: the model's own count, bert's
    at the --mlm-probability it trains with (its sparse softmax runs on the masked tokens only);
    None for replaced token detection (a generator beside the encoder): the trainer's estimate."""
    if args.objective == "rtd":
        return None
    if args.model == "bert":
        return partial(model.flops_per_token, mlm_probability=args.mlm_probability)
    return model.flops_per_token


def pretrain(args: PretrainArguments, training_args: TrainingArguments) -> TrainOutput:
    """Build tokenizer, data and model from the options, train, and return the trainer's result."""
    tokenizer = load_tokenizer(args.tokenizer)
    set_seed(training_args.seed)  # the model's initial weights
    model, preset = build_model(args, tokenizer)
    check_vocab_matches(tokenizer, model.config.vocab_size, f"the {args.model} model")
    train_set, collator = build_examples(args, tokenizer, args.train_files, training_args.seed)
    eval_set, eval_collator = None, None
    if args.validation_files:
        # Its own collator: the eval masks stay those of epoch 0, so evaluations compare.
        eval_set, eval_collator = build_examples(
            args, tokenizer, args.validation_files, training_args.seed
        )
        if args.max_eval_samples is not None:
            eval_set = first_examples(eval_set, args.max_eval_samples)
    batch_metrics, finalize_metrics = EVAL_METRICS["rtd" if args.objective == "rtd" else args.model]
    trainer = Trainer(
        model,
        training_args,
        train_set,
        collator,
        eval_dataset=eval_set,
        eval_collator=eval_collator,
        batch_metrics=batch_metrics,
        finalize_metrics=finalize_metrics,
        run_config=run_config(args, preset, tokenizer),
        tokenizer=tokenizer_for_model(tokenizer, model.config, args.seq_len),
        card=ModelCardInfo(
            pipeline_tag=PIPELINE_TAGS[args.model],
            license=args.license,
            datasets=args.card_datasets,
            description=f"An egbert {args.model} model pretrained from scratch with "
            f"`egbert pretrain` ({type(model).__name__}).",
        ),
        flops_per_token=model_flops_per_token(model, args),
    )
    result = trainer.train()
    if trainer.accelerator.is_main_process:
        options = {"pretrain": asdict(args), "training": asdict(training_args)}
        path = Path(training_args.output_dir) / "pretrain_args.json"
        path.write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")
    if not result.interrupted:
        summary = ", ".join(f"{name} {value:.4g}" for name, value in result.metrics.items())
        trainer.accelerator.print(
            f"egbert: {args.model} pretrained for {result.step} steps "
            f"({result.elapsed_seconds / 60:.1f} min); {summary or 'no validation files'}; "
            f"model saved in {result.model_dir}",
            flush=True,
        )
    return result


# ---------------------------------------------------------------- model


def build_model(args: PretrainArguments, tokenizer) -> tuple[PreTrainedModel, dict[str, Any]]:
    """A fresh model of the preset's size (vocab from the tokenizer), or the one in
    --init-from; returns it with the config kwargs that define it."""
    if args.init_from:
        model = _load_existing_model(args)
        preset = {"init_from": str(Path(args.init_from).resolve())}
    else:
        preset = load_preset(args.model, args.preset)
        config = _model_config(args, preset, tokenizer)
        model = _model_class(args)(config)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and args.seq_len > max_positions:
        raise ConfigError(
            f"--seq-len {args.seq_len} is above the model's max_position_embeddings "
            f"({max_positions}); use --seq-len {max_positions} or less, or a larger preset"
        )
    return model, preset


def _model_config(args: PretrainArguments, preset: dict[str, Any], tokenizer):
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if args.model == "gpt":
        eos = tokenizer.eos_token_id
        ids |= {"bos_token_id": eos, "eos_token_id": eos}
        if ids["pad_token_id"] is None:
            ids["pad_token_id"] = eos
    try:
        config = CONFIG_CLASSES[args.model](**{**preset, **ids})
    except (TypeError, ValueError) as error:
        message = str(error).splitlines()[0]
        raise ConfigError(f"--preset {args.preset}: invalid model config: {message}") from None
    apply_config_overrides(config, args.config_overrides)
    return config


def _model_class(args: PretrainArguments) -> type[PreTrainedModel]:
    if args.model == "bert" and args.objective == "rtd":
        return EgbertBertForReplacedTokenDetection
    if args.model == "bert":
        return EgbertBertForPreTraining if args.nsp else EgbertBertForMaskedLM
    return {"gpt": EgbertGPTForCausalLM, "elmo": EgbertElmoForBidirectionalLM}[args.model]


def _load_existing_model(args: PretrainArguments) -> PreTrainedModel:
    path = Path(args.init_from)
    model_type = read_model_config(path).get("model_type")
    expected = CONFIG_CLASSES[args.model].model_type
    if model_type != expected:
        raise CheckpointError(
            f"--init-from {path} holds a {model_type!r} model, not {expected!r}; "
            f"pass a {args.model} model or change --model"
        )
    return load_pretrained(_model_class(args), path, allow_pickle=args.allow_pickle)


# ---------------------------------------------------------------- data


def build_examples(
    args: PretrainArguments, tokenizer, files: list[str], seed: int
) -> tuple[Dataset | IterableDataset, Any]:
    """Files -> documents -> token ids -> this family's examples, and the collator for them."""
    _check_special_tokens(args, tokenizer)
    documents = data.read_documents(
        files,
        doc_boundary=args.doc_boundary,
        encoding=args.encoding,
        errors=args.encoding_errors,
        streaming=args.streaming,
    )
    tokenized = data.tokenize_documents(
        documents, tokenizer, split_sentences=args.model == "bert", num_proc=args.num_proc
    )
    if args.model != "bert":
        return data.pack_blocks(tokenized, args.seq_len, tokenizer.eos_token_id), (
            data.CausalLMCollator(tokenizer)
        )
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
    if args.dupe_factor > 1:  # static masks, one set per duplicate, as BERT's original data
        examples = data.add_static_masks(
            examples,
            tokenizer,
            mlm_probability=args.mlm_probability,
            whole_word_mask=args.whole_word_mask,
            seed=seed,
            num_proc=args.num_proc,
        )
    collator = data.MLMCollator(
        tokenizer,
        mlm_probability=args.mlm_probability,
        whole_word_mask=args.whole_word_mask,
        seed=seed,
    )
    return examples, collator


def first_examples(examples: Dataset | IterableDataset, count: int) -> Dataset | IterableDataset:
    if isinstance(examples, IterableDataset):
        return examples.take(count)
    return examples.select(range(min(count, len(examples))))


def _check_special_tokens(args: PretrainArguments, tokenizer) -> None:
    needed = ("cls_token", "sep_token", "mask_token", "pad_token")
    if args.model != "bert":
        needed = ("eos_token",)  # joins the documents of packed blocks
    missing = [name for name in needed if getattr(tokenizer, name) is None]
    if missing:
        raise ConfigError(
            f"--tokenizer {args.tokenizer} has no {', '.join(missing)}, which --model "
            f"{args.model} needs; train one with `egbert tokenizer train`"
        )


def run_config(args: PretrainArguments, preset: dict[str, Any], tokenizer) -> dict[str, Any]:
    """What a resumed run must share with the original: model, tokenizer, data, example shape."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "model": {"family": args.model, "nsp": args.nsp, "objective": args.objective, **preset},
        "tokenizer": {
            "size": len(tokenizer),
            "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest()[:16],
        },
        "data": {
            "train_files": _file_identities(args.train_files),
            "validation_files": _file_identities(args.validation_files),
            "doc_boundary": args.doc_boundary,
            "encoding": args.encoding,
        },
        "seq_len": args.seq_len,
        "mlm_probability": args.mlm_probability,
        "whole_word_mask": args.whole_word_mask,
        "dupe_factor": args.dupe_factor,
    }


def _file_identities(files: list[str]) -> list[str]:
    identities = []
    for name in files:
        path = Path(name).resolve()
        size = path.stat().st_size if path.is_file() else "missing"
        identities.append(f"{path} ({size} bytes)")
    return identities


# ---------------------------------------------------------------- evaluation metrics
# Each returns {name: (sum, count)} for one batch; the trainer adds them over batches and
# processes and reports sum / count. Losses are weighted by their number of targets.


def bert_metrics(batch: dict[str, torch.Tensor], outputs) -> dict[str, tuple[float, float]]:
    labels = batch["labels"]
    masked = labels != -100
    logits = getattr(outputs, "prediction_logits", None)
    if logits is None:
        logits = outputs.logits
    # sparse_mlm_logits: the logits are already (masked positions, vocab)
    predicted = logits.argmax(-1) if logits.dim() == 2 else logits.argmax(-1)[masked]
    n_masked = float(masked.sum())
    mlm_loss = getattr(outputs, "mlm_loss", None)
    if mlm_loss is None:
        mlm_loss = outputs.loss
    metrics = {
        "mlm_loss": (mlm_loss.item() * n_masked, n_masked),
        "mlm_accuracy": (float((predicted == labels[masked]).sum()), n_masked),
    }
    if "next_sentence_label" in batch:
        nsp_labels = batch["next_sentence_label"]
        nsp_predicted = outputs.seq_relationship_logits.argmax(-1)
        metrics["nsp_accuracy"] = (float((nsp_predicted == nsp_labels).sum()), len(nsp_labels))
    return metrics


def rtd_metrics(batch: dict[str, torch.Tensor], outputs) -> dict[str, tuple[float, float]]:
    n_masked = float((batch["labels"] != -100).sum())
    real = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    n_real = float(real.sum())
    correct = (outputs.logits[real] > 0) == outputs.replaced[real]
    return {
        "generator_mlm_loss": (outputs.generator_loss.item() * n_masked, n_masked),
        "rtd_loss": (outputs.rtd_loss.item() * n_real, n_real),
        "rtd_accuracy": (float(correct.sum()), n_real),
        "replaced_share": (float(outputs.replaced[real].sum()), n_real),
    }


def _targets(batch: dict[str, torch.Tensor]) -> float:
    """Next-token targets: positions whose label and whose predecessor are real tokens."""
    real = batch["labels"] != -100
    return float((real[:, 1:] & real[:, :-1]).sum())


def gpt_metrics(batch: dict[str, torch.Tensor], outputs) -> dict[str, tuple[float, float]]:
    targets = _targets(batch)
    return {"loss": (outputs.loss.item() * targets, targets)}


def elmo_metrics(batch: dict[str, torch.Tensor], outputs) -> dict[str, tuple[float, float]]:
    targets = _targets(batch)  # the same pairs serve both directions
    return {
        "loss": (outputs.loss.item() * targets, targets),
        "forward_loss": (outputs.forward_loss.item() * targets, targets),
        "backward_loss": (outputs.backward_loss.item() * targets, targets),
    }


def gpt_perplexity(metrics: dict[str, float]) -> dict[str, float]:
    return {**metrics, "perplexity": math.exp(metrics["loss"])}


def elmo_perplexities(metrics: dict[str, float]) -> dict[str, float]:
    forward = math.exp(metrics["forward_loss"])
    backward = math.exp(metrics["backward_loss"])
    # Peters et al. report the average of the forward and backward perplexities.
    return {
        **metrics,
        "forward_perplexity": forward,
        "backward_perplexity": backward,
        "perplexity": (forward + backward) / 2,
    }


EVAL_METRICS = {
    "bert": (bert_metrics, None),
    "rtd": (rtd_metrics, None),
    "gpt": (gpt_metrics, gpt_perplexity),
    "elmo": (elmo_metrics, elmo_perplexities),
}


if __name__ == "__main__":
    main()
