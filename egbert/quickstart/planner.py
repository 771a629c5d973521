"""quickstart's plan for the machine it runs on, as pure functions of what was measured there.

Before anything trains, quickstart times a few training steps of each family at each preset
(`egbert.quickstart.throughput`); `plan_run` turns those timings, the budget and the corpus size
into the sizes, batches, sequence lengths, passes over the corpus and fine-tuning runs, each
with its reason. plan.json keeps the timings and the plan, so a rerun neither measures nor
plans again.

The rule for the model size. Each family gets a fixed share of the budget for pretraining; at
each measured preset that time buys `tokens = rate x seconds`. The preset chosen is the one
whose predicted loss is lowest, by the data-constrained scaling law of Muennighoff et al. (2023,
"Scaling Data-Constrained Language Models"): the parametric loss of Hoffmann et al. (2022),
E + A / N^alpha + B / D'^beta with Chinchilla's fitted constants, where N counts every
parameter, the embeddings included, as Hoffmann et al. count them (Pearce and Song, 2024, trace
the gap between Kaplan's and Chinchilla's optima to that count; at quickstart's sizes the
embeddings are most of a model), and D' the effective tokens: the corpus once, plus its repetitions
worth less and less, D' = U + U R* (1 - exp(-R / R*)) for R repetitions of U unique tokens with
R* = 15.4 (their fit: up to about 4 passes repeated tokens are worth nearly fresh ones; after
about 16 the rest is worth nothing). On two CPU cores a larger model sees fewer tokens than
the corpus holds, so the law keeps the smallest; a GPU buys many passes of the small corpus,
worth little, and the law moves the time into a larger model. Past USEFUL_PASSES the run ends
early and gives its time back to the fine-tuning.

Two constraints come first. A size is taken only if its fine-tuning fits: every fine-tuning run
trains its whole schedule (the recipe's epochs, or the plan's cap of steps) to its end, since a
fine-tune cut short by the clock says nothing about what pretraining bought. And where even the
smallest sizes cannot fine-tune every model in the time left, the plan fine-tunes fewer: bert and
its twin (the comparison the fine-tuning table is about) before gpt and elmo (both still probed),
then fewer steps for the largest tasks: a cap on each run's steps (the schedule then ends at the
cap, and every example can still be seen once, where a cut of the examples would drop some).

The batch is the one of least time to a given loss by the model of McCandlish et al. (2018, "An
Empirical Model of Large-Batch Training"): a batch of B examples needs (1 + B / B_noise) times the
examples a very small batch needs for the same loss, so it takes time in proportion to
(1 + B / B_noise) / rate(B). The noise scale B_noise is taken to be the family's recipe batch, the
one its lr was tuned at (where the probe of step times starts). Quickstart's own runs put it that
low: tiny bert at about 10M tokens reached an MLM loss of 4.38-4.42 at batch 16, 4.53 at 32
and 4.63-4.72 at 64 (docs/results.md), so a larger batch pays only where it makes the device much
faster: on two CPU cores, where a batch four times the recipe's runs 1.2-1.5x faster, never
(it needs 2.5x); on a GPU, whose small batches leave it idle, up to where its rate levels off.

On a GPU the card's memory bounds both. A step whose measured peak passes MEMORY_SHARE of the card
is never planned as it is; the probe measures the two ways round it, the same batch with gradient
checkpointing (each layer recomputed in the backward pass) and, where the recipe's batch itself
does not fit, micro-batches accumulated up to it, and the batch rule above weighs them by their
measured rates with the steps that fit: of two ways to one batch, the faster. A size none of
whose steps fits is left out. The reason says what the memory changed and what the other way
would have cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

# Hoffmann et al. (2022), Approach 3's fit; Muennighoff et al. (2023) use it with their R*_D.
LOSS_E, LOSS_A, LOSS_B, LOSS_ALPHA, LOSS_BETA = 1.69, 406.4, 410.7, 0.34, 0.28
REPETITION_HALF_LIFE = 15.4  # R*_D: repeated tokens' worth decays with this many repetitions
# Passes over the corpus past which the plan stops pretraining early (their worth is < 2% of
# a fresh pass's by the law above) and gives the time to fine-tuning.
USEFUL_PASSES = 16
# Positions past the fine-tuning length are never used downstream (quickstart fine-tunes at
# 128), and attention costs grow with the length: the transformers pretrain at 128. elmo's
# LSTMs cost the same per token at any length, so shorter blocks give more updates in the same
# time (its recipe, egbert/configs/recipes/elmo.yaml: 64).
TRANSFORMER_SEQ_LEN = 128
ELMO_SEQ_LEN = 64
# A fine-tuning step, in pretraining tokens: GLUE examples padded to the longest of a batch of
# 32 hold about 50 tokens (the six tasks' train sets, steps weighted, quickstart's tokenizer),
# and with no softmax over the vocabulary a fine-tuning token costs about two thirds of a
# pretraining one (tiny bert on 2 CPU cores: 36 ms a CoLA step, 110 ms an RTE step, against
# 75 ms a pretraining step of 16 x 128 tokens).
FINETUNE_TOKENS_PER_EXAMPLE = 32
FINETUNE_BATCH = 32
MIN_FINETUNE_STEPS = 200  # the plan never caps a run below this many steps
# The widths each family's recipe lr was tuned at (egbert/configs/recipes/: bert and elmo on mini,
# gpt on tiny). A wider model gets the lr scaled by this width over its own, Adam's rule for
# hidden layers under the maximal-update parametrization (Yang et al. 2022): the update a step
# makes to a layer's output then stays the size the recipe was tuned for.
TUNED_WIDTHS = {"bert": 256, "gpt": 128, "elmo": 256}
# The same for quickstart's fine-tuning lr (the quickstart-finetune sections): bert's was tuned
# on tiny, gpt's and elmo's on mini (docs/experiments/quickstart-plan.md, recipe-compare.md).
FINETUNE_TUNED_WIDTHS = {"bert": 128, "gpt": 256, "elmo": 256}
# The share of a card's memory a planned step may take at its peak: the probe's step holds one
# model, its optimizer and one batch, where a training run adds evaluation batches, the data
# loader's pinned buffers and hours of allocator fragmentation, and the CUDA context lies
# outside torch's count.
MEMORY_SHARE = 0.9


@dataclass(frozen=True)
class Measurement:
    """Training steps of one family at one preset and batch, timed on the device."""

    family: str
    preset: str
    batch_size: int
    seq_len: int
    parameters: int  # every parameter, the embeddings included
    hidden_size: int
    seconds_per_step: float  # of one micro-batch where grad_accum > 1
    peak_bytes: int | None = None  # the device's peak memory in the steps (None: the CPU's)
    grad_accum: int = 1  # micro-batches of batch_size per optimizer step
    gradient_checkpointing: bool = False

    @property
    def tokens_per_second(self) -> float:
        return self.batch_size * self.seq_len / self.seconds_per_step

    @property
    def optimizer_batch(self) -> int:
        """Examples per optimizer step: the micro-batch times its accumulation."""
        return self.batch_size * self.grad_accum


@dataclass(frozen=True)
class FinetuneWork:
    """What the fine-tuning stage must train: training examples per task, the recipe's epochs,
    and which models in order of priority (each a family, bert twice: the pretrained model and
    its twin)."""

    examples: Mapping[str, int]
    epochs: int
    models: Sequence[str] = ("bert", "bert", "gpt", "elmo")
    overhead_seconds: float = 8.0  # per run: start-up, data, evaluation, saving


@dataclass(frozen=True)
class PretrainChoice:
    """One family's pretraining: size, batch, length, time, and what they buy."""

    family: str
    preset: str
    batch_size: int
    seq_len: int
    minutes: float
    epochs: int | None  # the passes cap (None: the time ends first)
    lr_scale: float  # of the family's pretraining lr
    finetune_lr_scale: float  # of the family's quickstart-finetune lr
    tokens_per_second: float
    tokens: int
    passes: float
    predicted_loss: float
    reason: str
    grad_accum: int = 1  # micro-batches of batch_size per optimizer step
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class FinetuneChoice:
    """Which models are fine-tuned, on how many examples of each task, in about how long."""

    models: tuple[str, ...]
    max_steps: int | None  # a cap on each run's steps (None: the recipe's epochs)
    seconds: float
    reason: str


@dataclass(frozen=True)
class RunPlan:
    pretraining: dict[str, PretrainChoice]
    finetuning: FinetuneChoice
    seconds: dict[str, float] = field(default_factory=dict)  # each stage's planned seconds


def pretraining_seq_len(family: str) -> int:
    return ELMO_SEQ_LEN if family == "elmo" else TRANSFORMER_SEQ_LEN


def effective_tokens(tokens: float, unique_tokens: float) -> float:
    """D' of Muennighoff et al.: tokens past the first pass count less and less."""
    if tokens <= unique_tokens:
        return tokens
    repetitions = tokens / unique_tokens - 1
    decay = 1 - math.exp(-repetitions / REPETITION_HALF_LIFE)
    return unique_tokens * (1 + REPETITION_HALF_LIFE * decay)


def predicted_loss(parameters: float, tokens: float, unique_tokens: float) -> float:
    """The data-constrained scaling law's loss for N parameters trained on `tokens`."""
    data = effective_tokens(tokens, unique_tokens)
    return LOSS_E + LOSS_A / parameters**LOSS_ALPHA + LOSS_B / data**LOSS_BETA


def best_rate(measurements: Sequence[Measurement]) -> float:
    return max(m.tokens_per_second for m in measurements)


def noise_batch(measurements: Sequence[Measurement]) -> int:
    """B_noise of the batch rule (module docstring): the recipe's batch, the smallest measured
    (throughput.measure_preset starts there and never plans below it)."""
    return min(m.optimizer_batch for m in measurements)


def time_to_loss(m: Measurement, noise: int) -> float:
    """Seconds per example a very small batch would need, at this batch: (1 + B / B_noise) / rate
    (McCandlish et al. 2018), in units that only compare batches of one preset."""
    return (1 + m.optimizer_batch / noise) / m.tokens_per_second


def chosen_batch(measurements: Sequence[Measurement], noise: int | None = None) -> Measurement:
    """The batch of least time to a given loss (module docstring; `noise`: B_noise, where not
    the measurements' own); of two ways to one batch (micro-batches accumulated, gradient
    checkpointing), the faster; of two equal, the smaller."""
    noise = noise or noise_batch(measurements)
    return min(measurements, key=lambda m: (time_to_loss(m, noise), m.optimizer_batch))


def fits_memory(measurement: Measurement, memory_bytes: float | None) -> bool:
    """Whether a step's measured peak fits MEMORY_SHARE of the device's memory (`memory_bytes`
    None: no limit, as on the CPU)."""
    peak = measurement.peak_bytes
    return memory_bytes is None or peak is None or peak <= MEMORY_SHARE * memory_bytes


def within_memory(
    by_preset: Mapping[str, Sequence[Measurement]], memory_bytes: float | None
) -> dict[str, list[Measurement]]:
    """Each preset's steps that fit the device's memory, presets with none left out; where no
    step of any fits, the one of least memory alone (the probe ran it; training may not)."""
    fitting = {
        preset: [m for m in measured if fits_memory(m, memory_bytes)]
        for preset, measured in by_preset.items()
    }
    fitting = {preset: measured for preset, measured in fitting.items() if measured}
    if fitting:
        return fitting
    least = min((m for ms in by_preset.values() for m in ms), key=lambda m: m.peak_bytes or 0)
    return {least.preset: [least]}


def gigabytes(count: float) -> str:
    return f"{count / 1e9:.1f} GB"


def batch_words(m: Measurement) -> str:
    """ "micro-batch 8 x 2 accumulation", "batch 16 with gradient checkpointing"."""
    words = f"batch {m.batch_size}"
    if m.grad_accum > 1:
        words = f"micro-batch {m.batch_size} x {m.grad_accum} accumulation"
    return words + (" with gradient checkpointing" if m.gradient_checkpointing else "")


def way_to_batch(m: Measurement) -> tuple[bool, bool]:
    """(accumulated, checkpointed): the way a step reaches its batch."""
    return m.grad_accum > 1, m.gradient_checkpointing


def memory_note(
    chosen: Measurement, measured: Sequence[Measurement], memory_bytes: float | None
) -> str:
    """What the device's memory changed in a preset's batch ("" where nothing): the batch that
    does not fit, the way round it and the other way's rate."""
    if memory_bytes is None:
        return ""
    card = f"{MEMORY_SHARE:.0%} of the card's {gigabytes(memory_bytes)}"
    if not fits_memory(chosen, memory_bytes):
        return f"; no step fits {card}: {batch_words(chosen)}, the least memory"
    if way_to_batch(chosen) == (False, False) and chosen == chosen_batch(measured):
        return ""
    too_big = [m for m in measured if not fits_memory(m, memory_bytes)]
    if too_big:  # the batch the rule would take without the card's limit
        over = chosen_batch(too_big, noise_batch(measured))
        need = f"{batch_words(over)} needs ~{gigabytes(over.peak_bytes)}, more than {card}"
    else:  # the probe ran out of memory at it
        need = f"batch {chosen.optimizer_batch} does not fit the card's {gigabytes(memory_bytes)}"
    note = f"; {need}: {batch_words(chosen)} at {chosen.tokens_per_second:,.0f} tokens/s"
    rivals = [
        m
        for m in measured
        if fits_memory(m, memory_bytes) and way_to_batch(m) != way_to_batch(chosen)
    ]
    if rivals:
        rival = max(rivals, key=lambda m: m.tokens_per_second)
        note += f" ({batch_words(rival)}: {rival.tokens_per_second:,.0f})"
    return note


def batch_reason(chosen: Measurement, measured: Sequence[Measurement]) -> str:
    """ "; batch 16 of least time to a given loss with the recipe's 16 as the noise scale
    (batch 64: 1.7x the time at 1.53x the rate)": the rival of highest rate, where there is one."""
    noise = noise_batch(measured)
    reason = (
        f"; batch {chosen.optimizer_batch} of least time to a given loss with the recipe's "
        f"{noise} as the noise scale"
    )
    rival = max(measured, key=lambda m: m.tokens_per_second)
    if rival.optimizer_batch != chosen.optimizer_batch:
        cost = time_to_loss(rival, noise) / time_to_loss(chosen, noise)
        speed = rival.tokens_per_second / chosen.tokens_per_second
        reason += f" (batch {rival.optimizer_batch}: {cost:.2f}x the time at {speed:.2f}x the rate)"
    return reason


def finetune_step_seconds(measurements: Sequence[Measurement]) -> float:
    """Seconds of a fine-tuning step at one preset: its tokens at the best rate, or the
    smallest measured step where the device is bound by per-step costs."""
    tokens = FINETUNE_BATCH * FINETUNE_TOKENS_PER_EXAMPLE
    return max(tokens / best_rate(measurements), min(m.seconds_per_step for m in measurements))


def finetune_run_steps(count: int, epochs: int) -> int:
    """Optimizer steps of a fine-tuning run over `count` examples for `epochs`."""
    return math.ceil(count / FINETUNE_BATCH) * epochs


def finetune_steps(work: FinetuneWork, max_steps: int | None) -> int:
    """Optimizer steps of one model's fine-tuning runs over every task."""
    return sum(
        min(finetune_run_steps(count, work.epochs), max_steps or math.inf)
        for count in work.examples.values()
    )


def finetune_seconds(
    work: FinetuneWork,
    models: Sequence[str],
    step_seconds: Mapping[str, float],
    max_steps: int | None,
) -> float:
    per_model = finetune_steps(work, max_steps)
    runs = len(models) * len(work.examples)
    return sum(per_model * step_seconds[family] for family in models) + runs * (
        work.overhead_seconds
    )


def step_caps(work: FinetuneWork) -> list[int | None]:
    """No cap, then the longest run's steps cut by a quarter at a time down to
    MIN_FINETUNE_STEPS."""
    longest = max((finetune_run_steps(n, work.epochs) for n in work.examples.values()), default=0)
    caps: list[int | None] = [None]
    cap = longest * 3 // 4
    while cap >= MIN_FINETUNE_STEPS:
        caps.append(cap)
        cap = cap * 3 // 4
    return caps


def model_names(models: Sequence[str]) -> str:
    """ "bert, its twin, gpt, elmo": the second bert of FinetuneWork.models is the twin."""
    return ", ".join("its twin" if i == 1 else family for i, family in enumerate(models))


def choose_finetuning(
    work: FinetuneWork, step_seconds: Mapping[str, float], seconds: float
) -> FinetuneChoice:
    """The most of `work` that fits `seconds` at these step times: every model on every
    schedule, else bert and its twin alone, uncapped or at the largest cap of steps that fits
    (else the smallest cap, in the time there is)."""
    every, pair = tuple(work.models), tuple(work.models[:2])
    options = [(every, None)] + [(pair, cap) for cap in step_caps(work)]
    for models, cap in options:
        needed = finetune_seconds(work, models, step_seconds, cap)
        if needed <= seconds:
            dropped = every[len(models) :]
            reason = f"{model_names(models)} fine-tuned for {work.epochs} epochs"
            reason += f", each run {cap:,} steps at most" if cap else ""
            reason += f": about {needed:.0f} of the {seconds:.0f} s left for fine-tuning"
            if dropped:
                reason += f" ({', '.join(dropped)}: probed only, their fine-tunes did not fit)"
            return FinetuneChoice(models, cap, needed, reason)
    cap = MIN_FINETUNE_STEPS
    needed = finetune_seconds(work, pair, step_seconds, cap)
    reason = (
        f"bert and its twin, each run {cap:,} steps at most: about {needed:.0f} s, more than "
        f"the {seconds:.0f} s left; the runs end when the time does"
    )
    return FinetuneChoice(pair, cap, min(needed, seconds), reason)


def width_scale(tuned: Mapping[str, int], family: str, width: int) -> float:
    """The lr multiplier of a model `width` wide: tuned width over its own, never above 1."""
    return min(1.0, tuned.get(family, width) / width)


def size_reason(
    preset: str,
    losses: Mapping[str, float],
    fits: Mapping[str, bool],
    bound: set[str],
    rate: float,
    seconds: float,
) -> str:
    """ "mini: predicted loss 5.10 at ... (against tiny 5.31, ...)"; `bound`: the presets whose
    best rate the card's memory lowered."""

    def remark(name: str) -> str:
        if not fits[name]:
            return " (its fine-tuning does not fit)"
        return " (at the steps that fit the card)" if name in bound else ""

    others = ", ".join(
        f"{name} {value:.2f}{remark(name)}"
        for name, value in sorted(losses.items(), key=lambda item: item[1])
        if name != preset
    )
    return (
        f"{preset}: predicted loss {losses[preset]:.2f} at {rate:,.0f} tokens/s for {seconds:.0f} s"
        + (f" (against {others})" if others else "")
    )


def choose_preset(
    family: str,
    by_preset: Mapping[str, Sequence[Measurement]],
    seconds: float,
    corpus_tokens: int,
    fits: Mapping[str, bool],
    memory_bytes: float | None = None,
) -> PretrainChoice:
    """The preset of lowest predicted loss among those whose fine-tuning fits, each at the steps
    that fit the device's memory (`memory_bytes`, None: no limit)."""
    usable = within_memory(by_preset, memory_bytes)
    losses = {
        preset: predicted_loss(measured[0].parameters, best_rate(measured) * seconds, corpus_tokens)
        for preset, measured in usable.items()
    }
    fitting = [preset for preset in usable if fits[preset]]
    if fitting:
        preset = min(fitting, key=losses.__getitem__)
    else:  # the smallest, whose fine-tuning comes nearest to fitting
        preset = min(usable, key=lambda name: usable[name][0].parameters)
    batch = chosen_batch(usable[preset])
    rate = batch.tokens_per_second
    useful = USEFUL_PASSES * corpus_tokens
    train_seconds = min(seconds, useful / rate)
    tokens = rate * train_seconds
    bound = {
        name for name, steps in usable.items() if best_rate(steps) < best_rate(by_preset[name])
    }
    reason = size_reason(preset, losses, fits, bound, rate, seconds)
    reason += batch_reason(batch, usable[preset])
    reason += memory_note(batch, by_preset[preset], memory_bytes)
    if dropped := [name for name in by_preset if name not in usable]:
        reason += f"; {', '.join(dropped)}: no step fits {MEMORY_SHARE:.0%} of the card's memory"
    if not fits[preset]:
        reason += "; no size's fine-tuning fits: the smallest"
    if train_seconds < seconds:
        reason += f"; stops after {USEFUL_PASSES} passes, its time goes to fine-tuning"
    return PretrainChoice(
        family=family,
        preset=preset,
        batch_size=batch.batch_size,
        seq_len=batch.seq_len,
        minutes=math.floor(train_seconds / 60 * 1e4) / 1e4,  # down: never past the share
        epochs=USEFUL_PASSES if train_seconds < seconds else None,
        lr_scale=width_scale(TUNED_WIDTHS, family, batch.hidden_size),
        finetune_lr_scale=width_scale(FINETUNE_TUNED_WIDTHS, family, batch.hidden_size),
        tokens_per_second=round(rate, 1),
        tokens=int(tokens),
        passes=round(tokens / corpus_tokens, 2),
        predicted_loss=round(losses[preset], 3),
        reason=reason,
        grad_accum=batch.grad_accum,
        gradient_checkpointing=batch.gradient_checkpointing,
    )


def plan_run(
    measurements: Sequence[Measurement],
    *,
    budget_seconds: float,
    spent_seconds: float,
    corpus_tokens: int,
    work: FinetuneWork,
    pretrain_shares: tuple[float, float],
    family_shares: Mapping[str, float],
    evaluation_share: float,
    reserve_seconds: float,
    pretrain_overhead_seconds: float,
    memory_bytes: float | None = None,
) -> RunPlan:
    """The plan (see the module's docstring). `measurements` hold each family's candidate
    presets (only the pinned one where --preset is given); `spent_seconds` is what the budget
    lost before planning (the tokenizer, the measuring). Pretraining gets what the evaluation's
    share and the fine-tuning leave, within `pretrain_shares` (least, most) of the budget.
    `memory_bytes` is the GPU's memory (None on the CPU: no limit)."""
    grouped: dict[str, dict[str, list[Measurement]]] = {}
    for m in measurements:
        grouped.setdefault(m.family, {}).setdefault(m.preset, []).append(m)
    least, most = (share * budget_seconds for share in pretrain_shares)
    evaluation = budget_seconds * evaluation_share
    open_seconds = max(budget_seconds - evaluation - spent_seconds - reserve_seconds, 0.0)
    # Fine-tuning first, at the smallest sizes: what fits beside the least pretraining
    smallest = {
        family: min(presets.values(), key=lambda ms: ms[0].parameters)
        for family, presets in grouped.items()
    }
    step_seconds = {family: finetune_step_seconds(ms) for family, ms in smallest.items()}
    finetune = choose_finetuning(work, step_seconds, max(open_seconds - least, 0.0))
    pretraining = min(max(open_seconds - finetune.seconds, least), most)
    pretrain_seconds = {
        family: max(pretraining * share - pretrain_overhead_seconds, 1.0)
        for family, share in family_shares.items()
    }
    spent_pretraining = sum(pretrain_seconds.values()) + len(pretrain_seconds) * (
        pretrain_overhead_seconds
    )
    finetuning = max(open_seconds - spent_pretraining, 0.0)
    # Then each family's size: the lowest predicted loss among those whose fine-tuning still fits
    choices = {}
    for family, presets in grouped.items():
        fits = {}
        for preset, measured in presets.items():
            sized = {**step_seconds, family: finetune_step_seconds(measured)}
            needed = finetune_seconds(work, finetune.models, sized, finetune.max_steps)
            fits[preset] = family not in finetune.models or needed <= finetuning + 1e-6
        choices[family] = choose_preset(
            family, presets, pretrain_seconds[family], corpus_tokens, fits, memory_bytes
        )
        step_seconds[family] = finetune_step_seconds(presets[choices[family].preset])
    # Time a family's pretraining gives back (it stops after USEFUL_PASSES) goes to fine-tuning.
    returned = sum(max(pretrain_seconds[f] - c.minutes * 60, 0.0) for f, c in choices.items())
    needed = finetune_seconds(work, finetune.models, step_seconds, finetune.max_steps)
    finetune = replace(finetune, seconds=min(needed, finetuning + returned))
    seconds = {
        "before planning": spent_seconds,
        "pretraining": sum(c.minutes * 60 + pretrain_overhead_seconds for c in choices.values()),
        "evaluation": evaluation,
        "fine-tuning": finetune.seconds,
        "report": reserve_seconds,
    }
    return RunPlan(choices, finetune, seconds)


def run_plan_from_dict(data: Mapping) -> RunPlan:
    """A RunPlan as plan.json holds it (dataclasses.asdict of one)."""
    return RunPlan(
        pretraining={f: PretrainChoice(**c) for f, c in data["pretraining"].items()},
        finetuning=FinetuneChoice(
            **{**data["finetuning"], "models": tuple(data["finetuning"]["models"])}
        ),
        seconds=dict(data["seconds"]),
    )
