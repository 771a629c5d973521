"""`egbert quickstart --replay DIR`: a finished run's plan run again, the clock deciding nothing.

quickstart's runs stop on the clock, so the steps a budget buys vary from run to run. A replay
takes every decision from DIR instead: its options and plan (plan.json: sizes, batches, the
fine-tuning cap, each run's allotted minutes, the evaluation sizes), its tokenizer, each training
run's clock (the elapsed seconds after each of its steps, `--replay-clock`: the same schedule and
the same last step) and which fine-tuning runs ran. On the same machine and thread count it
gives the scores of DIR's results.json.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, fields, replace
from pathlib import Path

from egbert.errors import ConfigError
from egbert.quickstart.budget import Plan, load_plan
from egbert.quickstart.options import PLAN_FILE, QuickstartArguments
from egbert.training.step_numbers import CLOCK_FILE

RESULTS_FILE = "results.json"
# What a replay takes over from the replayed run's plan: its decisions, none of its timings.
DECISIONS = ("bf16", "allotted_minutes", "evaluation_sizes", "measurements", "corpus_tokens")
DECISIONS += ("run_plan",)


def replay_arguments(args: QuickstartArguments) -> QuickstartArguments:
    """The options of a replay: those of the finished run in args.replay, into args.output_dir
    (new and empty, or a replay of the same run stopped before its end). Any other option given
    is refused: the replayed run's are the replay's."""
    source, default = Path(args.replay), QuickstartArguments()
    given = [
        f"--{spec.name.replace('_', '-')}"
        for spec in fields(QuickstartArguments)
        if spec.name not in ("output_dir", "replay")
        and getattr(args, spec.name) != getattr(default, spec.name)
    ]
    if given:
        raise ConfigError(
            f"--replay takes every option from {source / PLAN_FILE}; leave out {', '.join(given)}"
        )
    if not (source / PLAN_FILE).is_file():
        raise ConfigError(
            f"--replay {source}: no {PLAN_FILE} there; pass the --output-dir of a finished "
            "egbert quickstart"
        )
    if not (source / RESULTS_FILE).is_file():
        raise ConfigError(
            f"--replay {source}: the run is not finished (no {RESULTS_FILE}); run its command "
            "again to finish it, then replay it"
        )
    check_output_dir(Path(args.output_dir), args.replay)
    options = {**load_plan(source / PLAN_FILE).options}
    options |= {"output_dir": args.output_dir, "replay": args.replay}
    print(f"replaying {source}: its plan, steps and runs; the clock decides nothing", flush=True)
    return replace(args, **{name: options.get(name, getattr(args, name)) for name in asdict(args)})


def check_output_dir(output_dir: Path, replay: str) -> None:
    """A replay writes into a new, empty folder, or goes on with its own stopped replay."""
    if not output_dir.exists() or not any(output_dir.iterdir()):
        return
    plan = output_dir / PLAN_FILE
    if plan.is_file() and load_plan(plan).options.get("replay") == replay:
        return
    raise ConfigError(
        f"--output-dir {output_dir} is not empty; a replay goes into a new, empty folder"
    )


def replayed_plan(args: QuickstartArguments) -> Plan:
    """A new plan for the replay of args.replay: that run's options and decisions (the plan,
    the allotted minutes, the evaluation sizes), with its tokenizer copied beside it; refused
    where a training run of it left no clock (made before egbert recorded them)."""
    source = Path(args.replay)
    recorded = load_plan(source / PLAN_FILE)
    for run_dir in training_runs(source):
        if not (run_dir / CLOCK_FILE).is_file():
            raise ConfigError(
                f"--replay {source}: {run_dir} has no {CLOCK_FILE} (made before egbert recorded "
                "its runs' clocks), so its steps cannot be replayed"
            )
    target = Path(args.output_dir) / "tokenizer"
    shutil.copytree(source / "tokenizer", target, dirs_exist_ok=True)
    plan = Plan(options=asdict(args), bf16=recorded.bf16)
    return replace(plan, **{name: getattr(recorded, name) for name in DECISIONS})


def training_runs(source: Path) -> list[Path]:
    """The folders of a finished run's pretraining and fine-tuning runs."""
    pretraining = [path.parent for path in (source / "pretrain").glob("*/train_results.json")]
    finetuning = [path.parent for path in (source / "finetune").rglob("eval_results.json")]
    return sorted(pretraining) + sorted(finetuning)


def replayed_clock(args: QuickstartArguments, run_dir: Path) -> str | None:
    """The replayed run's folder of the training run that goes to `run_dir` (its clock is
    replayed), None when not replaying."""
    if args.replay is None:
        return None
    return str(Path(args.replay) / run_dir.relative_to(args.output_dir))


def ran(args: QuickstartArguments, run_dir: Path) -> bool:
    """Whether the replayed run finished the fine-tuning run that goes to `run_dir`."""
    return (Path(replayed_clock(args, run_dir)) / "eval_results.json").is_file()
