"""Validation loss of pretrained models on one and the same set of examples, so that runs made
with different options compare (docs/defaults.md): a bert run's own evaluation masks at its own
--mlm-probability, which makes a 40%-masking run's MLM loss incomparable with a 15% one's.

    python scripts/pretrain_eval.py --tokenizer runs/tok --files wiki.valid.tokens \\
        --models runs/bert-old runs/bert-new [--mlm-probability 0.15] [--max-examples 2000]

bert: MLM loss and accuracy at --mlm-probability (15%, BERT's) on NSP pairs of the files with
the same masks for every model, and NSP accuracy; gpt: causal LM loss and perplexity on packed
128-token blocks; elmo: the mean of the forward and backward losses and its perplexity on
64-token blocks. One Markdown table.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import egbert


def examples(family: str, tokenizer, files: list[str], limit: int):
    """The family's evaluation examples of `files` and their collator (seed 0)."""
    documents = egbert.read_documents(files, doc_boundary="wikitext", errors="replace")
    tokenized = egbert.tokenize_documents(documents, tokenizer, split_sentences=family == "bert")
    if family == "bert":
        ids = {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id}
        built = egbert.build_nsp_examples(tokenized, 128, seed=0, **ids)
    else:
        built = egbert.pack_blocks(
            tokenized, 128 if family == "gpt" else 64, tokenizer.eos_token_id
        )
    return built.select(range(min(limit, len(built))))


@torch.no_grad()
def evaluate(model_dir: Path, tokenizer, files: list[str], limit: int, mlm: float) -> dict:
    config = egbert.read_model_config(model_dir)
    family = config["model_type"].removeprefix("egbert-")
    model_class = {
        "bert": egbert.EgbertBertForPreTraining,
        "gpt": egbert.EgbertGPTForCausalLM,
        "elmo": egbert.EgbertElmoForBidirectionalLM,
    }[family]
    model = egbert.load_pretrained(model_class, model_dir).eval()
    data = examples(family, tokenizer, files, limit)
    if family == "bert":
        collator = egbert.MLMCollator(tokenizer, mlm_probability=mlm, seed=0)
    else:
        collator = egbert.CausalLMCollator(tokenizer)
    sums = {"loss": 0.0, "targets": 0.0, "correct": 0.0, "nsp": 0.0, "pairs": 0.0}
    for batch in DataLoader(data, batch_size=32, collate_fn=collator):
        outputs = model(**batch)
        if family == "bert":
            masked = batch["labels"] != -100
            logits = outputs.prediction_logits
            predicted = logits.argmax(-1) if logits.dim() == 2 else logits.argmax(-1)[masked]
            n = float(masked.sum())
            sums["loss"] += outputs.mlm_loss.item() * n
            sums["correct"] += float((predicted == batch["labels"][masked]).sum())
            nsp = outputs.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]
            sums["nsp"] += float(nsp.sum())
            sums["pairs"] += len(nsp)
        else:
            real = batch["labels"] != -100
            n = float((real[:, 1:] & real[:, :-1]).sum())
            sums["loss"] += outputs.loss.item() * n
        sums["targets"] += n
    loss = sums["loss"] / sums["targets"]
    if family == "bert":
        return {
            "MLM loss": f"{loss:.3f}",
            "MLM accuracy": f"{100 * sums['correct'] / sums['targets']:.1f}%",
            "NSP accuracy": f"{100 * sums['nsp'] / sums['pairs']:.1f}%",
        }
    return {"loss": f"{loss:.3f}", "perplexity": f"{math.exp(loss):.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    columns = list(next(iter(rows.values())))
    print("| model | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(values[c] for c in columns) + " |")


if __name__ == "__main__":
    main()
