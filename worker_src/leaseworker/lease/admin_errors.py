"""What the operator's actions (lease/admin.py) refuse: an id that exists already, an id that does
not, and a URL that is not ws:// or wss://. The CLI maps each to its exit code (cli/errors.py).
"""

from __future__ import annotations

from urllib.parse import urlsplit


class ConnectionExists(ValueError):
    pass


class UnknownConnection(LookupError):
    def __init__(self, connection_id: str) -> None:
        super().__init__(f"no connection {connection_id!r} in the table")
        self.connection_id = connection_id


def check_ws_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"invalid url {url!r}: must be ws:// or wss:// with a host")
    return url
