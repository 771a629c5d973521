"""Where a command writes: checked before the command works, so that minutes of tokenizing or
training never end on a file in the place of a folder or on a folder nobody may write.

The check leaves nothing behind: a folder that does not exist yet is not created (the command
creates it when it writes); its nearest existing parent is tried with a new entry, removed at
once. Trying is the one test that holds for everyone: root passes the permission bits that
`os.access` reads, and a file system such as /sys refuses even root.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from egbert.errors import ConfigError


def check_output_folder(path: str | os.PathLike, option: str) -> Path:
    """`path` as a folder the command may write into, new or existing; a one-line ConfigError
    naming `option` where it is a file or its place takes no new files."""
    folder = Path(path)
    _check_can_write(folder, folder, option)
    return folder


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """`path` as a file the command may write, its folder new or existing; a one-line
    ConfigError naming `option` otherwise."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{option} {file} is a folder; pass a file name")
    _check_can_write(file.parent, file, option)
    return file


def _check_can_write(folder: Path, named: Path, option: str) -> None:
    existing = next(place for place in (folder, *folder.parents) if place.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {named}: {existing} is a file, not a folder; choose another {option}"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".egbert-write-check-", dir=existing))
    except OSError as error:
        raise ConfigError(
            f"{option} {named}: cannot write in {existing} ({error.strerror}); choose another "
            f"{option} or fix the folder's permissions"
        ) from None
