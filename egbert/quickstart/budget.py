"""quickstart's wall clock: the plan (what each run is allotted, decided by pure functions) and
its persistence in plan.json, which a rerun reads to keep the same allotments."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from egbert.quickstart.options import (
    EVALUATION_FULL_MINUTES,
    FIRST_OVERHEAD_SECONDS,
    MIN_EVALUATION_SCALE,
    MIN_TRAIN_SECONDS,
    PROMPT_EVAL_SAMPLES,
    probe_options,
)


def full_size(command: str) -> int:
    """Examples per task at full size: the probe's training examples, the prompts' dev ones."""
    if command == "probe":
        return probe_options(None)["max_train_samples"]
    return PROMPT_EVAL_SAMPLES


@dataclass(frozen=True)
class EvaluationRun:
    """A finished probe or prompt-eval run: its examples per task and its wall seconds."""

    command: str
    model: str
    size: int
    seconds: float


@dataclass
class Plan:
    """What a run was started with and how its time went: the options a rerun must share, the
    minutes allotted to each training run and the sizes to each evaluation (kept, so a resumed
    run keeps its schedule) and the seconds spent on finished work (a rerun goes on with what
    is left)."""

    options: dict[str, Any]
    bf16: bool
    fp16: bool = False  # a GPU without bf16 (T4, V100): fp16 with loss scaling
    allotted_minutes: dict[str, float] = field(default_factory=dict)
    run_seconds: dict[str, float] = field(default_factory=dict)  # each fine-tuning run's wall time
    spent_seconds: float = 0.0
    overheads: dict[str, list[float]] = field(default_factory=dict)
    # examples per task of each group of evaluation runs (None: skipped, the share was spent)
    evaluation_sizes: dict[str, int | None] = field(default_factory=dict)
    evaluation_runs: list[dict[str, Any]] = field(default_factory=list)
    # the machine's plan (egbert.quickstart.planner): what was measured, and what it decided
    measurements: list[dict[str, Any]] = field(default_factory=list)
    corpus_tokens: int | None = None
    run_plan: dict[str, Any] | None = None


# ---------------------------------------------------------------- planning (pure functions)


def training_minutes(share_seconds: float, overhead_seconds: float) -> float:
    """A training run's minutes: its share of the budget less the per-run cost of its stage
    (start-up, data, evaluation, saving), at least MIN_TRAIN_SECONDS."""
    return round(max(share_seconds - overhead_seconds, MIN_TRAIN_SECONDS) / 60, 4)


def planned_size(command: str, budget_minutes: float) -> int:
    """Examples per task a probe or prompt-eval run starts at: the full size from
    EVALUATION_FULL_MINUTES up, shrinking with smaller budgets to MIN_EVALUATION_SCALE of it."""
    scale = min(max(budget_minutes / EVALUATION_FULL_MINUTES, MIN_EVALUATION_SCALE), 1.0)
    return round(full_size(command) * scale)


def smallest_size(command: str) -> int:
    return round(full_size(command) * MIN_EVALUATION_SCALE)


def cost_line(measured: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(seconds, seconds per example) of a run of one command as a line in its examples per task,
    from the (size, seconds) of the runs measured: the least-squares line once two sizes were
    measured (neither part below 0), else half the mean cost fixed and half proportional."""
    sizes = [float(size) for size, _ in measured]
    seconds = [float(cost) for _, cost in measured]
    mean_size, mean_seconds = statistics.fmean(sizes), statistics.fmean(seconds)
    if len(set(sizes)) < 2:
        return mean_seconds / 2, mean_seconds / 2 / mean_size
    slope = statistics.linear_regression(sizes, seconds).slope
    slope = max(slope, 0.0)
    fixed = max(mean_seconds - slope * mean_size, 0.0)
    return fixed, slope


def evaluation_size(
    command: str,
    planned: int,
    seconds_per_run: float,
    measured: Sequence[tuple[int, float]],
    required: bool = False,
) -> int | None:
    """Examples per task for the next runs of `command` (a model and its twin, which share one
    size so that their scores compare) to take `seconds_per_run` each: `planned`, or less where
    the runs measured so far say it would not fit. Where even the smallest size would not fit
    (or no time is left), None: the runs are skipped, unless `required` (the probe: every model
    gets its row), then they run at the smallest size."""
    smallest = smallest_size(command)
    if seconds_per_run <= 0:
        size = 0
    elif not measured:
        size = planned
    else:
        fixed, per_example = cost_line(measured)
        fits = planned if per_example == 0 else (seconds_per_run - fixed) / per_example
        size = min(planned, math.floor(fits))
    if size >= smallest:
        return size
    return smallest if required else None


# ---------------------------------------------------------------- the clock and plan.json


class Budget:
    """The run's wall clock and its plan; `save` writes the plan to plan.json."""

    def __init__(self, plan: Plan, path: Path, minutes: float) -> None:
        self.plan, self.path = plan, path
        self.total = minutes * 60
        self.started = time.perf_counter() - plan.spent_seconds

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.started)

    def save(self) -> None:
        self.plan.spent_seconds = time.perf_counter() - self.started
        temp = self.path.with_suffix(".partial")
        temp.write_text(json.dumps(asdict(self.plan), indent=2) + "\n", encoding="utf-8")
        temp.replace(self.path)

    def overhead(self, stage: str) -> float:
        """The median per-run cost (wall time beyond training) of the stage's runs so far."""
        seen = self.plan.overheads.get(stage)
        return statistics.median(seen) if seen else FIRST_OVERHEAD_SECONDS[stage]

    def allot(self, key: str, seconds: float, stage: str) -> float:
        """Training minutes of the run `key`: its share `seconds` less the stage's per-run cost;
        decided once (kept in the plan: a rerun resumes it with the same schedule)."""
        if key not in self.plan.allotted_minutes:
            self.plan.allotted_minutes[key] = training_minutes(seconds, self.overhead(stage))
        return self.plan.allotted_minutes[key]

    def record(self, stage: str, wall_seconds: float, train_seconds: float) -> None:
        self.plan.overheads.setdefault(stage, []).append(round(wall_seconds - train_seconds, 2))

    def evaluation_runs(self) -> list[EvaluationRun]:
        return [EvaluationRun(**run) for run in self.plan.evaluation_runs]

    def size_for(
        self,
        key: str,
        command: str,
        planned: int,
        share_seconds: float,
        runs_left: int,
        required: bool,
    ) -> int | None:
        """Examples per task of the evaluation group `key` (decided once, kept in the plan):
        the share's seconds not yet spent, split evenly over the runs left."""
        if key not in self.plan.evaluation_sizes:
            done = self.evaluation_runs()
            left = share_seconds - sum(run.seconds for run in done)
            measured = [(run.size, run.seconds) for run in done if run.command == command]
            self.plan.evaluation_sizes[key] = evaluation_size(
                command, planned, left / runs_left, measured, required
            )
        return self.plan.evaluation_sizes[key]

    def record_evaluation(self, run: EvaluationRun) -> None:
        self.plan.evaluation_runs.append(asdict(run))


def load_plan(path: Path) -> Plan:
    return Plan(**json.loads(path.read_text(encoding="utf-8")))
