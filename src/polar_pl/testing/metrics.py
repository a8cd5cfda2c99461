"""Read a server's `GET /metrics` with the official Prometheus parser, for tests and benches."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape: the exposition text and every sample in it."""

    text: str
    samples: tuple[Sample, ...]
    families: frozenset[str]  # metric family names (a counter's without `_total`)

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels` (0 when none)."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def labels(self, name: str, label: str) -> set[str]:
        """The values `label` takes among the samples called `name`."""
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def scrape(url: str, token: str | None = None) -> Scrape:
    """GET <url>/metrics (with `Authorization: Bearer <token>` when given), parsed."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    resp = httpx.get(f"{url.rstrip('/')}/metrics", headers=headers, timeout=30)
    resp.raise_for_status()
    families = list(text_string_to_metric_families(resp.text))
    samples = tuple(s for f in families for s in f.samples)
    return Scrape(resp.text, samples, frozenset(f.name for f in families))
