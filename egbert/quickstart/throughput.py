"""What the device does: training steps of each family timed at each preset and batch, the
planner's input (egbert.quickstart.planner), in a small share of quickstart's budget.

A step here is the trainer's: the model's forward with its loss, backward and a fused AdamW
update, under the autocast (bf16 or fp16) the plan uses, on a batch shaped as pretraining's (bert:
sentence pairs with 15-40% of their tokens masked; gpt and elmo: packed blocks) of random ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from egbert.config import available_presets
from egbert.pretrain import run as pretrain_run
from egbert.quickstart.planner import Measurement, pretraining_seq_len
from egbert.quickstart.steps import pretraining_default, pretraining_model_options
from egbert.training.optimization import adamw
from egbert.training.runtime import synchronize

WARMUP_STEPS = 1  # allocations, kernel choice
TIMED_STEPS = 3
# Batches are doubled from the family's recipe batch while the rate grows by at least this
# much, and while a step stays under MAX_STEP_SECONDS.
BATCH_GAIN = 0.1
MAX_STEP_SECONDS = 2.0
MAX_BATCH = 1024


def untrained_model(family: str, preset: str, tokenizer: PreTrainedTokenizerBase, seed: int):
    """The family's model as `egbert pretrain` starts it at `preset` (its recipe's config)."""
    torch.manual_seed(seed)
    model, _ = pretrain_run.build_model(*pretraining_model_options(family, preset), tokenizer)
    return model


def random_batch(
    family: str, model: PreTrainedModel, batch_size: int, seq_len: int, device: str
) -> dict[str, torch.Tensor]:
    """A pretraining batch of random ids: bert's with a quarter of its tokens as MLM targets
    and NSP labels, gpt's and elmo's with every token a target."""
    vocab = model.config.vocab_size
    ids = torch.randint(5, vocab, (batch_size, seq_len), device=device)
    if family != "bert":
        return {"input_ids": ids, "labels": ids}
    labels = torch.where(torch.rand(ids.shape, device=device) < 0.25, ids, -100)
    batch = {"input_ids": ids, "labels": labels}
    if hasattr(model, "nsp_head"):
        batch["next_sentence_label"] = torch.randint(0, 2, (batch_size,), device=device)
    return batch


def seconds_per_step(
    model: PreTrainedModel,
    batch: dict[str, torch.Tensor],
    device: str,
    dtype: torch.dtype | None,
) -> float:
    """Mean wall seconds of TIMED_STEPS training steps after WARMUP_STEPS."""
    optimizer = adamw(model.parameters(), device, lr=1e-5)
    model.train()

    def step() -> None:
        with torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP_STEPS):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / TIMED_STEPS


def measure_family(
    family: str,
    presets: list[str],
    tokenizer: PreTrainedTokenizerBase,
    device: str,
    dtype: torch.dtype | None,
    keep_going: Callable[[list[Measurement]], bool],
) -> list[Measurement]:
    """Each preset in order of size, each at doubling batches from the family's recipe batch
    while the rate still grows by BATCH_GAIN; after each preset, `keep_going(measured)` decides
    whether the next (larger) one is worth measuring."""
    seq_len = pretraining_seq_len(family)
    measured: list[Measurement] = []
    for preset in presets:
        model = untrained_model(family, preset, tokenizer, seed=0).to(device)
        parameters = model.num_parameters()
        hidden_size = model.config.hidden_size
        batch_size, best = pretraining_default(family, "batch_size"), 0.0
        while batch_size <= MAX_BATCH:
            try:
                batch = random_batch(family, model, batch_size, seq_len, device)
                seconds = seconds_per_step(model, batch, device, dtype)
            except torch.OutOfMemoryError:  # the device holds no larger batch: done
                break
            found = Measurement(
                family, preset, batch_size, seq_len, parameters, hidden_size, seconds
            )
            measured.append(found)
            rate = found.tokens_per_second
            if rate < (1 + BATCH_GAIN) * best or 2 * seconds > MAX_STEP_SECONDS:
                break
            best, batch_size = max(best, rate), 2 * batch_size
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        if not keep_going(measured):
            break
    return measured


def presets_by_size(family: str) -> list[str]:
    """The shipped presets of a family, smallest first."""
    order = {"tiny": 0, "mini": 1, "small": 2, "base": 3}
    return sorted(available_presets(family), key=lambda name: order.get(name, len(order)))
