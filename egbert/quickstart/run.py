"""`egbert quickstart`'s pipeline: `quickstart(args)` runs the stages in order; the helpers below
it say how each stage spends its share of the budget."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedTokenizerBase

from egbert.arguments import arguments_from_options
from egbert.config import load_recipe
from egbert.errors import ConfigError
from egbert.evaluation import probe, prompting
from egbert.families import MODEL_FAMILIES
from egbert.finetune.tasks import get_task, split_file
from egbert.hub import check_hub_reachable
from egbert.outputs import check_output_folder
from egbert.pretrain import run as pretrain_run
from egbert.quickstart import planner
from egbert.quickstart.budget import Budget, EvaluationRun, Plan, load_plan, planned_size
from egbert.quickstart.options import (
    CARD_DATASETS,
    EVALUATION_SHARE,
    FAMILY_SHARES,
    FIRST_OVERHEAD_SECONDS,
    MAX_SEEDS,
    MEASURE_SHARE,
    PLAN_FILE,
    PRETRAIN_SHARES,
    PROMPT_SHARE,
    PROMPT_SHOTS,
    PROMPT_TASKS,
    REPORT_RESERVE_SECONDS,
    VALIDATION_EXAMPLES,
    WIKITEXT,
    QuickstartArguments,
    probe_options,
)
from egbert.quickstart.planner import FinetuneWork, Measurement, RunPlan
from egbert.quickstart.replay import ran, replay_arguments, replayed_clock, replayed_plan
from egbert.quickstart.report import Evaluation, FinetuneRun, Row, averaged_tasks, write_report
from egbert.quickstart.steps import (
    RunStopped,
    corpus_files,
    corpus_tokens,
    export_hub_corpus,
    find_data,
    finetune_once,
    finetune_options,
    is_finished,
    local_glue_tasks,
    prepare_tokenizer,
    pretraining_default,
    pretraining_summary,
    quickstart_pretraining,
    save_twin,
    train_size,
)
from egbert.quickstart.throughput import device_memory, measure_family, presets_by_size
from egbert.training.runtime import bf16_pays_off, training_device

# The fine-tuned rows in priority order, as the planner names them (planner.FinetuneWork.models)
FINETUNED = (Row("bert"), Row("bert", pretrained=False), Row("gpt"), Row("elmo"))


def run_quickstart(**options: Any) -> dict[str, Any]:
    """`egbert quickstart` from Python: the keyword arguments are its options
    (QuickstartArguments fields); returns the report it writes to results.json ({} when a
    signal stopped it)."""
    (args,) = arguments_from_options((QuickstartArguments,), options)
    return quickstart(args)


def quickstart(args: QuickstartArguments) -> dict[str, Any]:
    """Tokenizer -> the plan -> pretraining -> probe and prompts -> fine-tuning -> results
    (with --replay, the finished run's plan and clocks: egbert.quickstart.replay)."""
    args = replay_arguments(args) if args.replay else args
    output_dir = check_output_folder(args.output_dir, "--output-dir")
    # Data: local files, or the hub's written out as local files
    if args.from_hub:
        check_hub_reachable(instead="drop --from-hub and point --data at local WikiText-2 files")
        data, glue = export_hub_corpus(output_dir / "hub-data"), None
    else:
        data = find_data(args.data)
        glue = data / "glue"
    tasks = local_glue_tasks(args.tasks, glue)
    # The plan: new, or the one an interrupted start of the same options left
    budget = start_budget(args, output_dir)
    print(f"[1/6] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer = prepare_tokenizer(
        output_dir, [data / WIKITEXT / "wiki.train.tokens"], args.vocab_size
    )
    print(f"[2/6] planning for this machine ({precision(budget)})", flush=True)
    plan = plan_for_machine(args, budget, tokenizer, data, tasks, glue)
    # every fine-tune loads a pretrained model under a new head: the report of its missing head
    # weights, dozens of times, would bury the progress
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        print(
            f"[3/6] pretraining bert, gpt and elmo in "
            f"{plan.seconds['pretraining'] / 60:.1f} of {args.budget_minutes:g} minutes",
            flush=True,
        )
        models = pretrain_families(args, budget, data, plan)
        models |= save_twins(args, tokenizer, plan)
        pretraining = {
            family: pretraining_summary(models[Row(family)]) for family in MODEL_FAMILIES
        }
        glue_dir = glue or data / "glue"
        print(
            f"[4/6] probing {len(models)} models and prompting gpt and its twin in "
            f"{EVALUATION_SHARE * args.budget_minutes:.1f} minutes at most",
            flush=True,
        )
        probes, prompts, prompt_tasks = evaluate_models(models, tasks, glue_dir, args, budget)
        finetuned = FINETUNED[: len(plan.finetuning.models)]  # the plan's, in this order
        print(f"[5/6] fine-tuning {', '.join(r.label for r in finetuned)} on {', '.join(tasks)}")
        finetune = finetune_models(
            {row: models[row] for row in finetuned}, tasks, glue, args, budget, plan
        )
        print(f"[6/6] results -> {output_dir / 'results.md'}", flush=True)
        report = write_report(
            output_dir, tasks, prompt_tasks, pretraining, finetune, probes, prompts,
            extra={"plan": asdict(budget.plan), "minutes": spent_minutes(budget)},
        )  # fmt: skip
        budget.save()
        print(f"quickstart: {report['minutes']:.1f} of {args.budget_minutes:g} minutes")
        return report
    except RunStopped:
        print("egbert quickstart: stopped; run the same command again to go on from there")
        return {}
    finally:
        transformers.logging.set_verbosity(verbosity)


def precision(budget: Budget) -> str:
    if budget.plan.fp16:
        return "fp16 with loss scaling (this GPU has no bf16)"
    return "bf16" if budget.plan.bf16 else "fp32 (bf16 is slower here)"


def autocast_dtype(plan: Plan) -> torch.dtype | None:
    """The dtype the plan trains in under autocast (None: fp32)."""
    return torch.float16 if plan.fp16 else torch.bfloat16 if plan.bf16 else None


def spent_minutes(budget: Budget) -> float:
    return round((budget.total - budget.left()) / 60, 2)


def start_budget(args: QuickstartArguments, output_dir: Path) -> Budget:
    """The plan of this output folder: new, or the one a previous start left (then its options
    must be these); written to plan.json at once."""
    path = output_dir / PLAN_FILE
    options = asdict(args)
    if path.is_file():
        plan = load_plan(path)
        changed = [
            f"{name} {plan.options.get(name)} -> {value}"
            for name, value in options.items()
            if name != "output_dir" and plan.options.get(name) != value
        ]
        if changed:
            raise ConfigError(
                f"{output_dir} holds a quickstart run made with other options "
                f"({'; '.join(changed)}); pass another --output-dir, or the same options"
            )
        print(f"  reusing {path} ({plan.spent_seconds / 60:.1f} min spent)", flush=True)
    else:
        output_dir.mkdir(parents=True, exist_ok=True)
        if args.replay:
            plan = replayed_plan(args)
        else:
            device = training_device()
            bf16 = bf16_pays_off(device)
            plan = Plan(options=options, bf16=bf16, fp16=device == "cuda" and not bf16)
    budget = Budget(plan, path, args.budget_minutes)
    budget.save()
    return budget


# ---------------------------------------------------------------- the plan


def plan_for_machine(
    args: QuickstartArguments,
    budget: Budget,
    tokenizer: PreTrainedTokenizerBase,
    data: Path,
    tasks: list[str],
    glue: Path | None,
) -> RunPlan:
    """The plan in plan.json, or a new one from this machine's measured throughput
    (egbert.quickstart.planner), printed with its reasons either way."""
    if budget.plan.run_plan is not None:
        print(f"  reusing the plan in {budget.path}", flush=True)
        plan = planner.run_plan_from_dict(budget.plan.run_plan)
    else:
        train_files, _ = corpus_files(data)
        budget.plan.corpus_tokens = corpus_tokens(tokenizer, train_files)
        memory = device_memory(training_device())
        measurements = measure_throughputs(args, budget, tokenizer, memory)
        budget.plan.measurements = [asdict(m) for m in measurements]
        plan = planner.plan_run(
            measurements,
            budget_seconds=budget.total,
            spent_seconds=budget.total - budget.left(),
            corpus_tokens=budget.plan.corpus_tokens,
            work=finetune_work(tasks, glue),
            pretrain_shares=PRETRAIN_SHARES,
            family_shares=FAMILY_SHARES,
            evaluation_share=EVALUATION_SHARE,
            reserve_seconds=REPORT_RESERVE_SECONDS,
            pretrain_overhead_seconds=FIRST_OVERHEAD_SECONDS["pretrain"],
            memory_bytes=memory,
        )
        budget.plan.run_plan = asdict(plan)
        budget.save()
    print_plan(plan, budget)
    return plan


def measure_throughputs(
    args: QuickstartArguments,
    budget: Budget,
    tokenizer: PreTrainedTokenizerBase,
    memory_bytes: int | None,
) -> list[Measurement]:
    """Training steps of each family timed at its presets (only --preset's, when given), from
    the smallest up while a larger one could still lower the predicted loss, in MEASURE_SHARE
    of the budget at most; on a GPU within its `memory_bytes`."""
    device, start = training_device(), time.perf_counter()
    deadline = start + MEASURE_SHARE * budget.total
    corpus = budget.plan.corpus_tokens
    measured: list[Measurement] = []
    for family in MODEL_FAMILIES:
        seconds = budget.total * PRETRAIN_SHARES[0] * FAMILY_SHARES[family]

        def larger_may_pay(found: list[Measurement], seconds=seconds) -> bool:
            fitting = [m for m in found if planner.fits_memory(m, memory_bytes)]
            losses = [
                planner.predicted_loss(m.parameters, m.tokens_per_second * seconds, corpus)
                for m in best_per_preset(fitting)
            ]
            improving = len(losses) < 2 or losses[-1] < losses[-2]
            return improving and time.perf_counter() < deadline

        presets = [args.preset] if args.preset else presets_by_size(family)
        dtype = autocast_dtype(budget.plan)
        measured += measure_family(
            family, presets, tokenizer, device, dtype, larger_may_pay, memory_bytes
        )
    print(f"  measured {len(measured)} step times in {time.perf_counter() - start:.0f} s")
    return measured


def best_per_preset(measured: list[Measurement]) -> list[Measurement]:
    """Each preset's fastest measurement, in the order the presets were measured."""
    best: dict[str, Measurement] = {}
    for m in measured:
        if m.preset not in best or m.tokens_per_second > best[m.preset].tokens_per_second:
            best[m.preset] = m
    return list(best.values())


def finetune_work(tasks: list[str], glue: Path | None) -> FinetuneWork:
    """The fine-tuning stage's work at the quickstart-finetune recipe: each task's training
    examples (at most the recipe's cap) for the recipe's epochs."""
    recipe = load_recipe("bert", "quickstart-finetune")
    cap = recipe["max_train_samples"]
    examples = {task: min(train_size(task, glue) or cap, cap) for task in tasks}
    overhead = FIRST_OVERHEAD_SECONDS["finetune"]
    return FinetuneWork(examples, recipe["epochs"], overhead_seconds=overhead)


def print_plan(plan: RunPlan, budget: Budget) -> None:
    for family, choice in plan.pretraining.items():
        print(
            f"  {family}: {choice.preset}, batch {choice.batch_size} x {choice.seq_len}, "
            f"{choice.minutes:.2f} min, ~{choice.tokens:,} tokens ({choice.passes:g} passes)"
            f"; {choice.reason}",
            flush=True,
        )
    print(f"  fine-tuning: {plan.finetuning.reason}")
    stages = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in plan.seconds.items())
    print(f"  planned: {stages} of {budget.total:.0f} s", flush=True)


# ---------------------------------------------------------------- pretraining


def pretrain_families(
    args: QuickstartArguments, budget: Budget, data: Path, plan: RunPlan
) -> dict[Row, Path]:
    """Each family pretrained with `egbert pretrain`'s defaults and quickstart's choices over them
    (quickstart_pretraining) at the plan's size, batch, length, lr and minutes (and its passes
    cap)."""
    train_files, valid_files = corpus_files(data)
    output_dir = Path(args.output_dir)
    run_dirs = {}
    for family in MODEL_FAMILIES:
        run_dir = run_dirs[Row(family)] = output_dir / "pretrain" / family
        if is_finished(run_dir):
            print(f"  {family}: reusing {run_dir}", flush=True)
            continue
        choice = plan.pretraining[family]
        print(f"  {family}: {choice.minutes:.2f} minutes of training -> {run_dir}", flush=True)
        start = time.perf_counter()
        result = pretrain_run.run_pretraining(
            model=family,
            preset=choice.preset,
            batch_size=choice.batch_size,
            grad_accum=choice.grad_accum,
            gradient_checkpointing=choice.gradient_checkpointing,
            seq_len=choice.seq_len,
            lr=pretraining_default(family, "lr") * choice.lr_scale,
            tokenizer=str(output_dir / "tokenizer"),
            train_files=list(map(str, train_files)),
            validation_files=list(map(str, valid_files)),
            max_eval_samples=VALIDATION_EXAMPLES,
            doc_boundary="wikitext",
            # Two Gutenberg books are Latin-1; their 7 non-ASCII bytes are not worth a pass.
            encoding_errors="replace",
            budget_minutes=choice.minutes,
            epochs=choice.epochs,
            bf16=budget.plan.bf16,
            fp16=budget.plan.fp16,
            seed=args.seed,
            save_every=500,
            keep_checkpoints=1,
            resume=(run_dir / "checkpoints").is_dir(),
            replay_clock=replayed_clock(args, run_dir),
            output_dir=str(run_dir),
            card_datasets=CARD_DATASETS,
            **quickstart_pretraining(family),
        )
        if result.interrupted:
            raise RunStopped
        budget.record("pretrain", time.perf_counter() - start, result.elapsed_seconds)
        budget.save()
    return run_dirs


def save_twins(
    args: QuickstartArguments, tokenizer: PreTrainedTokenizerBase, plan: RunPlan
) -> dict[Row, Path]:
    """Each family's twin: its model as pretraining starts it (the planned size), saved at its
    random weights."""
    pretrain_dir = Path(args.output_dir) / "pretrain"
    return {
        Row(family).twin(): save_twin(
            family,
            plan.pretraining[family].preset,
            args.seed,
            tokenizer,
            pretrain_dir / f"{family}-random",
        )
        for family in MODEL_FAMILIES
    }


# ---------------------------------------------------------------- probe and prompts


def evaluate_models(
    models: dict[Row, Path],
    tasks: list[str],
    glue_dir: Path,
    args: QuickstartArguments,
    budget: Budget,
) -> tuple[dict[Row, Evaluation], dict[Row, Evaluation], list[str]]:
    """(probes, prompts, prompt tasks): gpt and its twin prompted in PROMPT_SHARE of
    EVALUATION_SHARE of the budget, then every model probed in what is left of it. A model and
    its twin share one size (examples per task), the planned one or less where the runs measured
    before say the share left needs it, and never less than a tenth of it."""
    prompt_tasks = [t for t in PROMPT_TASKS if split_file(get_task(t), "validation", glue_dir)]
    pairs = [(Row(family), Row(family).twin()) for family in MODEL_FAMILIES]
    # The prompts first, in their part of the share, so that probes slower than measured
    # (elmo's cost more an example than bert's) cannot leave them nothing.
    groups = [("prompt-eval", (Row("gpt"), Row("gpt").twin()))]
    groups += [("probe", pair) for pair in pairs]
    share = EVALUATION_SHARE * budget.total
    start = time.perf_counter()
    found: dict[str, dict[Row, Evaluation]] = {"probe": {}, "prompt-eval": {}}
    for number, (command, rows) in enumerate(groups):
        later = [group for group in groups[number:] if group[0] == command]
        runs_left = sum(len(group_rows) for _, group_rows in later)
        size = budget.size_for(
            f"{command}/{rows[0].family}",
            command,
            planned_size(command, args.budget_minutes),
            share * PROMPT_SHARE if command == "prompt-eval" else share,
            runs_left,
            required=True,
        )
        budget.save()
        for row in rows:
            found[command][row] = Evaluation(
                evaluate_once(
                    command, row, models[row], budget, size, tasks, prompt_tasks, glue_dir, args
                ),
                size,
            )
    print(f"  probed and prompted in {time.perf_counter() - start:.0f} s", flush=True)
    return found["probe"], found["prompt-eval"], prompt_tasks


def evaluate_once(
    command: str,
    row: Row,
    model_dir: Path,
    budget: Budget,
    size: int,
    tasks: list[str],
    prompt_tasks: list[str],
    glue_dir: Path,
    args: QuickstartArguments,
) -> dict[str, Any]:
    """`egbert probe` or `egbert prompt-eval` (their Python API) on one model at `size` examples
    per task, into <output>/<command>/<model>/, or the results a finished run left there."""
    out = model_dir.parent.parent / command / model_dir.name
    results_file = out / (probe.RESULTS_FILE if command == "probe" else prompting.RESULTS_FILE)
    if results_file.is_file():
        return json.loads(results_file.read_text(encoding="utf-8"))
    print(f"  {command}: {model_dir.name} ({size} examples a task)", flush=True)
    start = time.perf_counter()
    if command == "probe":
        options = {**probe_options(row.family), "max_train_samples": size}
        results = probe.run_probe(
            model_dir, tasks, glue_dir, seed=args.seed, output_dir=out, **options
        )
    else:
        results = prompting.run_prompt_eval(
            model_dir, prompt_tasks, glue_dir, shots=PROMPT_SHOTS, max_eval_samples=size,
            seed=args.seed, output_dir=out,
        )  # fmt: skip
    seconds = round(time.perf_counter() - start, 2)
    budget.record_evaluation(EvaluationRun(command, model_dir.name, size, seconds))
    budget.save()
    return results


# ---------------------------------------------------------------- fine-tuning


def finetune_models(
    models: dict[Row, Path],
    tasks: list[str],
    glue: Path | None,
    args: QuickstartArguments,
    budget: Budget,
    plan: RunPlan,
) -> dict[Row, dict[str, dict[int, FinetuneRun]]]:
    """{row: {task: {seed: its run}}}, each run at most the plan's steps. First every
    model with the first seed, task by task, each run of a task for the same minutes (its share
    of the time left); then, while the time left allows a task's runs again, bert and its twin
    with further seeds, task by task (not the tasks NOT_AVERAGED: no average holds them)."""
    tasks = sorted(tasks, key=lambda task: train_size(task, glue))  # small first: time left over
    first = [(task, [(row, args.seed) for row in models]) for task in tasks]
    scores = run_finetune_pass(first, models, glue, args, budget, plan)
    pairs = [row for row in models if row.family == "bert"]
    for seed in range(args.seed + 1, args.seed + MAX_SEEDS):
        for task in averaged_tasks(tasks):
            keys = [run_key(models[row], head, task, seed) for row in pairs for head in args.heads]
            needed = sum(
                budget.plan.run_seconds.get(run_key(models[row], head, task, args.seed), 0.0)
                for row in pairs
                for head in args.heads
            )
            if further_seed_goes(keys, needed, args, budget):
                runs = [(task, [(row, seed) for row in pairs])]
                found = run_finetune_pass(runs, models, glue, args, budget, plan)
                for row, by_task in found.items():
                    scores[row][task] |= by_task[task]
    return scores


def further_seed_goes(
    keys: list[str], needed: float, args: QuickstartArguments, budget: Budget
) -> bool:
    """Whether a task's runs `keys` with a further seed go ahead: where they ran before (a
    rerun) or the time left has the seconds `needed`; in a replay, where the replayed run made
    them."""
    if args.replay:
        return all(ran(args, budget.path.parent / "finetune" / key) for key in keys)
    done = all(key in budget.plan.run_seconds for key in keys)
    return done or needed < budget.left() - REPORT_RESERVE_SECONDS


def run_finetune_pass(
    passes: list[tuple[str, list[tuple[Row, int]]]],
    models: dict[Row, Path],
    glue: Path | None,
    args: QuickstartArguments,
    budget: Budget,
    plan: RunPlan,
) -> dict[Row, dict[str, dict[int, FinetuneRun]]]:
    """Fine-tune each (task, [(model, seed), ...]) of `passes` with every head, each run at most
    the plan's steps and at the lr for its model's width: the runs of a task get the same
    minutes, the time left shared out over the runs left."""
    scores: dict[Row, dict[str, dict[int, FinetuneRun]]] = {}
    total = sum(len(runs) for _, runs in passes) * len(args.heads)
    number = 0
    for task, runs in passes:
        for (model, seed), head in ((run, head) for run in runs for head in args.heads):
            key = run_key(models[model], head, task, seed)
            left = max(budget.left() - REPORT_RESERVE_SECONDS, 0.0)
            minutes = budget.allot(
                f"finetune/{task}/seed{seed}", left / (total - number), "finetune"
            )
            budget.save()
            number += 1
            print(f"  ({number}/{total}) {model.label} / {head} / {task} / seed {seed}")
            start = time.perf_counter()
            mixed = budget.plan.bf16, budget.plan.fp16
            options = finetune_options(models[model], task, head, seed, glue, *mixed)
            options["lr"] *= plan.pretraining[model.family].finetune_lr_scale
            cap = plan.finetuning.max_steps
            if cap is not None and cap < task_run_steps(task, glue, options):
                options["max_steps"] = cap  # the schedule ends there
            run_dir = budget.path.parent / "finetune" / key
            options["replay_clock"] = replayed_clock(args, run_dir)
            result, trained = finetune_once(run_dir, budget_minutes=minutes, **options)
            if trained:
                budget.record("finetune", time.perf_counter() - start, result["train_seconds"])
                budget.plan.run_seconds[key] = round(time.perf_counter() - start, 2)
                budget.save()
            row = model if len(args.heads) == 1 else Row(model.family, model.pretrained, head)
            run = FinetuneRun(result["score"], result.get("dev_predictions", {}))
            scores.setdefault(row, {}).setdefault(task, {})[seed] = run
    return scores


def task_run_steps(task: str, glue: Path | None, options: dict[str, Any]) -> int:
    """Steps of a fine-tuning run with these options over the task's (local) training set."""
    count = min(
        train_size(task, glue) or options["max_train_samples"], options["max_train_samples"]
    )
    return planner.finetune_run_steps(count, options["epochs"])


def run_key(model_dir: Path, head: str, task: str, seed: int) -> str:
    """A fine-tuning run's folder under finetune/ and its key in plan.json."""
    return f"{model_dir.name}/{head}/{task}-seed{seed}"
