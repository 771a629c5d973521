"""`egbert probe`: score a frozen model's features with a linear probe (egbert.evaluation.probe)."""

from __future__ import annotations

from egbert.evaluation.probe import RESULTS_FILE, build_parser, probe_table, run_probe
from egbert.evaluation.results import print_results


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = run_probe(**vars(args))
    print_results("probe", probe_table(results), args.output_dir, RESULTS_FILE)
