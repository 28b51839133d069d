//! Forwarding to the cloud: the request as the client sent it (minus hop-by-hop headers,
//! and minus Authorization when the node identity speaks), the answer streamed back as it
//! arrives; upgrades (exec, attach, port-forward over SPDY or websocket) are spliced both
//! ways once the cloud agrees to switch protocols.
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    HeaderMap, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    http::uri::PathAndQuery,
};
use hyper_util::rt::TokioIo;

use crate::kproto::StatusDetails;
use crate::{
    body::{BodyError, ProxyBody},
    upstream::{Cloud, UpstreamError, cloud::AsWho},
};

/// Requests bigger than kube-apiserver accepts are refused before reading them all.
pub const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// Copies end-to-end headers; `upgrade` keeps Connection/Upgrade for protocol switches.
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, upgrade: bool, drop_auth: bool) {
    // Headers that Connection names are hop-by-hop too (only HTTP/1.1 clients send it).
    let has_connection = from.contains_key(header::CONNECTION);
    let listed = |n: &str| {
        from.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|l| l.trim().eq_ignore_ascii_case(n))
    };
    for (name, value) in from {
        let n = name.as_str();
        if n == "host" || (drop_auth && n == "authorization") {
            continue;
        }
        if upgrade && (n == "connection" || n == "upgrade") {
            to.append(name.clone(), value.clone());
            continue;
        }
        if HOP_BY_HOP.contains(&n) || n == "upgrade" || (has_connection && listed(n)) {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers().contains_key(header::UPGRADE)
        && req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))
        })
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("request body: {0}")]
    Body(String),
    #[error("request body larger than {MAX_REQUEST_BODY} bytes")]
    TooLarge,
    #[error("upgrade: {0}")]
    Upgrade(String),
}

/// Reads the request body (bounded) so the request can be retried on another server.
pub async fn buffered_body(body: Incoming) -> Result<Bytes, ForwardError> {
    match http_body_util::Limited::new(body, MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ForwardError::TooLarge)
        }
        Err(e) => Err(ForwardError::Body(e.to_string())),
    }
}

pub struct Forwarded {
    pub response: Response<ProxyBody>,
    pub server: String,
}

/// Sends a (non-upgrade) request to the cloud and returns its streaming answer.
pub async fn forward(
    cloud: &Cloud,
    req: Request<Incoming>,
    who: AsWho,
) -> Result<Forwarded, ForwardError> {
    let (parts, body) = req.into_parts();
    let body = buffered_body(body).await?;
    forward_parts(cloud, &parts, body, who).await
}

/// A list whose answer may be large: no `limit`, or one above a page of 100. A one-item
/// list (the watch cache's check) is not worth a connection of its own.
fn may_be_large(parts: &hyper::http::request::Parts) -> bool {
    let query = parts.uri.query().unwrap_or("");
    let info = super::request::RequestInfo::parse(&parts.method, parts.uri.path(), query);
    let limit: u64 = super::request::query_param(query, "limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    info.is_resource && info.verb == "list" && !(1..=100).contains(&limit)
}

/// Sends a request whose body is already read.
pub async fn forward_parts(
    cloud: &Cloud,
    parts: &hyper::http::request::Parts,
    body: Bytes,
    who: AsWho,
) -> Result<Forwarded, ForwardError> {
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let drop_auth = who == AsWho::Node;
    let bulk = may_be_large(parts);
    let (resp, server) = cloud
        .send(who, |server| {
            let mut b = Request::builder()
                .method(parts.method.clone())
                .uri(server.uri(path.clone()));
            if bulk {
                b = b.extension(crate::upstream::cloud::Bulk);
            }
            copy_headers(&parts.headers, b.headers_mut()?, false, drop_auth);
            b.body(body.clone()).ok()
        })
        .await?;
    let (rparts, rbody) = resp.into_parts();
    let mut out = Response::builder().status(rparts.status);
    if let Some(h) = out.headers_mut() {
        copy_headers(&rparts.headers, h, false, false);
    }
    // A watch's (or a followed log's) small pieces are merged into fewer TLS records, and
    // so is a list read over HTTP/1.1, which kube-apiserver 1.33+ writes in chunks of a
    // few KiB: against 1.36, per 1000-pod list, 11-15 % less CPU in protobuf with latency
    // no higher, and 13 % less in JSON for about 6 ms more of a 45 ms list (still faster
    // than the apiserver answers directly). Another answer already comes in full frames,
    // and merging them would only copy it once more.
    let streaming = parts
        .uri
        .query()
        .is_some_and(|q| super::request::flag(q, "watch") || super::request::flag(q, "follow"));
    let body = if streaming {
        use super::clean_end::{CleanEnd, Framing};
        let content_type = rparts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let framing = Framing::of(
            content_type,
            rparts.headers.contains_key(header::CONTENT_ENCODING),
        );
        let merged = super::coalesce::Coalesce::new(rbody.boxed()).boxed();
        CleanEnd::new(merged, framing, Cloud::gone(server.clone())).boxed()
    } else if bulk {
        super::coalesce::Coalesce::new(rbody.boxed()).boxed()
    } else {
        rbody.boxed()
    };
    Ok(Forwarded {
        response: out
            .body(body)
            .map_err(|e| ForwardError::Body(e.to_string()))?,
        server: server.url.authority(),
    })
}

/// Forwards an upgrade request; on 101 from the cloud, splices client and cloud together.
pub async fn forward_upgrade(
    cloud: &Cloud,
    mut req: Request<Incoming>,
    who: AsWho,
) -> Result<Forwarded, ForwardError> {
    let client_upgrade = hyper::upgrade::on(&mut req);
    let (conn, server) = cloud.open_upgrade(who).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(conn)
        .await
        .map_err(|e| ForwardError::Upgrade(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let (parts, _) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut b = Request::builder().method(parts.method.clone()).uri(path);
    if let Some(h) = b.headers_mut() {
        copy_headers(&parts.headers, h, true, who == AsWho::Node);
        h.insert(
            header::HOST,
            HeaderValue::from_str(&server.url.authority())
                .map_err(|e| ForwardError::Upgrade(e.to_string()))?,
        );
    }
    let upstream_req = b
        .body(full(Bytes::new()))
        .map_err(|e| ForwardError::Upgrade(e.to_string()))?;
    let mut resp = sender
        .send_request(upstream_req)
        .await
        .map_err(|e| ForwardError::Upgrade(e.to_string()))?;
    let server_name = server.url.authority();
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (rparts, rbody) = resp.into_parts();
        let mut out = Response::builder().status(rparts.status);
        if let Some(h) = out.headers_mut() {
            copy_headers(&rparts.headers, h, false, false);
        }
        return Ok(Forwarded {
            response: out
                .body(rbody.map_err(BodyError::from).boxed())
                .map_err(|e| ForwardError::Body(e.to_string()))?,
            server: server_name,
        });
    }
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    if let Some(h) = out.headers_mut() {
        copy_headers(resp.headers(), h, true, false);
    }
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) = (client_upgrade.await, upstream_upgrade.await) else {
            return;
        };
        let _ =
            tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream))
                .await;
    });
    Ok(Forwarded {
        response: out
            .body(full(Bytes::new()))
            .map_err(|e| ForwardError::Body(e.to_string()))?,
        server: server_name,
    })
}

/// A Kubernetes Status error response.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<ProxyBody> {
    status_about(code, reason, message, None)
}

/// A Kubernetes Status error about one object, with the `details` kube-apiserver gives.
pub fn status_about(
    code: StatusCode,
    reason: &str,
    message: &str,
    about: Option<StatusDetails>,
) -> Response<ProxyBody> {
    let mut body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    if let Some(d) = &about {
        body["details"] = d.json();
    }
    Response::builder()
        .status(code)
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )
        .extension(OwnStatus {
            reason: reason.to_string(),
            message: message.to_string(),
            about,
        })
        .body(full(serde_json::to_vec(&body).expect("json")))
        .expect("static response")
}

/// Marks a Status error the hub answered itself (never one the cloud sent).
#[derive(Debug, Clone)]
pub struct OwnStatus {
    reason: String,
    message: String,
    about: Option<StatusDetails>,
}

/// The hub's own Status error in protobuf when the client asks for protobuf first, as
/// kube-apiserver answers such a client (kubelet); anything else as it is.
pub fn in_clients_encoding(resp: Response<ProxyBody>, protobuf_first: bool) -> Response<ProxyBody> {
    if !protobuf_first {
        return resp;
    }
    let Some(own) = resp.extensions().get::<OwnStatus>().cloned() else {
        return resp;
    };
    let (mut parts, _) = resp.into_parts();
    let code = u64::from(parts.status.as_u16());
    let body = crate::kproto::status(&own.reason, &own.message, code, own.about.as_ref());
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, full(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut from = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, X-Trace"),
            ("x-trace", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("host", "127.0.0.1"),
            ("authorization", "Bearer t"),
            ("accept", "application/json"),
            ("user-agent", "kubectl/v1.32"),
        ] {
            from.append(n, HeaderValue::from_static(v));
        }
        let names = |to: &HeaderMap| {
            let mut v: Vec<String> = to.keys().map(|k| k.to_string()).collect();
            v.sort();
            v
        };
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to, false, false);
        assert_eq!(names(&to), ["accept", "authorization", "user-agent"]);
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to, false, true);
        assert_eq!(names(&to), ["accept", "user-agent"]);
        from.remove("connection");
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to, false, false);
        assert_eq!(
            names(&to),
            ["accept", "authorization", "user-agent", "x-trace"]
        );
    }
}
