"""Tests of egbert.training.trainer against a tiny real next-token model (no BERT/GPT/ELMo needed).

Run as a script (`python tests/test_trainer.py '{json options}'`) the file trains that model in
a process of its own (the memory tests'). Kill, stop and resume are proved on the real commands
(tests/test_faults.py).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from option_coverage import proves
from safetensors.torch import load_file, save_model
from torch import nn

from egbert.config import TrainingArguments
from egbert.errors import CheckpointError, ConfigError, TrainingError
from egbert.finetune.run import parse_finetune_args
from egbert.pretrain.collators import MLMCollator
from egbert.tokenizer import load_tokenizer
from egbert.training.batches import Batching, TrainingData, epochs_done, padded_length, real_tokens
from egbert.training.checkpoints import TrainerState
from egbert.training.model_saving import (
    BestModel,
    SavedWithModel,
    run_model_card,
    save_model_folder,
)
from egbert.training.optimization import (
    RunLength,
    Schedule,
    accumulation_text,
    adamw,
    batches_per_step,
    lr_multiplier,
    noam_multiplier,
    parameter_groups,
    run_progress,
    schedule_multiplier,
    total_steps,
    warmup_length,
)
from egbert.training.runtime import bf16_pays_off, matmul_gflops
from egbert.training.trainer import Trainer, options_for

VOCAB = 40
POISON = VOCAB - 1  # a token whose embedding row is NaN in the non-finite tests


@dataclass
class TinyConfig:
    vocab_size: int = VOCAB
    hidden_size: int = 16
    dropout: float = 0.1
    label_smoothing: float = 0.0


@dataclass
class TinyOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyLM(nn.Module):
    """Predicts the next token from the current one: embedding, LayerNorm, dropout, linear."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None, label_smoothing=None):
        """label_smoothing: of the loss (None: the config's), as egbert's models take it."""
        logits = self.head(self.dropout(self.norm(self.embed(input_ids))))  # (batch, seq, vocab)
        loss = None
        if labels is not None:
            if label_smoothing is None:
                label_smoothing = self.config.label_smoothing
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                label_smoothing=label_smoothing,
            )
        return TinyOutput(loss, logits)


def tiny_dataset(size: int = 24, length: int = 8, poison_index: int | None = None) -> list[dict]:
    """Sequences following t -> 3t+1 (mod VOCAB-1) with 20% noise: there is something to learn."""
    rng = np.random.default_rng(0)
    examples = []
    for index in range(size):
        ids = [int(rng.integers(POISON))]
        for _ in range(length - 1):
            nxt = (3 * ids[-1] + 1) % POISON
            ids.append(int(rng.integers(POISON)) if rng.random() < 0.2 else nxt)
        if index == poison_index:
            ids[3] = POISON
        examples.append({"input_ids": ids, "id": index})
    return examples


class NoisyCollator:
    """Dynamic corruption in miniature (like MLM masking): replaces `noise` of the inputs with
    random ids from a generator seeded by (seed, epoch, example), never by the global RNG."""

    def __init__(self, noise: float = 0.2, seed: int = 0, sleep: float = 0.0) -> None:
        self.noise, self.seed, self.sleep, self.epoch = noise, seed, sleep, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        time.sleep(self.sleep)  # a slow collator: the budget tests' steps take time
        labels = torch.tensor([example["input_ids"] for example in examples])
        inputs = labels.clone()
        for row, example in enumerate(examples):
            rng = np.random.default_rng([self.seed, self.epoch, example["id"]])
            noisy = rng.random(inputs.size(1)) < self.noise
            inputs[row, torch.from_numpy(noisy)] = torch.from_numpy(
                rng.integers(POISON, size=int(noisy.sum()))
            )
        return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}


def make_trainer(
    out: Path,
    dropout: float = 0.1,
    noise: float = 0.2,
    sleep: float = 0.0,
    poison: int | None = None,
    run_config: dict | None = None,
    size: int = 24,
    eval_size: int = 0,
    **options,
) -> Trainer:
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(dropout=dropout))
    if poison is not None:
        with torch.no_grad():
            model.embed.weight[POISON] = float("nan")
    defaults = {"lr": 3e-2, "batch_size": 4, "max_steps": 6, "log_every": 1, "seed": 1}
    args = TrainingArguments(output_dir=str(out), **{**defaults, **options})
    eval_data = tiny_dataset(eval_size) if eval_size else None
    data = TrainingData(
        tiny_dataset(size, poison_index=poison),
        NoisyCollator(noise, sleep=sleep),
        eval=eval_data,
        eval_collator=NoisyCollator(0.0) if eval_size else None,
    )
    run_config = run_config or {"model": {"hidden_size": 16}, "seq_len": 8}
    return Trainer(model, data, args, saved_with_model=SavedWithModel(run_config=run_config))


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The order Accelerate's seedable sampler gives an epoch: a permutation seeded seed + epoch."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def train_losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [record["loss"] for record in records if record["split"] == "train"]


def assert_same_weights(first: Path, second: Path, atol: float) -> None:
    a, b = load_file(first), load_file(second)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, equal_nan=True)


pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


# ---------------------------------------------------------------- schedules and optimizer


def test_linear_and_cosine_match_transformers():
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    for name, reference in (
        ("linear", get_linear_schedule_with_warmup),
        ("cosine", get_cosine_schedule_with_warmup),
    ):
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = reference(optimizer, num_warmup_steps=10, num_training_steps=100)
        expected = []
        for _ in range(101):
            expected.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        ours = [schedule_multiplier(name, step, 100, 10) for step in range(101)]
        assert ours == pytest.approx(expected, abs=1e-12)
    assert schedule_multiplier("linear", 10, 100, 10) == 1.0
    assert schedule_multiplier("linear", 55, 100, 10) == pytest.approx(0.5)
    assert schedule_multiplier("cosine", 55, 100, 10) == pytest.approx(0.5)
    assert schedule_multiplier("linear", 100, 100, 10) == 0.0
    assert schedule_multiplier("constant", 5, 100, 10) == 0.5
    assert schedule_multiplier("constant", 90, 100, 10) == 1.0


def test_the_schedule_is_the_same_in_any_unit_and_names_an_unknown_one():
    """Seconds of a half-second budget as steps of a long run: halfway is half the peak."""
    assert schedule_multiplier("linear", 0.25, 0.5, 0.0) == pytest.approx(0.5)
    assert schedule_multiplier("linear", 500, 1000, 0) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match=r"unknown schedule 'step'; use one of .*linear"):
        schedule_multiplier("step", 50, 100, 10)


def test_progress_is_the_larger_of_the_budget_and_the_steps_done(tmp_path):
    """docs/training.md: a run with a budget and a step count is as far as the further of the
    two; the batch ramp from 4 to 12 examples a step follows it (1 + round(2 x progress))."""
    args = TrainingArguments(
        output_dir=str(tmp_path), budget_minutes=2, max_steps=100, batch_size=4, batch_ramp_to=12
    )
    budget, batching = args.budget_minutes, options_for(Batching, args)
    assert run_progress(budget, 0, 30.0, 100) == pytest.approx(0.25)  # 30 s of 120
    assert run_progress(budget, 80, 30.0, 100) == pytest.approx(0.8)  # 80 steps of 100
    ramp = [batches_per_step(batching, budget, 0, seconds, 100) for seconds in (0, 60, 120)]
    assert ramp == [1, 2, 3]
    assert batches_per_step(batching, budget, 100, 0.0, 100) == 3
    assert batches_per_step(batching, budget, 0, 240.0, 100) == 3  # past the budget: its end
    assert accumulation_text(batching) == "1 to 3 accumulation (batch ramp)"


def test_a_budget_runs_the_schedule_in_seconds_with_its_warmup_share(tmp_path):
    """A 2-minute budget with a quarter of it as warmup (30 s) and 100 steps: 15 s in is half
    the warmup; 60 steps done is 60% of the run, whatever the clock says (linear: 1 - 0.6 / 0.75
    of the way after warmup)."""
    args = TrainingArguments(
        output_dir=str(tmp_path), budget_minutes=2, max_steps=100, warmup_steps=0.25
    )
    warmup = warmup_length(args.warmup_steps, args.warmup_is_ratio, args.budget_minutes, 100)
    assert warmup == pytest.approx(30.0)
    schedule = Schedule("linear", 100, warmup, True, args.budget_minutes, None)
    assert lr_multiplier(schedule, 0, 15.0) == pytest.approx(0.5, rel=1e-9)
    after = (0.6 * 120 - 30) / (120 - 30)
    assert lr_multiplier(schedule, 60, 15.0) == pytest.approx(1 - after, rel=1e-9)


def test_a_budget_ramps_a_warmup_in_steps_over_the_schedule_in_seconds():
    """A 2-minute budget of at most 100 steps with 10 warmup steps: the warmup ramps by steps
    (5 of 10: half the peak) over the linear schedule, which runs on the share of the run done
    (5 of 100 steps after 3 s: 5%, so 0.95 of the peak): 0.475. After the warmup, at step 20
    and 60 s (half the budget, more than 20 of 100 steps), the schedule alone: 0.5."""
    schedule = Schedule("linear", 100, 10, False, 2, None)
    assert lr_multiplier(schedule, 5, 3.0) == pytest.approx(0.475, rel=1e-9)
    assert lr_multiplier(schedule, 20, 60.0) == pytest.approx(0.5, rel=1e-9)


def test_a_run_without_a_length_is_one_epoch(tmp_path):
    assert total_steps(RunLength(epochs=None, max_steps=None, budget_minutes=None), 7) == 7
    assert total_steps(RunLength(epochs=3, max_steps=None, budget_minutes=None), 7) == 21


def test_noam_rule():
    d_model, warmup = 512, 4000
    # n = step + 1; rising as n * warmup^-1.5 up to n = warmup, then n^-0.5
    assert noam_multiplier(0, warmup, d_model) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_multiplier(warmup - 1, warmup, d_model) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert noam_multiplier(warmup - 1, warmup, d_model) == pytest.approx(6.988e-4, rel=1e-3)
    assert noam_multiplier(4 * warmup - 1, warmup, d_model) == pytest.approx(
        noam_multiplier(warmup - 1, warmup, d_model) / 2
    )
    peak = max(range(0, 3 * warmup, 50), key=lambda s: noam_multiplier(s, warmup, d_model))
    assert abs(peak - warmup) <= 50


def test_adamw_is_fused_where_torch_has_the_kernel():
    """The CPU and CUDA get torch's fused AdamW (its default on the CPU is a loop over the
    tensors, 9x slower); another device its default, whose kernels it has."""
    weights = [torch.nn.Parameter(torch.zeros(3))]
    assert adamw(weights, "cpu", lr=0.1).defaults["fused"] is True
    assert adamw(weights, torch.device("cuda", 0), lr=0.1).defaults["fused"] is True
    assert adamw(weights, "mps", lr=0.1).defaults["fused"] is False


def test_no_weight_decay_on_biases_and_norms():
    model = TinyLM(TinyConfig())
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert sorted(names[id(p)] for p in decay["params"]) == ["embed.weight", "head.weight"]
    assert sorted(names[id(p)] for p in no_decay["params"]) == [
        "head.bias",
        "norm.bias",
        "norm.weight",
    ]


@proves("pretrain", "--seed")
def test_epoch_order_is_a_function_of_seed_and_epoch(tmp_path):
    def ids_of_epoch(trainer: Trainer, epoch: int) -> list[int]:
        trainer.train_loader.set_epoch(epoch)
        return [int(i) for batch in trainer.train_loader for i in batch["input_ids"][:, 0]]

    trainer = make_trainer(tmp_path / "a", size=10, batch_size=10, noise=0.0, seed=3)
    first, second = ids_of_epoch(trainer, 0), ids_of_epoch(trainer, 1)
    starts = [example["input_ids"][0] for example in tiny_dataset(10)]
    assert first == [starts[i] for i in epoch_order(10, 3, 0)]
    assert second == [starts[i] for i in epoch_order(10, 3, 1)] and first != second
    AcceleratorState._reset_state(reset_partial_state=True)
    replay = make_trainer(tmp_path / "b", size=10, batch_size=10, noise=0.0, seed=3)
    assert ids_of_epoch(replay, 1) == second


def test_bad_options_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="--lr must be > 0"):
        TrainingArguments(output_dir=str(tmp_path), lr=-1.0)
    with pytest.raises(ConfigError, match="--schedule"):
        TrainingArguments(output_dir=str(tmp_path), schedule="exponential")
    with pytest.raises(ConfigError, match="inverse_sqrt needs --warmup-steps"):
        TrainingArguments(output_dir=str(tmp_path), schedule="inverse_sqrt", warmup_steps=0.1)


# ---------------------------------------------------------------- training runs


def test_warmup_ratio_and_inverse_sqrt_drive_the_optimizer(tmp_path):
    trainer = make_trainer(tmp_path / "ratio", warmup_steps=0.5, max_steps=8)
    assert trainer.schedule.warmup == 4
    trainer.train()
    lrs = [r["lr"] for r in trainer.log.records() if r["split"] == "train"]
    assert lrs == pytest.approx([3e-2 * m for m in (0, 0.25, 0.5, 0.75, 1, 0.75, 0.5, 0.25)])
    AcceleratorState._reset_state(reset_partial_state=True)
    noam = make_trainer(tmp_path / "noam", schedule="inverse_sqrt", warmup_steps=3, lr=1.0)
    noam.train()
    lrs = [r["lr"] for r in noam.log.records() if r["split"] == "train"]
    assert lrs == pytest.approx([noam_multiplier(step, 3, 16) for step in range(6)])


def test_loss_falls_and_outputs_are_written(tmp_path):
    trainer = make_trainer(tmp_path, eval_size=8, max_steps=30, eval_every=10, lr=5e-2)
    result = trainer.train()
    evals = [r["loss"] for r in trainer.log.records() if r["split"] == "eval"]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.3
    assert result.metrics["loss"] == pytest.approx(evals[-1]) and not result.interrupted
    for name in ("model/model.safetensors", "model/README.md", "loss_curve.png", "train.log"):
        assert (tmp_path / name).is_file(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoints",
        "clock.json",  # each step's elapsed seconds, for --replay-clock
        "logs",
        "loss_curve.png",
        "metrics.jsonl",
        "model",
        "train.log",
        "train_results.json",
    ]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-30"]
    assert any((tmp_path / "logs" / "egbert").iterdir())  # TensorBoard, the default tracker
    assert result.history == trainer.log.records() and result.tokens == 30 * 4 * 8
    assert result.model_dir == tmp_path / "model"


class RecordingCollator:
    """BERT's MLM collator, recording which positions of each example it masked, each time."""

    def __init__(self, collator: MLMCollator) -> None:
        self.collator = collator
        self.masked: dict[tuple[int, ...], list[list[bool]]] = defaultdict(list)

    def set_epoch(self, epoch: int) -> None:
        self.collator.set_epoch(epoch)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.collator(examples)
        for example, labels in zip(examples, batch["labels"], strict=True):
            self.masked[tuple(example["input_ids"])].append((labels != -100).tolist())
        return batch


def test_masks_are_drawn_anew_each_epoch_through_the_trainer(tmp_path, tiny_tokenizer_dir):
    """Dynamic masking (docs/data.md): each example's masked positions in its second epoch
    differ from those of its first."""
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    words = sorted(set(range(len(tokenizer))) - set(tokenizer.all_special_ids))
    rng = np.random.default_rng(0)
    examples = [{"input_ids": rng.choice(words, 16).tolist()} for _ in range(8)]
    collator = RecordingCollator(MLMCollator(tokenizer, mlm_probability=0.3))
    args = TrainingArguments(
        output_dir=str(tmp_path), batch_size=4, epochs=2, seed=1, report_to="none", num_workers=0
    )  # collated in this process (a GPU's default loader workers would record in theirs)
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(vocab_size=len(tokenizer)))
    Trainer(model, TrainingData(examples, collator), args).train()
    assert len(collator.masked) == 8
    for first, second in collator.masked.values():
        assert any(first) and any(second) and first != second


def test_bf16_warns_where_it_is_slower_than_fp32(tmp_path, capsys):
    AcceleratorState._reset_state(reset_partial_state=True)  # the precision is process-wide
    make_trainer(tmp_path, bf16=True, max_steps=1).train()
    AcceleratorState._reset_state(reset_partial_state=True)
    warned = "bf16 is slower than fp32" in capsys.readouterr().out
    bf16, fp32 = (matmul_gflops("cpu", dtype) for dtype in (torch.bfloat16, torch.float32))
    assert math.isfinite(bf16) and math.isfinite(fp32) and bf16 > 0 and fp32 > 0
    assert warned == (not bf16_pays_off("cpu"))


def test_bf16_pays_off_where_the_cpu_has_bf16_instructions(monkeypatch):
    from egbert.training import runtime

    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not bf16_pays_off("cpu")
    for native in ("avx512_bf16", "amx_bf16"):
        monkeypatch.setattr(runtime, "cpu_flags", lambda native=native: frozenset({native}))
        assert bf16_pays_off("cpu")
    # without flags to read (not Linux), a timed matmul decides
    monkeypatch.setattr(runtime, "cpu_flags", frozenset)
    timed = matmul_gflops("cpu", torch.bfloat16) > matmul_gflops("cpu", torch.float32)
    assert bf16_pays_off("cpu") == timed


@proves("pretrain", "--grad-accum")
def test_grad_accumulation_equals_the_larger_batch(tmp_path):
    big = make_trainer(tmp_path / "big", dropout=0.0, batch_size=8, max_steps=3)
    big.train()
    AcceleratorState._reset_state(reset_partial_state=True)
    small = make_trainer(tmp_path / "acc", dropout=0.0, batch_size=4, grad_accum=2, max_steps=3)
    small.train()
    assert train_losses(tmp_path / "acc") == pytest.approx(train_losses(tmp_path / "big"), abs=1e-6)
    assert_same_weights(
        tmp_path / "big/model/model.safetensors", tmp_path / "acc/model/model.safetensors", 1e-6
    )


@proves("pretrain", "--batch-ramp-to")
def test_batch_ramp_accumulates_more_batches_as_the_run_goes_on(tmp_path):
    # 2-example batches ramping to 8: 1 batch a step at the start, then 1 + round(3 * share done)
    trainer = make_trainer(tmp_path, size=64, batch_size=2, batch_ramp_to=8, max_steps=4)
    result = trainer.train()
    assert result.step == 4
    assert trainer.state.batches_in_epoch == 1 + 2 + 3 + 3
    assert trainer.state.tokens_seen == 9 * 2 * 8


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"batch_ramp_to": 6}, "a multiple of --batch-size 4"),
        ({"batch_ramp_to": 4}, "a multiple of --batch-size 4 larger than it"),
        ({"batch_ramp_to": 8, "grad_accum": 2}, "leave --grad-accum at 1"),
        ({"batch_ramp_to": 8, "max_steps": None, "epochs": 2}, "--budget-minutes or --max-steps"),
    ],
)
def test_batch_ramp_refuses_what_it_cannot_do(tmp_path, options, fix):
    with pytest.raises(ConfigError, match=re.escape(fix)):
        make_trainer(tmp_path, **options)


def test_label_smoothing_trains_but_is_off_for_evaluation(tmp_path):
    """--label-smoothing reaches the training forward as its argument and evaluation passes 0
    (also against the model's own smoothing); the model's config is never changed."""
    trainer = make_trainer(tmp_path, label_smoothing=0.3, dropout=0.0, eval_size=8)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert trainer.loss_arguments == {"label_smoothing": 0.3}
    model.config.label_smoothing = 0.2  # the model's own: evaluation leaves it out too
    metrics = trainer.evaluate()
    assert model.config.label_smoothing == 0.2 and model.training
    # the batch goes where the trainer put the model (a GPU when there is one)
    batch = {
        name: value.to(trainer.accelerator.device)
        for name, value in NoisyCollator(0.0)(tiny_dataset(8)).items()
    }
    with torch.no_grad():
        unsmoothed = model(**batch, label_smoothing=0.0).loss.item()
        smoothed = model(**batch, **trainer.loss_arguments).loss.item()
    assert metrics["loss"] == pytest.approx(unsmoothed, abs=1e-6)
    assert smoothed != pytest.approx(unsmoothed, abs=1e-3)


class PlainLM(TinyLM):
    """A model whose forward takes no label_smoothing (transformers' own models)."""

    def forward(self, input_ids, attention_mask=None, labels=None) -> TinyOutput:
        return super().forward(input_ids, attention_mask, labels)


def test_label_smoothing_is_refused_for_a_model_that_cannot_take_it(tmp_path):
    def trainer(**options) -> Trainer:
        args = TrainingArguments(output_dir=str(tmp_path), batch_size=4, max_steps=1, **options)
        return Trainer(
            PlainLM(TinyConfig()), TrainingData(tiny_dataset(8), NoisyCollator(0.0)), args
        )

    with pytest.raises(ConfigError, match="PlainLM's forward takes no label_smoothing"):
        trainer(label_smoothing=0.1)
    plain = trainer()
    assert plain.loss_arguments == {} and plain.evaluator.forward_arguments == {}
    assert plain.train().step == 1


@proves("pretrain", "--metric-for-best-model")
def test_best_checkpoint_is_kept_by_metric(tmp_path):
    trainer = make_trainer(
        tmp_path, eval_size=8, max_steps=12, eval_every=3, lr=0.3, metric_for_best_model="loss"
    )
    result = trainer.train()
    evals = {r["step"]: r["loss"] for r in trainer.log.records() if r["split"] == "eval"}
    best_step = min(evals, key=evals.get)
    assert trainer.state.best_step == best_step
    assert result.metrics["loss"] == pytest.approx(evals[best_step])
    assert_same_weights(
        tmp_path / "best/model.safetensors", tmp_path / "model/model.safetensors", 0
    )


# (the metric's name, its value at steps 1, 2, 3, the step a best model keeps): a loss,
# perplexity or error, whatever its prefix, is better lower; any other metric higher; of equal
# values the first is kept.
BEST_BY_NAME = [
    ("loss", [2.0, 2.0, 3.0], 1),
    ("score", [0.5, 0.5, 0.4], 1),
    ("loss", [3.0, 2.0, 2.5], 2),
    ("mlm_loss", [3.0, 2.0, 2.5], 2),
    ("eval_forward_perplexity", [90.0, 70.0, 80.0], 2),
    ("rtd_error", [0.3, 0.4, 0.1], 3),
    ("score", [0.5, 0.7, 0.6], 2),
    ("eval_accuracy", [0.5, 0.4, 0.6], 3),
]


def best_step_of(args: TrainingArguments, values: list[float]) -> int | None:
    """The step whose model BestModel keeps when evaluations at steps 1, 2, ... give `values`."""
    save, write_extras = (lambda folder, write_extras: None), (lambda folder: None)
    metric, greater = args.metric_for_best_model, args.greater_is_better
    best = BestModel(metric, greater, Path("best"), save, write_extras)
    state = TrainerState()
    for step, value in enumerate(values, start=1):
        state.step = step
        best.track({args.metric_for_best_model.removeprefix("eval_"): value, "other": 0.0}, state)
    return state.best_step


@pytest.mark.parametrize(("name", "values", "best"), BEST_BY_NAME)
def test_the_best_model_is_the_lowest_loss_and_the_highest_of_other_metrics(name, values, best):
    args = TrainingArguments(output_dir="out", metric_for_best_model=name)
    assert best_step_of(args, values) == best


def test_the_best_model_folder_holds_its_extras_and_loads_onto_ddp_s_cpu_device(tmp_path):
    """BestModel's contract: nothing kept before a first evaluation; an unknown metric names
    those there are; the folder gets the run's extras (the tokenizer, in a run); the weights load
    back onto DDP's torch.device("cpu", 0), which safetensors takes only as "cpu"."""
    args = TrainingArguments(output_dir=str(tmp_path), metric_for_best_model="accuracy")
    model = nn.Linear(2, 2)

    def save(folder: Path, write_extras) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_model(model, str(folder / "model.safetensors"))
        write_extras(folder)

    extras = lambda folder: (folder / "extra.txt").write_text("written")  # noqa: E731
    best = BestModel(args.metric_for_best_model, None, tmp_path / "best", save, extras)
    state = TrainerState()
    assert not best.kept(state)
    message = "--metric-for-best-model 'accuracy' is not an eval metric; choose from loss, score"
    with pytest.raises(ConfigError) as refused:
        best.track({"loss": 1.0, "score": 0.5}, state)
    assert str(refused.value) == message
    assert not best.kept(state)
    best.track({"accuracy": 0.5}, state)
    assert best.kept(state) and (tmp_path / "best" / "extra.txt").read_text() == "written"
    trained = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    best.load_into(model, torch.device("cpu", 0))
    torch.testing.assert_close(model.weight.detach(), trained, rtol=0, atol=0)


def test_finetune_keeps_the_lowest_loss_and_the_highest_score_by_its_recipe():
    """--metric-for-best-model loss keeps the epoch of the lowest dev loss, the recipe's task
    score the highest: the recipe leaves --greater-is-better to the metric's name."""
    by_loss = parse_finetune_args(["--model", "m", "--output-dir", "o", "--metric-for-best-model",
                                   "loss"])[1]  # fmt: skip
    assert by_loss.greater_is_better in (False, None)
    assert best_step_of(by_loss, [0.9, 0.6, 0.7]) == 2
    by_score = parse_finetune_args(["--model", "m", "--output-dir", "o"])[1]
    assert by_score.metric_for_best_model == "score"
    assert best_step_of(by_score, [0.5, 0.7, 0.6]) == 2


def _poisoned_step(batch_size: int = 4, seed: int = 1, poison: int = 5) -> int:
    return epoch_order(24, seed, 0).index(poison) // batch_size + 1


def test_nonfinite_loss_stops_and_names_the_step(tmp_path):
    trainer = make_trainer(tmp_path, poison=5, epochs=1, max_steps=None)
    step = _poisoned_step()
    with pytest.raises(TrainingError, match=f"loss is nan at step {step} "):
        trainer.train()


@proves("pretrain", "--skip-nonfinite")
def test_skip_nonfinite_skips_bad_steps(tmp_path):
    trainer = make_trainer(tmp_path, poison=5, epochs=1, max_steps=None, skip_nonfinite=1)
    result = trainer.train()
    assert trainer.state.skipped_nonfinite == 1 and result.step == 5
    weights = load_file(tmp_path / "model/model.safetensors")
    assert torch.isfinite(weights["head.weight"]).all()
    AcceleratorState._reset_state(reset_partial_state=True)
    again = make_trainer(tmp_path / "2", poison=5, epochs=2, max_steps=None, skip_nonfinite=1)
    with pytest.raises(TrainingError, match="at step 1[01] "):
        again.train()


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import accelerate.checkpointing

    real_save = accelerate.checkpointing.save

    def save_until_disk_full(obj, path, *args, **kwargs):
        if "step-4" in str(path):
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(accelerate.checkpointing, "save", save_until_disk_full)
    trainer = make_trainer(tmp_path, save_every=2)
    with pytest.raises(CheckpointError) as error:
        trainer.train()
    message = str(error.value)
    assert "\n" not in message and "disk full" in message and "step-2" in message
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2"]  # no temp dir left
    state = json.loads((checkpoints / "step-2/trainer_state.json").read_text())
    assert state["step"] == 2
    assert load_file(checkpoints / "step-2/model.safetensors")["head.weight"].shape == (VOCAB, 16)


def test_a_model_folder_left_half_written_by_a_kill_is_not_published(
    tmp_path, one_thread_and_fresh_accelerate, caplog
):
    """save_model_folder on its own (a trainer also clears `.tmp-*` as it starts): a save killed
    before it moved its folder into place left `.tmp-model`, here with another run's tokenizer;
    the next save starts that folder afresh, so none of its files reach `model/`; a save that
    fails leaves no such folder. A plain module's tied weights are saved once, without
    accelerate's "Removed shared tensor"."""
    stale = tmp_path / ".tmp-model"
    stale.mkdir()
    (stale / "tokenizer.json").write_text("{}")
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    tied[1].weight = tied[0].weight
    with caplog.at_level(logging.WARNING):
        save_model_folder(Accelerator(cpu=True), tied, tmp_path / "model")
    assert not stale.exists()
    assert {path.name for path in (tmp_path / "model").iterdir()} == {"model.safetensors"}
    assert load_file(tmp_path / "model/model.safetensors").keys() == {"0.weight", "1.bias"}
    assert not [record for record in caplog.records if "shared tensor" in record.getMessage()]

    def disk_full(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    with pytest.raises(OSError):  # a save that fails leaves the model it replaces, and no temp
        save_model_folder(Accelerator(cpu=True), tied, tmp_path / "model", disk_full)
    assert not stale.exists()
    assert load_file(tmp_path / "model/model.safetensors").keys() == {"0.weight", "1.bias"}


def test_the_model_card_names_the_model_and_every_option_but_the_processes(
    one_thread_and_fresh_accelerate,
):
    """The final model's card: its class, how long it trained, and the run's options as JSON,
    the number of processes left out (the same run on more processes is the same model)."""
    state = TrainerState(run_config={"seq_len": 8, "num_processes": 2, "lr": 0.03}, step=6)
    model = TinyLM(TinyConfig())
    card = str(run_model_card(None, model, "run", {"loss": 1.0}, state, Accelerator(cpu=True)))
    assert "A `TinyLM` (" in card
    assert "\n6 optimizer steps, 0 full epochs, 0 tokens, 0.0 minutes of training on 1 " in card
    options = card.split("## Training")[1].split("```json\n")[1].split("\n```")[0]
    assert json.loads(options) == {"seq_len": 8, "lr": 0.03}


@proves("pretrain", "--resume-anyway")
def test_resume_with_a_changed_config_is_refused(tmp_path):
    make_trainer(tmp_path, max_steps=2).train()
    AcceleratorState._reset_state(reset_partial_state=True)
    changed = {"model": {"hidden_size": 16}, "seq_len": 16}
    with pytest.raises(ConfigError, match=r"seq_len: 8 -> 16.*--resume-anyway"):
        make_trainer(tmp_path, max_steps=4, resume=True, run_config=changed).train()
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(ConfigError, match="--batch-size 4 -> 2"):
        make_trainer(tmp_path, max_steps=4, resume=True, batch_size=2).train()
    AcceleratorState._reset_state(reset_partial_state=True)
    result = make_trainer(
        tmp_path, max_steps=4, resume=True, resume_anyway=True, run_config=changed
    ).train()
    assert result.step == 4
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(ConfigError, match="already holds checkpoints; pass --resume"):
        make_trainer(tmp_path, max_steps=4).train()


class Payload:
    """An object a pickle-based loader would construct (and so could run code through)."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_checkpoint_state_is_loaded_with_weights_only(tmp_path):
    make_trainer(tmp_path, max_steps=2).train()
    torch.save({"state": Payload()}, tmp_path / "checkpoints/step-2/optimizer.bin")
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        make_trainer(tmp_path, max_steps=4, resume=True).train()


@proves("pretrain", "--budget-minutes", "--replay-clock")
def test_budget_stops_on_time_with_the_schedule_at_zero(tmp_path):
    budget_s = 0.05 * 60
    trainer = make_trainer(
        tmp_path, size=8, sleep=0.02, max_steps=None, budget_minutes=0.05, warmup_steps=0.1
    )
    started = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - started
    assert budget_s <= result.elapsed_seconds < budget_s + 1.0
    assert wall < budget_s + 20
    assert result.epoch >= 1  # epochs do not end a budget run: the deadline does
    assert trainer.scheduler.get_last_lr() == [0.0, 0.0]  # the schedule ends at zero, on time
    lrs = [r["lr"] for r in trainer.log.records() if r["split"] == "train"]
    assert max(lrs) > 0.5 * 3e-2 and lrs[-1] < 0.1 * 3e-2
    state = json.loads(
        (tmp_path / f"checkpoints/step-{result.step}/trainer_state.json").read_text()
    )
    assert state["elapsed_seconds"] >= budget_s
    assert trainer.schedule.warmup == pytest.approx(0.1 * budget_s)
    assert schedule_multiplier("cosine", budget_s, budget_s, 0.3) == 0.0
    # Replayed with that run's clock, a run whose steps take no time (no sleeping collator) ends
    # at the same step with the same lr at every step, and the same weights.
    AcceleratorState._reset_state(reset_partial_state=True)
    replay = make_trainer(
        tmp_path / "replay", size=8, max_steps=None, budget_minutes=0.05, warmup_steps=0.1,
        replay_clock=str(tmp_path),
    ).train()  # fmt: skip
    assert replay.step == result.step and replay.elapsed_seconds == result.elapsed_seconds
    assert [r["lr"] for r in replay.history if r["split"] == "train"] == lrs
    weights = "model/model.safetensors"
    assert (tmp_path / "replay" / weights).read_bytes() == (tmp_path / weights).read_bytes()


def test_training_time_counts_the_updates_but_not_evaluation(tmp_path):
    """A budget is training wall time: optimizer steps count (they once fell out of it, so
    budget runs overran their minutes); evaluations and checkpoints do not."""
    trainer = make_trainer(tmp_path, max_steps=6, eval_size=8, eval_every=1, save_every=1)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # Accelerate wraps it
    optimizer.register_step_pre_hook(lambda *_: time.sleep(0.1))
    trainer.model.register_forward_pre_hook(
        lambda module, _: None if module.training else time.sleep(0.2)
    )
    result = trainer.train()
    # five updates are followed by a step that counts them; six evaluations sleep 2.4 s
    assert 5 * 0.1 <= result.elapsed_seconds < 5 * 0.1 + 1.0


# ---------------------------------------------------------------- a run in a process of its own


def _run_from_json(options: dict) -> None:
    out = Path(options.pop("out"))
    trainer = make_trainer(out, **options)
    trainer.train()


if __name__ == "__main__":
    _run_from_json(json.loads(sys.argv[1]))


# mallinfo2's hblkhd: the bytes malloc holds in mmap'd blocks (freed at once, pages lost)
MALLOC_MAPPED_BYTES = """
import ctypes, json, runpy, sys, torch
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
def mapped_while_holding_64_mib():
    tensor = torch.empty(2**24)
    return mallinfo2().hblkhd
before = mapped_while_holding_64_mib()
sys.argv = ["test_trainer.py", json.dumps({"out": OUT, "max_steps": 2, "use_cpu": True})]
sys.path.insert(0, TEST_FILE.rsplit("/", 1)[0])  # its imports of the tests' helpers
runpy.run_path(TEST_FILE, run_name="__main__")  # trains 2 steps with egbert's Trainer
print(before, mapped_while_holding_64_mib())
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver() < ("glibc", "2.33"), reason="needs mallinfo2"
)
@pytest.mark.slow
@pytest.mark.parametrize("user_setting", [None, "MALLOC_TRIM_THRESHOLD_"])
def test_cpu_training_keeps_freed_memory_in_the_process(
    user_setting: str | None, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    # a fresh interpreter: the setting is process-wide, and the default is what it changes
    env = {name: value for name, value in subprocess_env.items() if not name.startswith("MALLOC_")}
    if user_setting:
        env[user_setting] = str(2**20)
    script = f"OUT = {str(tmp_path / 'run')!r}\nTEST_FILE = {__file__!r}\n{MALLOC_MAPPED_BYTES}"
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    before, after = map(int, result.stdout.splitlines()[-1].split())  # after the log
    assert before >= 2**26  # a 64 MiB tensor is mmap'd by default...
    if user_setting:
        assert after >= 2**26  # ...and still is where the user tuned malloc themselves
    else:
        assert after < 2**26  # ...and comes from the heap once the trainer has trained


# ---------------------------------------------------------------- batches' bookkeeping


def test_epochs_done_to_four_places_and_a_batchs_padded_length():
    loader = [None] * 3  # what epochs_done asks of a loader: its length
    assert epochs_done(1, 1, loader) == 1.3333  # 1 + 1/3, rounded to 4 places
    assert epochs_done(0, 2, loader) == 0.6667
    whole = epochs_done(0, 3, loader)  # the last step ends its epoch: 1, as an int (logs "1")
    assert whole == 1 and type(whole) is int
    assert epochs_done(2, 5, iter(())) == 2  # a stream has no length: the epoch alone
    assert padded_length({"input_ids": torch.zeros(4, 37, dtype=torch.long)}) == 37
    assert padded_length({"labels": torch.zeros(4, 37)}) == 0


def test_real_tokens_are_the_attention_masks_sum_else_every_input_id():
    ids = torch.ones(2, 5, dtype=torch.long)
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1] * 5])}
    assert real_tokens(padded) == 8
    assert real_tokens({"input_ids": ids}) == 10  # no mask: no padding
    assert real_tokens({"labels": ids}) == 0
