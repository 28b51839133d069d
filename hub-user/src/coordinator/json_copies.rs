//! JSON for the pool. kubelet and kube-proxy read in protobuf, so much of a node's cache is
//! protobuf, which JSON-only clients (kubectl, dynamic clients) cannot take — and the hub
//! cannot convert it without every kind's schema. So while the cloud is up, the push asks
//! it for the JSON form of each protobuf object it is about to push (a GET as the node,
//! which the cloud already let the node read) and pushes that: the pool then holds what
//! every client accepts. A copy is kept per object and resourceVersion, so an unchanged
//! object is fetched once. With the cloud down, protobuf is pushed as it is (better than
//! nothing; it stays so until the object changes, since an equal resourceVersion is a
//! no-op in the coordinator).
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::BodyExt;
use hyper::{Request, StatusCode, header};
use tokio::task::JoinSet;

use super::storage::split_gvr;
use crate::{
    body::ProxyBody,
    cache::objects::{self, Encoding, Item},
    gzip::{self, ContentEncoding},
    upstream::cloud::{AsWho, Cloud},
};

/// GETs in flight at once for one push.
const PARALLEL: usize = 8;
const GET_TIMEOUT: Duration = Duration::from_secs(5);
/// kube-apiserver refuses objects above 1.5 MiB in etcd; JSON adds some.
const MAX_OBJECT: usize = 3 * 1024 * 1024;
const USER_AGENT: &str = "hub-pool-push";

/// A failed GET: the cloud's status when it answered, and why.
#[derive(Debug)]
pub struct GetError {
    pub status: Option<StatusCode>,
    pub message: String,
}

/// A GET of `path_and_query` from the cloud as the node, in JSON, its body decoded if the
/// cloud gzipped it; anything but 200 is an error carrying the status (and the start of
/// the answer).
pub async fn get_as_node(
    cloud: &Cloud,
    path_and_query: &str,
    user_agent: &str,
) -> Result<hyper::Response<ProxyBody>, GetError> {
    let (resp, _) = cloud
        .send(AsWho::Node, |server| {
            Request::builder()
                .uri(server.uri(path_and_query.parse().ok()?))
                .header(header::ACCEPT, "application/json")
                // Large lists cross the edge link gzipped, as client-go asks for them.
                .header(header::ACCEPT_ENCODING, "gzip")
                .header(header::USER_AGENT, user_agent)
                .body(bytes::Bytes::new())
                .ok()
        })
        .await
        .map_err(|e| GetError {
            status: None,
            message: e.to_string(),
        })?;
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    let Some(encoding) = ContentEncoding::of(parts.headers.get(header::CONTENT_ENCODING)) else {
        return Err(GetError {
            status: Some(status),
            message: "the cloud answered in a Content-Encoding the hub cannot read".into(),
        });
    };
    parts.headers.remove(header::CONTENT_ENCODING);
    let resp = hyper::Response::from_parts(parts, gzip::decoded(body, encoding));
    if status == StatusCode::OK {
        return Ok(resp);
    }
    let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Err(GetError {
        status: Some(status),
        message: format!(
            "the cloud answered {status}: {}",
            String::from_utf8_lossy(&body)
        ),
    })
}

/// (gvr, namespace, name).
type ObjectId = (String, String, String);

enum Copy {
    /// The JSON form, at its resourceVersion.
    Json(Item),
    /// The cloud refused it (gone, forbidden) at this resourceVersion: push protobuf.
    Refused(u64),
}

/// What a set's objects are pushed as.
pub enum ForPush {
    Ready(Ready),
    /// The cloud did not answer for some: push the set next round.
    Retry(String),
}

pub struct Ready {
    pub items: Vec<Item>,
    /// JSON forms fetched from the cloud for this push.
    pub fetched: u64,
    /// Objects the cloud would not give (gone, forbidden), so pushed in protobuf.
    pub refused: u64,
    /// Objects pushed in protobuf, for whatever reason (also: the cloud is down).
    pub protobuf: u64,
}

impl Ready {
    /// `items` pushed as they are, nothing fetched.
    fn as_is(items: Vec<Item>) -> Ready {
        let protobuf = items
            .iter()
            .filter(|i| i.encoding == Encoding::Protobuf)
            .count() as u64;
        Ready {
            items,
            fetched: 0,
            refused: 0,
            protobuf,
        }
    }
}

pub struct JsonCopies {
    cloud: Arc<Cloud>,
    copies: Mutex<HashMap<ObjectId, Copy>>,
}

impl JsonCopies {
    pub fn new(cloud: Arc<Cloud>) -> JsonCopies {
        JsonCopies {
            cloud,
            copies: Mutex::new(HashMap::new()),
        }
    }

    /// `items` of resource `gvr` with each protobuf object replaced by its JSON form (which
    /// may be fresher). With the cloud down they are returned as they are.
    pub async fn for_push(&self, gvr: &str, items: Vec<Item>) -> ForPush {
        let wanted: Vec<usize> = {
            let copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
            items
                .iter()
                .enumerate()
                .filter(|(_, i)| i.encoding == Encoding::Protobuf)
                .filter(|(_, i)| match copies.get(&id(gvr, i)) {
                    Some(Copy::Json(j)) => j.rv < i.rv,
                    Some(Copy::Refused(rv)) => *rv < i.rv,
                    None => true,
                })
                .map(|(n, _)| n)
                .collect()
        };
        let (mut fetched, mut refused) = (0, 0);
        if !wanted.is_empty() && self.cloud.healthy() {
            match self.fetch(gvr, &items, &wanted).await {
                Ok(counts) => (fetched, refused) = counts,
                Err(e) => return ForPush::Retry(e),
            }
        }
        let copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let items: Vec<Item> = items
            .into_iter()
            .map(|i| match copies.get(&id(gvr, &i)) {
                Some(Copy::Json(j)) if i.encoding == Encoding::Protobuf && j.rv >= i.rv => {
                    j.clone()
                }
                _ => i,
            })
            .collect();
        ForPush::Ready(Ready {
            fetched,
            refused,
            ..Ready::as_is(items)
        })
    }

    /// GETs the JSON form of `items[wanted]`, PARALLEL at a time; (fetched, refused).
    async fn fetch(
        &self,
        gvr: &str,
        items: &[Item],
        wanted: &[usize],
    ) -> Result<(u64, u64), String> {
        let Some((group, version, resource)) = split_gvr(gvr) else {
            return Ok((0, 0));
        };
        let base = match group {
            "" => format!("/api/{version}"),
            g => format!("/apis/{g}/{version}"),
        };
        let mut queue = wanted.iter().map(|n| &items[*n]);
        let mut running = JoinSet::new();
        let (mut failed, mut fetched, mut refused) = (None, 0, 0);
        loop {
            while running.len() < PARALLEL {
                let Some(item) = queue.next() else { break };
                let key = id(gvr, item);
                let Some(path) = object_path(&base, resource, item) else {
                    self.remember(key, Copy::Refused(item.rv));
                    refused += 1;
                    continue;
                };
                let (cloud, resource, rv) = (self.cloud.clone(), resource.to_string(), item.rv);
                running.spawn(async move {
                    let got = tokio::time::timeout(GET_TIMEOUT, json_of(&cloud, &path, &resource))
                        .await
                        .unwrap_or_else(|_| Err(Fetch::Retry("timed out".into())));
                    (key, rv, got)
                });
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            let Ok((key, rv, got)) = done else { continue };
            match got {
                Ok(item) => {
                    self.remember(key, Copy::Json(item));
                    fetched += 1;
                }
                Err(Fetch::Refused) => {
                    self.remember(key, Copy::Refused(rv));
                    refused += 1;
                }
                Err(Fetch::Retry(e)) => failed = Some(format!("{}/{}: {e}", key.1, key.2)),
            }
        }
        failed.map_or(Ok((fetched, refused)), |e| {
            Err(format!("JSON form of {gvr} {e}"))
        })
    }

    fn remember(&self, key: ObjectId, copy: Copy) {
        self.copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, copy);
    }

    /// Forgets the copies of objects no set holds any more.
    pub fn keep_only(&self, held: &HashSet<ObjectId>) {
        self.copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| held.contains(k));
    }
}

pub fn id(gvr: &str, item: &Item) -> ObjectId {
    (gvr.to_string(), item.namespace.clone(), item.name.clone())
}

/// The object's path, or None for a name that could not be one (the store keeps names
/// as the cloud sent them; a path must not be steered by them).
fn object_path(base: &str, resource: &str, item: &Item) -> Option<String> {
    let safe = |s: &str| s != "." && s != ".." && !s.contains(['/', '?', '#', '%', '\0', ' ']);
    if !safe(&item.name) || item.name.is_empty() || !safe(&item.namespace) {
        return None;
    }
    Some(match item.namespace.as_str() {
        "" => format!("{base}/{resource}/{}", item.name),
        ns => format!("{base}/namespaces/{ns}/{resource}/{}", item.name),
    })
}

enum Fetch {
    /// Not found or not allowed: no JSON form to have.
    Refused,
    Retry(String),
}

async fn json_of(cloud: &Cloud, path: &str, resource: &str) -> Result<Item, Fetch> {
    let resp = get_as_node(cloud, path, USER_AGENT)
        .await
        .map_err(|e| match e.status {
            Some(s) if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => Fetch::Refused,
            _ => Fetch::Retry(e.message),
        })?;
    let body = http_body_util::Limited::new(resp.into_body(), MAX_OBJECT)
        .collect()
        .await
        .map_err(|e| Fetch::Retry(format!("reading: {e}")))?
        .to_bytes();
    objects::parse_object(resource, Encoding::Json, &body).map_err(|_| Fetch::Refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(ns: &str, name: &str) -> Item {
        Item {
            name: name.into(),
            namespace: ns.into(),
            rv: 1,
            labels: vec![],
            fields: vec![],
            api_version: "v1".into(),
            kind: "Pod".into(),
            encoding: Encoding::Protobuf,
            body: vec![],
        }
    }

    #[test]
    fn paths_and_path_tricks() {
        assert_eq!(
            object_path("/api/v1", "pods", &item("default", "p-1")).as_deref(),
            Some("/api/v1/namespaces/default/pods/p-1")
        );
        assert_eq!(
            object_path("/api/v1", "nodes", &item("", "edge-1")).as_deref(),
            Some("/api/v1/nodes/edge-1")
        );
        for (ns, name) in [
            ("default", "../secrets/x"),
            ("default", ".."),
            ("..", "p"),
            ("default", "a?watch=1"),
            ("default", ""),
            ("default", "a%2F"),
        ] {
            assert_eq!(object_path("/api/v1", "pods", &item(ns, name)), None);
        }
    }
}
