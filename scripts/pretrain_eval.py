"""Validation loss of pretrained models on one and the same set of examples, so that runs made
with different options compare (docs/defaults.md): a bert run's own evaluation masks at its own
--mlm-probability, which makes a 40%-masking run's MLM loss incomparable with a 15% one's.

    python scripts/pretrain_eval.py --tokenizer runs/tok --files wiki.valid.tokens \\
        --models runs/bert-old runs/bert-new [--mlm-probability 0.15] [--max-examples 2000]

bert: MLM loss and accuracy at --mlm-probability (15%, BERT's) on NSP pairs of the files with
the same masks for every model, and NSP accuracy; gpt: causal LM loss and perplexity on packed
128-token blocks; elmo: the mean of the forward and backward losses and the mean of their
perplexities on 64-token blocks. The metrics are `egbert pretrain`'s own (egbert.EVAL_METRICS) on
examples built as it builds them (egbert.build_examples). One Markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import egbert

SEQ_LEN = {"bert": 128, "gpt": 128, "elmo": 64}
MODEL_CLASSES = {
    "bert": egbert.EgbertBertForPreTraining,
    "gpt": egbert.EgbertGPTForCausalLM,
    "elmo": egbert.EgbertElmoForBidirectionalLM,
}


def examples(family: str, tokenizer, files: list[str], limit: int, mlm: float):
    """The family's first `limit` evaluation examples of `files` and their collator, built as
    `egbert pretrain` builds them (seed 0; bert's masks at `mlm`)."""
    data_args = egbert.DataArguments(
        tokenizer=tokenizer.name_or_path,
        train_files=files,
        doc_boundary="wikitext",
        encoding_errors="replace",
        seq_len=SEQ_LEN[family],
    )
    objective_args = egbert.ObjectiveArguments(mlm_probability=mlm)
    built, collator = egbert.build_examples(
        family, data_args, objective_args, tokenizer, files, seed=0
    )
    return built.select(range(min(limit, len(built)))), collator


@torch.no_grad()
def evaluate(model_dir: Path, tokenizer, files: list[str], limit: int, mlm: float) -> dict:
    """The metrics `egbert pretrain` reports on its validation files (EVAL_METRICS), as text."""
    family = egbert.read_model_config(model_dir)["model_type"].removeprefix("egbert-")
    model = egbert.load_pretrained(MODEL_CLASSES[family], model_dir).eval()
    data, collator = examples(family, tokenizer, files, limit, mlm)
    batch_metrics, finalize_metrics = egbert.EVAL_METRICS[family]
    sums: dict[str, list[float]] = {}
    for batch in DataLoader(data, batch_size=32, collate_fn=collator):
        for name, (total, count) in batch_metrics(batch, model(**batch)).items():
            sums.setdefault(name, [0.0, 0.0])
            sums[name][0] += total
            sums[name][1] += count
    metrics = {name: total / count for name, (total, count) in sums.items()}
    if finalize_metrics is not None:
        metrics = finalize_metrics(metrics)
    if family == "bert":
        return {
            "MLM loss": f"{metrics['mlm_loss']:.3f}",
            "MLM accuracy": f"{100 * metrics['mlm_accuracy']:.1f}%",
            "NSP accuracy": f"{100 * metrics['nsp_accuracy']:.1f}%",
        }
    return {"loss": f"{metrics['loss']:.3f}", "perplexity": f"{metrics['perplexity']:.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--files", nargs="+", required=True, help="validation text files")
    parser.add_argument("--models", nargs="+", required=True, type=Path, help="run or model dirs")
    parser.add_argument("--mlm-probability", type=float, default=0.15)
    parser.add_argument("--max-examples", type=int, default=2000)
    args = parser.parse_args()
    tokenizer = egbert.load_tokenizer(args.tokenizer)
    rows = {
        str(path): evaluate(path, tokenizer, args.files, args.max_examples, args.mlm_probability)
        for path in args.models
    }
    columns = list(dict.fromkeys(column for values in rows.values() for column in values))
    print("| model | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(values.get(c, "") for c in columns) + " |")


if __name__ == "__main__":
    main()
