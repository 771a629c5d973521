"""GLUE's metrics as a local `evaluate` module, so scoring never needs the Hugging Face Hub.

Load it with `evaluate.load(path_to_this_file, KIND)` where KIND is one of
`accuracy`, `accuracy_f1` (MRPC, QQP), `matthews_correlation` (CoLA) or
`pearson_spearman` (STS-B). The result keys are those of the hub's `glue` metric.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_DESCRIPTION = "The metrics of the GLUE benchmark (gluebenchmark.com), one configuration per kind."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (regression: predicted scores).
    references: gold class ids (regression: gold scores).
Returns:
    accuracy: fraction of exact matches (`accuracy`, `accuracy_f1`);
    f1: F1 of the positive class 1 (`accuracy_f1`);
    matthews_correlation: Matthews correlation coefficient, -1..1 (`matthews_correlation`);
    pearson, spearmanr: correlation coefficients, -1..1 (`pearson_spearman`); 0 when the
        predictions are all equal (a correlation with a constant is undefined).
"""

_CITATION = """@inproceedings{wang2019glue,
  title={GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer
          and Bowman, Samuel R.},
  booktitle={ICLR},
  year={2019}
}"""

KINDS = ("accuracy", "accuracy_f1", "matthews_correlation", "pearson_spearman")


def compute_kind(kind: str, predictions, references) -> dict[str, float]:
    if kind == "accuracy":
        return {"accuracy": float(accuracy_score(references, predictions))}
    if kind == "accuracy_f1":
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "f1": float(f1_score(references, predictions)),
        }
    if kind == "matthews_correlation":
        return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
    if len(set(predictions)) < 2:
        # A correlation with a constant is undefined (scipy gives nan); score it 0, as
        # sklearn's Matthews correlation does for a constant prediction, so that averages and
        # best-epoch choices stay numbers.
        return {"pearson": 0.0, "spearmanr": 0.0}
    return {
        "pearson": float(pearsonr(predictions, references)[0]),
        "spearmanr": float(spearmanr(predictions, references)[0]),
    }


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in KINDS:
            raise KeyError(f"unknown GLUE metric kind {self.config_name!r}; choose from {KINDS}")
        value_type = "float32" if self.config_name == "pearson_spearman" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value(value_type),
                    "references": datasets.Value(value_type),
                }
            ),
            homepage="https://gluebenchmark.com/",
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return compute_kind(self.config_name, predictions, references)
