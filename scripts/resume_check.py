"""Pretrain, kill and resume each model family, and check that the resumed run starts from
exactly the checkpoint's weights, every tensor of them (part of scripts/gpu_check.sh: on a GPU,
cuDNN keeps elmo's LSTM weights as views of one flat buffer, which once lost them on saving).

    python scripts/resume_check.py [--families bert gpt elmo] [--output-dir runs/resume-check]

For each family: `egbert pretrain` (tiny preset, 40 steps, a checkpoint every 10) is killed with
SIGKILL once checkpoint step-20 exists; `--resume --max-steps S` on the newest checkpoint S then
loads it and saves it as the final model at once, which must hold the checkpoint's tensors
exactly and every weight of the model; `--resume` again trains on to step 40. One table at the
end; the exit code is 1 if any family failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

import egbert

STEPS, SAVE_EVERY, KILL_AFTER = 40, 10, 20


def corpus_and_tokenizer(data: Path, root: Path) -> tuple[Path, Path]:
    """The first 2,000 lines of WikiText-2 train and a 2,000-token WordPiece trained on them."""
    source = data / "corpus" / "wikitext-2" / "wiki.train.tokens"
    corpus = root / "corpus.txt"
    with source.open(encoding="utf-8") as handle:
        corpus.write_text("".join(next(handle) for _ in range(2000)), encoding="utf-8")
    tokenizer_dir = root / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        egbert.train_tokenizer(
            [corpus], vocab_size=2000, out_dir=tokenizer_dir, show_progress=False
        )
    return corpus, tokenizer_dir


def pretrain_command(family: str, tokenizer: Path, corpus: Path, out: Path, *extra: str) -> list:
    return [
        sys.executable, "-m", "egbert.cli", "pretrain", "--model", family, "--preset", "tiny",
        "--tokenizer", str(tokenizer), "--train-files", str(corpus), "--doc-boundary", "wikitext",
        "--seq-len", "64", "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY),
        "--keep-checkpoints", "5", "--log-every", "5", "--seed", "0", "--report-to", "none",
        "--output-dir", str(out), *extra,
    ]  # fmt: skip


def newest_checkpoint(out: Path) -> int:
    steps = [
        int(path.name.removeprefix("step-"))
        for path in (out / "checkpoints").glob("step-*")
        if (path / "trainer_state.json").is_file()
    ]
    return max(steps, default=0)


def kill_after_checkpoint(command: list, out: Path, log: Path) -> int:
    """Start the run, SIGKILL it once checkpoint KILL_AFTER exists; the newest checkpoint."""
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while newest_checkpoint(out) < KILL_AFTER:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"no checkpoint step-{KILL_AFTER}; see {log}")
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
    return newest_checkpoint(out)


def run(command: list, log: Path) -> None:
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"exit code {code}; see {log}")


def check_family(family: str, tokenizer: Path, corpus: Path, root: Path) -> dict:
    out = root / family
    command = pretrain_command(family, tokenizer, corpus, out)
    killed_at = kill_after_checkpoint(command, out, root / f"{family}-killed.log")
    run([*command[:-2], "--max-steps", str(killed_at), *command[-2:], "--resume"],
        root / f"{family}-reload.log")  # fmt: skip
    saved = load_file(out / "checkpoints" / f"step-{killed_at}" / "model.safetensors")
    reloaded = load_file(out / "model" / "model.safetensors")
    arguments = egbert.PretrainArguments(model=family, tokenizer="", train_files=[], preset="tiny")
    model, _ = egbert.build_model(arguments, egbert.load_tokenizer(tokenizer))
    # every weight of the model but those tied to another (saved once, tied again on loading)
    expected = set(model.state_dict()) - set(getattr(model, "_tied_weights_keys", None) or {})
    missing = sorted(expected - saved.keys())
    difference = max(
        (
            float((reloaded[name].float() - tensor.float()).abs().max())
            for name, tensor in saved.items()
        ),
        default=float("inf"),
    )
    run([*command, "--resume"], root / f"{family}-finish.log")
    return {
        "killed at": killed_at,
        "missing from checkpoint": len(missing),
        "max |reloaded - checkpoint|": difference,
        "finished": newest_checkpoint(out) == STEPS,
        "ok": not missing and difference == 0.0 and newest_checkpoint(out) == STEPS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["bert", "gpt", "elmo"])
    parser.add_argument("--output-dir", type=Path, default=Path("runs/resume-check"))
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EGBERT_DATA", "../shared/data"))
    )
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = corpus_and_tokenizer(args.data, args.output_dir)
    results = {}
    for family in args.families:
        try:
            results[family] = check_family(family, tokenizer, corpus, args.output_dir)
        except RuntimeError as error:
            results[family] = {"ok": False, "error": str(error)}
    print("| family | killed at | missing from checkpoint | max abs difference | finished | ok |")
    print("|---|---:|---:|---:|---|---|")
    for family, r in results.items():
        if "error" in r:
            print(f"| {family} | | | | {r['error']} | FAIL |")
            continue
        print(
            f"| {family} | step {r['killed at']} | {r['missing from checkpoint']} | "
            f"{r['max |reloaded - checkpoint|']:.3g} | {r['finished']} | "
            f"{'ok' if r['ok'] else 'FAIL'} |"
        )
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
