"""`egbert prepare` against a run_mlm.py-style pipeline on corpora of N copies of WikiText-2.

For each size (copies of wiki.train.tokens written to --work, /tmp by default) it runs, each in
a fresh subprocess and one after the other in the same run:
  - the reference: `load_dataset("text")`, a batched tokenization with `num_proc`, run_mlm.py's
    `group_texts` into blocks of --seq-len (its own cache folder, measured afterwards);
  - `egbert.prepare_corpus` for bert (NSP pairs) and for gpt (packed blocks), with the same
    tokenizer, sequence length and `num_proc`.
It reports the seconds each takes (imports excluded), the peak RSS of its main process and of
its largest worker, and the disk it leaves: the reference's `datasets` cache, egbert's prepared
folder (bytes per corpus token; for bert also per stored token, since NSP pairs repeat a share
of the text and add [CLS]/[SEP]). Then a 200-step tiny run from the prepared folder of the
smallest and the largest corpus, for each family, gives the anonymous memory (the peak of RssAnon
in /proc/self/status, sampled every 50 ms from the first logged step until the final save: the
mapped shards are file pages, not counted; --no-memory skips these runs).

    python scripts/data_bench.py --copies 1 10 30 --json data-bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from itertools import chain
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
FAMILIES = ("bert", "gpt")


def main() -> None:
    args = parse_args()
    if args.child:
        print("RESULT " + json.dumps(CHILDREN[args.child](args)), flush=True)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = shared_tokenizer(args, work)
    rows, memory = [], []
    for copies in args.copies:
        corpus = write_corpus(args, work, copies)
        reference = None
        if copies in args.reference_copies:
            reference = child(args, "reference", corpus=corpus, tokenizer=tokenizer)
        for family in FAMILIES:
            prepared = child(args, "prepare", corpus=corpus, tokenizer=tokenizer, family=family)
            rows.append({"copies": copies, "family": family, **prepared, "reference": reference})
            print_row(rows[-1], flush=True)
        if reference is not None:
            shutil.rmtree(reference["cache_dir"], ignore_errors=True)
    for family in FAMILIES if args.memory else ():
        for copies in (min(args.copies), max(args.copies)):
            folder = work / f"prepared-{family}-x{copies}"
            result = child(args, "train", folder=folder, family=family)
            memory.append({"copies": copies, "family": family, **result})
            print(f"200 steps {family} x{copies}: RssAnon peak {result['rss_anon_mb']:.0f} MB")
    print_tables(rows, memory)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "memory": memory}, indent=2))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument(
        "--reference-copies",
        type=int,
        nargs="+",
        default=[1, 10],
        help="the sizes the reference also runs at (it is the slow part)",
    )
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the training runs from the prepared folders (their anonymous memory)",
    )
    parser.add_argument("--work", default="/tmp/data_bench")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", choices=list(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--family", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    return parser.parse_args()


def data_dir() -> Path:
    return Path(os.environ.get("EGBERT_DATA", REPOSITORY.parent / "shared" / "data"))


def shared_tokenizer(args: argparse.Namespace, work: Path) -> Path:
    from egbert import train_tokenizer

    folder = work / f"tokenizer-{args.vocab_size}"
    if not (folder / "tokenizer.json").is_file():
        source = data_dir() / "corpus" / "wikitext-2" / "wiki.train.tokens"
        train_tokenizer([source], vocab_size=args.vocab_size, out_dir=folder, show_progress=False)
    return folder


def write_corpus(args: argparse.Namespace, work: Path, copies: int) -> Path:
    path = work / f"wiki-x{copies}.tokens"
    text = (data_dir() / "corpus" / "wikitext-2" / "wiki.train.tokens").read_bytes()
    if not path.is_file() or path.stat().st_size != copies * len(text):
        with path.open("wb") as handle:
            for _ in range(copies):
                handle.write(text)
    return path


def child(args: argparse.Namespace, kind: str, **options) -> dict:
    command = [sys.executable, __file__, "--child", kind, "--work", args.work]
    command += ["--num-proc", str(args.num_proc), "--seq-len", str(args.seq_len)]
    command += ["--steps", str(args.steps)]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        sys.exit(f"{kind} {options} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    print(f"{kind} {options}: {lines[-1]}", flush=True)  # what a stopped run leaves behind
    return json.loads(lines[-1].removeprefix("RESULT "))


def peak_rss_mb() -> dict[str, float]:
    """Peak RSS of this process and of its largest (waited-for) worker, in MB (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": own, "worker_peak_rss_mb": workers}


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# ---------------------------------------------------------------- children


def run_reference(args: argparse.Namespace) -> dict:
    """run_mlm.py's path without line_by_line: text lines -> tokens -> blocks of seq_len."""
    from datasets import load_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    cache = Path(args.work) / f"reference-cache-{Path(args.corpus).stem}"
    shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    raw = load_dataset("text", data_files={"train": args.corpus}, cache_dir=str(cache))

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(
        tokenize_function, batched=True, num_proc=args.num_proc, remove_columns=["text"]
    )

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total = len(concatenated["input_ids"]) // args.seq_len * args.seq_len
        return {
            k: [t[i : i + args.seq_len] for i in range(0, total, args.seq_len)]
            for k, t in concatenated.items()
        }

    grouped = tokenized.map(group_texts, batched=True, num_proc=args.num_proc)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "examples": len(grouped["train"]),
        "cache_bytes": folder_bytes(cache),
        "cache_dir": str(cache),
        **peak_rss_mb(),
    }


def run_prepare(args: argparse.Namespace) -> dict:
    from egbert import prepare_corpus

    folder = Path(args.work) / f"prepared-{args.family}-{Path(args.corpus).stem.split('-')[-1]}"
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    manifest = prepare_corpus(
        model=args.family,
        tokenizer=args.tokenizer,
        train_files=[args.corpus],
        doc_boundary="wikitext",
        seq_len=args.seq_len,
        num_proc=args.num_proc,
        output_dir=str(folder),
    )
    seconds = time.perf_counter() - start
    train = manifest["splits"]["train"]
    return {
        "seconds": seconds,
        "documents": train["documents"],
        "corpus_tokens": train["corpus_tokens"],
        "examples": train["examples"],
        "stored_tokens": train["tokens"],
        "dtype": manifest["dtype"],
        "folder_bytes": folder_bytes(folder),
        "shard_bytes": folder_bytes(folder / "train"),
        **peak_rss_mb(),
    }


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def run_train(args: argparse.Namespace) -> dict:
    import torch

    from egbert import run_pretraining

    # One thread: on a shared 2-core machine two OpenMP threads wait on each other's barriers
    # (tiny gpt ran 18 s a step with two threads under a load of 20, about 1 s with one).
    torch.set_num_threads(1)
    out = Path(args.work) / f"train-{Path(args.folder).name}"
    shutil.rmtree(out, ignore_errors=True)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        # From the first logged step (setup done) until the final model is written (saving and
        # the loss plot are not training): the memory that would grow with the corpus.
        metrics, model = out / "metrics.jsonl", out / "model"
        while not done.wait(0.05):
            if metrics.is_file() and metrics.stat().st_size and not model.exists():
                peak[0] = max(peak[0], rss_anon_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    run_pretraining(
        model=args.family,
        data=args.folder,
        preset="tiny",
        seq_len=args.seq_len,
        max_steps=args.steps,
        output_dir=str(out),
        report_to="none",
        log_every=50,
    )
    done.set()
    sampler.join()
    return {
        "seconds": time.perf_counter() - start,
        "rss_anon_mb": peak[0],
        **peak_rss_mb(),
    }


CHILDREN = {"reference": run_reference, "prepare": run_prepare, "train": run_train}


# ---------------------------------------------------------------- tables


def print_row(row: dict, flush: bool = False) -> None:
    reference = row["reference"]
    vs = f", reference {reference['seconds']:.0f} s" if reference else ""
    print(
        f"x{row['copies']} {row['family']}: {row['seconds']:.0f} s{vs}, "
        f"{row['folder_bytes'] / row['corpus_tokens']:.2f} B/corpus token",
        flush=flush,
    )


def print_tables(rows: list[dict], memory: list[dict]) -> None:
    print(
        "\n| corpus | family | egbert prepare | reference | time ratio | peak RSS egbert / "
        "reference (GB) | folder | bytes / corpus token (shards) | bytes / stored token | "
        "reference cache | folder / cache |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        reference = row["reference"]
        per_corpus = row["folder_bytes"] / row["corpus_tokens"]
        shards = row["shard_bytes"] / row["corpus_tokens"]
        per_stored = row["shard_bytes"] / row["stored_tokens"]
        cells = [
            f"x{row['copies']} ({row['corpus_tokens'] / 1e6:.1f} M tokens)",
            row["family"],
            f"{row['seconds']:.0f} s",
        ]
        if reference:
            cells += [
                f"{reference['seconds']:.0f} s",
                f"{row['seconds'] / reference['seconds']:.2f}",
                f"{row['peak_rss_mb'] / 1024:.2f} / {reference['peak_rss_mb'] / 1024:.2f}",
            ]
        else:
            cells += ["", "", f"{row['peak_rss_mb'] / 1024:.2f} / "]
        cells += [
            f"{row['folder_bytes'] / 1e6:.1f} MB",
            f"{per_corpus:.2f} ({shards:.2f})",
            f"{per_stored:.2f}",
        ]
        if reference:
            cells += [
                f"{reference['cache_bytes'] / 1e6:.0f} MB",
                f"{row['folder_bytes'] / reference['cache_bytes']:.2f}",
            ]
        else:
            cells += ["", ""]
        print("| " + " | ".join(cells) + " |")
    if not memory:
        return
    print("\n| family | corpus | RssAnon peak, 200 tiny steps | ratio to the smallest | steps s |")
    print("|---|---|---|---|---|")
    first = min(row["copies"] for row in memory)
    smallest = {row["family"]: row["rss_anon_mb"] for row in memory if row["copies"] == first}
    for row in memory:
        ratio = row["rss_anon_mb"] / smallest[row["family"]]
        print(
            f"| {row['family']} | x{row['copies']} | {row['rss_anon_mb']:.0f} MB | "
            f"{ratio:.3f} | {row['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
