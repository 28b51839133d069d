//! Prometheus metrics (`/metrics`, text format), prefix `hub_`, one sub-registry per
//! module.
use std::sync::{Arc, OnceLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};

use crate::{cache::Cache, coordinator::pool::Pool, shared::Shared};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub verb: &'static str,
    pub code: u16,
    pub component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub route: &'static str,
    pub verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    pub server: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~65 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 18,
    ))
}

/// The cache's counters, read from it at each scrape (`hub_cache_*`).
#[derive(Debug, Default, Clone)]
pub struct CacheCollector(pub Arc<OnceLock<Arc<Cache>>>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(cache) = self.0.get() else {
            return Ok(());
        };
        let s = cache.status();
        /// (name, help, [(result label, value)])
        type CounterFamily<'a> = (&'a str, &'a str, Vec<(&'static str, u64)>);
        let families: [CounterFamily; 2] = [
            (
                "writes",
                "Objects the cache applied or refused, by result",
                vec![
                    ("written", s.written),
                    ("stale", s.stale),
                    ("deleted", s.deleted),
                    ("rejected", s.rejected),
                    ("too_large", s.too_large),
                    ("error", s.write_errors),
                ],
            ),
            (
                "offline_writes",
                "Writes accepted while the cloud was unreachable, and their replay",
                vec![
                    ("accepted", s.offline_accepted),
                    ("replayed", s.replayed),
                    ("dropped", s.replay_dropped),
                    ("superseded", s.superseded),
                    ("expired", s.expired),
                ],
            ),
        ];
        for (name, help, values) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (result, v) in values {
                ConstCounter::new(v).encode(family.encode_family(&ResultLabel { result })?)?;
            }
        }
        let help = "Objects recognised as already stored by a metadata scan alone, not parsed";
        counters(
            &mut encoder,
            &[
                ("scanned_only", help, s.scanned_only),
                (
                    "writer_waits",
                    "Times a watch stream waited for the cache writer to catch up",
                    s.writer_waits,
                ),
            ],
        )?;
        gauges(
            &mut encoder,
            &[
                (
                    "entries",
                    "Objects stored, tombstones included",
                    s.entries as i64,
                ),
                ("file_bytes", "Size of the store file", s.file_bytes as i64),
                (
                    "queued_writes",
                    "Offline writes waiting for the cloud",
                    s.queued as i64,
                ),
                (
                    "pending_bytes",
                    "Bytes of answers and events waiting for the cache writer",
                    s.pending_bytes as i64,
                ),
            ],
        )?;
        Ok(())
    }
}

/// Writes each (name, help, value) as a counter read at this scrape.
fn counters(encoder: &mut DescriptorEncoder, each: &[(&str, &str, u64)]) -> std::fmt::Result {
    for (name, help, v) in each {
        let c = ConstCounter::new(*v);
        c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
    }
    Ok(())
}

/// Writes each (name, help, value) as a gauge read at this scrape.
fn gauges(encoder: &mut DescriptorEncoder, each: &[(&str, &str, i64)]) -> std::fmt::Result {
    for (name, help, v) in each {
        let g = ConstGauge::new(*v);
        g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
    }
    Ok(())
}

/// Conversions between protobuf and JSON (`hub_convert_*`), read at each scrape.
#[derive(Debug, Default)]
struct ConvertCollector;

impl Collector for ConvertCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        counters(
            &mut encoder,
            &[
                (
                    "objects",
                    "Objects, lists and watch events converted between protobuf and JSON",
                    crate::convert::conversions_total(),
                ),
                (
                    "fields_left_out",
                    "Fields left out of a conversion: newer than the hub's schema (Kubernetes 1.36)",
                    crate::convert::unknown_fields_total(),
                ),
            ],
        )?;
        Ok(())
    }
}

/// The node-level watch cache's counts, read at each scrape (`hub_watch_cache_*`).
#[derive(Default, Clone)]
pub struct SharedCollector(pub Arc<OnceLock<Arc<Shared>>>);

impl std::fmt::Debug for SharedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedCollector")
    }
}

impl Collector for SharedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(shared) = self.0.get() else {
            return Ok(());
        };
        let s = shared.status();
        counters(
            &mut encoder,
            &[
                (
                    "lists_served",
                    "LISTs answered from the node's shared sets",
                    s.lists_served,
                ),
                (
                    "gets_served",
                    "GETs at any resourceVersion answered from the node's shared sets",
                    s.gets_served,
                ),
                (
                    "watches_served",
                    "Watches answered from the node's shared sets",
                    s.watches_served,
                ),
                (
                    "checks",
                    "Clients' own requests sent to the cloud to learn their authorization or its resourceVersion",
                    s.checks,
                ),
                (
                    "passed_to_cloud",
                    "Reads of shared resources the sets could not answer, sent to the cloud",
                    s.passed_to_cloud,
                ),
            ],
        )?;
        let current = s.sets.iter().filter(|set| set.state == "current").count();
        let help = "Shared sets listed and watched from the cloud now";
        gauges(&mut encoder, &[("sets_current", help, current as i64)])
    }
}

/// The pool coordinator's state, read from it at each scrape (`hub_coordinator_*`).
#[derive(Default, Clone)]
pub struct PoolCollector(pub Arc<OnceLock<Arc<Pool>>>);

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolCollector")
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(pool) = self.0.get() else {
            return Ok(());
        };
        let s = pool.status();
        gauges(
            &mut encoder,
            &[
                (
                    "healthy",
                    "1 if the pool coordinator answers reads",
                    i64::from(s.healthy),
                ),
                (
                    "pushes_healthy",
                    "1 if the last round of pushes to the pool coordinator succeeded",
                    i64::from(s.pushes_healthy),
                ),
                (
                    "leader",
                    "1 while this hub leads its pool",
                    i64::from(s.role == "leader"),
                ),
            ],
        )?;
        counters(
            &mut encoder,
            &[
                (
                    "full_pushes",
                    "Pushes of everything (the first, and one per coordinator rebuild)",
                    s.full_pushes,
                ),
                (
                    "sets_pushed",
                    "Component sets written to the coordinator",
                    s.lists_pushed,
                ),
                (
                    "objects_pushed",
                    "Objects written to the coordinator by pushes",
                    s.objects_written,
                ),
                (
                    "stale_dropped",
                    "Pushed objects the coordinator held newer, dropped",
                    s.stale_dropped,
                ),
                (
                    "converted_for_storage",
                    "Objects held in JSON converted to protobuf for the coordinator",
                    s.converted_for_storage,
                ),
                (
                    "stored_as_json",
                    "Objects pushed in JSON (no schema to convert them: custom resources)",
                    s.stored_as_json,
                ),
                (
                    "leader_lists",
                    "Pool-scope lists the leader wrote",
                    s.leader_lists,
                ),
                (
                    "leader_events",
                    "Pool-scope watch events the leader applied",
                    s.leader_events,
                ),
                (
                    "leader_stale",
                    "Pool-scope events older than what the coordinator held",
                    s.leader_stale,
                ),
                (
                    "gc_removed",
                    "Objects the leader's sweeps removed (no live hub held them)",
                    s.gc.removed,
                ),
                (
                    "gc_nodes_removed",
                    "Departed hubs whose records the leader removed",
                    s.gc.nodes_removed,
                ),
                (
                    "gc_tombstones_removed",
                    "Deletion records older than the tombstone TTL, removed",
                    s.gc.tombstones_removed,
                ),
            ],
        )?;
        Ok(())
    }
}

pub struct Metrics {
    registry: Registry,
    /// Filled once the pool is set up.
    pub pool: PoolCollector,
    /// Filled when the node-level watch cache is on.
    pub shared: SharedCollector,
    /// Filled once the cache is open; its counters are read at each scrape.
    pub cache: CacheCollector,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    pub open_streams: Gauge,
    pub upstream_healthy: Family<ServerLabels, Gauge>,
    pub intercepted: Counter,
    /// The hub's own Warning headers, at most once a minute per client and kind.
    pub warnings: crate::proxy::warnings::Warnings,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hub");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let open_streams = Gauge::default();
        let upstream_healthy = Family::<ServerLabels, Gauge>::default();
        let intercepted = Counter::default();
        let warnings = crate::proxy::warnings::Warnings::default();
        {
            let proxy = registry.sub_registry_with_prefix("proxy");
            proxy.register(
                "requests",
                "API requests served, by route, verb, status code and client component",
                requests.clone(),
            );
            proxy.register(
                "request_duration_seconds",
                "Time to response headers, by route and verb",
                latency.clone(),
            );
            proxy.register(
                "open_streams",
                "Watches, followed logs and upgraded connections in progress",
                open_streams.clone(),
            );
            proxy.register(
                "warnings_suppressed",
                "The hub's own Warning headers left out of answers (a client hears each kind once a minute), by kind",
                warnings.suppressed.clone(),
            );
        }
        registry.sub_registry_with_prefix("upstream").register(
            "healthy",
            "1 if the cloud server is healthy",
            upstream_healthy.clone(),
        );
        let cache = CacheCollector::default();
        registry
            .sub_registry_with_prefix("cache")
            .register_collector(Box::new(cache.clone()));
        let pool = PoolCollector::default();
        registry
            .sub_registry_with_prefix("coordinator")
            .register_collector(Box::new(pool.clone()));
        registry
            .sub_registry_with_prefix("convert")
            .register_collector(Box::new(ConvertCollector));
        let shared = SharedCollector::default();
        registry
            .sub_registry_with_prefix("watch_cache")
            .register_collector(Box::new(shared.clone()));
        registry.sub_registry_with_prefix("intercept").register(
            "connections",
            "Connections accepted on intercepted VIP listeners",
            intercepted.clone(),
        );
        Metrics {
            registry,
            pool,
            shared,
            cache,
            requests,
            latency,
            open_streams,
            upstream_healthy,
            intercepted,
            warnings,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
