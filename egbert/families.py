"""egbert's model families and the model types (config.json's `model_type`) of each: the one list
that the options, the tokenizer's rules and the commands that take only some families read."""

MODEL_FAMILIES = ("bert", "gpt", "elmo")
# egbert's own model types and the stock transformers ones it reads (`egbert convert`, finetune).
FAMILY_OF_MODEL_TYPE = {
    "egbert-bert": "bert",
    "bert": "bert",
    "egbert-gpt": "gpt",
    "gpt2": "gpt",
    "egbert-elmo": "elmo",
}
# Left-to-right language models, the ones `egbert generate` and `egbert prompt-eval` take.
CAUSAL_MODEL_TYPES = tuple(
    model_type for model_type, family in FAMILY_OF_MODEL_TYPE.items() if family == "gpt"
)
