"""`egbert compare`: is one run better than another, beyond the dev sets' noise?
(egbert.finetune.significance)"""

from __future__ import annotations

from egbert.arguments import parse_args
from egbert.finetune.significance import CompareArguments, compare_runs, summary_line

DESCRIPTION = (
    "Compare two finetune, probe or prompt-eval runs on the dev examples both scored: per task, "
    "A minus B in points of the GLUE metric with the 95% interval of a paired bootstrap over the "
    "dev examples. A difference is real where its interval excludes 0."
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((CompareArguments,), argv, "egbert compare", DESCRIPTION)
    differences = compare_runs(args.run_a, args.run_b, samples=args.samples, seed=args.seed)
    print(f"A: {args.run_a}\nB: {args.run_b}\n")
    print("| task | A - B (points) | 95% interval | verdict |\n|---|---:|---:|---|")
    for task, d in differences.items():
        verdict = "A ahead" if d.ahead else "B ahead" if d.behind else "within noise"
        print(f"| {task} | {d.points:+.1f} | [{d.low:+.1f}, {d.high:+.1f}] | {verdict} |")
    print(f"\n{summary_line('A', 'B', differences)}")
