"""What `egbert rlhf` reports of a tuned policy against its start, on held-out prompts each
completed by both with the same sampling seeds (so that the two rewards of a prompt are paired):

- the scorer's mean reward of each, and the change with its 95% paired-bootstrap interval;
- the KL of the tuned policy to the start per completion token, estimated on the tuned
  policy's own completions (the mean of log p_tuned - log p_start over their tokens);
- the perplexity of a validation text under each (how much of the language the tuning kept);
- the first completions of both side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from egbert.errors import DataError
from egbert.finetune.significance import SAMPLES, interval

GENERATION_BATCH = 32
PERPLEXITY_BLOCKS = 200
SIDE_BY_SIDE = 5


@dataclass
class PolicyReport:
    """The held-out prompts and how they are completed (as in training)."""

    prompts: list[str]
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    seed: int = 42
    validation_text: str | None = None


def compare_policies(
    starting: PreTrainedModel,
    tuned: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    scorer: Callable[..., list[float]],
    report: PolicyReport,
) -> dict[str, Any]:
    """The report of the module doc, as rlhf_results.json holds it."""
    device = next(tuned.parameters()).device
    starting.to(device).eval()
    tuned.eval()
    sampled = {
        name: sampled_completions(model, tokenizer, report)
        for name, model in (("before", starting), ("after", tuned))
    }
    rewards = {
        name: np.asarray(scorer(report.prompts, [""] * len(ids), completion_ids=ids))
        for name, ids in sampled.items()
    }
    prompt_ids = tokenizer(report.prompts[:SIDE_BY_SIDE])["input_ids"]
    texts = {
        name: tokenizer.batch_decode(
            [p + c for p, c in zip(prompt_ids, ids, strict=False)], skip_special_tokens=True
        )
        for name, ids in sampled.items()
    }
    results: dict[str, Any] = {
        "held_out_prompts": len(report.prompts),
        "reward": reward_change(rewards["before"], rewards["after"], report.seed),
        "kl_per_token": round(
            completion_kl(tuned, starting, tokenizer, report.prompts, sampled["after"]), 4
        )
        + 0.0,  # no "-0.0"
    }
    if report.validation_text:
        results["validation_perplexity"] = {
            name: round(text_perplexity(model, tokenizer, report.validation_text), 2)
            for name, model in (("before", starting), ("after", tuned))
        }
    results["completions"] = [
        {
            "prompt": prompt,
            **{f"text_{name}": texts[name][i] for name in sampled},
            **{f"reward_{name}": round(float(rewards[name][i]), 4) for name in sampled},
        }
        for i, prompt in enumerate(report.prompts[:SIDE_BY_SIDE])
    ]
    return results


@torch.no_grad()
def sampled_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, report: PolicyReport
) -> list[list[int]]:
    """Each prompt's sampled completion (its token ids, up to and with the first eos), batch i
    drawn with seed + i, so that every model is sampled with the same seeds."""
    device = next(model.parameters()).device
    completions: list[list[int]] = []
    for number, start in enumerate(range(0, len(report.prompts), GENERATION_BATCH)):
        batch = tokenizer(
            report.prompts[start : start + GENERATION_BATCH],
            padding=True,
            padding_side="left",
            return_tensors="pt",
        ).to(device)
        torch.manual_seed(report.seed + number)
        generated = model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            do_sample=True,
            max_new_tokens=report.max_new_tokens,
            temperature=report.temperature,
            top_k=report.top_k or None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for row in generated[:, batch["input_ids"].shape[1] :].tolist():
            completions.append(until_eos(row, tokenizer.eos_token_id))
    return completions


def until_eos(ids: list[int], eos_token_id: int | None) -> list[int]:
    """A completion up to and with its first eos (what follows it is padding)."""
    if eos_token_id is not None and eos_token_id in ids:
        return ids[: ids.index(eos_token_id) + 1]
    return ids


@torch.no_grad()
def completion_log_probs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[list[int]],
) -> list[torch.Tensor]:
    """The log-probability under `model` of each completion token after its prompt."""
    device = next(model.parameters()).device
    found: list[torch.Tensor] = []
    for start in range(0, len(prompts), GENERATION_BATCH):
        prompt_ids = tokenizer(prompts[start : start + GENERATION_BATCH])["input_ids"]
        batch = completions[start : start + GENERATION_BATCH]
        rows = [p + c for p, c in zip(prompt_ids, batch, strict=True)]
        width = max(len(row) for row in rows)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
        log_probs = F.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for row, (prompt, completion) in enumerate(zip(prompt_ids, batch, strict=True)):
            positions = torch.arange(
                len(prompt) - 1, len(prompt) + len(completion) - 1, device=device
            )
            tokens = torch.tensor(completion, device=device, dtype=torch.long)
            found.append(log_probs[row, positions, tokens].cpu())
    return found


def completion_kl(
    tuned: PreTrainedModel,
    starting: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[list[int]],
) -> float:
    """KL(tuned || starting) per completion token, on completions the tuned model sampled."""
    tuned_lp = completion_log_probs(tuned, tokenizer, prompts, completions)
    start_lp = completion_log_probs(starting, tokenizer, prompts, completions)
    tokens = sum(len(row) for row in tuned_lp)
    if tokens == 0:
        return 0.0
    return float(sum((t - s).sum() for t, s in zip(tuned_lp, start_lp, strict=True)) / tokens)


def reward_change(before: np.ndarray, after: np.ndarray, seed: int) -> dict[str, Any]:
    """The mean reward before and after, and the change with the 95% percentile interval of
    SAMPLES paired bootstrap draws of the prompts."""
    draws = np.random.default_rng(seed).integers(0, len(before), size=(SAMPLES, len(before)))
    change = float(after.mean() - before.mean())
    bounds = interval(change, (after[draws] - before[draws]).mean(axis=1))
    after_bounds = interval(float(after.mean()), after[draws].mean(axis=1))
    return {
        "before": round(float(before.mean()), 4),
        "after": round(float(after.mean()), 4),
        "after_low": round(after_bounds.low / 100, 4),
        "after_high": round(after_bounds.high / 100, 4),
        "change": round(change, 4),
        "change_low": round(bounds.low / 100, 4),
        "change_high": round(bounds.high / 100, 4),
    }


@torch.no_grad()
def text_perplexity(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str) -> float:
    """exp(mean next-token loss) over the first PERPLEXITY_BLOCKS blocks of the file's tokens."""
    text_file = Path(path)
    if not text_file.is_file():
        raise DataError(f"--validation-text {path}: no such file; pass a text file")
    text = text_file.read_text(encoding="utf-8", errors="replace")
    ids = tokenizer(text, verbose=False)["input_ids"]  # cut into blocks below
    block = min(128, model.config.max_position_embeddings)
    count = min(PERPLEXITY_BLOCKS, len(ids) // block)
    if count == 0:
        raise DataError(f"--validation-text {path}: fewer than {block} tokens; pass more text")
    device = next(model.parameters()).device
    blocks = torch.tensor(ids[: count * block], device=device).view(count, block)
    chunks = blocks.split(GENERATION_BATCH)
    losses = [model(input_ids=chunk, labels=chunk).loss.float().item() for chunk in chunks]
    return float(np.exp(np.average(losses, weights=[len(chunk) for chunk in chunks])))


def moving_mean(values: Sequence[float]) -> np.ndarray:
    """The mean of each value and the ones before it, over a window of a twentieth of them."""
    window = max(1, len(values) // 20)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    return (sums[ends] - sums[ends - counts]) / counts


def plot_reward_and_kl(log_history: list[dict[str, Any]], path: Path) -> None:
    """The mean reward and the KL to the start (TRL's logged values) against the step, each
    with its moving mean (one step's batch is noisy), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    figure, panes = plt.subplots(1, 2, figsize=(10, 4))
    for pane, key, label in zip(
        panes, ("reward", "kl"), ("mean reward", "KL to start per token"), strict=True
    ):
        points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
        if points:
            steps, values = zip(*points, strict=True)
            pane.plot(steps, values, alpha=0.35, label="each step")
            pane.plot(steps, moving_mean(values), label="mean of the last steps")
            pane.legend()
        pane.set_xlabel("step")
        pane.set_ylabel(label)
        pane.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
