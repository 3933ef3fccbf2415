"""`shoal worker --join URL --token T`: join a cluster with a one-time token, then serve
(`services/join_client.py`); run again, with or without the token, it serves as the node it
joined as."""

from __future__ import annotations

import argparse
import asyncio

import msgspec

from services.config import ResolvedConfig
from services.credentials import embedded_credentials_dir
from services.join_client import Joined, JoinRefused, join, read_joined
from services.join_tokens import BadToken, decode_token


def add_join_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--join", default=None, metavar="URL", help="join the cluster whose NATS server is at URL (with --token)"
    )
    parser.add_argument(
        "--token", default=None, help="a one-time join token (`shoal nats token create` on the control host)"
    )


def joined_config(
    resolved: ResolvedConfig, url: str, token_text: str | None, node_flag: str | None
) -> tuple[ResolvedConfig, str]:
    """The config this worker serves with once it joined `url` (joining first when it has not
    with this token), and its node id. `JoinRefused` / `BadToken` say what to do."""
    config = resolved.config
    if config.nats_url:
        raise JoinRefused("--join names the server: leave out --nats-url / SHOAL_NATS_URL / nats_url")
    directory = embedded_credentials_dir(config)
    joined = read_joined(directory)
    token = decode_token(token_text) if token_text else None
    if token is None:
        if joined is None or joined.url != url:
            raise JoinRefused(
                f"this host has not joined {url} yet: give --token (`shoal nats token create` on the control host "
                "prints one)"
            )
    elif joined is None or joined.url != url or joined.token_id != token.token_id:
        if token.node and node_flag and token.node != node_flag:
            raise JoinRefused(
                f"the token is for node {token.node!r}: leave out --node-id or say --node-id {token.node}"
            )
        from services.worker.service import default_node_id

        node = token.node or node_flag or default_node_id()
        joined = asyncio.run(join(url, token, node, directory, config.nats_tls))
        print(f"shoal worker: joined {url} as node {node!r}; its identities are in {directory} (0600)", flush=True)
    if node_flag and node_flag != joined.node:
        raise JoinRefused(
            f"this host joined {url} as node {joined.node!r}: leave out --node-id or say --node-id {joined.node}"
        )
    return _serving_config(resolved, joined, str(directory)), joined.node


def _serving_config(resolved: ResolvedConfig, joined: Joined, directory: str) -> ResolvedConfig:
    changes: dict[str, str] = {"nats_url": joined.url, "nats_credentials_dir": directory}
    if joined.ca:
        changes["nats_tls_ca"] = joined.ca
    config = msgspec.structs.replace(resolved.config, **changes)
    sources = {**resolved.sources, **{key: "joined with a token (--join)" for key in changes}}
    return msgspec.structs.replace(resolved, config=config, sources=sources)


__all__ = ["BadToken", "JoinRefused", "add_join_flags", "joined_config"]
