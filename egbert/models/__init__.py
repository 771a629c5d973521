"""egbert's model families; importing this registers them with the transformers Auto classes."""

from egbert.models import bert, elmo, gpt, heads  # noqa: F401  (registration happens on import)
