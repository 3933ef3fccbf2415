"""Prometheus metrics of the API: a custom collector over the fold, plus the process's own.

Two kinds of figures, both read at scrape time by `FoldCollector`:
- per-task observations (latencies, rates, how tasks ended) accumulated by `Metrics.observe` as
  each event is folded, so a scrape costs O(models), not O(tasks in the log); they come from the
  log itself (usage of `TaskCompleted`, cancels, failures), so every API replica that follows
  the log from the same point reports the same figures;
- gauges read straight from the State (nodes up, instances ready, tasks waiting and running), so
  they are never out of step with what the API serves.

Names are vLLM-style and kept stable for scrapers (`shoal_time_to_first_token_seconds`, ...).
Every API owns its `CollectorRegistry` (with the process and platform collectors), never the
global one: two APIs in one process (the tests) never share a series.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from events.catalogue import LogEvent, TaskCancelled, TaskCompleted, TaskFailed
from events.retention import live_tasks_of
from events.state import State

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
WAITING_STATUSES = frozenset({"created", "assigned"})  # vLLM's "waiting": not yet computing
RUNNING_STATUSES = frozenset({"prefilling", "decoding"})


class Histogram:
    """Bucket counts of one series (prometheus_client's own Histogram is an instrument bound to a
    registry; here the collector renders these on demand)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count of observations <= le) for every bound and +Inf, as the exposition wants them."""
        running, out = 0, list[tuple[str, float]]()
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Metrics:
    """What the API observed: folded task outcomes, its own publishes and HTTP answers."""

    def __init__(self) -> None:
        self.ttft = defaultdict[str, Histogram](lambda: Histogram(LATENCY_BUCKETS_S))
        self.queue_time = defaultdict[str, Histogram](lambda: Histogram(LATENCY_BUCKETS_S))
        self.prefill_tps = defaultdict[str, Histogram](lambda: Histogram(RATE_BUCKETS))
        self.decode_tps = defaultdict[str, Histogram](lambda: Histogram(RATE_BUCKETS))
        self.completed = Counter[tuple[str, str]]()
        self.cancels = Counter[tuple[str, str]]()
        self.failures = Counter[str]()
        self.events_published = Counter[str]()
        self.requests = Counter[tuple[str, int]]()

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


class FoldCollector(Collector):
    """The API's metric families, built at each scrape from `Metrics` and the current State."""

    def __init__(self, metrics: Metrics, state: Callable[[], State]) -> None:
        self._metrics = metrics
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield from self._histograms()
        yield from self._counters()
        yield from self._gauges(self._state())

    def _histograms(self) -> Iterator[Metric]:
        m = self._metrics
        for name, documentation, series in (
            ("shoal_time_to_first_token_seconds", "Time to first token", m.ttft),
            ("shoal_queue_time_seconds", "Assignment to prefill start", m.queue_time),
            ("shoal_prefill_tokens_per_second", "Prefill rate per task", m.prefill_tps),
            ("shoal_decode_tokens_per_second", "Decode rate per task", m.decode_tps),
        ):
            family = HistogramMetricFamily(name, documentation, labels=["model"])
            for model, histogram in sorted(series.items()):
                family.add_metric([model], histogram.cumulative(), histogram.total)
            yield family

    def _counters(self) -> Iterator[Metric]:
        m = self._metrics
        for name, documentation, labels, series in (
            ("shoal_tasks_completed", "Tasks ended by finish reason", ["model", "finish_reason"], m.completed),
            ("shoal_task_cancels", "Cancels requested", ["model", "reason"], m.cancels),
            ("shoal_task_failures", "Tasks failed", ["model"], _keyed(m.failures)),
            ("shoal_events_published", "Events this API published", ["type"], _keyed(m.events_published)),
            ("shoal_http_requests", "HTTP requests by route and status", ["route", "status"], m.requests),
        ):
            family = CounterMetricFamily(name, documentation, labels=labels)
            for key, count in sorted(series.items()):
                family.add_metric([str(part) for part in key], count)
            yield family

    def _gauges(self, state: State) -> Iterator[Metric]:
        waiting, running = Counter[str](), Counter[str]()
        for task in live_tasks_of(state):
            if task.status in WAITING_STATUSES:
                waiting[task.model] += 1
            elif task.status in RUNNING_STATUSES:
                running[task.model] += 1
        for name, documentation, series in (
            ("shoal_num_requests_waiting", "Tasks created or assigned, not yet computing", waiting),
            ("shoal_num_requests_running", "Tasks in prefill or decode", running),
        ):
            family = GaugeMetricFamily(name, documentation, labels=["model"])
            for model, count in sorted(series.items()):
                family.add_metric([model], count)
            yield family
        nodes_up = sum(1 for node in state.nodes.values() if node.status == "up")
        yield GaugeMetricFamily("shoal_nodes_up", "Nodes whose worker is up", value=nodes_up)
        ready = sum(1 for instance in state.instances.values() if instance.ready)
        yield GaugeMetricFamily("shoal_instances_ready", "Instances whose every rank is ready", value=ready)
        yield GaugeMetricFamily("shoal_log_last_seq", "Last log sequence folded by this API", value=state.last_seq)


def _keyed(series: Counter[str]) -> dict[tuple[str], int]:
    return {(key,): count for key, count in series.items()}


def metrics_registry(metrics: Metrics, state: Callable[[], State]) -> CollectorRegistry:
    """This API's registry: its fold collector, and the process's CPU, memory and Python version."""
    registry = CollectorRegistry()
    registry.register(FoldCollector(metrics, state))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The scrape body and its content type: OpenMetrics when the scraper asks for it
    (`Accept: application/openmetrics-text`), else the classic text format."""
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type
