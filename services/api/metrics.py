"""Prometheus metrics folded from the task events the API sees (no client library needed).

Values are observed from the log itself (usage of `TaskCompleted`, cancels, failures), so every
API replica that follows the log reports the same figures.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

from events.catalogue import LogEvent, TaskCancelled, TaskCompleted, TaskFailed
from events.state import State

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.observations = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.observations += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out: list[str] = []
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            out.append(f'{name}_bucket{{{labels},le="{bound:g}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.observations}')
        out.append(f"{name}_sum{{{labels}}} {self.total:g}")
        out.append(f"{name}_count{{{labels}}} {self.observations}")
        return out


class Metrics:
    def __init__(self) -> None:
        self.ttft = defaultdict[str, Histogram](lambda: Histogram(LATENCY_BUCKETS_S))
        self.queue_time = defaultdict[str, Histogram](lambda: Histogram(LATENCY_BUCKETS_S))
        self.prefill_tps = defaultdict[str, Histogram](lambda: Histogram(RATE_BUCKETS))
        self.decode_tps = defaultdict[str, Histogram](lambda: Histogram(RATE_BUCKETS))
        self.completed = defaultdict[tuple[str, str], int](int)
        self.cancels = defaultdict[tuple[str, str], int](int)
        self.failures = defaultdict[str, int](int)
        self.events_published = defaultdict[str, int](int)
        self.requests = defaultdict[tuple[str, int], int](int)

    def observe(self, state: State, event: LogEvent) -> None:
        """Call after `event` was folded into `state`."""
        match event:
            case TaskCompleted():
                task = state.tasks.get(event.task_id)
                model = task.model if task is not None else "unknown"
                self.completed[(model, event.finish_reason)] += 1
                if event.usage.ttft_ms > 0:
                    self.ttft[model].observe(event.usage.ttft_ms / 1000)
                if event.usage.prefill_tps > 0:
                    self.prefill_tps[model].observe(event.usage.prefill_tps)
                if event.usage.decode_tps > 0:
                    self.decode_tps[model].observe(event.usage.decode_tps)
                if task is not None and task.assigned_at and task.prefill:
                    started = min(p.started_at for p in task.prefill.values())
                    self.queue_time[model].observe(max(0, started - task.assigned_at) / 1e9)
            case TaskCancelled():
                task = state.tasks.get(event.task_id)
                self.cancels[(task.model if task is not None else "unknown", event.reason)] += 1
            case TaskFailed():
                task = state.tasks.get(event.task_id)
                self.failures[task.model if task is not None else "unknown"] += 1
            case _:
                pass

    def render(self) -> str:
        lines: list[str] = []
        for name, kind, help_text, series in (
            ("shoal_time_to_first_token_seconds", "histogram", "Time to first token", self.ttft),
            ("shoal_queue_time_seconds", "histogram", "Assignment to prefill start", self.queue_time),
            ("shoal_prefill_tokens_per_second", "histogram", "Prefill rate per task", self.prefill_tps),
            ("shoal_decode_tokens_per_second", "histogram", "Decode rate per task", self.decode_tps),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for model, histogram in sorted(series.items()):
                lines += histogram.lines(name, f'model="{_escape(model)}"')
        lines += [
            "# HELP shoal_tasks_completed_total Tasks ended by finish reason",
            "# TYPE shoal_tasks_completed_total counter",
        ]
        lines += [
            f'shoal_tasks_completed_total{{model="{_escape(m)}",finish_reason="{r}"}} {n}'
            for (m, r), n in sorted(self.completed.items())
        ]
        lines += ["# HELP shoal_task_cancels_total Cancels requested", "# TYPE shoal_task_cancels_total counter"]
        lines += [
            f'shoal_task_cancels_total{{model="{_escape(m)}",reason="{r}"}} {n}'
            for (m, r), n in sorted(self.cancels.items())
        ]
        lines += ["# HELP shoal_task_failures_total Tasks failed", "# TYPE shoal_task_failures_total counter"]
        lines += [f'shoal_task_failures_total{{model="{_escape(m)}"}} {n}' for m, n in sorted(self.failures.items())]
        lines += [
            "# HELP shoal_events_published_total Events this API published",
            "# TYPE shoal_events_published_total counter",
        ]
        lines += [f'shoal_events_published_total{{type="{t}"}} {n}' for t, n in sorted(self.events_published.items())]
        lines += [
            "# HELP shoal_http_requests_total HTTP requests by route and status",
            "# TYPE shoal_http_requests_total counter",
        ]
        lines += [
            f'shoal_http_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())
        ]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
