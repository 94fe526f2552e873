"""/metrics in the Prometheus text format.

Two sources, each with one owner: the server counts what it served (requests by endpoint and
finish reason, refusals by status, tokens, latencies: `ServerMetrics.observe*`), and the
engine's state (queue length, KV pool use, tau, acceptance by block position, throughput) is
read at scrape time from the loop's snapshot, which the engine thread writes after each step.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine.outputs import RequestStats
from .engine_loop import LoopSnapshot

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _EngineCollector:
    """Engine-side gauges and counters, from the latest loop snapshot."""

    def __init__(self, snapshot: Callable[[], LoopSnapshot]):
        self._snapshot = snapshot

    def collect(self):
        s = self._snapshot()
        e = s.engine
        yield _gauge("dspine_requests_running", "requests being decoded", s.running)
        yield _gauge("dspine_requests_waiting", "requests queued for admission (queue length)",
                     s.waiting)
        yield _gauge("dspine_requests_in_flight", "requests accepted and not finished",
                     s.in_flight)
        for name, doc, field in (
                ("dspine_kv_pages_total", "pages in the KV pool", "total"),
                ("dspine_kv_pages_used", "KV pages holding a live sequence's K/V", "used"),
                ("dspine_kv_pages_reserved", "KV pages promised to admitted requests, not yet "
                 "taken", "reserved")):
            g = GaugeMetricFamily(name, doc, labels=["pool"])
            for pool, use in s.pools.items():
                g.add_metric([pool], getattr(use, field))
            yield g
        g = GaugeMetricFamily("dspine_kv_usage_ratio", "used / total KV pages", labels=["pool"])
        for pool, use in s.pools.items():
            g.add_metric([pool], use.used / use.total if use.total else 0.0)
        yield g
        yield _counter("dspine_engine_steps", "engine steps (prefill batches and rounds)",
                       s.steps)
        yield _counter("dspine_engine_rounds", "decode steps / speculative rounds, summed over "
                       "sequences", e.rounds)
        yield _counter("dspine_engine_batches", "verified batches (rounds / batches = sequences "
                       "a batch held: how full the rounds run)", e.batches)
        yield _counter("dspine_engine_generated_tokens", "tokens the engine committed",
                       e.new_tokens)
        yield _counter("dspine_engine_accepted_draft_tokens", "draft tokens accepted (tau = 1 + "
                       "accepted / rounds)", e.accepted_drafts)
        yield _gauge("dspine_engine_tokens_per_second", "output tokens per second of engine busy "
                     "time (for a windowed rate use rate(dspine_generation_tokens_total))",
                     e.tokens_per_second)
        yield _gauge("dspine_tau", "mean tokens committed per round, bonus included (1 without a "
                     "draft)", e.tau)
        g = GaugeMetricFamily("dspine_acceptance_rate", "fraction of drafted rounds that "
                              "accepted the first j draft tokens", labels=["position"])
        for j, rate in enumerate(e.acceptance_by_position(), start=1):
            g.add_metric([str(j)], rate)
        yield g


def _gauge(name, doc, value):
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name, doc, value):
    return CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, snapshot: Callable[[], LoopSnapshot]):
        disable_created_metrics()  # no *_created series: they double the text and say nothing
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dspine_requests", "finished requests", ["endpoint",
                                "finish_reason"], registry=r)
        self.refused = Counter("dspine_refused_requests", "requests answered with an error "
                               "status", ["status"], registry=r)
        self.prompt_tokens = Counter("dspine_prompt_tokens", "prompt tokens of finished "
                                     "requests", registry=r)
        self.generation_tokens = Counter("dspine_generation_tokens", "output tokens of finished "
                                         "requests", registry=r)
        self.ttft = Histogram("dspine_time_to_first_token_seconds", "engine admission to first "
                              "token", buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("dspine_request_seconds", "engine admission to last token",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(snapshot))

    def observe_finished(self, endpoint: str, finish_reason: str | None,
                         stats: RequestStats | None) -> None:
        self.requests.labels(endpoint, finish_reason or "unknown").inc()
        if stats is None:
            return
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        if stats.new_tokens:
            self.ttft.observe(stats.time_to_first_token)
        self.latency.observe(stats.elapsed)

    def observe_refused(self, status: int) -> None:
        self.refused.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
