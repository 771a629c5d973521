"""The quickstart comparison at a chosen scale, with several classifier heads per model.

Pretrains bert, gpt and elmo at one preset for the same number of tokens, then fine-tunes each,
plus a randomly initialised bert, with every head asked for (features `cls`, `last4-concat`,
`last4-sum` or `scalar-mix`, the model fine-tuned or frozen) on the GLUE tasks, and writes
`results.md`, `results.json` and `results.png` in the output directory (rows: model and head).
A rerun reuses every finished step, as `egbert quickstart` does.

    python scripts/glue_table.py --preset mini --budget-minutes 120 --tasks rte mrpc stsb cola \\
        --heads cls cls-frozen last4-concat last4-concat-frozen scalar-mix scalar-mix-frozen \\
        --output-dir runs/glue-mini
"""

from __future__ import annotations

from egbert.errors import EgbertError
from egbert.quickstart import Head, build_parser, check_args, run_pipeline

FEATURES = ("cls", "last4-concat", "last4-sum", "scalar-mix")
HEADS = {
    f"{features}{suffix}": Head(features=features, freeze=bool(suffix))
    for features in FEATURES
    for suffix in ("", "-frozen")
}
DEFAULT_HEADS = ["cls", "cls-frozen", "last4-concat", "last4-concat-frozen"]
DEFAULT_HEADS += ["scalar-mix", "scalar-mix-frozen"]


def main() -> None:
    parser = build_parser(prog="scripts/glue_table.py")
    parser.description = __doc__.split("\n\n")[0]
    parser.set_defaults(output_dir=parser.get_default("output_dir").with_name("glue-table"))
    parser.add_argument(
        "--heads",
        nargs="+",
        choices=list(HEADS),
        default=DEFAULT_HEADS,
        help="classifier heads; -frozen trains only the head (default: %(default)s)",
    )
    args = parser.parse_args()
    try:
        check_args(args)
        run_pipeline(args, heads=[HEADS[name] for name in args.heads])
    except EgbertError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
