//! The node's live state while the cloud is unreachable: what the node writes offline —
//! its pods' status, its node's status, its lease — is applied to the objects its clients
//! are served, in every encoding, and folded into one write per object for the cloud.
//!
//! * `patch`, `smp`: the PATCH bodies kube-apiserver takes, applied as it applies them
//!   (merge keys and strategies from the schema of Kubernetes' Go types), and the two-way
//!   strategic merge patch that carries an object's net change back.
//! * One [`Entry`] per object the node wrote offline, kept in the cache's store beside the
//!   write queue: the cloud's object the writes started from (`base`) and the object with
//!   every write applied (`state`). The cache serves `state` in place of the cloud's copy
//!   (GET, LIST, watch and watch-list; open watches get a MODIFIED event) without ever
//!   storing it over that copy: the cache keeps the cloud's objects.
//! * `endpoints`: the EndpointSlices and Endpoints clients are served follow the pods as
//!   the node knows them now, as the cloud's controllers would write them.
//! * The entry rides on one outbox row: when the cloud is back, one write per object
//!   carries everything the node wrote (`Entry::net_write`), so the cloud never passes
//!   through a stale state and gets at most one write per object.
//!
//! **Resource versions.** A client keeps the resourceVersion of the last thing it was
//! served and, once the cloud is back, resumes its watch there at the cloud. So what the
//! node made up must never carry a resourceVersion the cloud could take as "you have
//! everything up to here": an object served from an entry carries one *below* the cloud's
//! version it was made from (`base_rv - writes`, distinct for each write so clients that
//! skip an update with an unchanged resourceVersion still see it), and a watch that served
//! one bookmarks no further than that. Resuming from there, the cloud sends the object
//! again (or answers 410 and the client lists): every client converges on the cloud's
//! objects and keeps nothing the hub made (docs/offline.md).
pub mod endpoints;
pub mod patch;
pub mod smp;
pub mod state;

use hyper::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    cache::objects::{self, Encoding, Item},
    convert,
    proxy::request::RequestInfo,
};

/// A patch that cannot be applied: what kube-apiserver would refuse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct PatchError(pub String);

/// Why a write is not taken offline (answered with this Status, never queued).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed, or a patch that does not apply: 400 BadRequest (kube-apiserver answers
    /// 422 or 400 for these).
    BadRequest(String),
    /// The write changes what kube-apiserver keeps (`metadata.uid`: it names another
    /// object): 422 Invalid, as kube-apiserver answers it.
    Immutable {
        kind: String,
        field: &'static str,
        value: String,
    },
}

/// How an entry's net change goes back to the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayAs {
    /// A two-way strategic merge patch from `base` to `state` (pod and node status).
    Patch,
    /// The whole `state` (a lease renewal: the newest carries everything).
    Put,
    /// The whole `state`, created: an event the node recorded offline, with every later
    /// change of its recorder (count, lastTimestamp) folded in.
    Create,
}

/// One write of the node, as its request carried it.
pub enum Write<'a> {
    Patch(patch::PatchType, &'a Value),
    Whole(Value),
}

/// An object the node wrote while offline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// `group/version/resource`, as `RequestInfo::gvr` writes it.
    pub gvr: String,
    pub namespace: String,
    pub name: String,
    /// Where its net write goes: the object's path, `/status` included for a status write.
    pub path: String,
    /// The component whose write it was (the replay speaks as it).
    pub component: String,
    pub replay: ReplayAs,
    /// The cloud's object the writes apply to, and its resourceVersion.
    pub base: Value,
    pub base_rv: u64,
    /// `base` with every write applied.
    pub state: Value,
    /// Writes folded in; also the entry's version.
    pub writes: u64,
    /// The encoding the node's own copy is held in (the replay's answer is asked in it).
    pub encoding: Encoding,
}

/// The store key of an object's entry.
pub fn key(gvr: &str, namespace: &str, name: &str) -> Vec<u8> {
    [gvr, namespace, name].join("\0").into_bytes()
}

/// The prefix of every entry of `gvr` in `namespace` (None: all namespaces).
pub fn scope_prefix(gvr: &str, namespace: Option<&str>) -> Vec<u8> {
    match namespace {
        Some(ns) => format!("{gvr}\0{ns}\0").into_bytes(),
        None => format!("{gvr}\0").into_bytes(),
    }
}

/// The resourceVersion of what the node made from the cloud's object at `rv` after `writes`
/// writes: below it, one lower a write (never 0, which means "any" to a client).
pub fn below(rv: u64, writes: u64) -> u64 {
    rv.saturating_sub(writes).max(1)
}

/// The writes whose object the node keeps live offline, and how each goes back.
pub fn replay_as(info: &RequestInfo) -> Option<ReplayAs> {
    let named = !info.name.is_empty();
    match (
        info.group.as_str(),
        info.resource.as_str(),
        info.subresource.as_str(),
        info.verb,
    ) {
        ("", "pods" | "nodes", "status", "patch" | "update") if named => Some(ReplayAs::Patch),
        ("coordination.k8s.io", "leases", "", "update") if named => Some(ReplayAs::Put),
        // Events, as the kubelet's recorder writes them: created, then patched (count,
        // lastTimestamp) while they repeat.
        ("" | "events.k8s.io", "events", "", "create") if !named => Some(ReplayAs::Create),
        ("" | "events.k8s.io", "events", "", "patch") if named => Some(ReplayAs::Patch),
        _ => None,
    }
}

/// Whether `gvr` is events (core or events.k8s.io).
pub fn is_events(gvr: &str) -> bool {
    matches!(gvr, "/v1/events" | "events.k8s.io/v1/events")
}

/// When an event was last seen (Unix seconds): the newest of the times its recorder
/// writes (either API's), None if it says none.
pub fn event_last_seen(event: &Value) -> Option<u64> {
    [
        &event["lastTimestamp"],
        &event["series"]["lastObservedTime"],
        &event["deprecatedLastTimestamp"],
        &event["eventTime"],
        &event["firstTimestamp"],
        &event["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .filter_map(|t| crate::x509::rfc3339_to_unix(t.as_str()?))
    .max()
}

/// An event known only by its name (one recorded before the hub saw it, patched offline
/// as it repeats): what its patches apply to.
pub fn bare_event(info: &RequestInfo) -> Value {
    serde_json::json!({
        "kind": "Event",
        "apiVersion": crate::cache::serve::api_version(info),
        "metadata": {"name": info.name, "namespace": info.namespace},
    })
}

fn schema_of(obj: &Value) -> smp::At {
    let text = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or_default();
    convert::kind_index(text("apiVersion"), text("kind"))
}

fn uid(obj: &Value) -> Option<&str> {
    obj.get("metadata")?
        .get("uid")?
        .as_str()
        .filter(|u| !u.is_empty())
}

/// `write` applied to `target`, as kube-apiserver applies it to a status subresource (only
/// `status` changes) or to the whole object. Refused when it does not apply or names
/// another object.
pub fn apply_write(target: &Value, write: &Write, status_only: bool) -> Result<Value, Refusal> {
    let mut next = target.clone();
    let precondition = match write {
        Write::Patch(kind, body) => {
            patch::apply(&mut next, body, *kind, schema_of(target))
                .map_err(|e| Refusal::BadRequest(format!("the patch does not apply: {e}")))?;
            match kind {
                patch::PatchType::Json => None,
                _ => uid(body).map(str::to_string),
            }
        }
        Write::Whole(body) => {
            if !body.is_object() {
                return Err(Refusal::BadRequest("the body is not a JSON object".into()));
            }
            next = body.clone();
            uid(body).map(str::to_string)
        }
    };
    if let (Some(wanted), Some(held)) = (precondition.as_deref(), uid(target))
        && wanted != held
    {
        return Err(Refusal::Immutable {
            kind: target["kind"].as_str().unwrap_or_default().to_string(),
            field: "metadata.uid",
            value: wanted.to_string(),
        });
    }
    if status_only {
        let mut kept = target.clone();
        kept["status"] = next.get("status").cloned().unwrap_or(Value::Null);
        if kept["status"].is_null() {
            kept.as_object_mut().map(|o| o.remove("status"));
        }
        return Ok(kept);
    }
    // What identifies the object is the cloud's, whatever the body said.
    for k in ["apiVersion", "kind"] {
        if let Some(v) = target.get(k) {
            next[k] = v.clone();
        }
    }
    Ok(next)
}

impl Entry {
    pub fn decode(b: &[u8]) -> Option<Entry> {
        serde_json::from_slice(b).ok()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn key(&self) -> Vec<u8> {
        key(&self.gvr, &self.namespace, &self.name)
    }

    fn status_only(&self) -> bool {
        self.path.ends_with("/status")
    }

    /// The resourceVersion its clients are served it with: below the cloud's version it
    /// came from, one lower for each write (see the module's doc) — except for an object
    /// written whole (a lease), whose writer sends the version back as its optimistic
    /// lock: it gets the cloud's own, which its first write after the return must carry.
    pub fn served_rv(&self) -> u64 {
        match self.replay {
            ReplayAs::Put => self.base_rv,
            ReplayAs::Patch | ReplayAs::Create => below(self.base_rv, self.writes),
        }
    }

    /// The object as the node's clients are served it (JSON).
    pub fn served(&self) -> Option<Item> {
        let mut v = self.state.clone();
        v.get_mut("metadata")?.as_object_mut()?.insert(
            "resourceVersion".into(),
            self.served_rv().to_string().into(),
        );
        let resource = self.gvr.rsplit('/').next().unwrap_or_default();
        objects::from_json(resource, v, "", "").ok()
    }

    /// The entry once the write it had queued was sent (as `sent`) while more came in:
    /// what is left goes as a patch of what was sent, to the object itself.
    pub fn after_sent(self, sent: Entry) -> Entry {
        let (replay, path) = match sent.replay {
            ReplayAs::Create => (
                ReplayAs::Patch,
                format!("{}/{}", sent.path.trim_end_matches('/'), sent.name),
            ),
            other => (other, self.path),
        };
        Entry {
            writes: self.writes - sent.writes,
            base: sent.state,
            replay,
            path,
            ..self
        }
    }

    /// An event whose last sighting is more than `ttl` seconds before `now`: the cloud
    /// would have let it expire already.
    pub fn expired_event(&self, now: u64, ttl: u64) -> bool {
        is_events(&self.gvr) && event_last_seen(&self.state).is_some_and(|t| t + ttl < now)
    }

    /// Folds one more write in.
    pub fn fold(&mut self, write: &Write) -> Result<(), Refusal> {
        self.state = apply_write(&self.state, write, self.status_only())?;
        self.writes += 1;
        Ok(())
    }

    /// The cloud's object moved on (`cloud`, at `cloud_rv`) while writes still wait: the
    /// node's net change is carried over onto it.
    pub fn rebase(&mut self, cloud: Value, cloud_rv: u64) {
        let at = schema_of(&cloud);
        let change = smp::two_way(&self.base, &self.state, at);
        let mut state = cloud.clone();
        if smp::apply(&mut state, &change, at).is_ok() {
            self.state = state;
        }
        self.base = cloud;
        self.base_rv = cloud_rv;
    }

    /// The one write that carries everything the node wrote: (method, content type,
    /// body); None when the writes cancel out.
    pub fn net_write(&self) -> Option<(Method, &'static str, Vec<u8>)> {
        match self.replay {
            ReplayAs::Create => {
                let mut body = self.state.clone();
                body.get_mut("metadata")?
                    .as_object_mut()?
                    .remove("resourceVersion");
                Some((
                    Method::POST,
                    "application/json",
                    serde_json::to_vec(&body).ok()?,
                ))
            }
            ReplayAs::Put => {
                let mut body = self.state.clone();
                if let Some(rv) = self
                    .base
                    .get("metadata")
                    .and_then(|m| m.get("resourceVersion"))
                {
                    body["metadata"]["resourceVersion"] = rv.clone();
                }
                Some((
                    Method::PUT,
                    "application/json",
                    serde_json::to_vec(&body).ok()?,
                ))
            }
            ReplayAs::Patch => {
                let at = schema_of(&self.base);
                let mut change = smp::two_way(&self.base, &self.state, at);
                if change.as_object().is_none_or(|c| c.is_empty()) {
                    return None;
                }
                // As the kubelet does: the uid makes the write fail on a recreated object.
                if let Some(u) = uid(&self.base) {
                    change["metadata"]["uid"] = u.into();
                }
                // Without a schema, lists are replaced: a JSON merge patch says just that.
                let content_type = if at.is_some() {
                    "application/strategic-merge-patch+json"
                } else {
                    "application/merge-patch+json"
                };
                Some((
                    Method::PATCH,
                    content_type,
                    serde_json::to_vec(&change).ok()?,
                ))
            }
        }
    }
}

/// An object whose live state changed: open watches of its scope send it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub gvr: String,
    pub namespace: String,
    pub name: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod_entry() -> Entry {
        let base = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "40"},
            "spec": {"nodeName": "n"},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}});
        Entry {
            gvr: "/v1/pods".into(),
            namespace: "ns".into(),
            name: "p".into(),
            path: "/api/v1/namespaces/ns/pods/p/status".into(),
            component: "kubelet".into(),
            replay: ReplayAs::Patch,
            state: base.clone(),
            base,
            base_rv: 40,
            writes: 0,
            encoding: Encoding::Protobuf,
        }
    }

    #[test]
    fn writes_fold_into_one_net_patch_that_only_touches_status() {
        let mut e = pod_entry();
        let ready = |s: &str| {
            json!({"metadata": {"uid": "u1"}, "spec": {"nodeName": "elsewhere"},
            "status": {"$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": s}], "phase": "Running"}})
        };
        let (a, b) = (ready("True"), ready("False"));
        let (c, d) = (ready("True"), json!({"status": {"podIP": "10.1.0.9"}}));
        for p in [&a, &b, &c] {
            e.fold(&Write::Patch(patch::PatchType::Strategic, p))
                .unwrap();
        }
        e.fold(&Write::Patch(patch::PatchType::Merge, &d)).unwrap();
        assert_eq!(e.writes, 4);
        assert_eq!(
            e.state["spec"]["nodeName"], "n",
            "a status write leaves the spec"
        );
        let served = e.served().unwrap();
        assert_eq!(
            served.rv, 36,
            "below the cloud's version, one lower a write"
        );
        let (method, ct, body) = e.net_write().unwrap();
        assert_eq!(
            (method, ct),
            (Method::PATCH, "application/strategic-merge-patch+json")
        );
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({"metadata": {"uid": "u1"}, "status": {"phase": "Running", "podIP": "10.1.0.9",
                "$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "True"}]}})
        );
    }

    #[test]
    fn a_write_naming_another_object_or_not_applying_is_refused() {
        let mut e = pod_entry();
        let other = json!({"metadata": {"uid": "u2"}, "status": {"phase": "Failed"}});
        assert!(matches!(
            e.fold(&Write::Patch(patch::PatchType::Strategic, &other)),
            Err(Refusal::Immutable { .. })
        ));
        let broken = json!({"status": {"conditions": [{"status": "True"}]}});
        assert!(matches!(
            e.fold(&Write::Patch(patch::PatchType::Strategic, &broken)),
            Err(Refusal::BadRequest(_))
        ));
        assert_eq!((e.writes, &e.state), (0, &e.base), "nothing taken");
        // Writes that cancel out send nothing.
        let there = json!({"status": {"phase": "Running"}});
        let back = json!({"status": {"phase": "Pending"}});
        e.fold(&Write::Patch(patch::PatchType::Merge, &there))
            .unwrap();
        e.fold(&Write::Patch(patch::PatchType::Merge, &back))
            .unwrap();
        assert!(e.net_write().is_none());
    }

    #[test]
    fn a_rebase_keeps_the_node_s_change_on_the_cloud_s_newer_object() {
        let mut e = pod_entry();
        let p = json!({"status": {"phase": "Running"}});
        e.fold(&Write::Patch(patch::PatchType::Merge, &p)).unwrap();
        let mut newer = e.base.clone();
        newer["metadata"]["labels"] = json!({"new": "label"});
        newer["metadata"]["resourceVersion"] = "55".into();
        e.rebase(newer, 55);
        assert_eq!(e.state["status"]["phase"], "Running");
        assert_eq!(e.state["metadata"]["labels"]["new"], "label");
        assert_eq!(e.served_rv(), 54);
    }

    #[test]
    fn an_event_created_offline_is_created_once_and_what_follows_its_send_is_a_patch() {
        let created = json!({"kind": "Event", "apiVersion": "v1",
            "metadata": {"name": "p.1", "namespace": "ns", "resourceVersion": "1"},
            "reason": "Pulled", "count": 1, "firstTimestamp": "2026-12-06T10:00:00Z",
            "lastTimestamp": "2026-12-06T10:00:00Z"});
        let mut e = Entry {
            gvr: "/v1/events".into(),
            namespace: "ns".into(),
            name: "p.1".into(),
            path: "/api/v1/namespaces/ns/events".into(),
            component: "kubelet".into(),
            replay: ReplayAs::Create,
            base: Value::Null,
            base_rv: 0,
            state: Value::Null,
            writes: 0,
            encoding: Encoding::Json,
        };
        e.fold(&Write::Whole(created)).unwrap();
        let bump = json!({"count": 2, "lastTimestamp": "2026-12-06T10:05:00Z"});
        e.fold(&Write::Patch(patch::PatchType::Strategic, &bump))
            .unwrap();
        let (method, _, body) = e.net_write().unwrap();
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(method, Method::POST);
        assert_eq!(
            (&sent["count"], &sent["reason"]),
            (&json!(2), &json!("Pulled"))
        );
        assert!(sent["metadata"].get("resourceVersion").is_none(), "{sent}");
        assert_eq!(
            event_last_seen(&e.state),
            crate::x509::rfc3339_to_unix("2026-12-06T10:05:00Z")
        );
        let t = event_last_seen(&e.state).unwrap();
        assert!(!e.expired_event(t + 3600, 3600) && e.expired_event(t + 3601, 3600));
        // Sent while the recorder bumped it again: the rest is a patch of the event.
        let sent_entry = e.clone();
        let bump = json!({"count": 3});
        e.fold(&Write::Patch(patch::PatchType::Strategic, &bump))
            .unwrap();
        let rest = e.after_sent(sent_entry);
        assert_eq!((rest.replay, rest.writes), (ReplayAs::Patch, 1));
        assert_eq!(rest.path, "/api/v1/namespaces/ns/events/p.1");
        let (method, _, body) = rest.net_write().unwrap();
        assert_eq!(method, Method::PATCH);
        let patch: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(patch, json!({"count": 3}));
    }
}
