//! The pool leader's duty (design.md §7): list and watch each pool-scope resource
//! (coordinator.poolScopeResources) from the cloud once for the whole pool and keep the
//! coordinator holding exactly what the cloud has, so followers read these resources from
//! the coordinator instead of each watching the cloud over the edge link.
//!
//! A complete list replaces the resource in the coordinator in one Txn, whoever wrote its
//! keys (what the cloud no longer has goes, unless written fresher since), together with
//! the marker `/hub/synced/<gvr>` = the list's resourceVersion: followers serve the
//! resource from the coordinator only once a leader has synced it. Watch events then apply
//! one Txn each, freshness-guarded; bookmarks advance the marker. A hub that loses the
//! leadership stops at once; the next leader lists again, so nothing from the gap is lost.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::BodyExt;
use tokio::sync::watch;

use super::{
    cloud_get::{MAX_ANSWER, WATCH_SECONDS, get_as_node, list_as_node},
    storage::{Object, Resource, Storage, StorageError, resource_of, split_gvr},
};
use crate::{
    body::ProxyBody,
    cache::objects::{self, Encoding, EventType, Item},
    upstream::cloud::Cloud,
};

pub const SYNCED_PREFIX: &str = "/hub/synced/";
/// The ownership name of what the leader writes.
pub const COMPONENT: &str = "pool";
const USER_AGENT: &str = "hub/pool-leader";
/// How often a leader that lost nothing checks it is still the leader.
const CHECK: Duration = Duration::from_millis(200);
/// The marker is advanced at most this often while events flow.
const MARKER_EVERY: Duration = Duration::from_secs(1);

/// The marker key of a resource (`/v1/services` -> `/hub/synced/v1/services`).
pub fn synced_key(gvr: &str) -> String {
    format!("{SYNCED_PREFIX}{}", gvr.trim_start_matches('/'))
}

/// The API path of a resource across all namespaces.
pub fn api_path(gvr: &str) -> Option<String> {
    let (group, version, resource) = split_gvr(gvr)?;
    Some(if group.is_empty() {
        format!("/api/{version}/{resource}")
    } else {
        format!("/apis/{group}/{version}/{resource}")
    })
}

/// An object as the coordinator keeps it: in kube-apiserver's storage encoding.
fn object(i: &Item) -> Object {
    let (stored, not_converted) = i.clone().for_storage();
    if let Some(e) = not_converted {
        tracing::warn!("{}/{}: stored as JSON: {e}", i.namespace, i.name);
    }
    Object {
        namespace: (!stored.namespace.is_empty()).then(|| stored.namespace.clone()),
        value: stored.encoded(),
        name: stored.name,
        rv: stored.rv,
    }
}

/// What the leader's sync needs of the pool it runs for.
pub trait Leads: Send + Sync {
    fn storage(&self) -> Option<Arc<Storage>>;
    fn is_leader(&self) -> bool;
    /// Which life of the coordinator this is (a rebuilt one is a new life).
    fn life(&self) -> u64;
    fn note_leader_error(&self, e: String);
    fn count(&self, what: Counted);
}

/// What the leader's sync counts.
#[derive(Debug, Clone, Copy)]
pub enum Counted {
    List,
    Event,
    /// An event older than what the coordinator holds.
    Stale,
}

/// Runs the leader's duty for every pool-scope resource while this hub leads, until `stop`.
pub async fn run(
    pool: Arc<dyn Leads>,
    cloud: Arc<Cloud>,
    resources: Vec<String>,
    stop: watch::Receiver<bool>,
) {
    let tasks: Vec<_> = resources
        .into_iter()
        .map(|gvr| {
            tokio::spawn(sync_resource(
                pool.clone(),
                cloud.clone(),
                gvr,
                stop.clone(),
            ))
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

struct Syncer {
    pool: Arc<dyn Leads>,
    cloud: Arc<Cloud>,
    storage: Arc<Storage>,
    gvr: String,
    resource: Resource,
    path: String,
    /// The coordinator's life this sync wrote into: a rebuilt one is listed into afresh.
    life: u64,
}

async fn sync_resource(
    pool: Arc<dyn Leads>,
    cloud: Arc<Cloud>,
    gvr: String,
    mut stop: watch::Receiver<bool>,
) {
    let (Some(resource), Some(path)) = (resource_of(&gvr), api_path(&gvr)) else {
        tracing::warn!(gvr, "pool-scope resource not understood; not synced");
        return;
    };
    loop {
        // Wait to lead.
        let storage = loop {
            if let Some(s) = pool.storage().filter(|_| pool.is_leader()) {
                break s;
            }
            tokio::select! {
                _ = tokio::time::sleep(CHECK) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        };
        let s = Syncer {
            pool: pool.clone(),
            cloud: cloud.clone(),
            storage,
            gvr: gvr.clone(),
            resource: resource.clone(),
            path: path.clone(),
            life: pool.life(),
        };
        let result = match s.list().await {
            Ok(rv) => tokio::select! {
                r = s.watch(rv) => r,
                _ = stop.wait_for(|s| *s) => return,
            },
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            pool.note_leader_error(format!("syncing {gvr}: {e}"));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

impl Syncer {
    async fn get(&self, path_and_query: &str) -> Result<hyper::Response<ProxyBody>, String> {
        get_as_node(&self.cloud, path_and_query, USER_AGENT)
            .await
            .map_err(|e| e.message)
    }

    /// Lists the resource from the cloud (all pages) and makes the coordinator hold it;
    /// returns the list's resourceVersion.
    async fn list(&self) -> Result<u64, String> {
        let started = Instant::now();
        let listed = list_as_node(
            &self.cloud,
            &self.path,
            &self.resource.resource,
            USER_AGENT,
            "application/json",
        )
        .await
        .map_err(|e| e.message)?;
        let (items, rv) = (listed.items, listed.rv);
        if !self.pool.is_leader() {
            return Err("no longer the leader".into());
        }
        let objects: Vec<Object> = items.iter().map(object).collect();
        let done = self
            .storage
            .replace_resource(
                COMPONENT,
                &self.resource,
                rv,
                &objects,
                (&synced_key(&self.gvr), &rv.to_string()),
            )
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(
            gvr = self.gvr,
            rv,
            objects = objects.len(),
            written = done.written,
            deleted = done.deleted,
            ms = started.elapsed().as_millis() as u64,
            "pool leader: listed from the cloud into the coordinator"
        );
        self.pool.count(Counted::List);
        Ok(rv)
    }

    /// Applies the cloud's watch from `rv` until it ends, fails, or this hub stops leading.
    async fn watch(&self, mut rv: u64) -> Result<(), String> {
        let mut marker_at = (Instant::now(), rv);
        loop {
            let q = format!(
                "{}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}",
                self.path
            );
            let mut body = self.get(&q).await?.into_body();
            let mut buf: Vec<u8> = Vec::new();
            loop {
                let frame = tokio::select! {
                    f = body.frame() => f,
                    _ = tokio::time::sleep(CHECK) => {
                        if !self.still_current() {
                            return Ok(());
                        }
                        continue;
                    }
                };
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|e| format!("watch: {e}"))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buf.extend_from_slice(&data);
                if buf.len() > MAX_ANSWER {
                    return Err("a watch event over the size limit".into());
                }
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    match self.apply(&line).await? {
                        Applied::At(v) => rv = rv.max(v),
                        Applied::Relist => return Ok(()),
                    }
                }
                if !self.still_current() {
                    return Ok(());
                }
                if rv != marker_at.1 && marker_at.0.elapsed() >= MARKER_EVERY {
                    self.storage
                        .put_meta(&synced_key(&self.gvr), &rv.to_string())
                        .await
                        .map_err(|e| e.to_string())?;
                    marker_at = (Instant::now(), rv);
                }
            }
            // The cloud ended the watch (timeoutSeconds): watch again from where it was.
        }
    }

    /// Still the leader, writing into the same coordinator.
    fn still_current(&self) -> bool {
        self.pool.is_leader() && self.pool.life() == self.life
    }

    async fn apply(&self, line: &[u8]) -> Result<Applied, String> {
        let (ty, item) = objects::parse_event(&self.resource.resource, Encoding::Json, line)
            .map_err(|e| e.to_string())?;
        let storage_err = |e: StorageError| e.to_string();
        match (ty, item) {
            (EventType::Added | EventType::Modified, Some(i)) => {
                match self
                    .storage
                    .update(COMPONENT, &self.resource, &object(&i))
                    .await
                {
                    Ok(_) => {}
                    Err(StorageError::Conflict { .. }) => self.pool.count(Counted::Stale),
                    Err(e) => return Err(storage_err(e)),
                }
                self.pool.count(Counted::Event);
                Ok(Applied::At(i.rv))
            }
            (EventType::Deleted, Some(i)) => {
                let ns = (!i.namespace.is_empty()).then_some(i.namespace.as_str());
                self.storage
                    .delete(COMPONENT, &self.resource, ns, &i.name, i.rv)
                    .await
                    .map_err(storage_err)?;
                self.pool.count(Counted::Event);
                Ok(Applied::At(i.rv))
            }
            (EventType::Bookmark, _) => Ok(Applied::At(bookmark_rv(line))),
            // ERROR (410 Gone: the cloud compacted past us) or unknown: list again.
            _ => Ok(Applied::Relist),
        }
    }
}

enum Applied {
    At(u64),
    Relist,
}

fn bookmark_rv(line: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|v| {
            v["object"]["metadata"]["resourceVersion"]
                .as_str()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_markers() {
        assert_eq!(
            api_path("/v1/services").as_deref(),
            Some("/api/v1/services")
        );
        assert_eq!(
            api_path("discovery.k8s.io/v1/endpointslices").as_deref(),
            Some("/apis/discovery.k8s.io/v1/endpointslices")
        );
        assert_eq!(synced_key("/v1/services"), "/hub/synced/v1/services");
        assert_eq!(
            bookmark_rv(br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"42"}}}"#),
            42
        );
    }
}
