//! A GET of the cloud as the node, its body ungzipped: how the pool leader lists and
//! watches the pool-scope resources (in JSON), and the node-level watch cache its
//! resources (in protobuf).
use http_body_util::BodyExt;
use hyper::{Request, StatusCode, header};

use crate::{
    body::ProxyBody,
    cache::objects::{self, Encoding, Item},
    gzip::{self, ContentEncoding},
    kproto,
    proxy::request::percent_encode,
    upstream::cloud::{AsWho, Cloud},
};

/// Pages of a list the hub takes for itself.
pub const PAGE: usize = 500;
/// A list page or one watch event larger than this is refused.
pub const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// How long one watch request of the hub's own to the cloud stays open.
pub const WATCH_SECONDS: u64 = 300;

/// Every object of a list the hub took for itself (all pages).
pub struct Listed {
    pub items: Vec<Item>,
    /// The resourceVersion of its first page.
    pub rv: u64,
    /// Objects the hub could not read.
    pub bad: usize,
}

/// Lists `path` from the cloud as the node, every page, asking for `accept`; the objects
/// are parsed as `resource`'s.
pub async fn list_as_node(
    cloud: &Cloud,
    path: &str,
    resource: &str,
    user_agent: &str,
    accept: &str,
) -> Result<Listed, GetError> {
    let failed = |message: String| GetError {
        status: None,
        message,
    };
    let mut listed = Listed {
        items: Vec::new(),
        rv: 0,
        bad: 0,
    };
    let mut cont = String::new();
    loop {
        let mut q = format!("{path}?limit={PAGE}");
        if !cont.is_empty() {
            q.push_str(&format!("&continue={}", percent_encode(&cont)));
        }
        let resp = get_as_node_in(cloud, &q, user_agent, accept).await?;
        let mut body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER);
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| failed(format!("reading the list: {e}")))?;
            if let Ok(data) = frame.into_data() {
                pieces.push(data);
            }
        }
        let enc = if pieces.first().is_some_and(|p| p.starts_with(kproto::MAGIC)) {
            Encoding::Protobuf
        } else {
            Encoding::Json
        };
        let page = objects::parse_list_pieces(resource, enc, &pieces, |_| false)
            .map_err(|e| failed(e.to_string()))?;
        if listed.rv == 0 {
            listed.rv = page.rv;
        }
        listed.items.extend(page.items);
        listed.bad += page.bad;
        cont = page.continue_token;
        if cont.is_empty() {
            return Ok(listed);
        }
    }
}

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
    get_as_node_in(cloud, path_and_query, user_agent, "application/json").await
}

/// Like [`get_as_node`], asking for the answer in `accept`.
pub async fn get_as_node_in(
    cloud: &Cloud,
    path_and_query: &str,
    user_agent: &str,
    accept: &str,
) -> Result<hyper::Response<ProxyBody>, GetError> {
    let (resp, _) = cloud
        .send(AsWho::Node, |server| {
            Request::builder()
                .uri(server.uri(path_and_query.parse().ok()?))
                .header(header::ACCEPT, accept)
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
