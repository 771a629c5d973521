"""`egbert compare`: is one run better than another, beyond the dev sets' noise?
(egbert.finetune.significance)"""

from __future__ import annotations

from egbert.arguments import ArgumentParser
from egbert.finetune.significance import compare_runs, summary_line


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        "egbert compare",
        description=(
            "Compare two finetune, probe or prompt-eval runs on the dev examples both scored: "
            "per task, A minus B in points of the GLUE metric with the 95%% interval of a paired "
            "bootstrap over the dev examples. A difference is real where its interval excludes 0."
        ),
    )
    parser.add_argument("run_a", metavar="RUN_A", help="output folder of the first run")
    parser.add_argument("run_b", metavar="RUN_B", help="output folder of the second run")
    parser.add_argument("--samples", type=int, help="bootstrap draws")
    parser.add_argument("--seed", type=int, help="seed of the draws")
    parser.defaults_from(compare_runs)
    args = parser.parse_args(argv)
    differences = compare_runs(args.run_a, args.run_b, samples=args.samples, seed=args.seed)
    print(f"A: {args.run_a}\nB: {args.run_b}\n")
    print("| task | A - B (points) | 95% interval | verdict |\n|---|---:|---:|---|")
    for task, d in differences.items():
        verdict = "A ahead" if d.ahead else "B ahead" if d.behind else "within noise"
        print(f"| {task} | {d.points:+.1f} | [{d.low:+.1f}, {d.high:+.1f}] | {verdict} |")
    print(f"\n{summary_line('A', 'B', differences)}")
