"""`egbert probe`: score a frozen model's features with a linear probe (egbert.evaluation.probe)."""

from __future__ import annotations

from dataclasses import asdict

from egbert.arguments import parse_args
from egbert.evaluation.probe import (
    ALPHA_GRID,
    C_GRID,
    RESULTS_FILE,
    ProbeArguments,
    probe_table,
    run_probe,
)
from egbert.evaluation.results import print_results

DESCRIPTION = (
    "Probe a frozen model: pool one vector per example from chosen layers, fit a logistic "
    "regression (ridge for STS-B) on the training split's vectors, and score it on dev with "
    "GLUE's metric. Nothing of the model is trained."
)
EPILOG = (
    f"The probe's regularization is chosen per task: logistic regression's C from {C_GRID[0]:g}.."
    f"{C_GRID[-1]:g} by the task's GLUE score on a held-out fifth of the training vectors, "
    f"ridge's alpha from {ALPHA_GRID[0]:g}..{ALPHA_GRID[-1]:g} by leave-one-out error; features "
    "are standardized. The table gives each task's dev metrics, its score, the majority-label "
    "score it has to beat and the chosen regularization. Example: egbert probe --model "
    "runs/bert-mini --task sst2 stsb --data-dir data/glue --features last4-concat --output-dir "
    "runs/bert-mini/probe"
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((ProbeArguments,), argv, "egbert probe", DESCRIPTION, epilog=EPILOG)
    results = run_probe(**asdict(args))
    print_results("probe", probe_table(results), args.output_dir, RESULTS_FILE)
