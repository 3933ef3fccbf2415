"""`shoal models ls|load|unload` (through the API, with an admin key) and `shoal placement
explain MODEL` (from the log, like `shoal diagnose`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from services.config import ConfigError, resolve_config
from services.ops.placement_explain import explain_placement
from services.ops.scan import scan
from services.ops.sources import SourceError, add_source_arguments, open_source

ADMIN_KEY_ENV = "SHOAL_ADMIN_KEY"  # the key `shoal models` sends (not a setting: the API's keys are `api_keys`)


def register(subparsers: Any) -> None:
    models = subparsers.add_parser("models", help="list, load and unload the cluster's models (through the API)")
    verbs = models.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("ls", help="every model the cluster serves, its state and instances")
    load = verbs.add_parser("load", help="place a model now (and keep it placed while pinned)")
    load.add_argument("model", help="`tiny`, a model directory (the same path on every node) or a Hub id")
    load.add_argument("--pin", action="store_true", help="never unload it for idleness nor evict it")
    load.add_argument("--node", action="append", default=[], help="only on this node (repeatable)")
    load.add_argument("--min-nodes", type=int, default=1, help="split it over at least this many nodes")
    load.add_argument("--max-nodes", type=int, default=0, help="and at most this many (0: as it needs)")
    unload = verbs.add_parser("unload", help="retire a model's instances once their running tasks end")
    unload.add_argument("model")
    for parser in (ls, load, unload):
        parser.add_argument("--url", default=None, help="the API (default: http://api_host:api_port of the config)")
        parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
        parser.set_defaults(handler=run_models)

    placement = subparsers.add_parser("placement", help="why the models' instances sit where they do")
    explain_verbs = placement.add_subparsers(dest="verb", metavar="VERB", required=True)
    explain = explain_verbs.add_parser("explain", help="each instance of MODEL: its nodes, layers and reason")
    explain.add_argument("model")
    add_source_arguments(explain, default_to_config=True)
    explain.set_defaults(handler=run_explain)


def run_models(args: argparse.Namespace) -> int:
    try:
        base = args.url or _configured_url(args.config)
    except ConfigError as exc:
        print(f"shoal models: {exc}", file=sys.stderr)
        return 2
    headers = {"authorization": f"Bearer {key}"} if (key := os.environ.get(ADMIN_KEY_ENV)) else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30.0) as client:
            return _send(client, args)
    except httpx.HTTPError as exc:
        print(f"shoal models: the API at {base} did not answer: {exc}", file=sys.stderr)
        return 2


def _send(client: httpx.Client, args: argparse.Namespace) -> int:
    match args.verb:
        case "load":
            body = {"model": args.model, "pin": args.pin, "nodes": args.node, "min_nodes": args.min_nodes}
            response = client.post("/v1/admin/models/load", json={**body, "max_nodes": args.max_nodes})
        case "unload":
            response = client.post("/v1/admin/models/unload", json={"model": args.model})
        case _:
            response = client.get("/v1/models")
    if response.status_code >= 400:
        message = response.json().get("error", {}).get("message", response.text)
        hint = f" (set {ADMIN_KEY_ENV} to an admin key)" if response.status_code in (401, 403) else ""
        print(f"shoal models: {response.status_code}: {message}{hint}", file=sys.stderr)
        return 1
    if args.verb == "ls":
        print("\n".join(models_table(response.json()["data"])))
    else:
        print(f"shoal models: {args.verb} of {args.model!r} is on the log (seq {response.json()['seq']})")
    return 0


def models_table(cards: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'MODEL':<40} {'STATE':<12} INSTANCES"]
    for card in cards:
        instances = "; ".join(
            f"{i['instance_id']} {i['state']} "
            + ",".join(f"{s['node_id']}[{s['start_layer']}-{s['end_layer'] - 1}]" for s in i["shards"])
            for i in card["instances"]
        )
        state = card["state"] + (" pinned" if card.get("pinned") else "")
        lines.append(f"{card['id']:<40} {state:<12} {instances or '-'}")
        if card.get("error"):
            lines.append(f"{'':<40} {card['error']}")
    return lines


def _configured_url(config_file: str | None) -> str:
    config = resolve_config(yaml_path=config_file).config
    host = "127.0.0.1" if config.api_host in ("0.0.0.0", "::") else config.api_host
    return f"http://{host}:{config.api_port}"


def run_explain(args: argparse.Namespace) -> int:
    try:
        source = open_source(args)
    except SourceError as exc:
        print(f"shoal placement explain: {exc}", file=sys.stderr)
        return 2
    result = scan(source.records(), abandon=source.abandon, allow_gaps=source.live)
    print("\n".join(explain_placement(result.state, args.model)))
    return 0
