"""The exception types egbert raises for user mistakes and bad input.

The CLI prints any `EgbertError` as one line on stderr and exits non-zero, with no traceback:
so every message must name the file, field or option at fault and say how to fix it.
"""


class EgbertError(Exception):
    """Base class: a problem the user can fix (bad input, bad option, wrong checkpoint)."""


class DataError(EgbertError):
    """An input file or data set is missing, empty, malformed or not decodable."""


class ConfigError(EgbertError):
    """An option or config value is invalid or inconsistent with another one."""


class CheckpointError(EgbertError):
    """A model, tokenizer or checkpoint directory is missing, of the wrong kind, or incompatible."""


class TrainingError(EgbertError):
    """Training cannot go on (for example a non-finite loss)."""


class Interrupted(EgbertError):
    """A signal (SIGTERM, SIGINT) stopped a command; the message says what it left behind. The
    CLI exits with 128 + the signal's number, as a shell reports it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def first_line(error: BaseException) -> str:
    """An exception as one line for a one-line error message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
