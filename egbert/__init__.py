"""egbert: pretrain and fine-tune BERT-, GPT- and ELMo-like models with the Hugging Face interfaces.

Importing the package registers egbert's models with the transformers Auto classes.
"""

from egbert import models  # noqa: F401  (registers the Auto classes)
from egbert.embed import TokenEmbeddings, embed, load_model
from egbert.errors import CheckpointError, ConfigError, DataError, EgbertError, TrainingError

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EgbertError",
    "TokenEmbeddings",
    "TrainingError",
    "embed",
    "load_model",
]
