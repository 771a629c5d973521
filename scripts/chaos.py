#!/usr/bin/env python
"""Chaos test: SIGKILL an `egbert pretrain` or `egbert finetune` run again and again, resume it
each time, and check that it ends with exactly the weights of a run never interrupted.

    scripts/chaos.py --kills 20 [--model bert|gpt|elmo] [--job pretrain|finetune] [--seed S]
                     [--workdir DIR] [--data DIR]

Every kill lands at a random moment: a random number of steps after the newest checkpoint plus a
random fraction of a step, while a checkpoint is being written (the trainer's temporary
`checkpoints/.tmp-step-N` exists), or during start-up (data preparation, model loading). Then
`--resume` picks the run up again. The run is a tiny preset in fp32 on one CPU thread, so the
final model must equal the uninterrupted run's to 1e-6; the exit status is 0 only if it does.
tests/test_faults.py uses the same functions with a few kills and SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("step", "save", "startup")
ATOL = 1e-6
POLL_SECONDS = 0.0005  # a tiny model's checkpoint is written in a few milliseconds
START_TIMEOUT = 300  # seconds until the first training step (start-up on a loaded machine)
SIGNAL_ACKNOWLEDGED = "send it again to exit at once"  # the trainer's answer to SIGINT/SIGTERM


@dataclass
class Kill:
    """One interruption: when, where the run was, and how it ended."""

    mode: str  # step | save | startup
    seconds: float  # after the process started
    step: int  # the last training step it logged
    checkpoint: int  # the newest complete checkpoint left behind
    mid_save: bool  # a checkpoint was being written when it died
    returncode: int
    exit_seconds: float  # from the (last) signal to the process's end


# ---------------------------------------------------------------- commands


def child_env() -> dict[str, str]:
    """One intra-op thread (same numerics in every run), no network, and this checkout first on
    the caller's PYTHONPATH (packages may come from there)."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths)}
    return env | {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def egbert_command(job: str, argv: list[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", "egbert.cli", job, *argv]


def pretrain_argv(
    model: str, tokenizer: Path, corpus: Path, out: Path, steps: int, save_every: int, seed: int
) -> list[str]:
    """A tiny run over several epochs of `corpus`, logging and checkpointing often."""
    return [
        "--model", model, "--preset", "tiny", "--tokenizer", str(tokenizer),
        "--train-files", str(corpus), "--doc-boundary", "wikitext", "--output-dir", str(out),
        "--seq-len", "32", "--batch-size", "8", "--max-steps", str(steps),
        "--save-every", str(save_every), "--keep-checkpoints", "2", "--log-every", "1",
        "--lr", "1e-3", "--seed", str(seed), "--resume",
    ]  # fmt: skip


def finetune_argv(
    model_dir: Path, glue_dir: Path, out: Path, epochs: int, save_every: int, seed: int
) -> list[str]:
    return [
        "--task", "rte", "--model", str(model_dir), "--data-dir", str(glue_dir),
        "--output-dir", str(out), "--epochs", str(epochs), "--batch-size", "8",
        "--max-seq-length", "64", "--lr", "1e-3", "--save-every", str(save_every),
        "--seed", str(seed), "--resume",
    ]  # fmt: skip


# ---------------------------------------------------------------- watching a run


def logged_step(out: Path) -> int:
    """The last training step in the run's metrics.jsonl (0 if none)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [0]
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the line being written right now
            continue
        if record.get("split") == "train":
            steps.append(record["step"])
    return max(steps)


def newest_checkpoint(out: Path) -> int:
    steps = [0]
    for state in (out / "checkpoints").glob("step-*/trainer_state.json"):
        steps.append(int(state.parent.name.removeprefix("step-")))
    return max(steps)


def saving(out: Path) -> bool:
    return any((out / "checkpoints").glob(".tmp-step-*"))


def read(log: Path) -> str:
    return log.read_text(errors="replace") if log.is_file() else ""


def training_started(log: Path) -> bool:
    """The run printed its banner: resume (and the log's truncation) is done."""
    return "egbert: training on" in read(log)


def _wait_until(condition: Callable[[], bool], process: subprocess.Popen, timeout: float) -> bool:
    """Poll until `condition` holds (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing happened for {timeout} s")
        time.sleep(POLL_SECONDS)
    return True


# ---------------------------------------------------------------- interrupting a run


def interrupt(
    command: list[str],
    out: Path,
    log: Path,
    rng: random.Random,
    mode: str,
    signals: tuple[int, ...] = (signal.SIGKILL,),
    steps_ahead: int = 4,
    popen: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> Kill | None:
    """Start the run (through `popen`), send `signals` at a moment chosen by `mode`, wait for it
    to end.

    step: `1..steps_ahead` steps after the newest checkpoint plus up to 50 ms; save: as soon as
    a checkpoint is being written; startup: at a random time before training starts.
    Returns None if the run finished before that moment came.
    """
    resumed_from = newest_checkpoint(out)
    with log.open("wb") as output:
        started = time.monotonic()
        process = popen(command, stdout=output, stderr=subprocess.STDOUT, env=child_env())
        try:
            if not _reach_moment(process, out, log, rng, mode, resumed_from, steps_ahead):
                process.wait()
                if process.returncode != 0:
                    raise RuntimeError(f"run failed (exit {process.returncode}): {tail(log)}")
                return None
            for index, signum in enumerate(signals):
                if index:  # the next one only once the run said it got the last one
                    _wait_until(lambda: SIGNAL_ACKNOWLEDGED in read(log), process, 60)
                fired_at = time.monotonic()
                process.send_signal(signum)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return Kill(
        mode=mode,
        seconds=round(fired_at - started, 2),
        step=logged_step(out),
        checkpoint=newest_checkpoint(out),
        mid_save=mode != "startup" and saving(out),  # start-up: maybe a leftover of before
        returncode=process.returncode,
        exit_seconds=round(time.monotonic() - fired_at, 2),
    )


def _reach_moment(
    process: subprocess.Popen,
    out: Path,
    log: Path,
    rng: random.Random,
    mode: str,
    resumed_from: int,
    steps_ahead: int,
) -> bool:
    if mode == "startup":
        deadline = time.monotonic() + rng.uniform(0.5, 6.0)
        return _wait_until(
            lambda: time.monotonic() > deadline or training_started(log), process, START_TIMEOUT
        )
    if not _wait_until(lambda: training_started(log), process, START_TIMEOUT):
        return False
    if mode == "save":
        return _wait_until(lambda: saving(out), process, START_TIMEOUT)
    target = resumed_from + rng.randint(1, steps_ahead)
    if not _wait_until(lambda: logged_step(out) >= target, process, START_TIMEOUT):
        return False
    time.sleep(rng.uniform(0.0, 0.05))  # somewhere inside the next step
    return process.poll() is None


def run_to_the_end(command: list[str], log: Path) -> None:
    with log.open("wb") as output:
        done = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"run failed (exit {done.returncode}): {tail(log)}")


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(read(log).splitlines()[-lines:])


def kill_and_resume(
    command: list[str],
    out: Path,
    log_dir: Path,
    rng: random.Random,
    modes: list[str],
    report: Callable[[int, Kill], None] = lambda number, kill: None,
    steps_ahead: int = 4,
) -> list[Kill]:
    """SIGKILL the run once per entry of `modes` (resuming each time), then let it finish."""
    log_dir.mkdir(parents=True, exist_ok=True)
    kills: list[Kill] = []
    for number, mode in enumerate(modes, start=1):
        log = log_dir / f"run-{number:02d}.log"
        kill = interrupt(command, out, log, rng, mode, steps_ahead=steps_ahead)
        if kill is None:  # the run finished first: nothing left to interrupt
            break
        kills.append(kill)
        report(number, kill)
    run_to_the_end(command, log_dir / "final.log")
    return kills


def max_weight_difference(first: Path, second: Path) -> float:
    """max |a - b| over all tensors of two model.safetensors (inf if their names differ)."""
    from safetensors.torch import load_file

    a, b = load_file(first), load_file(second)
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a)


# ---------------------------------------------------------------- the script's own inputs


def find_data(path: str | None) -> Path:
    data = Path(path or os.environ.get("EGBERT_DATA") or REPO.parent / "shared" / "data")
    if not (data / "corpus" / "wikitext-2" / "wiki.train.tokens").is_file():
        sys.exit(f"chaos: no WikiText-2 under {data}; pass --data or set EGBERT_DATA")
    return data


def prepare_inputs(workdir: Path, data: Path, job: str, model: str) -> dict[str, Path]:
    """A 1,000-token tokenizer and a 100-line corpus from WikiText-2; for finetune a tiny
    random model of the family and an RTE slice (64 train, 24 dev rows)."""
    from egbert import train_tokenizer

    lines = (data / "corpus/wikitext-2/wiki.train.tokens").read_text(encoding="utf-8")
    lines = lines.splitlines(keepends=True)
    inputs = {"tokenizer": workdir / "tokenizer", "corpus": workdir / "corpus.tokens"}
    inputs["corpus"].write_text("".join(lines[:100]), encoding="utf-8")
    if not (inputs["tokenizer"] / "tokenizer.json").is_file():
        corpus = workdir / "tokenizer-corpus.txt"
        corpus.write_text("".join(lines[:3000]), encoding="utf-8")
        train_tokenizer([corpus], vocab_size=1000, out_dir=inputs["tokenizer"], show_progress=False)
    if job == "finetune":
        inputs["model"] = save_tiny_model(model, inputs["tokenizer"], workdir / f"tiny-{model}")
        inputs["glue"] = glue_slice(data / "glue" / "RTE", workdir / "glue", rows=(64, 24))
    return inputs


def save_tiny_model(family: str, tokenizer_dir: Path, out: Path) -> Path:
    """A randomly initialised model of the family's tiny preset, saved with the tokenizer."""
    import torch
    from transformers import AutoModel

    from egbert import CONFIG_CLASSES, load_preset, load_tokenizer  # registers the Auto classes

    tokenizer = load_tokenizer(tokenizer_dir)
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if family == "gpt":
        ids |= {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = CONFIG_CLASSES[family](**{**load_preset(family, "tiny"), **ids})
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def glue_slice(task_dir: Path, root: Path, rows: tuple[int, int]) -> Path:
    """The GLUE layout with the first rows of train.tsv and dev.tsv of one task."""
    folder = root / task_dir.name
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in zip(("train.tsv", "dev.tsv"), rows, strict=True):
        with (task_dir / name).open(encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(count + 1)]  # the header, then data rows
        (folder / name).write_text("".join(lines), encoding="utf-8")
    return root


# ---------------------------------------------------------------- main


def choose_modes(kills: int, rng: random.Random) -> list[str]:
    """Mostly random steps, a quarter mid-save, a few start-ups; at least one mid-save."""
    modes = rng.choices(MODES, weights=(0.6, 0.3, 0.1), k=kills)
    if "save" not in modes:
        modes[rng.randrange(kills)] = "save"
    return modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="scripts/chaos.py", description=__doc__.split("\n\n")[0].strip()
    )
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs (default: 20)")
    parser.add_argument("--model", choices=("bert", "gpt", "elmo"), default="bert")
    parser.add_argument("--job", choices=("pretrain", "finetune"), default="pretrain")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments and run")
    parser.add_argument("--workdir", type=Path, help="default: a new temporary folder")
    parser.add_argument("--data", help="the shared data folder (default: $EGBERT_DATA)")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="egbert-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    inputs = prepare_inputs(workdir, find_data(args.data), args.job, args.model)

    save_every = 3
    steps = max(30, 2 * save_every * args.kills)  # kills land 1..2*save_every steps ahead

    def command(out: Path) -> list[str]:
        if args.job == "pretrain":
            return egbert_command("pretrain", pretrain_argv(
                args.model, inputs["tokenizer"], inputs["corpus"], out, steps, save_every,
                args.seed,
            ))  # fmt: skip
        epochs = math.ceil(steps / 8)  # 64 training rows, batch 8: 8 steps per epoch
        return egbert_command("finetune", finetune_argv(
            inputs["model"], inputs["glue"], out, epochs, save_every, args.seed
        ))  # fmt: skip

    clean, chaotic = workdir / "uninterrupted", workdir / "killed"
    for run in (clean, chaotic):
        if run.exists():
            sys.exit(f"chaos: {run} exists; pass a fresh --workdir")
    print(f"chaos: {args.job} {args.model}, {args.kills} kills, seed {args.seed}, in {workdir}")
    started = time.monotonic()
    run_to_the_end(command(clean), workdir / "uninterrupted.log")
    print(f"chaos: uninterrupted run done in {time.monotonic() - started:.0f} s", flush=True)

    def report(number: int, kill: Kill) -> None:
        where = "mid-save" if kill.mid_save else kill.mode
        print(
            f"kill {number:2d}/{args.kills}: {kill.seconds:5.2f} s after start ({where}), "
            f"step {kill.step} reached, newest checkpoint step-{kill.checkpoint}",
            flush=True,
        )

    modes = choose_modes(args.kills, rng)
    kills = kill_and_resume(
        command(chaotic), chaotic, workdir / "logs", rng, modes, report, 2 * save_every
    )
    # the final model (for finetune: the best epoch's) and the last step's checkpoint
    last = f"checkpoints/step-{newest_checkpoint(clean)}/model.safetensors"
    difference = max(
        max_weight_difference(clean / name, chaotic / name)
        for name in ("model/model.safetensors", last)
    )
    mid_save = sum(kill.mid_save for kill in kills)
    verdict = "PASS" if difference <= ATOL and len(kills) == args.kills else "FAIL"
    print(
        f"chaos: {verdict}: {len(kills)} of {args.kills} SIGKILLs delivered ({mid_save} while a "
        f"checkpoint was being written), resumed each time; final weights vs the uninterrupted "
        f"run: max |difference| {difference:.3g} (tolerance {ATOL:g}); "
        f"{time.monotonic() - started:.0f} s in all"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
