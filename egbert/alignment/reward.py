"""The scoring-model job (`egbert reward`): train a model to score the chosen text of each
preference pair above the rejected one, with TRL's RewardTrainer (the Bradley-Terry loss
-log sigmoid(r_chosen - r_rejected)), and report its pairwise accuracy on held-out pairs.

    egbert reward --model runs/bert-mini --pairs-from-task sst2 --data-dir $EGBERT_DATA/glue \
        --output-dir runs/reward

or from Python, with the same options as keyword arguments:

    egbert.run_reward_training(model="runs/bert-mini", pairs="pairs.jsonl", output_dir="runs/rw")

It reads one way: the model folder's tokenizer, the pairs (training and held-out: see
`RewardArguments`), each text tokenized with the model's own special tokens (the prompt and the
answer as one text, as TRL joins them), the model as a sequence classifier with one output
(egbert's heads; a stock BERT / GPT-2 checkpoint converted first), TRL's trainer with egbert's
budget and signal handling, then every held-out pair scored.

OUTPUT_DIR gets model/ (the scoring model and its tokenizer: AutoModelForSequenceClassification
loads it, its one logit the reward), reward_results.json (the held-out pairwise accuracy with its
95% bootstrap interval, the options, the training time) and checkpoints/ (TRL's checkpoint-N
folders: after a kill, SIGTERM or Ctrl-C the same command with --resume goes on from the last).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from huggingface_hub import ModelCard
from transformers import PreTrainedModel, PreTrainedTokenizerBase, set_seed
from trl import RewardConfig, RewardTrainer

from egbert.alignment.pairs import PROMPT_COLUMN, load_pairs, pairs_from_task
from egbert.alignment.runs import (
    CHECKPOINTS,
    StopTraining,
    last_checkpoint,
    show_metrics_in_progress_bar,
    train_until_stopped,
)
from egbert.arguments import arguments_from_options
from egbert.errors import ConfigError
from egbert.finetune.options import FinetuneArguments
from egbert.finetune.run import (
    load_classifier,
    load_task_tokenizer,
    read_backbone_config,
    sequence_length,
)
from egbert.finetune.significance import SAMPLES, interval
from egbert.finetune.tasks import custom_task
from egbert.model_files import resolve_model_dir
from egbert.outputs import check_output_folder
from egbert.report import ModelCardInfo, model_card
from egbert.training.runtime import bf16_pays_off, training_device

RESULTS_FILE = "reward_results.json"
# One output, read as a score: egbert's regression head, at unit scale and no shift.
SCORE_TASK = custom_task(text_columns=("text",), label_column="label", labels=None, name="reward")


@dataclass
class RewardArguments:
    """The options of `egbert reward`: the model, the pairs, and the training TRL runs."""

    _argument_group_name = "model, pairs and training"

    model: str = field(
        metadata={
            "help": "an egbert bert or gpt folder (or pretraining run), or a stock BERT/GPT-2 "
            "checkpoint, with its tokenizer: the scoring model starts from it"
        }
    )
    output_dir: str = field(
        metadata={"help": "the run's folder: model/, reward_results.json, checkpoints/"}
    )
    pairs: str | None = field(
        default=None,
        metadata={
            "help": "preference pairs (columns chosen, rejected, optional prompt): a .jsonl, "
            ".json, .csv or .parquet file, a save_to_disk folder or a data set (folder or "
            "Hub id, its train split)"
        },
    )
    validation_pairs: str | None = field(
        default=None,
        metadata={"help": "held-out pairs, as --pairs (default: --validation-share of --pairs)"},
    )
    pairs_from_task: str | None = field(
        default=None,
        metadata={
            "help": "make the pairs from a single-sentence GLUE task's labels instead (sst2, "
            "cola): a sentence of --chosen-label over one of another label; train pairs from "
            "its train split, held-out pairs from its dev split"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "the GLUE folder for --pairs-from-task (without it: the hub)"},
    )
    chosen_label: str | None = field(
        default=None,
        metadata={
            "help": "with --pairs-from-task: the preferred label, by name (positive) or as the "
            "files write it (1) (default: the task's last label: sst2 positive, cola acceptable)"
        },
    )
    validation_share: float = field(
        default=0.1,
        metadata={"help": "the share of --pairs held out when --validation-pairs is not given"},
    )
    max_train_pairs: int | None = field(
        default=None, metadata={"help": "train on the first N training pairs only"}
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "tokens per text (prompt and answer), longer ones truncated (default: 128, "
            "or the model's max_position_embeddings if smaller)"
        },
    )
    epochs: float = field(default=1.0, metadata={"help": "passes over the training pairs"})
    max_steps: int | None = field(
        default=None, metadata={"help": "optimizer steps (instead of --epochs)"}
    )
    lr: float = field(default=5e-5, metadata={"help": "peak learning rate (linear decay)"})
    batch_size: int = field(default=16, metadata={"help": "pairs per batch"})
    grad_accum: int = field(default=1, metadata={"help": "batches per optimizer step"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_steps: float = field(
        default=0.1,
        metadata={"help": "linear warmup: steps, or a fraction of the steps when below 1"},
    )
    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={
            "help": "weight of a penalty on the rewards' mean square, keeping them near 0 "
            "(Eisenstein et al. 2023 use 0.01)"
        },
    )
    seed: int = field(default=42, metadata={"help": "random seed (the head, the order, pairs)"})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bf16 autocast (default: where the device runs it faster than fp32)"},
    )
    budget_minutes: float | None = field(
        default=None,
        metadata={"help": "stop training after this many minutes (the held-out scoring aside)"},
    )
    save_every: int = field(
        default=0, metadata={"help": "checkpoint every N steps (0: at each epoch's end)"}
    )
    resume: bool = field(
        default=False, metadata={"help": "go on from the last checkpoint in OUTPUT_DIR"}
    )

    def __post_init__(self) -> None:
        if self.pairs is not None and self.pairs_from_task is not None:
            raise ConfigError("give one of --pairs FILE and --pairs-from-task TASK, not both")
        if self.pairs_from_task is None:
            if self.chosen_label is not None:
                raise ConfigError("--chosen-label names a label of --pairs-from-task's task")
        elif self.validation_pairs is not None:
            raise ConfigError(
                "--pairs-from-task holds out its task's dev split; drop --validation-pairs"
            )
        if not 0 < self.validation_share < 1:
            raise ConfigError(
                f"--validation-share must be between 0 and 1, got {self.validation_share}"
            )
        for name in ("max_train_pairs", "max_steps", "batch_size", "grad_accum"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ConfigError(f"--budget-minutes must be > 0, got {self.budget_minutes}")


@dataclass
class RewardOutput:
    """What `run_reward_training` returns: reward_results.json's content and where the model
    is (a signal ends the run with egbert.errors.Interrupted instead, its checkpoint saved)."""

    results: dict[str, Any] = field(default_factory=dict)
    model_dir: Path | None = None


def run_reward_training(**options: Any) -> RewardOutput:
    """`egbert reward` from Python: the keyword arguments are the command's options
    (RewardArguments fields, e.g. model="runs/bert", pairs="pairs.jsonl", output_dir=...)."""
    (args,) = arguments_from_options((RewardArguments,), options)
    return train_reward_model(args)


@dataclass
class RewardRun:
    """A run ready to train (`reward_trainer`), and what its results need: the held-out pairs,
    the tokenizer and the sequence length, the checkpoint to resume from, the stop callback."""

    trainer: RewardTrainer
    tokenizer: PreTrainedTokenizerBase
    held_out: Dataset
    max_length: int
    checkpoint: str | None
    stop: StopTraining


def reward_trainer(args: RewardArguments) -> RewardRun:
    """TRL's trainer over the model, the pairs and the options named (what
    `train_reward_model` trains; the tests read each option's effect off it)."""
    output_dir = check_output_folder(args.output_dir, "--output-dir")
    checkpoint = last_checkpoint(output_dir, args.resume, RESULTS_FILE)
    model_dir = resolve_model_dir(args.model)
    backbone = read_backbone_config(model_dir)
    tokenizer = load_task_tokenizer(model_dir, backbone)
    max_length = sequence_length(args, backbone)
    train, held_out = training_pairs(args)
    set_seed(args.seed)  # the new head's initial weights
    fields = {"pad_token_id": tokenizer.pad_token_id}
    model = load_classifier(model_dir, backbone, SCORE_TASK, FinetuneArguments(args.model), fields)
    stop = StopTraining(args.budget_minutes)
    trainer = RewardTrainer(
        model=model,
        args=reward_config(args, output_dir / CHECKPOINTS),
        train_dataset=tokenized_pairs(train, tokenizer, max_length),
        processing_class=tokenizer,
        callbacks=[stop],
    )
    show_metrics_in_progress_bar(trainer, ("loss", "accuracy", "margin"))
    return RewardRun(trainer, tokenizer, held_out, max_length, checkpoint, stop)


def train_reward_model(args: RewardArguments) -> RewardOutput:
    """Train the scoring model, score the held-out pairs, save both (see the module doc)."""
    run = reward_trainer(args)
    trainer, output_dir = run.trainer, Path(args.output_dir)
    train_seconds = train_until_stopped(trainer, run.checkpoint, run.stop, output_dir)
    final = output_dir / "model"
    trainer.model.save_pretrained(final)  # no training_args.bin: the options are in the results
    run.tokenizer.save_pretrained(final)
    accuracy = pair_accuracy(trainer.model, run.tokenizer, run.held_out, run.max_length, args.seed)
    results = {
        "model": str(args.model),
        "pairs": args.pairs or f"{args.pairs_from_task} (labels)",
        "train_pairs": len(trainer.train_dataset),
        "held_out_pairs": len(run.held_out),
        "pairwise_accuracy": accuracy,
        "steps": trainer.state.global_step,
        "train_seconds": round(train_seconds, 1),
        "options": asdict(args),
    }
    (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    reward_card(trainer.model, results).save(str(final / "README.md"))
    return RewardOutput(results, final)


def reward_card(model: PreTrainedModel, results: dict[str, Any]) -> ModelCard:
    """The scoring model's card: how to load it, its held-out accuracy, how it was trained."""
    accuracy = results["pairwise_accuracy"]
    info = ModelCardInfo(
        pipeline_tag="text-classification",
        description=(
            f"A scoring (reward) model trained with egbert reward (TRL's RewardTrainer) on "
            f"preference pairs from {results['pairs']}: its one logit is the reward. Held-out "
            f"pairwise accuracy {accuracy['accuracy']:.3f} [{accuracy['low']:.3f}, "
            f"{accuracy['high']:.3f}] on {accuracy['pairs']:,} pairs."
        ),
    )
    training = (
        f"{results['steps']:,} optimizer steps on {results['train_pairs']:,} pairs, "
        f"{results['train_seconds'] / 60:.1f} minutes."
    )
    metrics = {"pairwise_accuracy": accuracy["accuracy"]}
    return model_card(info, model, "model", metrics, training, results["options"])


# ---------------------------------------------------------------- pairs


def training_pairs(args: RewardArguments) -> tuple[Dataset, Dataset]:
    """(training pairs, held-out pairs), as the options say where each comes from."""
    if args.pairs is None and args.pairs_from_task is None:
        raise ConfigError("give the pairs: one of --pairs FILE and --pairs-from-task TASK")
    if args.pairs_from_task:
        task, label = args.pairs_from_task, args.chosen_label
        train, held_out = (
            pairs_from_task(task, split, args.data_dir, label, args.seed)
            for split in ("train", "validation")
        )
    elif args.validation_pairs:
        train, held_out = load_pairs(args.pairs), load_pairs(args.validation_pairs)
    else:
        split = load_pairs(args.pairs).train_test_split(args.validation_share, seed=args.seed)
        train, held_out = split["train"], split["test"]
    if args.max_train_pairs:
        train = train.select(range(min(args.max_train_pairs, len(train))))
    return train, held_out


def joined(prompts: list[str] | None, answers: list[str]) -> list[str]:
    """Each answer after its prompt, as one text (TRL joins them so); no prompts: the answers."""
    return [
        prompt + answer
        for prompt, answer in zip(prompts or [""] * len(answers), answers, strict=True)
    ]


def tokenized_pairs(pairs: Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Dataset:
    """chosen_ids and rejected_ids, the columns TRL trains on: each answer after its prompt
    as one text, with the tokenizer's special tokens ([CLS] ... [SEP] for bert)."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        return {
            f"{side}_ids": tokenizer(
                joined(batch.get(PROMPT_COLUMN), batch[side]),
                truncation=True,
                max_length=max_length,
            )["input_ids"]
            for side in ("chosen", "rejected")
        }

    return pairs.map(encode, batched=True, remove_columns=pairs.column_names, desc="tokenizing")


# ---------------------------------------------------------------- training


def reward_config(args: RewardArguments, checkpoints: Path) -> RewardConfig:
    """TRL's configuration of the run, from egbert's options."""
    device = training_device()
    bf16 = bf16_pays_off(device) if args.bf16 is None else args.bf16
    return RewardConfig(
        output_dir=str(checkpoints),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        center_rewards_coefficient=args.center_rewards_coefficient,
        seed=args.seed,
        bf16=bf16,
        save_strategy="steps" if args.save_every else "epoch",
        save_steps=args.save_every or 500,
        save_total_limit=2,
        logging_steps=10,
        report_to="none",
        activation_checkpointing=False,  # TRL's default is on: egbert's sizes need no saving
        max_length=None,  # tokenized_pairs truncates
        dataloader_num_workers=0,
        use_cpu=device == "cpu",
    )


# ---------------------------------------------------------------- held-out pairs


@torch.no_grad()
def pair_rewards(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int
) -> np.ndarray:
    """The model's reward of each text, in batches of 64."""
    model.eval()
    device = next(model.parameters()).device
    rewards = []
    for start in range(0, len(texts), 64):
        batch = tokenizer(
            texts[start : start + 64],
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        ).to(device)
        rewards.append(model(**batch).logits[:, 0].float().cpu().numpy())
    return np.concatenate(rewards)


def pair_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Dataset,
    max_length: int,
    seed: int,
) -> dict[str, Any]:
    """The share of pairs whose chosen text the model scores higher, with the 95% percentile
    interval of SAMPLES bootstrap draws of the pairs."""
    prompts = list(pairs[PROMPT_COLUMN]) if PROMPT_COLUMN in pairs.column_names else None
    sides = {
        side: pair_rewards(model, tokenizer, joined(prompts, list(pairs[side])), max_length)
        for side in ("chosen", "rejected")
    }
    correct = (sides["chosen"] > sides["rejected"]).astype(np.float64)
    accuracy = float(correct.mean())
    draws = np.random.default_rng(seed).integers(0, len(correct), size=(SAMPLES, len(correct)))
    bounds = interval(accuracy, correct[draws].mean(axis=1))
    return {
        "accuracy": round(accuracy, 4),
        "low": round(bounds.low / 100, 4),
        "high": round(bounds.high / 100, 4),
        "pairs": len(correct),
    }


def accuracy_line(results: dict[str, Any]) -> str:
    """The held-out accuracy as the command prints it."""
    accuracy = results["pairwise_accuracy"]
    return (
        f"held-out pairwise accuracy {accuracy['accuracy']:.3f} "
        f"[{accuracy['low']:.3f}, {accuracy['high']:.3f}] on {accuracy['pairs']:,} pairs "
        f"({results['steps']:,} steps, {results['train_seconds']:.0f} s)"
    )
