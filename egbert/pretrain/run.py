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
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from datasets import Dataset, IterableDataset
from torch.utils.data import Subset
from transformers import PreTrainedModel

from egbert.arguments import arguments_from_options, parse_args
from egbert.config import (
    MODEL_FAMILIES,
    SCRIPT_HINTS,
    RecipeValues,
    TrainingArguments,
    apply_config_overrides,
    load_preset,
    load_recipe,
    pretraining_recipe,
)
from egbert.errors import CheckpointError, ConfigError
from egbert.model_files import load_pretrained, read_model_config
from egbert.models.bert import (
    EgbertBertConfig,
    EgbertBertForMaskedLM,
    EgbertBertForPreTraining,
    EgbertBertForReplacedTokenDetection,
)
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.outputs import check_output_folder
from egbert.pretrain import prepared_folder as prepared
from egbert.pretrain.corpus import (
    CorpusUse,
    build_collator,
    examples_from_documents,
    file_identities,
    load_corpus,
)
from egbert.pretrain.options import (
    PRETRAIN_ARGUMENTS,
    DataArguments,
    ModelArguments,
    ObjectiveArguments,
    PretrainOptions,
    check_pretraining_options,
)
from egbert.report import ModelCardInfo
from egbert.tokenizer import check_vocab_matches, load_tokenizer, tokenizer_for_model
from egbert.training.batches import TrainingData
from egbert.training.checkpoints import checkpoint_to_resume, refuse_changed_run
from egbert.training.evaluator import EvalMetrics
from egbert.training.model_saving import SavedWithModel
from egbert.training.runtime import check_trackers_installed
from egbert.training.trainer import Trainer, TrainOutput

CONFIG_CLASSES = {"bert": EgbertBertConfig, "gpt": EgbertGPTConfig, "elmo": EgbertElmoConfig}

DESCRIPTION = (
    "Pretrain a bert (MLM + NSP), gpt (causal LM) or elmo (biLM) model on text, table or Hub "
    "corpora. Every option can also be set in a YAML/JSON file given with --config. Each family "
    "has its own defaults (its recipe, egbert/configs/recipes/FAMILY.yaml): `--model FAMILY "
    "--help` shows them, --print-config every resolved option."
)


def family_defaults() -> dict[str, dict[str, Any]]:
    """Each family's pretraining defaults, from its recipe (the one place they are set)."""
    return {family: load_recipe(family, "pretrain") for family in MODEL_FAMILIES}


def __getattr__(name: str) -> Any:
    # FAMILY_DEFAULTS: the recipe files read when it is asked for, never at import
    if name == "FAMILY_DEFAULTS":
        return family_defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# What each family's model is for on the Hub (the card's pipeline_tag).
PIPELINE_TAGS = {"bert": "fill-mask", "gpt": "text-generation", "elmo": "feature-extraction"}


def run_pretraining(**options: Any) -> TrainOutput:
    """`egbert pretrain` from Python: the keyword arguments are the command's options (the
    fields of PRETRAIN_ARGUMENTS, e.g. model="gpt", train_files=[...], output_dir="runs/gpt",
    max_steps=1000), with the same family defaults under them."""
    return pretrain(*pretrain_arguments(**options))


def pretrain_arguments(**options: Any) -> PretrainOptions:
    """The options of `run_pretraining` as its dataclasses, the family's recipe under them."""
    recipe = pretraining_defaults(options)
    return arguments_from_options(
        PRETRAIN_ARGUMENTS, options, recipe, check=check_pretraining_options
    )


def pretraining_defaults(options: dict[str, Any]) -> RecipeValues:
    """The family's pretraining recipe; with --data, the sequence length its examples were
    prepared with over it (an explicit --seq-len that differs is refused when the folder is
    opened)."""
    recipe = pretraining_recipe(options)
    seq_len = prepared.manifest_value(options.get("data"), "seq_len")
    if isinstance(seq_len, int):
        recipe["seq_len"] = seq_len
        recipe.origins["seq_len"] = f"{prepared.MANIFEST} in --data"
    return recipe


def parse_pretrain_args(argv: list[str] | None) -> PretrainOptions:
    """`egbert pretrain`'s options: the command line over the --config file over the family's
    recipe, parsed once."""
    return parse_args(
        PRETRAIN_ARGUMENTS,
        argv,
        "egbert pretrain",
        DESCRIPTION,
        recipe=pretraining_defaults,
        recipe_keys=("model", "init_from", "data"),
        recipe_choices={"model": MODEL_FAMILIES},
        hints=SCRIPT_HINTS,
        check=check_pretraining_options,
    )


def model_flops_per_token(
    model: PreTrainedModel, family: str, objective_args: ObjectiveArguments
) -> Callable | None:
    """seq_len -> training FLOPs per real token for the log's MFU: the model's own count, bert's
    at the --mlm-probability it trains with (its sparse softmax runs on the masked tokens only);
    None for replaced token detection (a generator beside the encoder): the trainer's estimate."""
    if objective_args.objective == "rtd":
        return None
    if family == "bert":
        return partial(model.flops_per_token, mlm_probability=objective_args.mlm_probability)
    return model.flops_per_token


def pretraining_options(
    model_args: ModelArguments, data_args: DataArguments, objective_args: ObjectiveArguments
) -> dict[str, Any]:
    """The run's options but the trainer's, by name: what pretrain_args.json and the resume
    check keep of them."""
    return {**asdict(model_args), **asdict(data_args), **asdict(objective_args)}


def pretrain(
    model_args: ModelArguments,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    training_args: TrainingArguments,
) -> TrainOutput:
    """Build tokenizer, data and model from the options, train, and return the trainer's result."""
    trainer = pretraining_trainer(model_args, data_args, objective_args, training_args)
    result = trainer.train()
    if trainer.accelerator.is_main_process:
        options = {
            "pretrain": pretraining_options(model_args, data_args, objective_args),
            "training": asdict(training_args),
        }
        path = Path(training_args.output_dir) / "pretrain_args.json"
        path.write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")
    if not result.interrupted:
        summary = ", ".join(f"{name} {value:.4g}" for name, value in result.metrics.items())
        trainer.accelerator.print(
            f"egbert: {model_args.model} pretrained for {result.step} steps "
            f"({result.elapsed_seconds / 60:.1f} min); {summary or 'no validation files'}; "
            f"model saved in {result.model_dir}",
            flush=True,
        )
    return result


def check_resume_before_data(identity: dict[str, Any], training_args: TrainingArguments) -> None:
    """A resumed run that changed an option is refused before its corpus is tokenized (the
    trainer checks the whole run config again: the number of processes too)."""
    output_dir = Path(training_args.output_dir)
    named = training_args.resume_from_checkpoint
    checkpoint = checkpoint_to_resume(output_dir, training_args.resume, named)
    if checkpoint is not None:
        options = {**identity["options"], **asdict(training_args)}
        current = {**identity, "options": options}
        refuse_changed_run(checkpoint, current, training_args.resume_anyway, parts=True)


def pretraining_trainer(
    model_args: ModelArguments,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    training_args: TrainingArguments,
) -> Trainer:
    """The run's trainer, ready to train: the tokenizer, the model and the data the options
    name (what `pretrain` trains; the tests read each option's effect off it)."""
    check_output_folder(training_args.output_dir, "--output-dir")  # before the data is tokenized
    check_trackers_installed(training_args.report_to)
    family = model_args.model
    folder = None
    if data_args.data:  # refuses a folder of other examples
        folder = prepared.folder_for_run(family, data_args, objective_args)
    tokenizer = (
        folder.load_tokenizer(data_args.tokenizer)
        if folder
        else _tokenizer_of(data_args, model_args.init_from)
    )
    set_seed(training_args.seed)  # the model's initial weights
    model, preset = build_model(model_args, objective_args, tokenizer)
    check_seq_len(model, data_args.seq_len, model_args.init_from)
    check_vocab_matches(tokenizer, model.config.vocab_size, f"the {family} model")
    options = pretraining_options(model_args, data_args, objective_args)
    identity = run_config(options, preset, tokenizer, folder)
    check_resume_before_data(identity, training_args)
    data = pretraining_data(
        family, data_args, objective_args, tokenizer, training_args.seed, folder
    )
    batch_metrics, finalize_metrics = EVAL_METRICS[
        "rtd" if objective_args.objective == "rtd" else family
    ]
    trainer = Trainer(
        model,
        TrainingData(data.train, data.collator, data.eval, data.eval_collator),
        training_args,
        metrics=EvalMetrics(batch_metrics=batch_metrics, finalize_metrics=finalize_metrics),
        saved_with_model=SavedWithModel(
            run_config=identity,
            tokenizer=tokenizer_for_model(tokenizer, model.config, data_args.seq_len),
            card=ModelCardInfo(
                pipeline_tag=PIPELINE_TAGS[family],
                license=model_args.license,
                datasets=data_args.card_datasets,
                description=f"An egbert {family} model pretrained from scratch with "
                f"`egbert pretrain` ({type(model).__name__}).",
            ),
        ),
        flops_per_token=model_flops_per_token(model, family, objective_args),
    )
    for line in data.corpus_use.report("training") if data.corpus_use else []:
        trainer.log.early_message(line)
    return trainer


# ---------------------------------------------------------------- model


def build_model(
    model_args: ModelArguments, objective_args: ObjectiveArguments, tokenizer
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """A fresh model of the preset's size (vocab from the tokenizer), or the one in
    --init-from, with the heads of the objective; returns it with the config kwargs that
    define it."""
    model_class = _model_class(model_args.model, objective_args)
    if model_args.init_from:
        model = _load_existing_model(model_args, model_class)
        preset = {"init_from": str(Path(model_args.init_from).resolve())}
    else:
        preset = load_preset(model_args.model, model_args.preset)
        model = model_class(_model_config(model_args, preset, tokenizer))
    return model, preset


def check_seq_len(model: PreTrainedModel, seq_len: int, init_from: str | None) -> None:
    """Refuse examples longer than the model's position table, naming the fixes that work (every
    preset of bert has 512 positions: a longer table is a config override, for a fresh model)."""
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and seq_len > max_positions:
        longer = (
            f" (the model of --init-from {init_from} keeps its position table)"
            if init_from
            else f", or give the model more: --config-overrides max_position_embeddings={seq_len}"
        )
        raise ConfigError(
            f"--seq-len {seq_len} is above the model's max_position_embeddings "
            f"({max_positions}); use --seq-len {max_positions} or less{longer}"
        )


def _model_config(model_args: ModelArguments, preset: dict[str, Any], tokenizer):
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if model_args.model == "gpt":
        eos = tokenizer.eos_token_id
        ids |= {"bos_token_id": eos, "eos_token_id": eos}
        if ids["pad_token_id"] is None:
            ids["pad_token_id"] = eos
    try:
        config = CONFIG_CLASSES[model_args.model](**{**preset, **ids})
    except (TypeError, ValueError) as error:
        message = str(error).splitlines()[0]
        raise ConfigError(
            f"--preset {model_args.preset}: invalid model config: {message}"
        ) from None
    apply_config_overrides(config, model_args.config_overrides)
    return config


def _model_class(family: str, objective_args: ObjectiveArguments) -> type[PreTrainedModel]:
    if family == "bert" and objective_args.objective == "rtd":
        return EgbertBertForReplacedTokenDetection
    if family == "bert":
        return EgbertBertForPreTraining if objective_args.nsp else EgbertBertForMaskedLM
    return {"gpt": EgbertGPTForCausalLM, "elmo": EgbertElmoForBidirectionalLM}[family]


def _load_existing_model(
    model_args: ModelArguments, model_class: type[PreTrainedModel]
) -> PreTrainedModel:
    path = Path(model_args.init_from)
    model_type = read_model_config(path).get("model_type")
    expected = CONFIG_CLASSES[model_args.model].model_type
    if model_type != expected:
        raise CheckpointError(
            f"--init-from {path} holds a {model_type!r} model, not {expected!r}; drop --model "
            f"{model_args.model} (the folder says its family) or pass a {model_args.model} model"
        )
    return load_pretrained(model_class, path, allow_pickle=model_args.allow_pickle)


# ---------------------------------------------------------------- data


@dataclass
class PretrainingData:
    """A run's examples and their collators (eval: None without validation data), and the share
    of the training corpus they hold (None where it is not known: a stream, or a folder
    prepared before egbert recorded it)."""

    train: Dataset | IterableDataset | prepared.PreparedExamples
    collator: Callable
    corpus_use: CorpusUse | None
    eval: Dataset | IterableDataset | prepared.PreparedExamples | Subset | None = None
    eval_collator: Callable | None = None


def pretraining_data(
    family: str,
    data_args: DataArguments,
    objective_args: ObjectiveArguments,
    tokenizer,
    seed: int,
    folder: prepared.PreparedFolder | None,
) -> PretrainingData:
    """The training and validation examples the options name: from the prepared `folder`, else
    read, tokenized and built from the sources (a stream shuffled in --shuffle-buffer)."""
    parts = (family, data_args, objective_args, tokenizer)
    if folder:  # tokenized once by `egbert prepare`: read from its memory-mapped shards
        collator = build_collator(family, objective_args, tokenizer, seed)
        data = PretrainingData(folder.examples("train"), collator, folder.corpus_use("train"))
        if folder.has_split("validation"):
            data.eval = folder.examples("validation")
            data.eval_collator = build_collator(family, objective_args, tokenizer, seed)
    else:
        train_documents, eval_documents = load_corpus(data_args, seed)
        data = PretrainingData(*examples_from_documents(*parts, train_documents, seed))
        if data_args.shuffle_buffer:
            data.train = data.train.shuffle(seed=seed, buffer_size=data_args.shuffle_buffer)
        if eval_documents is not None:
            # Its own collator: the eval masks stay those of epoch 0, so evaluations compare.
            data.eval, data.eval_collator, _ = examples_from_documents(*parts, eval_documents, seed)
    if data_args.max_train_samples is not None:
        data.train = first_examples(data.train, data_args.max_train_samples)
    if data.eval is not None and data_args.max_eval_samples is not None:
        data.eval = first_examples(data.eval, data_args.max_eval_samples)
    return data


def first_examples(examples: Dataset | IterableDataset, count: int) -> Dataset | IterableDataset:
    if isinstance(examples, IterableDataset):
        return examples.take(count)
    if isinstance(examples, Dataset):
        return examples.select(range(min(count, len(examples))))
    return Subset(examples, range(min(count, len(examples))))  # a prepared folder's examples


def _tokenizer_of(data_args: DataArguments, init_from: str | None):
    """--tokenizer's, else the one saved with the model of --init-from."""
    if data_args.tokenizer is None and init_from is None:
        raise ConfigError("pass --tokenizer DIR, or --data DIR (a folder from `egbert prepare`)")
    return load_tokenizer(data_args.tokenizer or init_from)


def run_config(
    options: dict[str, Any],
    preset: dict[str, Any],
    tokenizer,
    folder: prepared.PreparedFolder | None,
) -> dict[str, Any]:
    """What a resumed run must share with the original: the options (`pretraining_options`), and
    the identity of the model config, the tokenizer and the data files."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "options": options,
        "model": preset,
        "tokenizer": {
            "size": len(tokenizer),
            "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest()[:16],
        },
        "data": folder.identity()
        if folder
        else {
            "train_files": file_identities(options["train_files"]),
            "validation_files": file_identities(options["validation_files"]),
        },
    }


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
