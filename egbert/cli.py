"""The `egbert` command: dispatches to the commands' modules, prints user errors on one line.

Where a command lives: `egbert COMMAND` runs `main(argv)` of `egbert/commands/COMMAND.py` (a
hyphen becomes an underscore: `egbert prompt-eval` is `egbert/commands/prompt_eval.py`). A
command's module is its command line and nothing else: it parses argv into the job's option
dataclasses with egbert.arguments' one dataclass parser (so that `--help` shows the defaults the
Python API uses), calls the job's library function (`egbert pretrain` ->
`egbert.pretrain.run.pretrain`), then prints what the command reports. The jobs never import
`egbert.commands`.
"""

from __future__ import annotations

import importlib
import os
import sys

from egbert.errors import EgbertError, Interrupted

# command -> one-line summary; its module is module_name(command)
COMMANDS: dict[str, str] = {
    "tokenizer": "train the shared tokenizer or print its statistics",
    "prepare": "tokenize a corpus once into a folder for pretrain",
    "pretrain": "pretrain a bert, gpt or elmo model on text files",
    "finetune": "fine-tune and evaluate a model on GLUE or custom tasks",
    "embed": "extract sentence or token embeddings from a model",
    "probe": "score a frozen model's features with a linear probe",
    "prompt-eval": "score a gpt model by k-shot prompting",
    "reward": "train a scoring model on preference pairs (TRL)",
    "rlhf": "tune a gpt model against a scoring model with RL (TRL)",
    "compare": "compare two runs' dev scores, with 95% intervals",
    "generate": "generate text with a gpt model",
    "convert": "convert stock transformers BERT/GPT-2 <-> egbert",
    "push": "upload a model folder to the Hugging Face Hub",
    "quickstart": "run the whole pipeline on the data in $EGBERT_DATA",
}


def module_name(command: str) -> str:
    """The module whose `main(argv)` runs `egbert COMMAND`."""
    return f"egbert.commands.{command.replace('-', '_')}"


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: egbert COMMAND [options]   (egbert COMMAND --help for a command's options)",
        "",
        "Pretrain and fine-tune BERT-, GPT- and ELMo-like language models.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()]
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
    module = importlib.import_module(module_name(command))
    try:
        module.main(rest)
    except Interrupted as stop:  # not an error: what the command did, on one line
        print(f"egbert {command}: {stop}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    except EgbertError as error:
        sys.exit(f"egbert {command}: error: {error}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
