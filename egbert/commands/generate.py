"""`egbert generate`: continue a prompt with a gpt model (egbert.generate)."""

from __future__ import annotations

from egbert.arguments import ArgumentParser, BooleanFlag
from egbert.generate import check_sampling_options, generate_text
from egbert.model_files import ALLOW_PICKLE_HELP


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        "egbert generate",
        description="Continue a prompt with a gpt model, streaming the text to stdout.",
    )
    parser.add_argument("--model", required=True, help="gpt model directory (with its tokenizer)")
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, help="tokens to generate")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature; 0 or absent: greedy"
    )
    parser.add_argument("--top-k", type=int, help="sample from the k likeliest")
    parser.add_argument("--top-p", type=float, help="sample from the smallest set with this mass")
    parser.add_argument("--seed", type=int, help="random seed for sampling")
    parser.add_argument("--bf16", action=BooleanFlag, help="bf16 autocast")
    parser.add_argument(
        "--fp16", action=BooleanFlag, help="fp16 autocast, for GPUs without bf16; instead of --bf16"
    )
    parser.add_argument("--allow-pickle", action=BooleanFlag, help=ALLOW_PICKLE_HELP)
    parser.defaults_from(generate_text)
    args = parser.parse_args(argv)
    check_sampling_options(args)
    options = vars(args)
    # --model is generate_text's model_dir (its name in --print-config and --config files); every
    # other option is the parameter of the same name.
    generate_text(options.pop("model"), **options)
