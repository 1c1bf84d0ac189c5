"""Prometheus metrics of the search index's deferred writer (:mod:`ard.indexer`).

``kubemq_a2a_ard_index_deferred`` (documents of registrations written together, waiting for
this node's writer), ``kubemq_a2a_ard_index_written_total`` and
``kubemq_a2a_ard_index_given_up_total`` (given up during a database outage; the repair job
writes them). Read at scrape time: nothing is counted here per registration.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ard.indexer import writer


class IndexWriterCollector(Collector):
    def describe(self) -> Iterator:
        # Names only: registration must not run collect().
        yield GaugeMetricFamily("kubemq_a2a_ard_index_deferred", "")
        yield CounterMetricFamily("kubemq_a2a_ard_index_written", "")
        yield CounterMetricFamily("kubemq_a2a_ard_index_given_up", "")

    def collect(self) -> Iterator:
        index = writer()
        yield GaugeMetricFamily(
            "kubemq_a2a_ard_index_deferred",
            "Search documents of registrations written together, waiting for this node's "
            "index writer.", value=index.waiting())
        yield CounterMetricFamily(
            "kubemq_a2a_ard_index_written", "Search documents the index writer wrote.",
            value=index.written)
        yield CounterMetricFamily(
            "kubemq_a2a_ard_index_given_up",
            "Search documents the index writer gave up on (a database outage); the repair "
            "job writes them.", value=index.given_up)


_registered: list[IndexWriterCollector] = []


def register() -> None:
    """Add the collector to the process's registry, once."""
    if not _registered:
        _registered.append(IndexWriterCollector())
        REGISTRY.register(_registered[0])
