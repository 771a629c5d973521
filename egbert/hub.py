"""Reaching the Hugging Face Hub: one check that fails in seconds, before a job that needs the
Hub (`egbert push`, `egbert quickstart --from-hub`) spends minutes on retries or half a run."""

from __future__ import annotations

from huggingface_hub import constants
from huggingface_hub.utils import get_session

from egbert.errors import DataError, first_line

REACH_TIMEOUT_S = 10.0


def check_hub_reachable(instead: str) -> None:
    """Raise DataError when the Hub cannot be reached: offline mode (HF_HUB_OFFLINE), no
    network, or an error answer from its address (HF_ENDPOINT). `instead` ends the message: what
    the user can do without the Hub."""
    if constants.is_offline_mode():
        raise DataError(
            "HF_HUB_OFFLINE is set, so the Hub cannot be reached; unset HF_HUB_OFFLINE, or "
            + instead
        )
    try:
        # huggingface_hub's client: its proxy settings, a short timeout instead of none
        response = get_session().head(constants.ENDPOINT, timeout=REACH_TIMEOUT_S)
        reason = f"it answered HTTP {response.status_code}" if response.status_code >= 400 else ""
    except Exception as error:  # the HTTP client's errors share no base huggingface_hub exports
        reason = first_line(error)
    if reason:
        raise DataError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({reason}); check the network "
            f"connection or the HTTPS_PROXY setting, or {instead}"
        )
