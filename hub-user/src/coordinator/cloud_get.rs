//! A GET of the cloud as the node, its body ungzipped: how the pool leader lists and
//! watches the pool-scope resources (in JSON), and the node-level watch cache its
//! resources (in protobuf).
use http_body_util::BodyExt;
use hyper::{Request, StatusCode, header};

use crate::{
    body::ProxyBody,
    gzip::{self, ContentEncoding},
    upstream::cloud::{AsWho, Cloud},
};

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
