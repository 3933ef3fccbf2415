"""What `shoal up` prints while it waits for its model: a line per 10% of each node's download,
and a line each time the reason the model cannot be served changes. Pure over the State, so the
waiting loop only folds and prints."""

from __future__ import annotations

from events.ids import NodeId
from events.state import State
from services.models import model_error

GIB = 1 << 30


class UpProgress:
    def __init__(self, model: str) -> None:
        self.model = model
        self._tenths_shown: dict[NodeId, int] = {}
        self._error_shown = ""

    def lines(self, state: State) -> list[str]:
        """The lines owed since the last call (each line is said once)."""
        lines: list[str] = []
        status = state.models.get(self.model)
        for node_id, report in sorted(status.downloads.items()) if status is not None else []:
            if report.bytes_total <= 0:
                continue
            tenths = min(10, report.bytes_done * 10 // report.bytes_total)
            if tenths > self._tenths_shown.get(node_id, -1):
                self._tenths_shown[node_id] = tenths
                done, total = report.bytes_done / GIB, report.bytes_total / GIB
                lines.append(
                    f"shoal: {node_id} downloading {self.model!r}: {tenths * 10}% ({done:.2f} of {total:.2f} GiB)"
                )
        error = model_error(state, self.model)
        if error and error != self._error_shown:
            lines.append(f"shoal: {self.model!r} cannot be served: {error}")
        self._error_shown = error
        return lines
