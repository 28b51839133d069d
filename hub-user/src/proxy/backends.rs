//! The three places a request can be answered — the cloud, the pool coordinator, the local
//! cache — each one type behind one trait: given the request as the hub understood it,
//! answer it or say why not (the proxy then tries the next route).
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::{Request, Response, body::Incoming};

use super::{
    forward::{ForwardError, forward, forward_upgrade, is_upgrade},
    request::RequestInfo,
    too_large,
};
use crate::{
    body::ProxyBody,
    cache::{Cache, serve::CacheRequest},
    coordinator::pool::Pool,
    route::Inputs,
    upstream::{Cloud, cloud::AsWho},
};

/// How long a request waits for the pool coordinator before the next route is tried.
const COORDINATOR_ANSWER: Duration = Duration::from_secs(2);

/// A request as every backend is asked it.
pub struct Asked<'a> {
    pub info: &'a RequestInfo,
    pub path: &'a str,
    pub query: &'a str,
    pub accept: &'a str,
    pub who: AsWho,
    /// The cache's name for the caller's credential (worked out on first use).
    pub credential: &'a (dyn Fn() -> String + Sync),
    /// What the router knew when it planned the routes.
    pub inputs: Inputs,
    /// The request itself, for the one backend that sends it on (the cloud).
    pub request: Mutex<Option<Request<Incoming>>>,
}

/// Why a backend gave no answer.
pub enum Refusal {
    /// It cannot answer this; the reason goes into the 503 if no route can.
    Unable(String),
    /// An answer to give as is, without trying other routes (a request too large).
    Final(Response<ProxyBody>),
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal::Unable(why)
    }
}

/// One place that answers requests.
pub trait Backend {
    async fn serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal>;
}

/// The cloud apiservers, through the identity the request speaks as.
pub struct CloudBackend<'a>(pub &'a Cloud);

impl Backend for CloudBackend<'_> {
    async fn serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal> {
        // Probes say no server answers: sending would only hang the client (a frozen
        // cloud accepts connections and never replies).
        if !self.0.healthy() {
            return Err("unreachable (no server passes its health probe)"
                .to_string()
                .into());
        }
        let taken = asked
            .request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(req) = taken else {
            return Err("the request was already sent".to_string().into());
        };
        let result = if is_upgrade(&req) {
            Box::pin(forward_upgrade(self.0, req, asked.who)).await
        } else {
            Box::pin(forward(self.0, req, asked.who)).await
        };
        match result {
            Ok(f) => Ok(f.response),
            Err(ForwardError::TooLarge) => Err(Refusal::Final(too_large())),
            Err(e) => Err(e.to_string().into()),
        }
    }
}

/// This node's cache; `cloud` tells an offline watch when to end.
pub struct CacheBackend<'a> {
    pub cache: Option<&'a Cache>,
    pub cloud: &'a Arc<Cloud>,
}

impl Backend for CacheBackend<'_> {
    async fn serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal> {
        let Some(cache) = self.cache else {
            return Err("the cache is turned off".to_string().into());
        };
        let credential = (asked.credential)();
        let request = CacheRequest {
            info: asked.info,
            path: asked.path,
            query: asked.query,
            accept: asked.accept,
            credential: &credential,
        };
        let cloud = self.cloud.clone();
        let cloud_back = move || cloud.health_known() && cloud.healthy();
        Ok(Box::pin(cache.serve(request, Arc::new(cloud_back))).await?)
    }
}

/// The pool's coordinator; `cloud` tells a watch served from it when to end.
pub struct CoordinatorBackend<'a> {
    pub pool: Option<&'a Arc<Pool>>,
    pub cloud: &'a Arc<Cloud>,
}

impl Backend for CoordinatorBackend<'_> {
    async fn serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal> {
        let Some(pool) = self.pool else {
            return Err("none configured".to_string().into());
        };
        // Pool data came from node identities: only they are served it.
        if asked.who != AsWho::Node {
            return Err("pool data is served to the node identity only"
                .to_string()
                .into());
        }
        // A watch served from here ends once the hub would route it elsewhere; the
        // client then re-lists there.
        let (p, cloud) = (pool.clone(), self.cloud.clone());
        let pool_scope = asked.inputs.pool_scope;
        let keep_open = move || p.healthy() && (pool_scope || !cloud.healthy());
        let answer = pool.serve(
            asked.info,
            asked.query,
            asked.accept,
            asked.inputs.cloud_healthy,
            Arc::new(keep_open),
        );
        // A frozen etcd must not hold the client: no answer in time is a failure (and a
        // signal on the coordinator's health).
        match tokio::time::timeout(COORDINATOR_ANSWER, Box::pin(answer)).await {
            Ok(answer) => Ok(answer?),
            Err(_) => {
                pool.note_unanswered("a request");
                Err(format!("no answer within {} ms", COORDINATOR_ANSWER.as_millis()).into())
            }
        }
    }
}
