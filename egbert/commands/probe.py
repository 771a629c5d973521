"""`egbert probe`: score a frozen model's features with a linear probe (egbert.evaluation.probe)."""

from __future__ import annotations

from egbert.evaluation.probe import RESULTS_FILE, build_parser, results_table, run_probe


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = run_probe(**vars(args))
    print(results_table(results))
    if args.output_dir is not None:
        print(f"egbert probe: wrote {args.output_dir / RESULTS_FILE}")
