//! The node's live pod state, shared with its pool: while the cloud is unreachable every
//! hub publishes the pods its node wrote offline (IPs, readiness, deletion: what
//! `live::endpoints` needs) under `/hub/live/<pool>/<node>/<namespace>/<name>`, bound to
//! its membership lease, and reads what the other hubs publish. So every node of a site
//! whose cloud link is down serves slices that follow every pod of the site, not only its
//! own. A hub that dies takes its keys with it when its lease expires; a hub whose node
//! is back in step with the cloud publishes nothing (its entries are replayed and gone).
//!
//! What is shared is derived state, never a cloud object: the coordinator's objects stay
//! the cloud's, and nothing here is served as is.
use std::{collections::HashMap, sync::Arc};

use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};

use super::{
    storage::{Resource, Storage},
    watch::parse_stored,
};
use crate::{
    cache::objects::{Encoding, Item},
    live::{
        endpoints::{Follow, Kind, PodId, PodNow, Pods},
        state::LiveState,
    },
};

pub const LIVE_PREFIX: &str = "/hub/live/";

fn pool_prefix(pool: &str) -> String {
    format!("{LIVE_PREFIX}{pool}/")
}

fn node_prefix(pool: &str, node: &str) -> String {
    format!("{}{node}/", pool_prefix(pool))
}

/// What this hub has published, as of which membership lease.
#[derive(Default)]
pub struct Sharing {
    lease: i64,
    published: HashMap<PodId, Vec<u8>>,
}

/// (namespace, name) of a key below a node's prefix.
fn pod_of(rest: &str) -> Option<PodId> {
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| (ns.to_string(), name.to_string()))
}

impl Sharing {
    /// One round: publishes what changed in this node's pods since the last round (all of
    /// them again under a new lease), then takes what the other hubs publish into `live`.
    pub async fn round(
        &mut self,
        client: &Client,
        pool: &str,
        node: &str,
        lease: i64,
        max_txn_ops: usize,
        live: &Arc<LiveState>,
    ) -> Result<(), String> {
        let reader = live.clone();
        let own = tokio::task::spawn_blocking(move || reader.own_pods())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        self.publish(client, pool, node, lease, max_txn_ops, &own)
            .await?;
        let others = read_others(client, pool, node).await?;
        live.share_others(others);
        Ok(())
    }

    async fn publish(
        &mut self,
        client: &Client,
        pool: &str,
        node: &str,
        lease: i64,
        max_txn_ops: usize,
        own: &Pods,
    ) -> Result<(), String> {
        if lease != self.lease {
            // Keys bound to an expired lease are gone: publish everything again.
            self.published.clear();
            self.lease = lease;
        }
        let prefix = node_prefix(pool, node);
        let now: HashMap<PodId, Vec<u8>> = own
            .iter()
            .filter_map(|(id, pod)| Some((id.clone(), serde_json::to_vec(pod).ok()?)))
            .collect();
        let key = |(ns, name): &PodId| format!("{prefix}{ns}/{name}");
        let mut ops: Vec<TxnOp> = now
            .iter()
            .filter(|(id, v)| self.published.get(*id) != Some(*v))
            .map(|(id, v)| {
                TxnOp::put(
                    key(id),
                    v.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        ops.extend(
            self.published
                .keys()
                .filter(|id| !now.contains_key(*id))
                .map(|id| TxnOp::delete(key(id), None)),
        );
        if ops.is_empty() {
            return Ok(());
        }
        let mut kv = client.kv_client();
        for chunk in ops.chunks(max_txn_ops.max(1)) {
            kv.txn(Txn::new().and_then(chunk.to_vec()))
                .await
                .map_err(|e| format!("sharing live pod state: {e}"))?;
        }
        self.published = now;
        Ok(())
    }
}

/// `items` (EndpointSlices or Endpoints of `namespace`, None: all, as the coordinator holds
/// them) as their controllers would write them from the pods as the node knows them now,
/// in place; returns the lowest resourceVersion served adjusted. Services'
/// `publishNotReadyAddresses` come from the coordinator.
pub async fn follow(
    live: &Arc<LiveState>,
    storage: &Storage,
    kind: Kind,
    namespace: Option<&str>,
    items: &mut [Item],
) -> Option<u64> {
    if items.is_empty() {
        return None;
    }
    let (reader, ns) = (live.clone(), namespace.map(str::to_string));
    let pods = tokio::task::spawn_blocking(move || reader.pods(ns.as_deref()))
        .await
        .ok()?
        .ok()?;
    if pods.is_empty() {
        return None;
    }
    let publish = publishing(storage, &pods).await;
    let mut follow = Follow::new(kind, &pods, |ns, service| {
        publish.get(&(ns.to_string(), service.to_string())).copied()
    });
    let mut floor: Option<u64> = None;
    for item in items.iter_mut() {
        if let Some(adjusted) = follow.adjusted_item(item) {
            floor = Some(floor.map_or(adjusted.rv, |f| f.min(adjusted.rv)));
            *item = adjusted;
        }
    }
    floor
}

/// `publishNotReadyAddresses` of the services in the pods' namespaces, as the coordinator
/// holds them (a namespace it cannot read is left out: the slices say it).
async fn publishing(storage: &Storage, pods: &Pods) -> HashMap<(String, String), bool> {
    let services = Resource {
        group: String::new(),
        resource: "services".into(),
    };
    let mut out = HashMap::new();
    for ns in pods.namespaces() {
        let Ok(held) = storage.list(&services, Some(ns)).await else {
            continue;
        };
        for (_, value) in held {
            let Some(json) = parse_stored("services", &value)
                .and_then(|i| Some(i.in_encoding(Encoding::Json)?.into_owned()))
            else {
                continue;
            };
            if let Ok(svc) = serde_json::from_slice::<serde_json::Value>(&json.body) {
                let publishes = svc["spec"]["publishNotReadyAddresses"] == true;
                out.insert((json.namespace.clone(), json.name.clone()), publishes);
            }
        }
    }
    out
}

/// The pods the other hubs of the pool publish. A pod published by two (it moved between
/// nodes) is taken from the hub that names it as its node, else from either.
async fn read_others(client: &Client, pool: &str, me: &str) -> Result<Pods, String> {
    let prefix = pool_prefix(pool);
    let got = client
        .kv_client()
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("reading the pool's live pod state: {e}"))?;
    let mut pods: HashMap<PodId, (PodNow, bool)> = HashMap::new();
    for kv in got.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        let Some((node, rest)) = key.strip_prefix(&prefix).and_then(|r| r.split_once('/')) else {
            continue;
        };
        if node == me {
            continue;
        }
        let (Some(id), Ok(pod)) = (pod_of(rest), serde_json::from_slice::<PodNow>(kv.value()))
        else {
            continue;
        };
        let on_its_node = pod.node_name() == Some(node);
        if pods.get(&id).is_none_or(|(_, mine)| on_its_node && !mine) {
            pods.insert(id, (pod, on_its_node));
        }
    }
    Ok(pods.into_iter().map(|(id, (pod, _))| (id, pod)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_pod() {
        assert_eq!(
            pod_of("shop/web-1"),
            Some(("shop".to_string(), "web-1".to_string()))
        );
        assert_eq!(pod_of("shop/"), None);
        assert_eq!(pod_of("shop/a/b"), None);
        assert_eq!(node_prefix("p", "n"), "/hub/live/p/n/");
    }
}
