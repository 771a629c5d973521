"""Kill and resume each model family as docs/guarantees.md promises: a run killed with SIGKILL after
a checkpoint, then run again with the same command and --resume, ends with the weights of the
same run never interrupted (part of scripts/gpu_check.sh).

    python scripts/resume_check.py [--families bert gpt elmo] [--engine plain|ddp|fsdp]
                                   [--processes N] [--compile] [--steps 40] [--save-every 10]
                                   [--atol 1e-6] [--output-dir runs/resume-check]

For each family, `egbert pretrain` (tiny preset, --steps steps, a checkpoint every --save-every)
runs twice with the same options: once to the end, and once killed with SIGKILL as soon as a
checkpoint at or past half of the steps exists, then resumed with `--resume` (the same command,
which must say that it resumed from that checkpoint) to the end. Checked, per family:
- the kill came before the end and the resumed run went on from the checkpoint it left;
- that checkpoint holds every weight of the model (on a GPU, cuDNN keeps elmo's LSTM weights as
  views of one flat buffer, which once lost 16 of them from every checkpoint);
- the resumed run's final model equals the uninterrupted run's, every tensor within --atol (the
  guarantee: 1e-6, fp32 on the CPU; the plain engine trains in fp32, the launch configs in bf16).
One table at the end; the exit code is 1 if any family failed.

`--engine ddp` or `fsdp` starts each run through `accelerate launch` with
configs/accelerate/ddp.yaml or fsdp.yaml and --processes processes (default 1: the model is
wrapped in DDP, or sharded by FSDP2, its checkpoints sharded and the final model gathered, on a
machine with one GPU). On a CPU-only machine the same launch trains data-parallel on gloo
(MULTI_CPU; FSDP's config too, since FSDP runs on GPUs only). The table's engine column is what
the trainer reported at start. `--compile` trains every run with `--compile` (torch.compile
after DDP/FSDP wrapped the model).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import merge_fsdp_weights
from safetensors.torch import load_file

import egbert

REPOSITORY = Path(__file__).resolve().parents[1]
ENGINE_CONFIGS = {"ddp": "configs/accelerate/ddp.yaml", "fsdp": "configs/accelerate/fsdp.yaml"}
START_TIMEOUT_S = 600  # until the checkpoint to kill after exists (compiling included)


@dataclass(frozen=True)
class Runs:
    """What every run of the check shares: how it is started and its length."""

    launch: tuple[str, ...]
    tokenizer: Path
    corpus: Path
    steps: int
    save_every: int
    compile: bool

    def command(self, family: str, out: Path, *extra: str) -> list[str]:
        return [
            *self.launch, "pretrain", "--model", family, "--preset", "tiny",
            "--tokenizer", str(self.tokenizer), "--train-files", str(self.corpus),
            "--doc-boundary", "wikitext", "--seq-len", "64", "--batch-size", "16",
            "--max-steps", str(self.steps), "--save-every", str(self.save_every),
            "--keep-checkpoints", "2", "--log-every", str(self.save_every), "--seed", "0",
            "--report-to", "none", *(["--compile"] if self.compile else []),
            "--output-dir", str(out), *extra,
        ]  # fmt: skip


@dataclass
class FamilyResult:
    """One family's row of the table."""

    engine: str  # what the trainer reported: NO, MULTI_GPU, MULTI_CPU, FSDP
    killed_at: int  # the newest checkpoint the killed run left
    resumed_from: int | None  # the checkpoint the resumed run said it went on from
    missing: list[str]  # weights of the model absent from that checkpoint
    difference: float  # max |resumed - uninterrupted| over the final models' tensors
    atol: float
    steps: int

    @property
    def ok(self) -> bool:
        return (
            self.killed_at < self.steps
            and self.resumed_from == self.killed_at
            and not self.missing
            and self.difference <= self.atol
        )


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


def launcher(engine: str, processes: int, port: int) -> tuple[str, ...]:
    if engine == "plain":
        return (sys.executable, "-m", "egbert.cli")
    return (
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(REPOSITORY / ENGINE_CONFIGS[engine]), "--num_processes", str(processes),
        "--main_process_port", str(port), "-m", "egbert.cli",
    )  # fmt: skip


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


def kill_after_checkpoint(command: list[str], out: Path, step: int, log: Path) -> int:
    """Start the run, SIGKILL it once a checkpoint at `step` or later exists; the newest
    checkpoint it left."""
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while newest_checkpoint(out) < step:
            if process.poll() is not None or time.monotonic() > deadline:
                kill_tree(process.pid)
                raise RuntimeError(f"no checkpoint step-{step} before the run ended; see {log}")
            time.sleep(0.01)
        kill_tree(process.pid)
        process.wait()
    return newest_checkpoint(out)


def run(command: list[str], log: Path) -> str:
    """Run to the end; its output."""
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"exit code {code}; see {log}")
    return log.read_text(errors="replace")


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The model's tensors in a checkpoint: model.safetensors, or FSDP's sharded folder."""
    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    with tempfile.TemporaryDirectory() as temp:
        merge_fsdp_weights(str(folder / "pytorch_model_fsdp_0"), temp)
        return load_file(Path(temp) / "model.safetensors")


def model_weight_names(family: str, tokenizer: Path) -> set[str]:
    """Every weight of the family's tiny model but those tied to another (saved once, tied
    again on loading)."""
    model_args = egbert.ModelArguments(model=family, preset="tiny")
    objective_args = egbert.ObjectiveArguments()  # bert with its NSP head, as it pretrains
    model, _ = egbert.build_model(model_args, objective_args, egbert.load_tokenizer(tokenizer))
    return set(model.state_dict()) - set(getattr(model, "_tied_weights_keys", None) or {})


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of tensors; inf where their names or
    shapes differ."""
    if first.keys() != second.keys() or not first:
        return float("inf")
    if any(first[name].shape != second[name].shape for name in first):
        return float("inf")
    return max(float((first[name].float() - second[name].float()).abs().max()) for name in first)


def engine_reported(log: Path) -> str:
    """The distributed type the trainer reported at start (MULTI_GPU for DDP, FSDP, NO)."""
    found = re.search(
        r"egbert: training on \d+ process\(es\) \((\w+)", log.read_text(errors="replace")
    )
    return found.group(1) if found else "?"


def resumed_from(output: str) -> int | None:
    """The step of the checkpoint the trainer said it resumed from."""
    found = re.search(r"egbert: resumed from \S*step-(\d+)", output)
    return int(found.group(1)) if found else None


def check_family(family: str, runs: Runs, root: Path, atol: float) -> FamilyResult:
    clean, killed = root / family / "uninterrupted", root / family / "killed"
    run(runs.command(family, clean), root / f"{family}-uninterrupted.log")
    command = runs.command(family, killed)
    half = math.ceil(runs.steps / 2 / runs.save_every) * runs.save_every  # a checkpoint past half
    killed_log = root / f"{family}-killed.log"
    killed_at = kill_after_checkpoint(command, killed, half, killed_log)
    saved = checkpoint_tensors(killed / "checkpoints" / f"step-{killed_at}")
    output = run([*command, "--resume"], root / f"{family}-resumed.log")
    difference = max_difference(
        load_file(killed / "model" / "model.safetensors"),
        load_file(clean / "model" / "model.safetensors"),
    )
    return FamilyResult(
        engine=engine_reported(killed_log),
        killed_at=killed_at,
        resumed_from=resumed_from(output),
        missing=sorted(model_weight_names(family, runs.tokenizer) - saved.keys()),
        difference=difference,
        atol=atol,
        steps=runs.steps,
    )


def table(engine: str, results: dict[str, FamilyResult | str]) -> str:
    lines = [
        "| family | engine | killed at | resumed from | missing from checkpoint "
        "| max abs difference to the uninterrupted run | ok |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for family, result in results.items():
        if isinstance(result, str):
            lines.append(f"| {family} | {engine} | | | | {result} | FAIL |")
            continue
        start = "-" if result.resumed_from is None else f"step {result.resumed_from}"
        lines.append(
            f"| {family} | {result.engine} | step {result.killed_at} | {start} "
            f"| {len(result.missing)} | {result.difference:.3g} (atol {result.atol:g}) "
            f"| {'ok' if result.ok else 'FAIL'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["bert", "gpt", "elmo"])
    parser.add_argument("--engine", choices=["plain", *ENGINE_CONFIGS], default="plain")
    parser.add_argument(
        "--processes", type=int, default=1, help="processes of --engine ddp or fsdp (default 1)"
    )
    parser.add_argument("--compile", action="store_true", help="train every run with --compile")
    parser.add_argument("--steps", type=int, default=40, help="steps of each run (default 40)")
    parser.add_argument(
        "--save-every", type=int, default=10, help="steps between checkpoints (default 10)"
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-6,
        help="largest difference allowed between the final models (default 1e-6)",
    )
    parser.add_argument("--port", type=int, default=29561, help="accelerate's port (ddp, fsdp)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/resume-check"))
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EGBERT_DATA", "../shared/data"))
    )
    args = parser.parse_args()
    if args.engine == "plain" and args.processes != 1:
        parser.error("--processes: the plain engine trains in one process; use --engine ddp")
    if not 0 < args.save_every < args.steps:
        parser.error("--save-every must be above 0 and below --steps (a checkpoint to kill after)")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = corpus_and_tokenizer(args.data, args.output_dir)
    launch = launcher(args.engine, args.processes, args.port)
    runs = Runs(launch, tokenizer, corpus, args.steps, args.save_every, args.compile)
    results: dict[str, FamilyResult | str] = {}
    for family in args.families:
        shutil.rmtree(args.output_dir / family, ignore_errors=True)  # fresh runs each time
        try:
            results[family] = check_family(family, runs, args.output_dir, args.atol)
        except Exception as error:  # one family's failure must not hide the others' results
            results[family] = f"{type(error).__name__}: {error}"
    print(table(args.engine, results))
    return 0 if all(not isinstance(r, str) and r.ok for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
