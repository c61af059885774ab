"""Reading `/metrics` in tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(client: httpx.AsyncClient, url: str = "/metrics") -> Samples:
    response = await client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when it does not exist yet (a counter never incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
