"""What Client and AsyncClient share: the endpoint, credentials, token, project and channel
options, resolved as the `oomb` CLI resolves them (client/README.md)."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

from oomb._names import project_id

__all__ = ["DEFAULT_ENDPOINT", "Pem", "ChannelOptions", "Connection"]

DEFAULT_ENDPOINT = "127.0.0.1:7070"

# A PEM file's path, or its contents as bytes.
Pem = Union[str, "os.PathLike[str]", bytes]
ChannelOptions = Sequence[Tuple[str, Any]]


def _read_pem(value: Optional[Pem], what: str) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    try:
        with open(os.fspath(value), "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {os.fspath(value)}: {e.strerror}") from None


class Connection:
    """The resolved settings of a client."""

    def __init__(self, endpoint: Optional[str], token: Optional[str], ca: Optional[Pem], cert: Optional[Pem],
                 key: Optional[Pem], options: Optional[ChannelOptions], project: Optional[str] = None) -> None:
        self.endpoint: str = endpoint or os.environ.get("OOMB_ENDPOINT") or DEFAULT_ENDPOINT
        # As the CLI's --project: $OOMB_PROJECT when none is given; "" sets none (the env aside).
        if project is None:
            project = os.environ.get("OOMB_PROJECT")
        project = (project or "").strip()
        self.project: Optional[str] = project_id(project) if project else None
        if token is None:
            token = os.environ.get("OOMB_TOKEN")
        token = (token or "").strip()
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        if (cert is None) != (key is None):
            raise ValueError("mTLS needs both cert and key")
        self.credentials: Optional[grpc.ChannelCredentials] = None
        if ca is not None or cert is not None:
            self.credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(ca, "ca"), private_key=_read_pem(key, "key"),
                certificate_chain=_read_pem(cert, "cert"))
        # As the CLI: HTTP/2 keepalive pings keep idle WatchJob streams alive through proxies.
        # A short reconnect backoff, so that a restarted daemon is found again within seconds.
        self.options: List[Tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", 60000),
            ("grpc.keepalive_timeout_ms", 20000),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 5000),
        ]
        if options:
            given = {k for k, _ in options}
            self.options = [o for o in self.options if o[0] not in given] + list(options)

    def __repr__(self) -> str:
        tls = "tls" if self.credentials is not None else "plaintext"
        project = f", project {self.project}" if self.project else ""
        return f"{self.endpoint} ({tls}{', token' if self.metadata else ''}{project})"
