//! One cloud apiserver: its URL, its place among the servers, and its health.
use hyper::{
    Uri,
    http::uri::{Authority, PathAndQuery, Scheme},
};

use super::{ServerUrl, health::Health};

pub struct Server {
    pub url: ServerUrl,
    /// Its place in `Cloud::servers`, and in each identity's channels.
    pub(super) index: usize,
    scheme: Scheme,
    authority: Authority,
    pub health: Health,
}

impl Server {
    pub(super) fn new(
        index: usize,
        scheme: Scheme,
        authority: Authority,
        url: ServerUrl,
        health: Health,
    ) -> Server {
        Server {
            url,
            index,
            scheme,
            authority,
            health,
        }
    }

    /// This server's URL for a path and query (parsed once by the caller, not per server).
    pub fn uri(&self, path_and_query: PathAndQuery) -> Uri {
        let mut parts = hyper::http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path_and_query);
        Uri::from_parts(parts).expect("a scheme, an authority and a path make a URI")
    }
}
