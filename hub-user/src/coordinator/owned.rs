//! Which coordinator keys this hub owns, per component: the seed's "local component key
//! cache". It lives on the node, not in etcd, so that every etcd operation stays a single
//! Txn (seed 003). OpenYurt rewrote its file in place, ignored errors and never reconciled a
//! crash between the file and etcd; here it is a redb file, and every change is preceded
//! by a durable *intent* (the keys an operation will put and delete) and followed by one
//! transaction that applies the ownership change and clears the intent. A crash at any
//! point leaves an intent behind, which the next start reconciles against etcd.
use std::{
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

/// `component \0 etcd key` → the resourceVersion last written or seen for it.
const OWNED: TableDefinition<&str, u64> = TableDefinition::new("owned");
/// intent id → JSON `Intent`.
const INTENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("intents");

pub const FILE: &str = "coordinator.redb";

#[derive(Debug, thiserror::Error)]
#[error("coordinator ownership store {path}: {reason}")]
pub struct OwnedError {
    path: PathBuf,
    reason: String,
}

/// What one operation is about to do in etcd.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub component: String,
    /// Keys it writes, with the resourceVersion written.
    pub put: Vec<(String, u64)>,
    /// Keys it deletes, with the resourceVersion the deletion is as fresh as.
    pub delete: Vec<(String, u64)>,
}

pub struct Owned {
    /// None only after an I/O error, until it is opened again.
    db: RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    /// An I/O error (a full disk) was seen: redb refuses everything after one until the
    /// database is opened again, which the next use does.
    reopen: AtomicBool,
}

fn owned_key(component: &str, key: &str) -> String {
    format!("{component}\0{key}")
}

impl Owned {
    /// Opens (or creates) the ownership store under `dir`, owner-only.
    pub fn open(dir: &Path) -> Result<Owned, OwnedError> {
        let path = dir.join(FILE);
        let err = |e: &dyn std::fmt::Display| OwnedError {
            path: path.clone(),
            reason: e.to_string(),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(&e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err(&e))?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| err(&e))?;
        let db = Database::create(&path).map_err(|e| err(&e))?;
        let txn = db.begin_write().map_err(|e| err(&e))?;
        txn.open_table(OWNED).map_err(|e| err(&e))?;
        txn.open_table(INTENTS).map_err(|e| err(&e))?;
        txn.commit().map_err(|e| err(&e))?;
        Ok(Owned {
            db: RwLock::new(Some(Arc::new(db))),
            path,
            reopen: AtomicBool::new(false),
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> OwnedError {
        let reason = e.to_string();
        if reason.contains(crate::cache::store::IO_ERROR_TEXT) {
            self.reopen.store(true, Ordering::SeqCst);
        }
        OwnedError {
            path: self.path.clone(),
            reason,
        }
    }

    /// The database, opened again first if an I/O error asked for it.
    fn db(&self) -> Result<Arc<Database>, OwnedError> {
        if self.reopen.load(Ordering::SeqCst) {
            let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
            // The old handle holds the file's lock: drop it first (an operation still
            // holding it makes this fail; the next use tries again).
            *db = None;
            match Database::create(&self.path) {
                Ok(fresh) => {
                    tracing::info!(path = %self.path.display(), "coordinator ownership store reopened after an I/O error");
                    *db = Some(Arc::new(fresh));
                    self.reopen.store(false, Ordering::SeqCst);
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), "coordinator ownership store: reopening failed: {e}")
                }
            }
        }
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| OwnedError {
                path: self.path.clone(),
                reason: "closed after an I/O error; opening it again failed (tried at each use)"
                    .into(),
            })
    }

    /// The keys `component` owns that start with `prefix` ("" = all), sorted.
    pub fn keys(&self, component: &str, prefix: &str) -> Result<Vec<(String, u64)>, OwnedError> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(OWNED).map_err(|e| self.err(e))?;
        let start = owned_key(component, prefix);
        let mut out = Vec::new();
        for entry in table.range(start.as_str()..).map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let Some(key) = k.value().strip_prefix(&start) else {
                break;
            };
            out.push((format!("{prefix}{key}"), v.value()));
        }
        Ok(out)
    }

    /// Every component that owns something.
    pub fn components(&self) -> Result<Vec<String>, OwnedError> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(OWNED).map_err(|e| self.err(e))?;
        let mut out: Vec<String> = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (k, _) = entry.map_err(|e| self.err(e))?;
            let c = k.value().split('\0').next().unwrap_or_default().to_string();
            if out.last() != Some(&c) {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// Records what an operation is about to do, durably, before it touches etcd.
    pub fn begin(&self, intent: &Intent) -> Result<u64, OwnedError> {
        let db = self.db()?;
        let txn = db.begin_write().map_err(|e| self.err(e))?;
        let id = {
            let mut t = txn.open_table(INTENTS).map_err(|e| self.err(e))?;
            let id = t
                .last()
                .map_err(|e| self.err(e))?
                .map_or(1, |(k, _)| k.value() + 1);
            let raw = serde_json::to_vec(intent).map_err(|e| self.err(e))?;
            t.insert(id, raw.as_slice()).map_err(|e| self.err(e))?;
            id
        };
        txn.commit().map_err(|e| self.err(e))?;
        Ok(id)
    }

    /// Applies an operation's outcome to ownership and clears its intent, in one
    /// transaction: the component owns `owned` from now on and no longer owns `released`.
    /// It is not synced to disk on its own (the next `begin` syncs it): lost in a crash,
    /// it leaves the intent in place, which the next start reconciles — the same outcome.
    pub fn finish(
        &self,
        id: u64,
        component: &str,
        owned: &[(String, u64)],
        released: &[String],
    ) -> Result<(), OwnedError> {
        let db = self.db()?;
        let mut txn = db.begin_write().map_err(|e| self.err(e))?;
        txn.set_durability(redb::Durability::None)
            .map_err(|e| self.err(e))?;
        {
            let mut t = txn.open_table(OWNED).map_err(|e| self.err(e))?;
            for (key, rv) in owned {
                t.insert(owned_key(component, key).as_str(), *rv)
                    .map_err(|e| self.err(e))?;
            }
            for key in released {
                t.remove(owned_key(component, key).as_str())
                    .map_err(|e| self.err(e))?;
            }
            txn.open_table(INTENTS)
                .map_err(|e| self.err(e))?
                .remove(id)
                .map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Intents left by operations that did not finish (a crash), oldest first.
    pub fn pending(&self) -> Result<Vec<(u64, Intent)>, OwnedError> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(INTENTS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let intent = serde_json::from_slice(v.value()).map_err(|e| self.err(e))?;
            out.push((k.value(), intent));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_survive_until_finished_and_ownership_is_per_component() {
        let dir = crate::files::fresh_test_dir("owned");
        let o = Owned::open(&dir).unwrap();
        let intent = Intent {
            component: "kubelet".into(),
            put: vec![("/registry/pods/ns1/a".into(), 5)],
            delete: vec![],
        };
        let id = o.begin(&intent).unwrap();
        drop(o);
        let o = Owned::open(&dir).unwrap();
        assert_eq!(o.pending().unwrap(), vec![(id, intent)]);
        o.finish(
            id,
            "kubelet",
            &[
                ("/registry/pods/ns1/a".into(), 5),
                ("/registry/pods/ns10/b".into(), 6),
            ],
            &[],
        )
        .unwrap();
        o.finish(
            0,
            "kube-proxy",
            &[("/registry/services/specs/d/s".into(), 7)],
            &[],
        )
        .unwrap();
        assert!(o.pending().unwrap().is_empty());
        assert_eq!(
            o.keys("kubelet", "/registry/pods/ns1/").unwrap(),
            vec![("/registry/pods/ns1/a".to_string(), 5)]
        );
        assert_eq!(o.keys("kubelet", "").unwrap().len(), 2);
        assert_eq!(o.components().unwrap(), vec!["kube-proxy", "kubelet"]);
        o.finish(0, "kubelet", &[], &["/registry/pods/ns1/a".into()])
            .unwrap();
        assert_eq!(o.keys("kubelet", "").unwrap().len(), 1);
        let mode = std::fs::metadata(dir.join(FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
