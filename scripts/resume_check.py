"""Pretrain, kill and resume each model family, and check that the resumed run starts from
exactly the checkpoint's weights, every tensor of them (part of scripts/gpu_check.sh: on a GPU,
cuDNN keeps elmo's LSTM weights as views of one flat buffer, which once lost them on saving).

    python scripts/resume_check.py [--families bert gpt elmo] [--engine plain|ddp|fsdp]
                                   [--output-dir runs/resume-check]

For each family: `egbert pretrain` (tiny preset, 40 steps, a checkpoint every 10) is killed with
SIGKILL once checkpoint step-20 exists; `--resume --max-steps S` on the newest checkpoint S then
loads it and saves it as the final model at once, which must hold the checkpoint's tensors
exactly and every weight of the model; `--resume` again trains on to step 40. One table at the
end; the exit code is 1 if any family failed.

`--engine ddp` or `fsdp` starts each run through `accelerate launch` with
configs/accelerate/ddp.yaml or fsdp.yaml and one process: the model is wrapped in DDP, or
sharded by FSDP2 (its checkpoints sharded, the final model gathered), on a machine with one GPU.
The table's engine column is what the trainer reported at start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from accelerate.utils import merge_fsdp_weights
from safetensors.torch import load_file

import egbert

STEPS, SAVE_EVERY, KILL_AFTER = 40, 10, 20
ENGINE_CONFIGS = {"ddp": "configs/accelerate/ddp.yaml", "fsdp": "configs/accelerate/fsdp.yaml"}


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


def launcher(engine: str, port: int) -> list:
    if engine == "plain":
        return [sys.executable, "-m", "egbert.cli"]
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", ENGINE_CONFIGS[engine],
        "--num_processes", "1", "--main_process_port", str(port), "-m", "egbert.cli",
    ]  # fmt: skip


def pretrain_command(
    launch: list, family: str, tokenizer: Path, corpus: Path, out: Path, *extra: str
) -> list:
    return [
        *launch, "pretrain", "--model", family, "--preset", "tiny",
        "--tokenizer", str(tokenizer), "--train-files", str(corpus), "--doc-boundary", "wikitext",
        "--seq-len", "64", "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY),
        "--keep-checkpoints", "5", "--log-every", "5", "--seed", "0", "--report-to", "none",
        "--output-dir", str(out), *extra,
    ]  # fmt: skip


def newest_checkpoint(out: Path) -> int:
    return max((step for step, _ in egbert.checkpoints_in(out / "checkpoints")), default=0)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts its workers in sessions of their
    own, so killing the launcher's process group would leave them training)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, queue = [], [pid]
    while queue:
        tree.append(queue.pop())
        queue.extend(parents.get(tree[-1], []))
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def kill_after_checkpoint(command: list, out: Path, log: Path) -> int:
    """Start the run, SIGKILL it once checkpoint KILL_AFTER exists; the newest checkpoint."""
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while newest_checkpoint(out) < KILL_AFTER:
            if process.poll() is not None or time.monotonic() > deadline:
                kill_tree(process.pid)
                raise RuntimeError(f"no checkpoint step-{KILL_AFTER}; see {log}")
            time.sleep(0.01)
        kill_tree(process.pid)
        process.wait()
    return newest_checkpoint(out)


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The model's tensors in a checkpoint: model.safetensors, or FSDP's sharded folder."""
    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    with tempfile.TemporaryDirectory() as temp:
        merge_fsdp_weights(str(folder / "pytorch_model_fsdp_0"), temp)
        return load_file(Path(temp) / "model.safetensors")


def engine_reported(log: Path) -> str:
    """The distributed type the trainer reported at start (MULTI_GPU for DDP, FSDP, NO)."""
    found = re.search(
        r"egbert: training on \d+ process\(es\) \((\w+)", log.read_text(errors="replace")
    )
    return found.group(1) if found else "?"


def run(command: list, log: Path) -> None:
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"exit code {code}; see {log}")


def check_family(family: str, launch: list, tokenizer: Path, corpus: Path, root: Path) -> dict:
    out = root / family
    command = pretrain_command(launch, family, tokenizer, corpus, out)
    killed_at = kill_after_checkpoint(command, out, root / f"{family}-killed.log")
    run([*command[:-2], "--max-steps", str(killed_at), *command[-2:], "--resume"],
        root / f"{family}-reload.log")  # fmt: skip
    saved = checkpoint_tensors(out / "checkpoints" / f"step-{killed_at}")
    reloaded = load_file(out / "model" / "model.safetensors")
    arguments = egbert.PretrainArguments(model=family, tokenizer="", train_files=[], preset="tiny")
    model, _ = egbert.build_model(arguments, egbert.load_tokenizer(tokenizer))
    # every weight of the model but those tied to another (saved once, tied again on loading)
    expected = set(model.state_dict()) - set(getattr(model, "_tied_weights_keys", None) or {})
    missing = sorted(expected - saved.keys())
    difference = max(
        (
            float((reloaded[name].float() - tensor.float()).abs().max())
            if name in reloaded
            else float("inf")
            for name, tensor in saved.items()
        ),
        default=float("inf"),
    )
    run([*command, "--resume"], root / f"{family}-finish.log")
    return {
        "engine": engine_reported(root / f"{family}-killed.log"),
        "killed at": killed_at,
        "missing from checkpoint": len(missing),
        "max |reloaded - checkpoint|": difference,
        "finished": newest_checkpoint(out) == STEPS,
        "ok": not missing and difference == 0.0 and newest_checkpoint(out) == STEPS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["bert", "gpt", "elmo"])
    parser.add_argument("--engine", choices=["plain", *ENGINE_CONFIGS], default="plain")
    parser.add_argument("--port", type=int, default=29561, help="accelerate's port (ddp, fsdp)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/resume-check"))
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EGBERT_DATA", "../shared/data"))
    )
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = corpus_and_tokenizer(args.data, args.output_dir)
    results = {}
    launch = launcher(args.engine, args.port)
    for family in args.families:
        try:
            results[family] = check_family(family, launch, tokenizer, corpus, args.output_dir)
        except Exception as error:  # one family's failure must not hide the others' results
            results[family] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    print(
        "| family | engine | killed at | missing from checkpoint | max abs difference | finished "
        "| ok |"
    )
    print("|---|---|---:|---:|---:|---|---|")
    for family, r in results.items():
        if "error" in r:
            print(f"| {family} | {args.engine} | | | | {r['error']} | FAIL |")
            continue
        print(
            f"| {family} | {r['engine']} | step {r['killed at']} | "
            f"{r['missing from checkpoint']} | "
            f"{r['max |reloaded - checkpoint|']:.3g} | {r['finished']} | "
            f"{'ok' if r['ok'] else 'FAIL'} |"
        )
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
