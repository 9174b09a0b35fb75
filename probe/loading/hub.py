"""Whether the HuggingFace hub (and NDIF) can be reached, asked once with a socket.

huggingface_hub, offline, retries for about 25 s before it gives up; probe asks the
hub only when a TCP connection to it opens within a few seconds, and otherwise reads
the local cache alone (``local_files_only``).  ``HF_HUB_OFFLINE`` says offline without
asking.  The answer is kept for the process (:func:`hub_reachable` is cached).
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path


def hub_kwargs(location) -> dict:
    """Only ask the hub when it can answer: the offline retry loop takes ~25 s."""
    if isinstance(location, Path) or hub_reachable():
        return {}
    return {"local_files_only": True}


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the hub opens within ``timeout`` s (False under ``HF_HUB_OFFLINE``)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    from huggingface_hub import constants

    host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_state() -> str:
    """Why the hub did not give a model, for an error message."""
    return "the hub cannot be reached" if not hub_reachable() else "the hub has no such model"


def host_reachable(url: str, timeout: float = 3.0) -> bool:
    """A TCP connection to ``url``'s host (port 443 unless it names one) opens in ``timeout`` s."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    name, _, port = host.partition(":")
    try:
        with socket.create_connection((name, int(port or 443)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
