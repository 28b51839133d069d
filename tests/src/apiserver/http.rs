//! Request handling: authentication, routing, content negotiation, and the verbs.
use std::{collections::HashMap, convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use serde_json::{Value, json};

use super::{
    State,
    auth::User,
    patch,
    resources::{self, Resource, ResourceId},
    select::{FieldSelector, LabelSelector},
    store::{Key, StoreError, rv_of},
    table, time,
};

pub type Body = BoxBody<Bytes, Infallible>;

/// kube-apiserver's request body limit (3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A body handed out in the given pieces, one frame each (over HTTP/1.1 without a
/// length, one chunk each).
pub struct Pieces {
    left: std::collections::VecDeque<Bytes>,
    len: u64,
    /// Whether the length is announced (Content-Length over HTTP/1.1).
    sized: bool,
}

impl Pieces {
    /// With its whole length known.
    pub fn new(pieces: Vec<Bytes>) -> Pieces {
        let len = pieces.iter().map(|p| p.len() as u64).sum();
        Pieces {
            left: pieces.into(),
            len,
            sized: true,
        }
    }

    /// Sent chunked over HTTP/1.1; its length is still the lower bound of its size.
    pub fn chunked(pieces: Vec<Bytes>) -> Pieces {
        Pieces {
            sized: false,
            ..Pieces::new(pieces)
        }
    }
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        let next = self.left.pop_front();
        if let Some(p) = &next {
            self.len -= p.len() as u64;
        }
        std::task::Poll::Ready(next.map(|p| Ok(hyper::body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.left.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        if self.sized {
            return hyper::body::SizeHint::with_exact(self.len);
        }
        let mut hint = hyper::body::SizeHint::new();
        hint.set_lower(self.len);
        hint
    }
}

pub fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(serde_json::to_vec(value).expect("json")))
        .expect("response")
}

/// A metav1.Status error, as every kube-apiserver error is.
pub fn status_error(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Response<Body> {
    json_response(code, &status_value(code, reason, message, details))
}

/// The Status object of an error.
pub fn status_value(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(mut d) = details {
        // kube-apiserver leaves the core group ("") out.
        if d["group"] == "" {
            d.as_object_mut().map(|m| m.remove("group"));
        }
        s["details"] = d;
    }
    s
}

fn not_found(r: &Resource, name: &str) -> Response<Body> {
    status_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{} \"{name}\" not found", r.group_resource()),
        Some(json!({"name": name, "group": r.group, "kind": r.name})),
    )
}

pub fn bad_request(message: &str) -> Response<Body> {
    status_error(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

/// What the client asked to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Table,
    /// Kubernetes protobuf (only for kinds with a protobuf form, see `protobuf`).
    Protobuf,
}

/// Content negotiation over Accept for a resource of `kind`, in the client's order of
/// preference; protobuf is chosen only where the kind has a protobuf form here.
pub fn negotiate(accept: Option<&str>, kind: &str) -> Option<Format> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Format::Json);
    };
    for part in accept.split(',') {
        let mut fields = part.split(';').map(str::trim);
        let media = fields.next().unwrap_or_default().to_ascii_lowercase();
        let params: HashMap<&str, &str> = fields.filter_map(|f| f.split_once('=')).collect();
        match media.as_str() {
            "application/json"
                if params.get("as") == Some(&"Table")
                    && params.get("v") == Some(&"v1")
                    && params.get("g") == Some(&"meta.k8s.io") =>
            {
                return Some(Format::Table);
            }
            "application/json" if params.contains_key("as") => {}
            "application/json" | "*/*" | "application/*" => return Some(Format::Json),
            "application/vnd.kubernetes.protobuf" if super::protobuf::supported(kind) => {
                return Some(Format::Protobuf);
            }
            _ => {}
        }
    }
    None
}

fn not_acceptable() -> Response<Body> {
    status_error(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json",
        None,
    )
}

/// Percent-decoding for query values (`+` is a space, as in forms).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_pairs(uri: &hyper::Uri) -> impl Iterator<Item = (String, String)> + '_ {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
}

/// Query parameters (the last value wins for repeated names).
pub fn query(uri: &hyper::Uri) -> HashMap<String, String> {
    query_pairs(uri).collect()
}

/// A boolean query parameter, parsed like Go's strconv.ParseBool (as kube-apiserver does:
/// the Python client sends `watch=True`).
pub fn flag(q: &HashMap<String, String>, name: &str) -> bool {
    q.get(name)
        .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// Every value of a repeated query parameter (e.g. exec's `command`).
pub fn query_values(uri: &hyper::Uri, name: &str) -> Vec<String> {
    query_pairs(uri)
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v)
        .collect()
}

/// A parsed resource URL.
#[derive(Debug, Clone)]
pub struct Target {
    pub resource: ResourceId,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...` into a target.
pub fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let find = |name: &str| resources::find(group, version, name);
    match rest {
        ["namespaces", ns, res, tail @ ..]
            if find(res).is_some_and(|r| resources::get(r).namespaced) =>
        {
            Some(Target {
                resource: find(res)?,
                namespace: Some(ns.to_string()),
                name: tail.first().map(|s| s.to_string()),
                subresource: tail
                    .get(1)
                    .map(|s| s.to_string())
                    .filter(|_| tail.len() == 2),
            })
            .filter(|_| tail.len() <= 2)
        }
        [res, tail @ ..] if tail.len() <= 2 => Some(Target {
            resource: find(res)?,
            namespace: None,
            name: tail.first().map(|s| s.to_string()),
            subresource: tail.get(1).map(|s| s.to_string()),
        }),
        _ => None,
    }
}

/// Metadata name rules (RFC 1123 subdomain), which also keep `..`, `/` and NUL out.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Why `name` is not a valid name for `r`'s kind. RBAC objects follow kube-apiserver's
/// looser path-segment rule (`system:node` is a ClusterRole), everything else RFC 1123.
fn name_problem(r: &Resource, name: &str) -> Option<String> {
    if r.group == "rbac.authorization.k8s.io" {
        return if name == "." || name == ".." {
            Some(format!("may not be '{name}'"))
        } else if let Some(c) = ['/', '%'].into_iter().find(|c| name.contains(*c)) {
            Some(format!("may not contain '{c}'"))
        } else if name.is_empty() || name.contains('\0') {
            Some("must be a non-empty name without NUL".into())
        } else {
            None
        };
    }
    (!valid_name(name)).then(|| "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into())
}

fn invalid(r: &Resource, name: &str, field: &str, message: &str) -> Response<Body> {
    status_error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{} \"{name}\" is invalid: {field}: {message}", r.kind),
        Some(json!({"name": name, "group": r.group, "kind": r.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]})),
    )
}

/// Reads a request body up to the apiserver's limit.
pub async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(status_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                &format!("Request entity too large: limit is {MAX_BODY}"),
                None,
            ))
        }
        Err(e) => Err(bad_request(&format!("reading the request body: {e}"))),
    }
}

fn decode_object(body: &[u8]) -> Result<Value, Response<Body>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(bad_request(
            "the body of the request was in an unknown format",
        )),
        Err(e) => Err(bad_request(&format!(
            "couldn't get version/kind; json parse error: {e}"
        ))),
    }
}

/// Items of built-in lists omit apiVersion/kind on the wire; unstructured (CRD) ones keep them.
fn list_item(r: &Resource, obj: &Value) -> Value {
    let mut v = obj.clone();
    if r.group != "example.hub.dev"
        && let Some(m) = v.as_object_mut()
    {
        m.remove("apiVersion");
        m.remove("kind");
    }
    v
}

fn verb_of(method: &Method, t: &Target, q: &HashMap<String, String>) -> &'static str {
    let watch = flag(q, "watch");
    match (method, t.name.is_some()) {
        (&Method::GET, _) if watch => "watch",
        (&Method::GET, true) => "get",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "unknown",
    }
}

/// kube-apiserver's Forbidden Status: the object's name when the request had one, and
/// the authorizer's reason after the rule it failed.
fn forbidden(
    user: &User,
    a: &super::node_authz::Attributes,
    r: &Resource,
    reason: Option<String>,
) -> Response<Body> {
    let resource = match a.subresource {
        Some(s) => format!("{}/{s}", r.name),
        None => r.name.to_string(),
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    let subject = match a.name {
        Some(name) => format!("{} \"{name}\"", r.group_resource()),
        None => r.group_resource(),
    };
    let reason = reason.map(|r| format!(": {r}")).unwrap_or_default();
    let mut details = json!({"kind": r.name, "group": r.group});
    if let Some(name) = a.name {
        details["name"] = json!(name);
    }
    status_error(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!(
            "{subject} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}{reason}",
            user.name, a.verb, r.group
        ),
        Some(details),
    )
}

/// Serves one resource request (everything under /api and /apis with a resource).
pub async fn resource_request(
    state: Arc<State>,
    user: User,
    req: Request<Incoming>,
    target: Target,
) -> Response<Body> {
    let r = resources::get(target.resource);
    let q = query(req.uri());
    let verb = verb_of(req.method(), &target, &q);
    let ns = target.namespace.clone().unwrap_or_default();
    if r.namespaced && target.namespace.is_none() && target.name.is_some() {
        return not_found(r, target.name.as_deref().unwrap_or(""));
    }
    if !r.namespaced && target.namespace.is_some() {
        return status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
            None,
        );
    }
    if let Some(sub) = &target.subresource
        && !r.subresources.contains(&sub.as_str())
    {
        return status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
            None,
        );
    }
    let sub = target.subresource.as_deref();
    let authz_verb = match (verb, sub) {
        ("create", Some("exec" | "attach")) | ("get", Some("exec" | "attach")) => "create",
        (v, _) => v,
    };
    // As kube-apiserver's request info: a selector that does not parse is left out of
    // authorization (the handler refuses it), and list/watch of one object by
    // metadata.name carries that name.
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), r.kind)
        .unwrap_or_default();
    let name = match verb {
        "list" | "watch" => fields.equals("metadata.name"),
        _ => target.name.as_deref(),
    };
    let attributes = super::node_authz::Attributes {
        verb: authz_verb,
        resource: r.name,
        subresource: sub,
        namespace: &ns,
        name,
        fields: &fields,
    };
    if let Err(reason) = state.authorize(&user, &attributes) {
        return forbidden(&user, &attributes, r, reason);
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let format = match sub {
        Some("log" | "exec" | "attach") => Format::Json,
        _ => match negotiate(accept.as_deref(), r.kind) {
            Some(f) => f,
            None => return not_acceptable(),
        },
    };

    match (verb, sub) {
        ("create", Some("token")) => {
            let protobuf = req.headers().get(header::CONTENT_TYPE).is_some_and(|c| {
                c.as_bytes()
                    .starts_with(super::protobuf::CONTENT_TYPE.as_bytes())
            });
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(e) => return e,
            };
            match super::tokens::decode(&body, protobuf) {
                Ok(v) => super::tokens::request(&state, &target, v),
                Err(e) => bad_request(&format!("TokenRequest: {e}")),
            }
        }
        ("get", Some("log")) => super::stream::logs(&state, &target, &q).await,
        (_, Some("exec" | "attach")) => super::stream::exec(req, &target).await,
        ("watch", _) => super::watch::watch(state, target, q, format).await,
        // Built off the runtime's workers, so a large list never keeps the server from
        // answering PINGs and other requests (kube-apiserver's handlers run beside its
        // HTTP/2 framer, not on it).
        ("list", _) => tokio::task::spawn_blocking(move || list(&state, &target, &q, format))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        ("get", _) => get(&state, &target, format),
        ("create", _) => {
            let mut body = match object_body(req, &target).await {
                Ok(b) => b,
                Err(e) => return e,
            };
            if r.kind == "CertificateSigningRequest"
                && let Ok(mut csr) = serde_json::from_slice::<Value>(&body)
            {
                // kube-apiserver records who asked; approvers judge by it.
                let mut groups = user.groups.clone();
                groups.push("system:authenticated".into());
                csr["spec"]["username"] = json!(user.name);
                csr["spec"]["groups"] = json!(groups);
                body = Bytes::from(serde_json::to_vec(&csr).expect("JSON"));
            }
            let resp = create(&state, &target, &body, &q);
            super::signer::after_write(&state, &target, &resp);
            resp
        }
        ("update", _) => {
            let body = match object_body(req, &target).await {
                Ok(b) => b,
                Err(e) => return e,
            };
            let resp = update(&state, &target, &body);
            super::signer::after_write(&state, &target, &resp);
            resp
        }
        ("patch", _) => {
            let (body, ctype) = match read_write_body(
                req,
                &[
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                    "application/json-patch+json",
                ],
            )
            .await
            {
                Ok(b) => b,
                Err(e) => return e,
            };
            let resp = patch_object(&state, &target, &body, &ctype);
            super::signer::after_write(&state, &target, &resp);
            resp
        }
        ("delete", _) => delete(&state, &target),
        ("deletecollection", _) => delete_collection(&state, &target, &q),
        _ => status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            None,
        ),
    }
}

/// The body of a create or update as JSON: sent as JSON, or as Kubernetes protobuf for
/// the kinds nodes write that way (`protobuf_in`).
async fn object_body(req: Request<Incoming>, t: &Target) -> Result<Bytes, Response<Body>> {
    let r = resources::get(t.resource);
    let protobuf = super::protobuf_in::supported(r.kind);
    let allowed: &[&str] = if protobuf {
        &["application/json", super::protobuf::CONTENT_TYPE]
    } else {
        &["application/json"]
    };
    let (body, ctype) = read_write_body(req, allowed).await?;
    if ctype != super::protobuf::CONTENT_TYPE {
        return Ok(body);
    }
    match super::protobuf_in::decode(&r.api_version(), r.kind, &body) {
        Ok(v) => Ok(Bytes::from(serde_json::to_vec(&v).expect("JSON"))),
        Err(e) => Err(bad_request(&format!(
            "the body of the request was in an unknown format: {e}"
        ))),
    }
}

/// Checks Content-Type against `allowed` and reads the body.
async fn read_write_body(
    req: Request<Incoming>,
    allowed: &[&str],
) -> Result<(Bytes, String), Response<Body>> {
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if !allowed.contains(&ctype.as_str()) {
        return Err(status_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                allowed.join(", ")
            ),
            None,
        ));
    }
    Ok((read_body(req).await?, ctype))
}

fn key(t: &Target, name: &str) -> Key {
    Key {
        resource: t.resource,
        namespace: t.namespace.clone().unwrap_or_default(),
        name: name.to_string(),
    }
}

fn get(state: &State, t: &Target, format: Format) -> Response<Body> {
    let r = resources::get(t.resource);
    let name = t.name.as_deref().unwrap_or_default();
    match state.store.get(&key(t, name)) {
        Some(obj) if format == Format::Table => json_response(
            StatusCode::OK,
            &table::table(
                r,
                &[&obj],
                json!({"resourceVersion": rv_of(&obj).to_string()}),
            ),
        ),
        Some(obj) if format == Format::Protobuf => {
            protobuf_response(super::protobuf::object(&r.api_version(), r.kind, &obj))
        }
        Some(obj) => json_response(StatusCode::OK, &obj),
        None => not_found(r, name),
    }
}

/// kube-apiserver's continue token: base64url (no padding) of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"<relative key after the last item>"}`
/// (fixtures/wire/kube-apiserver-1.36/list-pods-json-limit2).
fn encode_continue(rv: i64, start: &str) -> String {
    use base64::Engine;
    let raw = format!(
        "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{}}}",
        json!(start)
    );
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// (resourceVersion to list at, None for the newest (-1); the relative key to start at)
/// of a token, as kube-apiserver's DecodeContinue reads it: a start without its leading
/// `/` gets one, and one that is not a clean path is refused.
fn decode_continue(token: &str) -> Option<(Option<u64>, String)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v["v"] != "meta.k8s.io/v1" {
        return None;
    }
    let rv = match v["rv"].as_i64()? {
        0 => return None,
        rv if rv < 0 => None,
        rv => Some(rv as u64),
    };
    let start = v["start"].as_str().filter(|s| !s.is_empty())?;
    let start = if start.starts_with('/') {
        start.to_string()
    } else {
        format!("/{start}")
    };
    let clean = start == "/"
        || (!start.ends_with('/') && start[1..].split('/').all(|p| !matches!(p, "" | "." | "..")));
    clean.then_some((rv, start))
}

pub fn selectors(
    r: &Resource,
    q: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), Response<Body>> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| bad_request(&e))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), r.kind)
        .map_err(|e| bad_request(&e))?;
    Ok((labels, fields))
}

fn list(state: &State, t: &Target, q: &HashMap<String, String>, format: Format) -> Response<Body> {
    let r = resources::get(t.resource);
    let (labels, fields) = match selectors(r, q) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut limit: usize = match q.get("limit").map(|l| l.parse()) {
        Some(Ok(l)) => l,
        Some(Err(_)) => return bad_request("limit must be a non-negative integer"),
        None => 0,
    };
    let exact_rv = match list_resource_version(state, q) {
        Ok(ListFrom::Latest) => None,
        // The watch cache answers, whole: kube-apiserver 1.32 ignores limit there.
        Ok(ListFrom::WatchCache) => {
            limit = 0;
            None
        }
        Ok(ListFrom::Exactly(rv)) => Some(rv),
        Err(e) => return e,
    };
    let (at_rv, start) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => match decode_continue(token) {
            Some((rv, start)) => (rv, Some(start)),
            None => return bad_request("continue key is not valid: malformed token"),
        },
        None => (exact_rv, None),
    };
    let read = |at_rv: Option<u64>| {
        state.store.list(
            t.resource,
            t.namespace.as_deref(),
            at_rv,
            start.as_deref(),
            limit,
            |o| labels.matches(o) && fields.matches(o),
        )
    };
    let page = match read(at_rv) {
        Ok(p) => p,
        // kube-apiserver 1.36 answers a continue token from before a compaction with the
        // next page of its watch cache's snapshot at the token's version. The stand-in
        // keeps no snapshots: the newest state after the token's place, at that version.
        Err(StoreError::Gone { .. })
            if start.is_some() && state.options.version == super::Version::V1_36 =>
        {
            match read(None) {
                Ok(mut p) => {
                    p.rv = at_rv.unwrap_or(p.rv);
                    p
                }
                Err(e) => return bad_request(&format!("{e:?}")),
            }
        }
        Err(StoreError::Gone { .. }) if start.is_none() => {
            return status_error(
                StatusCode::GONE,
                "Expired",
                "The resourceVersion for the provided list is too old.",
                None,
            );
        }
        Err(StoreError::Gone { .. }) => {
            let mut status = status_value(
                StatusCode::GONE,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                None,
            );
            if let Some(start) = &start {
                // The Status carries a token that goes on from the same place at the
                // newest state: resourceVersion -1, the start without its leading `/`
                // (fixtures/wire/kube-apiserver-1.32/list-continue-expired-json).
                status["metadata"]["continue"] = json!(encode_continue(-1, &start[1..]));
            }
            return json_response(StatusCode::GONE, &status);
        }
        Err(e) => return bad_request(&format!("{e:?}")),
    };
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    // kube-apiserver counts the remaining items only when no selector filtered them.
    let unfiltered = q.get("labelSelector").is_none_or(|s| s.is_empty())
        && q.get("fieldSelector").is_none_or(|s| s.is_empty());
    let remaining = page
        .last
        .as_ref()
        .filter(|_| unfiltered)
        .map(|_| page.remaining as i64);
    if let Some(last) = &page.last {
        meta["continue"] = json!(encode_continue(page.rv as i64, &format!("{last}\0")));
    }
    if let Some(n) = remaining {
        meta["remainingItemCount"] = json!(n);
    }
    if format == Format::Table {
        let objs: Vec<&Value> = page.items.iter().map(|a| a.as_ref()).collect();
        return json_response(StatusCode::OK, &table::table(r, &objs, meta));
    }
    if format == Format::Protobuf {
        let objs: Vec<&Value> = page.items.iter().map(|a| a.as_ref()).collect();
        let token = meta["continue"].as_str().map(String::from);
        return protobuf_response(super::protobuf::list(
            &r.api_version(),
            r.kind,
            &objs,
            &page.rv.to_string(),
            token.as_deref(),
            remaining,
        ));
    }
    let items: Vec<Value> = page.items.iter().map(|o| list_item(r, o)).collect();
    list_response(r, &meta, &items)
}

/// A JSON list with its fields in kube-apiserver's order (kind, apiVersion, metadata,
/// items), as the recordings have it; `json!` would sort them.
fn list_response(r: &Resource, meta: &Value, items: &[Value]) -> Response<Body> {
    let head = format!(
        r#"{{"kind":{},"apiVersion":{},"metadata":{},"items":"#,
        Value::from(format!("{}List", r.kind)),
        Value::from(r.api_version()),
        meta
    );
    let mut body = head.into_bytes();
    serde_json::to_writer(&mut body, items).expect("json");
    body.push(b'}');
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("response")
}

/// Where a list is read from, by its `resourceVersion` and `resourceVersionMatch`.
enum ListFrom {
    /// Unset, or not older than a version reached: the newest state.
    Latest,
    /// `0`: the watch cache, whatever its version.
    WatchCache,
    /// `resourceVersionMatch=Exact`: the state at that version.
    Exactly(u64),
}

fn list_resource_version(
    state: &State,
    q: &HashMap<String, String>,
) -> Result<ListFrom, Response<Body>> {
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let matching = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or("");
    let invalid = |message: &str| {
        status_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
            Some(json!({"group": "meta.k8s.io", "kind": "ListOptions"})),
        )
    };
    if rv.is_empty() {
        return if matching.is_empty() {
            Ok(ListFrom::Latest)
        } else {
            Err(invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ))
        };
    }
    let Ok(version) = rv.parse::<u64>() else {
        return Err(status_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("invalid resource version: {rv}"),
            None,
        ));
    };
    let current = state.store.current_rv();
    match matching {
        "Exact" if version == 0 => Err(invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        )),
        "" | "NotOlderThan" | "Exact" if version > current => Err(status_error(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            &format!("Too large resource version: {version}, current: {current}"),
            Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ),
        )),
        "" | "NotOlderThan" if version == 0 => Ok(ListFrom::WatchCache),
        // With a limit, kube-apiserver 1.32 reads these from etcd, newest state, in pages.
        "" | "NotOlderThan" => Ok(ListFrom::Latest),
        "Exact" => Ok(ListFrom::Exactly(version)),
        other => Err(invalid(&format!(
            "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        ))),
    }
}

fn protobuf_response(body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, super::protobuf::CONTENT_TYPE)
        .body(full(body))
        .expect("response")
}

fn uid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = time::now_unix();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        t as u32,
        (n >> 32) as u16,
        (n >> 20) as u16 & 0xfff,
        (n >> 8) as u16 & 0xfff,
        n
    )
}

fn suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0x9e37);
    let mut n = N.fetch_add(0x9e3779b9, Ordering::Relaxed);
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| {
            let c = alphabet[(n % alphabet.len() as u64) as usize] as char;
            n /= alphabet.len() as u64;
            c
        })
        .collect()
}

/// Checks kind/apiVersion/namespace of a written object and fills in the type fields.
fn check_object(r: &Resource, t: &Target, obj: &mut Value) -> Result<(), Response<Body>> {
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != r.kind
    {
        return Err(bad_request(&format!(
            "the kind of the body ({k}) does not match the resource ({})",
            r.kind
        )));
    }
    if let Some(a) = obj.get("apiVersion").and_then(Value::as_str)
        && a != r.api_version()
    {
        return Err(bad_request(&format!(
            "the API version in the data ({a}) does not match the expected API version ({})",
            r.api_version()
        )));
    }
    obj["kind"] = json!(r.kind);
    obj["apiVersion"] = json!(r.api_version());
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if let Some(ns) = &t.namespace {
        match obj["metadata"]["namespace"].as_str() {
            Some(body_ns) if body_ns != ns && !body_ns.is_empty() => {
                return Err(bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(ns),
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    defaults(r.kind, obj);
    Ok(())
}

/// The defaults kube-apiserver fills in on write for the kinds a node writes or reads
/// (as recorded: a Secret's type, an Event's timestamps and reporting fields).
fn defaults(kind: &str, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    let mut default = |k: &str, v: Value| {
        m.entry(k.to_string()).or_insert(v);
    };
    match kind {
        "Secret" => default("type", json!("Opaque")),
        "Event" => {
            for k in ["firstTimestamp", "lastTimestamp", "eventTime"] {
                default(k, Value::Null);
            }
            for k in ["reportingComponent", "reportingInstance"] {
                default(k, json!(""));
            }
        }
        _ => {}
    }
}

fn namespace_exists(state: &State, t: &Target) -> Result<(), Response<Body>> {
    let Some(ns) = &t.namespace else {
        return Ok(());
    };
    let ns_res = resources::find("", "v1", "namespaces").expect("namespaces");
    let k = Key {
        resource: ns_res,
        namespace: String::new(),
        name: ns.clone(),
    };
    if state.store.get(&k).is_none() {
        return Err(not_found(resources::get(ns_res), ns));
    }
    Ok(())
}

fn store_error(r: &Resource, name: &str, e: StoreError) -> Response<Body> {
    match e {
        StoreError::NotFound => not_found(r, name),
        StoreError::AlreadyExists => status_error(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", r.group_resource()),
            Some(json!({"name": name, "group": r.group, "kind": r.name})),
        ),
        StoreError::Conflict => status_error(
            StatusCode::CONFLICT,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                r.group_resource()
            ),
            Some(json!({"name": name, "group": r.group, "kind": r.name})),
        ),
        StoreError::Gone { .. } => status_error(
            StatusCode::GONE,
            "Expired",
            "resource version too old",
            None,
        ),
    }
}

pub fn create(
    state: &State,
    t: &Target,
    body: &[u8],
    q: &HashMap<String, String>,
) -> Response<Body> {
    let r = resources::get(t.resource);
    if t.name.is_some() {
        return status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "POST is not allowed on a named resource",
            None,
        );
    }
    let mut obj = match decode_object(body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_object(r, t, &mut obj) {
        return e;
    }
    let mut name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        match obj["metadata"]["generateName"].as_str() {
            Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", suffix()),
            _ => {
                return invalid(
                    r,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                );
            }
        }
    }
    if let Some(problem) = name_problem(r, &name) {
        return invalid(
            r,
            &name,
            "metadata.name",
            &format!("Invalid value: \"{name}\": {problem}"),
        );
    }
    if let Err(e) = namespace_exists(state, t) {
        return e;
    }
    let meta = &mut obj["metadata"];
    meta["name"] = json!(name);
    meta["uid"] = json!(uid());
    meta["creationTimestamp"] = json!(time::now_rfc3339());
    if let Some(m) = meta.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("deletionTimestamp");
    }
    if r.kind == "Pod" && obj["status"]["phase"].is_null() {
        obj["status"]["phase"] = json!("Pending");
    }
    if q.get("dryRun").is_some_and(|d| d == "All") {
        return json_response(StatusCode::CREATED, &obj);
    }
    match state.store.create(key(t, &name), obj) {
        Ok(o) => json_response(StatusCode::CREATED, &o),
        Err(e) => store_error(r, &name, e),
    }
}

/// Status-subresource rules: the main resource keeps the stored status, the status
/// subresource changes only the status; identity fields never change.
fn merge_for_write(r: &Resource, sub: Option<&str>, current: &Value, mut new: Value) -> Value {
    let keep = ["uid", "creationTimestamp", "namespace", "name"];
    for k in keep {
        new["metadata"][k] = current["metadata"][k].clone();
    }
    match sub {
        Some("status") => {
            let mut out = current.clone();
            out["status"] = new["status"].clone();
            out
        }
        Some("approval") => {
            let mut out = current.clone();
            out["status"]["conditions"] = new["status"]["conditions"].clone();
            out
        }
        // An object stored without a status keeps none (not a null one).
        _ if r.has_status => {
            match current.get("status") {
                Some(status) => new["status"] = status.clone(),
                None => {
                    new.as_object_mut().map(|o| o.remove("status"));
                }
            }
            new
        }
        _ => new,
    }
}

fn expected_rv(obj: &Value) -> Option<u64> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
}

fn update(state: &State, t: &Target, body: &[u8]) -> Response<Body> {
    let r = resources::get(t.resource);
    let name = t.name.clone().unwrap_or_default();
    let mut obj = match decode_object(body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_object(r, t, &mut obj) {
        return e;
    }
    if obj["metadata"]["name"].as_str().is_some_and(|n| n != name) {
        return bad_request("the name of the object does not match the name on the URL");
    }
    let expected = expected_rv(&obj);
    let sub = t.subresource.as_deref();
    match state.store.update(key(t, &name), expected, |cur| {
        merge_for_write(r, sub, cur, obj)
    }) {
        Ok(o) => json_response(StatusCode::OK, &o),
        Err(e) => store_error(r, &name, e),
    }
}

fn patch_object(state: &State, t: &Target, body: &[u8], ctype: &str) -> Response<Body> {
    let r = resources::get(t.resource);
    let name = t.name.clone().unwrap_or_default();
    let patch_doc: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(&format!("error decoding patch: {e}")),
    };
    let sub = t.subresource.as_deref();
    let mut failure = None;
    // A patch whose metadata.uid is not the object's fails validation, with nothing
    // written: uid is immutable (recorded: patch-pod-status-wrong-uid).
    let held = state.store.get(&key(t, &name));
    if let Some(uid) = patch_doc["metadata"]["uid"].as_str()
        && held.is_some_and(|cur| cur["metadata"]["uid"].as_str() != Some(uid))
    {
        let why = format!("Invalid value: {uid:?}: field is immutable");
        let cause = json!({"reason": "FieldValueInvalid", "message": why, "field": "metadata.uid"});
        // A pod's status update lists the cause twice (recorded); elsewhere once is assumed.
        let causes = if sub == Some("status") {
            vec![cause.clone(), cause]
        } else {
            vec![cause]
        };
        return status_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("{} {name:?} is invalid: metadata.uid: {why}", r.kind),
            Some(json!({"name": name, "kind": r.kind, "causes": causes})),
        );
    }
    let expected = expected_rv(&patch_doc);
    let result = state.store.update(key(t, &name), expected, |cur| {
        let mut new = cur.clone();
        match ctype {
            "application/json-patch+json" => {
                if let Err(e) = patch::json_patch(&mut new, &patch_doc) {
                    failure = Some(e);
                    return cur.clone();
                }
            }
            "application/strategic-merge-patch+json" => {
                patch::strategic_merge_patch(&mut new, &patch_doc)
            }
            _ => patch::merge_patch(&mut new, &patch_doc),
        }
        new["kind"] = cur["kind"].clone();
        new["apiVersion"] = cur["apiVersion"].clone();
        merge_for_write(r, sub, cur, new)
    });
    if let Some(e) = failure {
        // The store wrote the unchanged object; that is harmless but bumps the rv, as an
        // empty update would. Report the patch error as kube-apiserver does.
        return status_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("the server rejected our request due to an error in our request: {e}"),
            None,
        );
    }
    match result {
        Ok(o) => json_response(StatusCode::OK, &o),
        Err(e) => store_error(r, &name, e),
    }
}

fn delete(state: &State, t: &Target) -> Response<Body> {
    let r = resources::get(t.resource);
    let name = t.name.clone().unwrap_or_default();
    match state.store.delete(key(t, &name), None) {
        Ok(o) => {
            if r.kind == "Namespace" {
                delete_namespace_contents(state, &name);
            }
            json_response(StatusCode::OK, &o)
        }
        Err(e) => store_error(r, &name, e),
    }
}

/// Namespace deletion removes what it holds (immediately; the real server finalizes
/// asynchronously through the namespace controller).
fn delete_namespace_contents(state: &State, ns: &str) {
    for (i, r) in resources::RESOURCES
        .iter()
        .enumerate()
        .filter(|(_, r)| r.namespaced)
    {
        let id = ResourceId(i);
        if let Ok(page) = state.store.list(id, Some(ns), None, None, 0, |_| true) {
            for obj in page.items {
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let _ = state.store.delete(
                    Key {
                        resource: id,
                        namespace: ns.into(),
                        name,
                    },
                    None,
                );
            }
        }
        let _ = r;
    }
}

fn delete_collection(state: &State, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let r = resources::get(t.resource);
    let (labels, fields) = match selectors(r, q) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let page = match state
        .store
        .list(t.resource, t.namespace.as_deref(), None, None, 0, |o| {
            labels.matches(o) && fields.matches(o)
        }) {
        Ok(p) => p,
        Err(e) => return store_error(r, "", e),
    };
    let mut deleted = Vec::new();
    for obj in page.items {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let k = Key {
            resource: t.resource,
            namespace: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .into(),
            name,
        };
        if let Ok(o) = state.store.delete(k, None) {
            deleted.push(list_item(r, &o));
        }
    }
    let meta = json!({"resourceVersion": state.store.current_rv().to_string()});
    list_response(r, &meta, &deleted)
}
