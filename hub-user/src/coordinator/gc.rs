//! Nothing left behind in the coordinator (issue 8 §5). Every hub keeps a lease-bound
//! membership key, `/hub/members/<pool>/<node>`, and with each push of a set (one
//! component's objects of one resource) a record of the keys the set holds,
//! `/hub/sets/<pool>/<node>/<component>/<gvr>`, written in the same Txn as the objects.
//! The pool leader sweeps: keys of objects no record holds are removed (with their
//! resourceVersion companions, so a hub that caches them again can bring them back), and
//! the records of a hub gone for longer than coordinator.nodeGraceSeconds are removed
//! first. The sweep reads everything at one revision and deletes only if no record and
//! none of those objects changed since — so a key a live hub holds, or starts holding
//! meanwhile, is never removed. Pool-scope resources are the leader's own (its complete
//! lists replace them) and are not swept. Objects deleted in the cloud leave earlier: the
//! hubs and the leader delete them as they learn of it; the tombstones those deletions
//! leave (`/hub/rv/…` = `<rv>d<time>`) are swept after coordinator.tombstoneTtlSeconds.
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    keys,
    storage::{META_PREFIX, Storage, StorageError, deleted_at, resource_of, rv_key},
};

pub const MEMBERS_PREFIX: &str = "/hub/members/";
pub const SETS_PREFIX: &str = "/hub/sets/";

pub fn member_key(pool: &str, node: &str) -> String {
    format!("{MEMBERS_PREFIX}{pool}/{node}")
}

/// The record of one pushed set (`gvr` like `/v1/pods` or `apps/v1/deployments`).
pub fn set_key(pool: &str, node: &str, component: &str, gvr: &str) -> String {
    format!(
        "{SETS_PREFIX}{pool}/{node}/{component}/{}",
        gvr.trim_start_matches('/')
    )
}

/// What the last sweeps did (in `hub status` of the leader).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GcStatus {
    pub sweeps: u64,
    /// Objects removed because no live hub held them.
    pub removed: u64,
    /// Hubs whose records were removed after the grace.
    pub nodes_removed: u64,
    /// Sweeps that found the pool changing under them (retried next time).
    pub conflicts: u64,
    /// Deletion records older than the tombstone TTL, removed.
    #[serde(default)]
    pub tombstones_removed: u64,
    pub last_sweep_ms: u64,
}

/// Hubs whose records exist but whose membership is gone, and since when (as seen by the
/// current leader: a new leader starts counting again, which only lengthens the grace).
#[derive(Default)]
struct Absent(HashMap<String, Instant>);

/// How often to sweep and what to keep.
pub struct Schedule {
    pub interval: Duration,
    /// How long a hub may be gone before the keys only it held go.
    pub grace: Duration,
    /// How long a deletion's tombstone is kept.
    pub tombstone_ttl: Duration,
}

/// What the sweep needs of the pool it runs in.
pub trait Sweeps: Send + Sync {
    fn storage(&self) -> Option<Arc<Storage>>;
    fn is_leader(&self) -> bool;
    fn pool_name(&self) -> String;
    fn pool_scope(&self) -> Vec<String>;
    fn count_gc(&self, count: &mut dyn FnMut(&mut GcStatus));
    fn note_leader_error(&self, e: String);
}

/// Sweeps every `interval` while this hub leads the pool, until `stop`.
pub async fn run(pool: Arc<dyn Sweeps>, schedule: Schedule, mut stop: watch::Receiver<bool>) {
    let Schedule {
        interval,
        grace,
        tombstone_ttl,
    } = schedule;
    let mut absent = Absent::default();
    // Tombstones are read in full, so they are looked at less often than objects.
    let tombstones_every = tombstone_ttl.min(Duration::from_secs(600));
    let mut tombstones_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(storage) = pool.storage().filter(|_| pool.is_leader()) else {
            absent.0.clear();
            continue;
        };
        let started = Instant::now();
        match sweep(
            &storage,
            &pool.pool_name(),
            &pool.pool_scope(),
            grace,
            &mut absent,
        )
        .await
        {
            Ok(s) => pool.count_gc(&mut |g| {
                g.sweeps += 1;
                g.removed += s.removed;
                g.nodes_removed += s.nodes_removed;
                g.conflicts += u64::from(s.conflict);
                g.last_sweep_ms = started.elapsed().as_millis() as u64;
            }),
            Err(e) => pool.note_leader_error(format!("sweeping the coordinator: {e}")),
        }
        if tombstones_at.is_none_or(|t| t.elapsed() >= tombstones_every) {
            tombstones_at = Some(Instant::now());
            match drop_old_tombstones(&storage, tombstone_ttl).await {
                Ok(n) => pool.count_gc(&mut |g| g.tombstones_removed += n),
                Err(e) => pool.note_leader_error(format!("sweeping tombstones: {e}")),
            }
        }
    }
}

/// Removes deletion records older than `ttl` (each guarded by its mod revision, so one
/// rewritten meanwhile stays); returns how many went.
async fn drop_old_tombstones(storage: &Storage, ttl: Duration) -> Result<u64, StorageError> {
    let prefix = format!("{META_PREFIX}/");
    let resp = storage
        .send(Txn::new().and_then([TxnOp::get(
            prefix.as_str(),
            Some(GetOptions::new().with_prefix()),
        )]))
        .await?;
    let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
        return Err(StorageError::Shape);
    };
    let before = crate::cache::store::now().saturating_sub(ttl.as_secs());
    let budget = (storage.max_txn_ops() / 2).max(1);
    let old: Vec<(Vec<u8>, i64)> = got
        .kvs()
        .iter()
        .filter(|kv| deleted_at(kv.value()).is_some_and(|at| at < before))
        .take(budget)
        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
        .collect();
    if old.is_empty() {
        return Ok(0);
    }
    let when: Vec<Compare> = old
        .iter()
        .map(|(k, rev)| Compare::mod_revision(k.clone(), CompareOp::Equal, *rev))
        .collect();
    let ops: Vec<TxnOp> = old
        .iter()
        .map(|(k, _)| TxnOp::delete(k.clone(), None))
        .collect();
    let resp = storage.send(Txn::new().when(when).and_then(ops)).await?;
    Ok(if resp.succeeded() {
        old.len() as u64
    } else {
        0
    })
}

#[derive(Debug, Default)]
struct Swept {
    removed: u64,
    nodes_removed: u64,
    conflict: bool,
}

async fn sweep(
    storage: &Storage,
    pool: &str,
    pool_scope: &[String],
    grace: Duration,
    absent: &mut Absent,
) -> Result<Swept, StorageError> {
    let members_prefix = format!("{MEMBERS_PREFIX}{pool}/");
    let sets_prefix = format!("{SETS_PREFIX}{pool}/");
    let objects_prefix = format!("{}/", storage.prefix().trim_end_matches('/'));
    let keys_only = || Some(GetOptions::new().with_prefix().with_keys_only());
    let resp = storage
        .send(Txn::new().and_then([
            TxnOp::get(members_prefix.as_str(), keys_only()),
            TxnOp::get(sets_prefix.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(objects_prefix.as_str(), keys_only()),
        ]))
        .await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (Some(members), Some(sets), Some(objects)) = (gets.next(), gets.next(), gets.next()) else {
        return Err(StorageError::Shape);
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let live: HashSet<String> = members
        .kvs()
        .iter()
        .filter_map(|kv| {
            text(kv.key())
                .strip_prefix(&members_prefix)
                .map(String::from)
        })
        .collect();
    let node_of = |record: &str| {
        record
            .strip_prefix(&sets_prefix)
            .and_then(|r| r.split('/').next())
            .unwrap_or_default()
            .to_string()
    };
    // Hubs gone past the grace: their records go in this sweep's Txn.
    let recorded: HashSet<String> = sets
        .kvs()
        .iter()
        .map(|kv| node_of(&text(kv.key())))
        .collect();
    absent
        .0
        .retain(|n, _| recorded.contains(n) && !live.contains(n));
    let mut departed = Vec::new();
    for node in recorded.iter().filter(|n| !live.contains(*n)) {
        let since = absent.0.entry(node.clone()).or_insert_with(Instant::now);
        if since.elapsed() >= grace {
            departed.push(node.clone());
        }
    }
    let held: HashSet<&str> = sets
        .kvs()
        .iter()
        .filter(|kv| !departed.contains(&node_of(&text(kv.key()))))
        .flat_map(|kv| std::str::from_utf8(kv.value()).unwrap_or_default().lines())
        .collect();
    // The leader's own resources are kept by its lists, not by records.
    let scoped: Vec<String> = pool_scope
        .iter()
        .filter_map(|g| resource_of(g))
        .filter_map(|r| keys::range_prefix(storage.prefix(), &r.group, &r.resource, None).ok())
        .collect();
    let orphans: Vec<(String, i64)> = objects
        .kvs()
        .iter()
        .map(|kv| (text(kv.key()), kv.mod_revision()))
        .filter(|(k, _)| !held.contains(k.as_str()) && !scoped.iter().any(|p| k.starts_with(p)))
        .collect();
    if orphans.is_empty() && departed.is_empty() {
        return Ok(Swept::default());
    }
    // Bounded by the etcd's limits: the rest waits for the next sweep.
    let budget = (storage.max_txn_ops().saturating_sub(2 + departed.len()) / 2).max(1);
    let orphans = &orphans[..orphans.len().min(budget)];
    let mut when = vec![
        // No record was written or changed since the read (none was added either: a new
        // key in the range would have a newer mod revision).
        Compare::mod_revision(sets_prefix.as_str(), CompareOp::Less, revision + 1).with_prefix(),
    ];
    when.extend(
        orphans
            .iter()
            .map(|(k, rev)| Compare::mod_revision(k.as_str(), CompareOp::Equal, *rev)),
    );
    let mut ops: Vec<TxnOp> = orphans
        .iter()
        .flat_map(|(k, _)| {
            [
                TxnOp::delete(k.as_str(), None),
                TxnOp::delete(rv_key(k), None),
            ]
        })
        .collect();
    ops.extend(departed.iter().map(|n| {
        TxnOp::delete(
            format!("{sets_prefix}{n}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
    }));
    let resp = storage.send(Txn::new().when(when).and_then(ops)).await?;
    if !resp.succeeded() {
        return Ok(Swept {
            conflict: true,
            ..Default::default()
        });
    }
    for n in &departed {
        absent.0.remove(n);
        tracing::info!(
            node = n,
            "pool: a hub gone past the grace; its records removed"
        );
    }
    if !orphans.is_empty() {
        tracing::info!(
            removed = orphans.len(),
            "pool: removed objects no live hub holds"
        );
    }
    Ok(Swept {
        removed: orphans.len() as u64,
        nodes_removed: departed.len() as u64,
        conflict: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys() {
        assert_eq!(
            set_key("pool-a", "edge-1", "kubelet", "/v1/pods"),
            "/hub/sets/pool-a/edge-1/kubelet/v1/pods"
        );
        assert_eq!(
            set_key("p", "n", "kubectl@cgroup-7", "apps/v1/deployments"),
            "/hub/sets/p/n/kubectl@cgroup-7/apps/v1/deployments"
        );
        assert_eq!(member_key("p", "n"), "/hub/members/p/n");
    }
}
