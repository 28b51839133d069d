//! Prometheus metrics (`/metrics`, text format), prefix `hub_`, one sub-registry per
//! module.
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

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

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    pub open_streams: Gauge,
    pub upstream_healthy: Family<ServerLabels, Gauge>,
    pub intercepted: Counter,
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
        }
        registry.sub_registry_with_prefix("upstream").register(
            "healthy",
            "1 if the cloud server is healthy",
            upstream_healthy.clone(),
        );
        registry.sub_registry_with_prefix("intercept").register(
            "connections",
            "Connections accepted on intercepted VIP listeners",
            intercepted.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            open_streams,
            upstream_healthy,
            intercepted,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
