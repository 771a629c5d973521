"""The quickstart pipeline at a chosen scale, with several classifier heads per model.

`egbert quickstart` with more heads by default: every model is fine-tuned with each head asked
for (features `cls`, `last4-concat`, `last4-sum` or `scalar-mix`, the model fine-tuned or frozen)
and the tables get one row per model and head. A rerun reuses every finished step.

    python scripts/glue_table.py --preset mini --budget-minutes 120 --tasks rte mrpc stsb cola \\
        --heads cls cls-frozen last4-concat last4-concat-frozen scalar-mix scalar-mix-frozen \\
        --output-dir runs/glue-mini
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import egbert

DEFAULT_HEADS = ["cls", "cls-frozen", "last4-concat", "last4-concat-frozen"]
DEFAULT_HEADS += ["scalar-mix", "scalar-mix-frozen"]


def main(argv: list[str] | None = None) -> dict:
    defaults = {"heads": DEFAULT_HEADS, "output_dir": "runs/glue-table"}
    try:
        (args,) = egbert.parse_args(
            (egbert.QuickstartArguments,),
            argv,
            "scripts/glue_table.py",
            __doc__.split("\n\n")[0],
            defaults,
        )
        return egbert.run_quickstart(**asdict(args))
    except egbert.EgbertError as error:
        sys.exit(f"scripts/glue_table.py: error: {error}")


if __name__ == "__main__":
    main()
