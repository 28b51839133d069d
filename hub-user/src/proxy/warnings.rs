//! The hub's own `Warning` headers (an answer from the cache or the coordinator, a write
//! queued on the node, a token re-issued from the cache) inform once: client-go logs every
//! Warning header it receives, and one per offline answer filled a kubelet's log with 737
//! lines in 55 s. Each kind of message reaches a client — its credential and component —
//! at most once a minute; the rest are dropped from the answer and counted in
//! `hub_proxy_warnings_suppressed_total`.
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use hyper::{HeaderMap, header::HeaderValue};
use prometheus_client::{
    encoding::EncodeLabelSet, metrics::counter::Counter, metrics::family::Family,
};

/// How often one client hears the same kind of message.
pub const EVERY: Duration = Duration::from_secs(60);
/// Clients remembered at most; past it, those not warned within `EVERY` are forgotten.
const REMEMBERED: usize = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// The kind of one of the hub's own messages, from its text; None for a Warning the hub
/// did not write (the cloud's pass unchanged).
fn kind_of(value: &[u8]) -> Option<&'static str> {
    let text = std::str::from_utf8(value).ok()?;
    let message = text.strip_prefix("299 - \"hub: ")?;
    Some(
        if message.starts_with("served from the node's local cache") {
            "local-cache"
        } else if message.starts_with("served from the pool coordinator") {
            "coordinator"
        } else if message.contains("queued behind them") {
            "behind-replay"
        } else if message.contains("this write is queued") {
            "queued-write"
        } else if message.contains("token the cloud issued") {
            "token"
        } else {
            "other"
        },
    )
}

#[derive(Default)]
pub struct Warnings {
    /// (credential, component, kind) → when that client last heard that kind.
    last: Mutex<HashMap<(String, String, &'static str), Instant>>,
    pub suppressed: Family<KindLabel, Counter>,
}

impl Warnings {
    /// Drops from `headers` the hub's own warnings this client heard within the last
    /// minute, counting them.
    pub fn limit(
        &self,
        headers: &mut HeaderMap,
        credential: impl FnOnce() -> String,
        component: &str,
    ) {
        let ours: Vec<(&'static str, HeaderValue)> = headers
            .get_all("warning")
            .iter()
            .filter_map(|v| kind_of(v.as_bytes()).map(|k| (k, v.clone())))
            .collect();
        if ours.is_empty() {
            return;
        }
        let credential = credential();
        let now = Instant::now();
        let mut kept: Vec<HeaderValue> = headers
            .get_all("warning")
            .iter()
            .filter(|v| kind_of(v.as_bytes()).is_none())
            .cloned()
            .collect();
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.len() >= REMEMBERED {
                last.retain(|_, at| now.duration_since(*at) < EVERY);
                if last.len() >= REMEMBERED {
                    last.clear();
                }
            }
            for (kind, value) in ours {
                let key = (credential.clone(), component.to_string(), kind);
                match last.get(&key) {
                    Some(at) if now.duration_since(*at) < EVERY => {
                        self.suppressed.get_or_create(&KindLabel { kind }).inc();
                    }
                    _ => {
                        last.insert(key, now);
                        kept.push(value);
                    }
                }
            }
        }
        headers.remove("warning");
        for v in kept {
            headers.append("warning", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(warnings: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for w in warnings {
            h.append("warning", HeaderValue::from_str(w).unwrap());
        }
        h
    }

    fn left(h: &HeaderMap) -> Vec<String> {
        h.get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    }

    const CACHE: &str =
        "299 - \"hub: served from the node's local cache; the cloud is unreachable\"";
    const QUEUED: &str = "299 - \"hub: the cloud is unreachable; this write is queued on the node and will be replayed to the cloud when it is back\"";
    const CLOUD: &str = "299 - \"spec.foo is deprecated\"";

    #[test]
    fn every_message_of_the_hub_has_its_kind() {
        use crate::cache::serve::{FROM_COORDINATOR, FROM_LOCAL_CACHE};
        assert_eq!(kind_of(FROM_LOCAL_CACHE.as_bytes()), Some("local-cache"));
        assert_eq!(kind_of(FROM_COORDINATOR.as_bytes()), Some("coordinator"));
        assert_eq!(kind_of(QUEUED.as_bytes()), Some("queued-write"));
        let behind = "299 - \"hub: earlier writes of this node are being replayed to the cloud; this write is queued behind them\"";
        assert_eq!(kind_of(behind.as_bytes()), Some("behind-replay"));
        assert_eq!(kind_of(CLOUD.as_bytes()), None);
    }

    #[test]
    fn each_kind_reaches_a_client_once_a_minute_and_others_are_untouched() {
        let w = Warnings::default();
        let node = || "node".to_string();
        let mut first = answer(&[CACHE, CLOUD]);
        w.limit(&mut first, node, "kubelet");
        assert_eq!(left(&first), [CLOUD, CACHE]);
        let mut again = answer(&[CACHE, CLOUD]);
        w.limit(&mut again, node, "kubelet");
        assert_eq!(
            left(&again),
            [CLOUD],
            "the cloud's own warning always passes"
        );
        let mut other_kind = answer(&[QUEUED]);
        w.limit(&mut other_kind, node, "kubelet");
        assert_eq!(left(&other_kind), [QUEUED]);
        let mut other_client = answer(&[CACHE]);
        w.limit(&mut other_client, node, "kube-proxy");
        assert_eq!(left(&other_client), [CACHE]);
        let suppressed = w
            .suppressed
            .get_or_create(&KindLabel {
                kind: "local-cache",
            })
            .get();
        assert_eq!(suppressed, 1);
    }
}
