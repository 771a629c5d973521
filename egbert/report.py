"""What a training run writes for people: its log (console, `train.log`, `metrics.jsonl` and the
trackers of `--report-to`), the loss curve, and the model card of the saved model.

The model card follows the Hub's model-card metadata (YAML front matter through
`huggingface_hub.ModelCardData`): license, language, datasets, base_model, pipeline_tag,
library_name, and a `model-index` of the evaluation results when the job says what they measure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from tqdm.auto import tqdm

METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "train_results.json"
LOG_FILE = "train.log"
LOSS_CURVE = "loss_curve.png"


class RunLog:
    """A run's log: messages go to the console and to `train.log`; metric records (train and
    eval) to `metrics.jsonl` and to the trackers Accelerate was given (`log_with`). Only the
    main process writes; the others' calls do nothing."""

    def __init__(self, accelerator, output_dir: Path) -> None:
        self.accelerator = accelerator
        self.output_dir = output_dir
        self.writes = accelerator.is_main_process
        self._early: list[str] = []

    def message(self, text: str) -> None:
        """Print a line (above the progress bar) and keep it in train.log."""
        if self.accelerator.is_local_main_process:
            tqdm.write(text)
        self._append(LOG_FILE, text)

    def early_message(self, text: str) -> None:
        """A line said before the run starts: printed now, kept in train.log from the run's
        first line on (so that a run refused at its start writes nothing)."""
        if self.accelerator.is_local_main_process:
            tqdm.write(text)
        self._early.append(text)

    def record(self, split: str, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl, the same values to the trackers under `split/`."""
        self._append(METRICS_FILE, json.dumps({"split": split, **record}))
        numbers = {
            f"{split}/{name}": value
            for name, value in record.items()
            if name != "step" and isinstance(value, int | float)
        }
        self.accelerator.log(numbers, step=record["step"])
        if split == "train":
            shown = ", ".join(
                f"{name} {value:.4g}" for name, value in record.items() if name != "step"
            )
            self._append(LOG_FILE, f"step {record['step']}: {shown}")

    def results(self, results: dict[str, Any]) -> None:
        """train_results.json: what a finished run did (steps, tokens, time, final metrics), for
        whoever looks at the folder later (`read_train_results`)."""
        if self.writes:
            text = json.dumps(results, indent=2, default=str) + "\n"
            (self.output_dir / RESULTS_FILE).write_text(text, encoding="utf-8")

    def records(self) -> list[dict[str, Any]]:
        path = self.output_dir / METRICS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def truncate(self, after_step: int) -> None:
        """Drop metric records past the checkpoint a run restarts from: those steps are trained
        again."""
        path = self.output_dir / METRICS_FILE
        if not self.writes or not path.is_file():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if _record_step(line) <= after_step]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def _append(self, name: str, line: str) -> None:
        if not self.writes:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if name == LOG_FILE:
            line = "\n".join([*self._early, line])
            self._early.clear()
        with (self.output_dir / name).open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def progress_postfix(record: dict[str, Any]) -> dict[str, str]:
    """What the progress bar shows of a training log record: loss, lr, tokens/s (and MFU)."""
    postfix = {
        "loss": f"{record['loss']:.4f}",
        "lr": f"{record['lr']:.2e}",
        "tok_s": f"{record['tokens_per_s']:.0f}",
    }
    if "mfu" in record:
        postfix["mfu"] = f"{record['mfu']:.3f}"
    return postfix


class LossWindow:
    """What the next training log record averages: the losses of the steps since the last one
    (by name: loss, mlm_loss, ...), and the tokens and model FLOPs of its timed steps, for
    tokens/s and MFU."""

    def __init__(self, start_seconds: float) -> None:
        self.sums: dict[str, float] = {}
        self.steps, self.tokens, self.flops, self.start = 0, 0.0, 0.0, start_seconds

    def add(self, loss_sums: dict[str, float], steps: int, tokens: float, flops: float) -> None:
        """`steps` more steps: their losses summed, their timed tokens and FLOPs."""
        for name, value in loss_sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.steps += steps
        self.tokens += tokens
        self.flops += flops

    def record(
        self,
        step: int,
        epoch: int,
        lr: float,
        elapsed_seconds: float,
        peak_flops: float | None = None,
    ) -> dict[str, Any]:
        """The log record of the window, which ends at `elapsed_seconds` of training; with the
        matmul peak of all processes (FLOP/s), its MFU: model FLOPs per second over the peak."""
        seconds = max(elapsed_seconds - self.start, 1e-9)
        record = {
            "step": step,
            "epoch": epoch,
            **{name: total / self.steps for name, total in self.sums.items()},
            "lr": lr,
            "tokens_per_s": self.tokens / seconds,
            "elapsed_s": round(elapsed_seconds, 3),
        }
        if peak_flops:
            record["mfu"] = self.flops / seconds / peak_flops
        return record


def read_train_results(run_dir: str | Path) -> dict[str, Any]:
    """The train_results.json of a finished training run (steps, tokens, elapsed_seconds,
    metrics, ...); {} for a run that has not finished."""
    path = Path(run_dir) / RESULTS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _record_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 0


def tracker_config(options: dict[str, Any]) -> dict[str, Any]:
    """Run options as the flat scalar hyperparameters trackers take (TensorBoard's hparams)."""
    flat = {}
    for name, value in options.items():
        if isinstance(value, dict):
            flat |= {f"{name}.{key}": item for key, item in tracker_config(value).items()}
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        elif value is not None:
            flat[name] = str(value)
    return flat


def plot_loss_curve(records: list[dict[str, Any]], path: Path) -> None:
    """Training and evaluation loss against the step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for split in ("train", "eval"):
        points = [(r["step"], r["loss"]) for r in records if r["split"] == split and "loss" in r]
        if points:
            axes.plot(
                *zip(*points, strict=True),
                marker="." if split == "eval" else None,
                label=f"{split} loss",
            )
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@dataclass
class ModelCardInfo:
    """What a job knows about the model it trains, for the card's Hub metadata. Hub fields must
    hold Hub ids (the Hub refuses local paths): leave datasets and base_model empty when the
    data or the starting model are local files."""

    pipeline_tag: str | None = None
    license: str = "apache-2.0"
    language: list[str] = field(default_factory=lambda: ["en"])
    datasets: list[str] = field(default_factory=list)
    base_model: str | None = None
    # what the evaluation measured, for the model-index: task_type, dataset_type, dataset_name,
    # and optionally dataset_config and dataset_split (see huggingface_hub.EvalResult)
    evaluation: dict[str, str] | None = None
    description: str = ""


def training_summary(state: Any, accelerator: Any) -> str:
    """One sentence on how long a run trained, from its TrainerState."""
    return (
        f"{state.step} optimizer steps, {state.epoch} full epochs, {state.tokens_seen:,} tokens, "
        f"{state.elapsed_seconds / 60:.1f} minutes of training on {accelerator.num_processes} "
        f"process(es) ({accelerator.device.type})."
    )


def model_card(
    info: ModelCardInfo,
    model: Any,
    name: str,
    metrics: dict[str, float],
    training: str,
    options: dict[str, Any],
) -> ModelCard:
    """The card of a saved model: Hub metadata, how to load it (with and without egbert), its
    evaluation, and how it was trained. `name` is the model folder's name; the usage snippet
    uses it rather than a path of the training machine."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    config_json = config.to_json_string() if hasattr(config, "to_json_string") else "{}"
    data = _card_metadata(info, model_type, name, metrics)
    table = "\n".join(f"| {metric} | {value:.4f} |" for metric, value in metrics.items())
    body = f"""
# {name}

{info.description or f"A `{type(model).__name__}` ({model_type}) trained with egbert."}

## Use

```python
from transformers import AutoModel, AutoTokenizer

# with egbert installed, `import egbert` registers its model types; without it, the modeling
# files in this folder are used when you pass trust_remote_code=True (the tokenizer is
# transformers' own, but AutoTokenizer reads the model's config.json first)
tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
model = AutoModel.from_pretrained("{name}", trust_remote_code=True)
```

`"{name}"` is this folder, or its Hub id once pushed (`egbert push`). The full model with its
head is `{type(model).__name__}`. The modeling files need `transformers>=5.24,<6`.

## Evaluation

| metric | value |
|---|---|
{table or "| (no evaluation data) | |"}

## Training

{training}

```json
{json.dumps(options, indent=2, default=str)}
```

## Model configuration

```json
{config_json}
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def _card_metadata(
    info: ModelCardInfo, model_type: str, name: str, metrics: dict[str, float]
) -> ModelCardData:
    """The card's Hub metadata (its YAML header), with the evaluation as model-index results
    where the card says what it was evaluated on."""
    evaluated = {k: v for k, v in metrics.items() if k != "loss" and isinstance(v, int | float)}
    results = []
    if info.evaluation and evaluated:
        results = [
            EvalResult(metric_type=metric, metric_value=round(float(value), 4), **info.evaluation)
            for metric, value in evaluated.items()
        ]
    return ModelCardData(
        library_name="transformers",
        license=info.license,
        language=info.language,
        datasets=info.datasets or None,
        base_model=info.base_model,
        pipeline_tag=info.pipeline_tag,
        tags=["egbert", model_type, "custom_code"],
        model_name=name if results else None,
        eval_results=results or None,
    )
