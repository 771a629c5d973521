"""How long a streamed run takes to resume, early and late in its stream.

Trains `egbert pretrain --streaming` on N copies of a corpus file up to the last of --steps
(checkpoints at each), then resumes a copy of the run from each of those checkpoints for one
more step and reports the seconds from launch to the end of that first step after resume
(seen in metrics.jsonl with --log-every 1) and to the end of the process. A resume that
replayed the batches already trained would grow with the step; one from the stream's saved
state re-reads at most the current shard.

    python scripts/stream_resume_bench.py --corpus wiki.train.tokens --copies 10 \\
        --tokenizer tok/ --out /tmp/stream-resume --steps 200 2000 --nproc 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a WikiText-style text file")
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="resumes of each, alternated")
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    out = Path(args.out)
    corpus = copies_of(Path(args.corpus), args.copies, out / "corpus")
    options = [
        "--model", args.model, "--preset", "tiny", "--tokenizer", args.tokenizer,
        "--train-files", *map(str, corpus), "--doc-boundary", "wikitext", "--streaming",
        "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
        "--use-cpu", "true", "--log-every", "1",
    ]  # fmt: skip
    full = out / "full"
    if not (full / "checkpoints" / f"step-{max(args.steps)}").is_dir():
        started = time.monotonic()
        saves = ["--save-every", str(min(args.steps)), "--keep-checkpoints", "100"]
        training = launch(args.nproc, [*options, *saves, "--max-steps", str(max(args.steps)),
                                       "--output-dir", str(full), "--resume"], out)  # fmt: skip
        if training.wait() != 0:
            sys.exit(f"training failed; see {out / 'launch.log'}")
        print(f"trained {max(args.steps)} steps in {time.monotonic() - started:.0f} s")
    for _repeat in range(args.repeats):
        for step in args.steps:
            resume_once(full, out, step, options, args.nproc)


def resume_once(full: Path, out: Path, step: int, options: list[str], nproc: int) -> None:
    """Resume a copy of the run from its checkpoint at `step` for one step; print the times."""
    run = out / f"resume-{step}"
    shutil.rmtree(run, ignore_errors=True)
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / f"step-{step}", run / "checkpoints" / f"step-{step}")
    started = time.monotonic()
    process = launch(nproc, [*options, "--max-steps", str(step + 1), "--output-dir",
                                  str(run), "--resume"], out)  # fmt: skip
    first_step = None
    while process.poll() is None:
        if first_step is None and trained(run, step + 1):
            first_step = time.monotonic() - started
        time.sleep(0.02)
    total = time.monotonic() - started
    if process.returncode != 0:
        sys.exit(f"resume from step {step} failed; see {out / 'launch.log'}")
    first_step = first_step or total
    print(f"resume at step {step}: first trained step after {first_step:.1f} s, "
          f"process done after {total:.1f} s")  # fmt: skip


def copies_of(corpus: Path, copies: int, folder: Path) -> list[Path]:
    """N names for the corpus (symbolic links): N files, N shards of the stream."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(copies):
        path = folder / f"copy{index}{corpus.suffix}"
        if not path.exists():
            path.symlink_to(corpus.resolve())
        paths.append(path)
    return paths


def launch(nproc: int, options: list[str], out: Path) -> subprocess.Popen:
    """`egbert pretrain` on `nproc` processes (torchrun), its output appended to launch.log."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    command = [*(launcher if nproc > 1 else [sys.executable]), "-m", "egbert.cli", "pretrain"]
    with (out / "launch.log").open("a") as log:
        return subprocess.Popen([*command, *options], stdout=log, stderr=subprocess.STDOUT)


def trained(run: Path, step: int) -> bool:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return False
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if record.get("split") == "train" and record.get("step") == step:
            return True
    return False


if __name__ == "__main__":
    main()
