//! One leader per pool (issue 8 §4), on the coordinator: the leader holds
//! `/hub/leader/<pool>`, written in a Txn only when absent and bound to its lease. A hub
//! competes only while it is eligible (the cloud and the coordinator both healthy); when
//! it stops being eligible it deletes the key if it is still its own and revokes its lease,
//! and when its keep-alive fails it stops calling itself leader at once. A leader that
//! dies without resigning is replaced when its lease expires, within the TTL.
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use etcd_client::{
    Client, Compare, CompareOp, EventType, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn,
    TxnOp, TxnOpResponse, WatchStream,
};
use tokio::sync::watch;

pub const LEADER_PREFIX: &str = "/hub/leader/";

pub struct Election {
    client: Client,
    key: String,
    me: String,
    ttl: Duration,
    leader: AtomicBool,
    /// Who holds the key, as last seen ("" = nobody).
    holder: Mutex<String>,
}

/// An etcd lease kept alive by its holder (the leader's, a hub's membership).
pub(super) struct Lease {
    pub id: i64,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl Lease {
    pub async fn grant(client: &Client, ttl: Duration) -> Result<Lease, etcd_client::Error> {
        let mut leases = client.lease_client();
        let id = leases.grant(ttl.as_secs() as i64, None).await?.id();
        let (keeper, stream) = leases.keep_alive(id).await?;
        Ok(Lease { id, keeper, stream })
    }

    /// Renews the lease; false when it is gone (expired, or etcd unreachable).
    pub async fn renew(&mut self) -> bool {
        if self.keeper.keep_alive().await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.stream.message()).await,
            Ok(Ok(Some(r))) if r.ttl() > 0
        )
    }
}

impl Election {
    pub fn new(client: Client, pool: &str, me: &str, ttl: Duration) -> Election {
        Election {
            client,
            key: format!("{LEADER_PREFIX}{pool}"),
            me: me.into(),
            ttl: ttl.max(Duration::from_secs(2)),
            leader: AtomicBool::new(false),
            holder: Mutex::new(String::new()),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// The pool's leader (its node name) as last seen ("" when none).
    pub fn holder(&self) -> String {
        let h = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        h.split('#').next().unwrap_or_default().to_string()
    }

    fn set(&self, leader: bool, holder: &str) {
        if self.leader.swap(leader, Ordering::SeqCst) != leader {
            tracing::info!(pool_key = self.key, leader, "pool leadership changed");
        }
        *self.holder.lock().unwrap_or_else(|p| p.into_inner()) = holder.into();
    }

    /// The key's value while this hub leads: its name and its lease, so that two hubs
    /// that share a node name by mistake still never both think they lead.
    fn value(&self, lease: i64) -> String {
        format!("{}#{lease:x}", self.me)
    }

    /// Takes the key if nobody holds it; returns the value it holds now.
    async fn claim(&self, lease: i64) -> Result<String, etcd_client::Error> {
        let mine = self.value(lease);
        let txn = Txn::new()
            .when([Compare::version(self.key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                self.key.as_str(),
                mine.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.as_str(), None)]);
        let resp = self.client.kv_client().txn(txn).await?;
        if resp.succeeded() {
            return Ok(mine);
        }
        Ok(match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .unwrap_or_default(),
            _ => String::new(),
        })
    }

    /// Gives leadership up: the key goes if it is still ours, and the lease with it.
    async fn resign(&self, lease: Option<Lease>) {
        self.set(false, "");
        let txn = Txn::new()
            .when([Compare::value(
                self.key.as_str(),
                CompareOp::Equal,
                self.me.as_str(),
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let _ = self.client.kv_client().txn(txn).await;
        if let Some(l) = lease {
            let _ = self.client.lease_client().revoke(l.id).await;
        }
    }

    /// Returns when the leader key is deleted (or the watch on it fails: then after a
    /// short pause, so a broken etcd does not spin this loop).
    async fn vacated(&self, key_watch: &mut Option<WatchStream>) {
        if key_watch.is_none() {
            *key_watch = self
                .client
                .watch_client()
                .watch(self.key.as_str(), None)
                .await
                .ok();
        }
        let Some(w) = key_watch.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            match w.message().await {
                Ok(Some(r)) if r.canceled() => break,
                Ok(Some(r)) => {
                    if r.events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return;
                    }
                }
                _ => break,
            }
        }
        *key_watch = None;
        std::future::pending().await
    }

    /// Competes while `eligible()` says so, until `stop`.
    pub async fn run(
        self: Arc<Self>,
        eligible: Arc<dyn Fn() -> bool + Send + Sync>,
        mut stop: watch::Receiver<bool>,
    ) {
        let period = self.ttl / 3;
        let mut lease: Option<Lease> = None;
        let mut key_watch: Option<WatchStream> = None;
        loop {
            if eligible() {
                if let Some(l) = lease.as_mut()
                    && !l.renew().await
                {
                    // Without a live lease this hub cannot know it still leads.
                    lease = None;
                    self.set(false, "");
                }
                if lease.is_none() {
                    lease = Lease::grant(&self.client, self.ttl).await.ok();
                }
                match &lease {
                    Some(l) => match self.claim(l.id).await {
                        Ok(holder) => self.set(holder == self.value(l.id), &holder),
                        Err(_) => self.set(false, ""),
                    },
                    None => self.set(false, ""),
                }
            } else if lease.is_some() || self.is_leader() {
                self.resign(lease.take()).await;
            }
            // A follower also wakes when the leader's key goes (its lease expired or it
            // resigned), so the pool is led again within the TTL, not TTL + a period.
            let vacated = async {
                if self.is_leader() {
                    return std::future::pending().await;
                }
                self.vacated(&mut key_watch).await
            };
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = vacated => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        self.resign(lease.take()).await;
    }
}
