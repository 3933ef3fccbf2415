"""/metrics through prometheus_client's own parsers, in both formats it negotiates: the figures
match the State and the requests the API served."""

from __future__ import annotations

from collections.abc import Iterable

import anyio
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_classic

from eventlog.log import EventLog
from events.catalogue import TaskCompleted, TaskFailed, Usage
from events.ids import TaskId
from tests.events.builders import Events
from tests.services.test_api import Client, chat, running_api

pytestmark = pytest.mark.timeout(60)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def samples(families: Iterable[Metric]) -> Samples:
    found: Samples = {}
    for family in families:
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found[name][frozenset(labels.items())]


async def scrape(app: object, accept: str | None) -> tuple[str, str]:
    client = Client("GET", "/metrics")
    if accept is not None:
        client.scope["headers"].append((b"accept", accept.encode()))
    await app(client.scope, client.receive, client.send)  # type: ignore[operator]
    assert client.status == 200
    content_type = dict(client.sent[0]["headers"])[b"content-type"].decode()
    return "".join(client.texts), content_type


async def test_metrics_parse_in_both_formats_and_match_the_state(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.node("n2")])
    async with running_api(event_log) as (ctx, app):
        request = Client("POST", "/v1/chat/completions", chat(stream=False))
        async with anyio.create_task_group() as group:
            group.start_soon(app, request.scope, request.receive, request.send)
            with anyio.fail_after(10):
                while not ctx.hub.state.tasks:
                    await anyio.sleep(0.01)
            served = next(iter(ctx.hub.state.tasks))
            usage = Usage(prompt_tokens=3, completion_tokens=2, ttft_ms=250.0, prefill_tps=300.0, decode_tps=40.0)
            done = TaskCompleted(env=ev.master.stamp(), task_id=served, finish_reason="stop", usage=usage)
            await event_log.append(done)
        assert request.status == 200
        failed = TaskFailed(env=ev.master.stamp(), task_id=TaskId("broken"), error="boom")
        await event_log.append_many([ev.created("broken"), failed, ev.created("waiting")])
        with anyio.fail_after(10):
            while "waiting" not in ctx.hub.state.tasks:
                await anyio.sleep(0.01)

        classic, classic_type = await scrape(app, None)
        openmetrics, openmetrics_type = await scrape(app, OPENMETRICS)
        last_seq = ctx.hub.state.last_seq

    assert classic_type.startswith("text/plain; version=0.0.4")
    assert openmetrics_type.startswith("application/openmetrics-text") and openmetrics.endswith("# EOF\n")
    for found in (samples(parse_classic(classic)), samples(parse_openmetrics(openmetrics))):
        assert value(found, "shoal_tasks_completed_total", model="tiny", finish_reason="stop") == 1
        assert value(found, "shoal_task_failures_total", model="tiny") == 1
        assert value(found, "shoal_time_to_first_token_seconds_count", model="tiny") == 1
        assert value(found, "shoal_time_to_first_token_seconds_sum", model="tiny") == 0.25
        assert value(found, "shoal_time_to_first_token_seconds_bucket", model="tiny", le="0.1") == 0
        assert value(found, "shoal_time_to_first_token_seconds_bucket", model="tiny", le="0.25") == 1
        assert value(found, "shoal_time_to_first_token_seconds_bucket", model="tiny", le="+Inf") == 1
        assert value(found, "shoal_decode_tokens_per_second_sum", model="tiny") == 40
        assert value(found, "shoal_events_published_total", type="TaskCreated") == 1
        assert value(found, "shoal_http_requests_total", route="chat", status="200") == 1
        assert value(found, "shoal_num_requests_waiting", model="tiny") == 1
        assert value(found, "shoal_nodes_up") == 2
        assert value(found, "shoal_log_last_seq") == last_seq
        assert found["process_cpu_seconds_total"] and found["python_info"]  # the process's own collectors
    # The first scrape was counted before the second was rendered: the API counts its own answers.
    assert (
        value(samples(parse_openmetrics(openmetrics)), "shoal_http_requests_total", route="metrics", status="200") == 1
    )


async def test_two_apis_in_one_process_never_share_a_series(event_log: EventLog) -> None:
    async with running_api(event_log) as (first, _app), running_api(event_log) as (second, _other):
        first.metrics.requests[("chat", 200)] += 1
        assert first.registry is not second.registry
        assert second.registry.get_sample_value("shoal_http_requests_total", {"route": "chat", "status": "200"}) is None
        assert first.registry.get_sample_value("shoal_http_requests_total", {"route": "chat", "status": "200"}) == 1
