"""The `egbert` command: dispatches to the job modules, prints user errors on one line."""

from __future__ import annotations

import importlib
import os
import sys

from egbert.errors import EgbertError

# command -> (module with a `main(argv)` function, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "tokenizer": ("egbert.tokenizer", "train the shared tokenizer or print its statistics"),
    "prepare": ("egbert.pretrain.prepare", "tokenize a corpus once into a folder for pretrain"),
    "pretrain": ("egbert.pretrain.run", "pretrain a bert, gpt or elmo model on text files"),
    "finetune": ("egbert.finetune.run", "fine-tune and evaluate a model on GLUE or custom tasks"),
    "embed": ("egbert.embedding.command", "extract sentence or token embeddings from a model"),
    "probe": ("egbert.evaluation.probe", "score a frozen model's features with a linear probe"),
    "prompt-eval": ("egbert.evaluation.prompting", "score a gpt model by k-shot prompting"),
    "generate": ("egbert.generate", "generate text with a gpt model"),
    "convert": ("egbert.models.convert", "convert stock transformers BERT/GPT-2 <-> egbert"),
    "push": ("egbert.push", "upload a model folder to the Hugging Face Hub"),
    "quickstart": ("egbert.quickstart.run", "run the whole pipeline on the data in $EGBERT_DATA"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: egbert COMMAND [options]   (egbert COMMAND --help for a command's options)",
        "",
        "Pretrain and fine-tune BERT-, GPT- and ELMo-like language models.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(usage(), file=sys.stderr)
        sys.exit(f"egbert: error: unknown command {command!r}; choose from {', '.join(COMMANDS)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    module = importlib.import_module(COMMANDS[command][0])
    try:
        module.main(rest)
    except EgbertError as error:
        sys.exit(f"egbert {command}: error: {error}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
