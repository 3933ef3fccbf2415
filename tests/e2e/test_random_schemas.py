"""50 random JSON schemas through `response_format: json_schema` on the tiny random model, whose
unconstrained output is noise: the grammar alone makes every answer parse and validate."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import jsonschema
import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.helpers import serve_cluster
from tests.e2e.random_schemas import byte_bound, random_schema

pytestmark = pytest.mark.timeout(300)

REQUESTS = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from serve_cluster(tmp_path_factory.mktemp("cluster"), workers=1)


def test_fifty_random_schemas_all_parse_and_validate(cluster: Cluster) -> None:
    client = cluster.client(timeout=120)
    rng = random.Random(12)
    for number in range(REQUESTS):
        schema = random_schema(rng)
        completion = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"answer number {number}"}],
            max_tokens=byte_bound(schema) + 1,  # room for the longest valid answer and the EOS after it
            temperature=1.0,  # sampled, so the answers explore the schema, not one greedy path
            seed=number,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{number}", "schema": schema, "strict": True},
            },
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content or ""), schema)
