"""Embedding extraction: sentence and token vectors from chosen layers of a saved model.

Library: `egbert.embed(model_or_dir, texts_or_pairs, layers=..., combine=..., pool=...,
output=...)`, the one entry; command line: `egbert embed --model DIR --input FILE --output FILE`
(`egbert.commands.embed`), which maps its options onto it with the same defaults (mean
pooling of the last four layers concatenated, batches of 64) and the same checks
(`EmbedOptions`). Works for egbert's bert, gpt and elmo models and for stock transformers
checkpoints that `AutoModel` loads (BERT, GPT-2).

Layers are indices into the model's `hidden_states` = (embeddings, layer 1, ..., layer N): -1 is
the last layer, -2 the one below it, 0 the embedding layer. The chosen layers are combined per
token ('concat' in the order given, 'sum', 'mean', 'scalar-mix', or 'none' for a single layer),
then pooled into one vector per input over its real tokens ('mean': the average, 'cls': the
first token, 'last': the last real token, natural for left-to-right models), or kept per token
(pool 'none').

'scalar-mix' is ELMo's gamma * sum_j softmax(s)_j * h_j with the weights left untrained: s = 0 and
gamma = 1, so every layer gets the same weight (numerically the same as 'mean'). A task-specific
mix is trained by the fine-tuning heads, not here.

The package: `options` (EmbedOptions: defaults and checks; `egbert embed`'s other options),
`loading` (the model and the checks that need it), `vectors` (texts to vectors), `writers`
(.npy, .safetensors, .jsonl, stdout), `extract` (`embed`); its command line is
`egbert.commands.embed`.
"""

from egbert.embedding.extract import TruncatedInputsWarning, embed
from egbert.embedding.loading import load_model
from egbert.embedding.options import COMBINES, POOLS, EmbedOptions
from egbert.embedding.vectors import TokenEmbeddings
from egbert.embedding.writers import OUTPUT_SUFFIXES

__all__ = [
    "COMBINES",
    "OUTPUT_SUFFIXES",
    "POOLS",
    "EmbedOptions",
    "TokenEmbeddings",
    "TruncatedInputsWarning",
    "embed",
    "load_model",
]
