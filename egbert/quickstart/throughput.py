"""What the device does: training steps of each family timed at each preset and batch, the
planner's input (egbert.quickstart.planner), in a small share of quickstart's budget.

A step here is the trainer's: the model's forward with its loss, backward and a fused AdamW
update, under the autocast (bf16 or fp16) the plan uses, on a batch shaped as pretraining's (bert:
sentence pairs with 15-40% of their tokens masked; gpt and elmo: packed blocks) of random ids.
On a GPU each step's peak memory is measured too, and where a batch does not fit the card (it
runs out of memory, or its peak passes the planner's MEMORY_SHARE), the ways round it that the
planner weighs: that batch with gradient checkpointing, and where it is the recipe's batch,
smaller micro-batches accumulated up to it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from egbert.config import available_presets
from egbert.pretrain import run as pretrain_run
from egbert.quickstart.planner import Measurement, fits_memory, pretraining_seq_len
from egbert.quickstart.steps import pretraining_default, pretraining_model_options
from egbert.training.optimization import adamw
from egbert.training.runtime import synchronize
from egbert.training.trainer import enable_gradient_checkpointing

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


def device_memory(device: str) -> int | None:
    """The GPU's memory in bytes; None on the CPU, whose steps the plan does not size to it."""
    return torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None


def seconds_per_step(
    model: PreTrainedModel,
    batch: dict[str, torch.Tensor],
    device: str,
    dtype: torch.dtype | None,
) -> tuple[float, int | None]:
    """Mean wall seconds of TIMED_STEPS training steps after WARMUP_STEPS, and on a GPU the peak
    memory the allocator held meanwhile (None on the CPU)."""
    optimizer = adamw(model.parameters(), device, lr=1e-5)
    model.train()
    model.zero_grad(set_to_none=True)  # a step that ran out of memory may have left some
    cuda = device == "cuda"
    if cuda:  # what a larger batch before left cached would count as this one's
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

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
    seconds = (time.perf_counter() - start) / TIMED_STEPS
    # reserved rather than allocated: the blocks the allocator holds are what the card lacks
    return seconds, torch.cuda.max_memory_reserved() if cuda else None


def measure_step(
    model: PreTrainedModel,
    family: str,
    preset: str,
    device: str,
    dtype: torch.dtype | None,
    batch_size: int,
    grad_accum: int = 1,
) -> Measurement | None:
    """Training steps of `model` at `batch_size` (standing for `grad_accum` times as many
    examples a step), None where the device runs out of memory."""
    seq_len = pretraining_seq_len(family)
    try:
        batch = random_batch(family, model, batch_size, seq_len, device)
        seconds, peak = seconds_per_step(model, batch, device, dtype)
    except torch.OutOfMemoryError:
        return None
    sizes = model.num_parameters(), model.config.hidden_size
    checkpointing = model.is_activation_checkpointing
    return Measurement(
        family, preset, batch_size, seq_len, *sizes, seconds, peak, grad_accum, checkpointing
    )


def measure_preset(
    model: PreTrainedModel,
    family: str,
    preset: str,
    device: str,
    dtype: torch.dtype | None,
    memory_bytes: int | None,
) -> list[Measurement]:
    """Doubling batches from the family's recipe batch while the rate still grows by BATCH_GAIN
    and the step fits the device's memory; past one that does not, the ways round it."""
    timed = functools.partial(measure_step, model, family, preset, device, dtype)
    recipe_batch = pretraining_default(family, "batch_size")
    measured: list[Measurement] = []
    batch_size, best = recipe_batch, 0.0
    while batch_size <= MAX_BATCH:
        found = timed(batch_size)
        measured += [found] if found else []
        if found is None or not fits_memory(found, memory_bytes):
            return measured + ways_round(model, timed, batch_size, recipe_batch, memory_bytes)
        rate = found.tokens_per_second
        if rate < (1 + BATCH_GAIN) * best or 2 * found.seconds_per_step > MAX_STEP_SECONDS:
            break
        best, batch_size = max(best, rate), 2 * batch_size
    return measured


def ways_round(
    model: PreTrainedModel,
    timed: Callable[..., Measurement | None],
    batch_size: int,
    recipe_batch: int,
    memory_bytes: int | None,
) -> list[Measurement]:
    """The steps standing for a batch that does not fit: where it is the recipe's batch (the plan
    goes no lower: the recipe's lr was tuned at it), micro-batches accumulated up to it; then the
    batch with gradient checkpointing."""
    found = micro_batches(timed, batch_size, memory_bytes) if batch_size == recipe_batch else []
    enable_gradient_checkpointing(model)  # last: the model is not timed without it again
    checkpointed = timed(batch_size)
    return found + ([checkpointed] if checkpointed else [])


def micro_batches(
    timed: Callable[..., Measurement | None], batch_size: int, memory_bytes: int | None
) -> list[Measurement]:
    """Halved micro-batches of `batch_size`, each accumulated up to it, down to the first that
    fits the device's memory."""
    found: list[Measurement] = []
    micro = batch_size // 2
    while micro >= 1:
        step = timed(micro, grad_accum=batch_size // micro)
        found += [step] if step else []
        if step and fits_memory(step, memory_bytes):
            break
        micro //= 2
    return found


def measure_family(
    family: str,
    presets: list[str],
    tokenizer: PreTrainedTokenizerBase,
    device: str,
    dtype: torch.dtype | None,
    keep_going: Callable[[list[Measurement]], bool],
    memory_bytes: int | None = None,
) -> list[Measurement]:
    """Each preset in order of size (measure_preset, within `memory_bytes` of the GPU's memory:
    None, no limit); after each preset, `keep_going(measured)` decides whether the next (larger)
    one is worth measuring."""
    measured: list[Measurement] = []
    for preset in presets:
        model = untrained_model(family, preset, tokenizer, seed=0).to(device)
        measured += measure_preset(model, family, preset, device, dtype, memory_bytes)
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
