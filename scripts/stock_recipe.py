"""The stock transformers MLM pretraining recipe, for a time budget: the reference egbert is
measured against (issue #9). Plain transformers only, no egbert code.

    python scripts/stock_recipe.py --tokenizer runs/tok --train-files wiki.train.tokens *.txt \\
        --preset mini --budget-minutes 25 --output-dir runs/stock-mini

`BertForMaskedLM` (mini: L4 H256 A4 FFN1024) on the text files tokenized line by line and
concatenated into 128-token blocks (run_mlm.py's `group_texts`), dynamic 15% masking by
`DataCollatorForLanguageModeling`, batch 64, AdamW lr 1e-3 with weight decay 0.01, 6% warmup
then linear decay, bf16 autocast (`--no-bf16`: fp32), trained by `transformers.Trainer`. A few
timed steps choose `max_steps` so that the decay ends at the deadline; a callback stops at the
deadline anyway.
The output directory gets the model (safetensors) and tokenizer, `loss_curve.jsonl` (one
{"step", "minutes", "loss"} line per logged step) and `recipe.json` (steps, minutes, timing).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import tempfile
import time
from itertools import chain, pairwise
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

# The sizes of egbert's presets of the same names (egbert/configs/bert-*.yaml).
PRESETS = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2},
    "mini": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4},
    "small": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12},
}
BLOCK_SIZE = 128
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
WARMUP = 0.06  # transformers 5 dropped warmup_ratio: a float warmup_steps < 1 is the ratio
MLM_PROBABILITY = 0.15
# The probe times PROBE_STEPS steps after PROBE_WARMUP untimed ones (allocations, the
# dataloader's start) and takes the median: a mean of 5 once ran 20% slow, so the schedule's
# decay ended at 21 of 25 minutes.
PROBE_WARMUP = 2
PROBE_STEPS = 10


# ---------------------------------------------------------------- data


def read_lines(files: list[Path]) -> list[str]:
    """The non-blank lines of the files; undecodable bytes become U+FFFD (two Gutenberg books
    are Latin-1)."""
    lines = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines += [line.rstrip("\n") for line in handle if line.strip()]
    return lines


def group_texts(examples: dict[str, list], block_size: int) -> dict[str, list]:
    """run_mlm.py's `group_texts`: concatenate the tokenized lines and cut them into blocks,
    dropping the remainder."""
    concatenated = {name: list(chain(*values)) for name, values in examples.items()}
    total = len(concatenated["input_ids"]) // block_size * block_size
    return {
        name: [values[i : i + block_size] for i in range(0, total, block_size)]
        for name, values in concatenated.items()
    }


def build_blocks(tokenizer: PreTrainedTokenizerBase, files: list[Path]) -> Dataset:
    """Lines -> token ids (with [CLS]/[SEP] around each line) -> 128-token blocks."""
    lines = Dataset.from_dict({"text": read_lines(files)})
    tokenized = lines.map(
        lambda batch: tokenizer(batch["text"], return_special_tokens_mask=True),
        batched=True,
        remove_columns=["text"],
    )
    return tokenized.map(group_texts, batched=True, fn_kwargs={"block_size": BLOCK_SIZE})


# ---------------------------------------------------------------- training


def build_model(preset: str, tokenizer: PreTrainedTokenizerBase) -> BertForMaskedLM:
    size = PRESETS[preset]
    config = BertConfig(
        vocab_size=len(tokenizer),
        intermediate_size=4 * size["hidden_size"],
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        **size,
    )
    return BertForMaskedLM(config)


def training_arguments(
    output_dir: Path, max_steps: int, seed: int, bf16: bool, **overrides: Any
) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH_SIZE,
        learning_rate=LEARNING_RATE,
        weight_decay=WEIGHT_DECAY,
        warmup_steps=WARMUP,
        lr_scheduler_type="linear",
        max_steps=max_steps,
        bf16=bf16,
        use_cpu=not torch.cuda.is_available(),  # bf16 on a CPU-only machine needs it said
        logging_steps=max(1, min(10, max_steps // 5)),  # short runs still get a curve
        save_strategy="no",
        report_to="none",
        seed=seed,
        # The collator reads the special-tokens mask the tokenizer made instead of
        # recomputing it row by row; the model's forward does not take that column.
        remove_unused_columns=False,
        **overrides,
    )


class StepTimer(TrainerCallback):
    """Wall time between consecutive optimizer steps (data loading included)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


class StopAtDeadline(TrainerCallback):
    """Stop once the budget of training time is spent, whatever max_steps says."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = 0.0
        self.elapsed = 0.0  # training time at the last step

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.elapsed = time.perf_counter() - self.start
        if self.elapsed >= self.seconds:
            control.should_training_stop = True


class LossCurveWriter(TrainerCallback):
    """Append each logged training loss to a JSONL file: {"step", "minutes", "loss"}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
        self.path.write_text("", encoding="utf-8")  # a restarted run starts a fresh curve

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            minutes = (time.perf_counter() - self.start) / 60
            record = {"step": state.global_step, "minutes": round(minutes, 4)}
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record | {"loss": logs["loss"]}) + "\n")


def seconds_per_step(
    model, blocks: Dataset, collator, output_dir: Path, seed: int, bf16: bool
) -> float:
    """Median time of a Trainer step, measured on a copy of the model (the real run starts
    from the untouched initial weights)."""
    timer = StepTimer()
    with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
        args = training_arguments(
            Path(scratch),
            PROBE_WARMUP + PROBE_STEPS,
            seed,
            bf16,
            disable_tqdm=True,
            logging_strategy="no",
        )
        probe = Trainer(
            model=copy.deepcopy(model),
            args=args,
            data_collator=collator,
            train_dataset=blocks,
            callbacks=[timer],
        )
        probe.remove_callback(PrinterCallback)  # its end-of-run summary is not the run's
        probe.train()
    timed = timer.ends[PROBE_WARMUP - 1 :]
    return statistics.median(b - a for a, b in pairwise(timed))


def save_final(model, tokenizer, output_dir: Path) -> None:
    """Write the model and tokenizer into output_dir/model/ (egbert's run layout) through a
    staging folder: its presence means the run finished."""
    staging = Path(tempfile.mkdtemp(prefix=".final.", dir=output_dir))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, output_dir / "model")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def pretrain(args: argparse.Namespace) -> dict:
    """Train for the budget and save everything; returns what goes in recipe.json."""
    output_dir = args.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)  # the initial weights
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    blocks = build_blocks(tokenizer, args.train_files)
    model = build_model(args.preset, tokenizer)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MLM_PROBABILITY)
    step_seconds = seconds_per_step(model, blocks, collator, output_dir, args.seed, args.bf16)
    budget_seconds = args.budget_minutes * 60
    max_steps = max(1, int(budget_seconds / step_seconds))
    print(
        f"stock: {len(blocks):,} blocks of {BLOCK_SIZE}; {step_seconds:.3f} s per step -> "
        f"{max_steps:,} steps in {args.budget_minutes:g} min",
        flush=True,
    )
    deadline = StopAtDeadline(budget_seconds)
    trainer = Trainer(
        model=model,
        args=training_arguments(output_dir, max_steps, args.seed, args.bf16),
        data_collator=collator,
        train_dataset=blocks,
        callbacks=[deadline, LossCurveWriter(output_dir / "loss_curve.jsonl")],
    )
    result = trainer.train()
    summary = {
        "preset": args.preset,
        "budget_minutes": args.budget_minutes,
        "bf16": args.bf16,
        "seconds_per_step": round(step_seconds, 4),
        "max_steps": max_steps,
        "steps": result.global_step,
        "minutes": round(deadline.elapsed / 60, 3),
        "blocks": len(blocks),
        "train_loss": result.training_loss,
    }
    (output_dir / "recipe.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    save_final(model, tokenizer, output_dir)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="scripts/stock_recipe.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory (AutoTokenizer)")
    parser.add_argument("--train-files", nargs="+", type=Path, required=True, metavar="FILE")
    parser.add_argument("--preset", choices=list(PRESETS), default="mini")
    parser.add_argument("--budget-minutes", type=float, required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bf16 autocast, the recipe's (default); --no-bf16 trains in fp32, for CPUs without "
        "native bf16 (AVX512-BF16 or AMX), where bf16 is slower than fp32",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.budget_minutes > 0:
        parser.error(f"--budget-minutes must be > 0, got {args.budget_minutes}")
    missing = [str(path) for path in args.train_files if not path.is_file()]
    if missing:
        parser.error(f"--train-files: not found: {', '.join(missing)}")
    summary = pretrain(args)
    print(
        f"stock: {summary['steps']:,} steps in {summary['minutes']:.2f} min, model saved in "
        f"{args.output_dir}",
        flush=True,
    )


if __name__ == "__main__":
    main()
