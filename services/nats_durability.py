"""The embedded server's durability: its JetStream fsync policy, and noticing a full store.

JetStream writes each event to the OS before acknowledging it, so an acknowledged event survives
its server's process dying; it is fsynced within `sync_interval` (`nats_sync_interval`), which
bounds what a host losing power can lose; `always` fsyncs each write before its acknowledgement
(README "Durability"). The server reads `<store>/shoal-server.conf`, written at each start
(`server_config_text`): it includes the identities' config and sets the policy.

A store out of disk space makes nats-server 2.15 acknowledge nothing more, with no error to the
client and none after space returns until it restarts; its log says `no space left on device`
(`OutOfSpaceWatch`, read by `services.nats_keeper`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

from msgspec import Meta

# fsync at least every second: a host that loses power loses at most the last second of a lone
# server's acknowledgements (none of an R3 stream's while two of three hosts stand). `always`
# would acknowledge only what is on disk, but fsyncs each write on its own: on the VM disk
# measured (`shoal bench log --fsync`) appends fell ~30x, under one batch's chunk rate.
JETSTREAM_SYNC_INTERVAL = "1s"
SYNC_ALWAYS = "always"
NATS_DEFAULT_SYNC_INTERVAL = "2m"  # nats-server's own default, for the bench's comparison
SYNC_INTERVAL_PATTERN = r"^(always|[1-9][0-9]*(ms|s|m|h))$"
SyncInterval = Annotated[
    str,
    Meta(
        pattern=SYNC_INTERVAL_PATTERN,
        extra={"allowed": "always, or a duration such as 500ms, 1s, 2m"},
        description="how often the embedded nats-server fsyncs its store: an acknowledged event survives its "
        "process dying either way, and its host losing power once synced; `always` syncs each write before "
        'acknowledging it, at a large cost in append rate (README "Durability")',
    ),
]
WRAPPER_CONFIG = "shoal-server.conf"
OUT_OF_SPACE = b"no space left on device"


def server_config_text(config_file: str | os.PathLike[str] | None, store_dir: Path, sync_interval: str) -> str:
    """The config the server reads from `store_dir`: `config_file` included (nats-server resolves
    an include relative to the including file), then the fsync policy, which overrides any the
    included file sets."""
    lines: list[str] = []
    if config_file is not None:
        included = os.path.relpath(Path(config_file).expanduser().resolve(), store_dir.resolve())
        lines.append(f"include {json.dumps(included)}")
    # quoted: the parser reads a bare `2m` as the number 2,000,000 (seconds), not two minutes
    lines.append(f"jetstream {{ sync_interval: {json.dumps(sync_interval)} }}")
    return "\n".join(lines) + "\n"


class OutOfSpaceWatch:
    """Reads a server's log as it grows for `no space left on device`, one run at a time."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._scanned = 0
        self._full = False

    def new_run(self) -> None:
        """The server starts again: only the lines it writes from now on count."""
        self._scanned = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._full = False

    def full(self) -> bool:
        """Whether this run failed to write its store for want of space."""
        if self._full or not self.log_path.exists():
            return self._full
        with self.log_path.open("rb") as log:
            log.seek(self._scanned)
            new = log.read()
        complete = new[: new.rfind(b"\n") + 1]  # a line still being written is read next time
        self._scanned += len(complete)
        self._full = OUT_OF_SPACE in complete
        return self._full
