//! Service-account tokens for the node's pods while the cloud is unreachable. kubelet asks
//! the cloud for each pod's projected token (`POST serviceaccounts/<sa>/token`, a
//! TokenRequest bound to the pod) and renews it well before it expires; a kubelet that
//! restarts offline asks again for every pod. The hub never mints a token: it keeps the
//! last answer the cloud gave the node identity for the same request (service account,
//! audiences, lifetime, bound pod) and, offline, answers that same request with it while
//! the token is still valid. The answers live in the owner-only store, outside what
//! `hub cache` lists, and only the node identity ever reaches this path.
use bytes::Bytes;
use hyper::{Response, StatusCode, header};
use serde_json::Value;

use super::{Cache, objects::Encoding, store::Write};
use crate::{
    body::ProxyBody,
    kproto,
    proxy::{
        forward::{full, status},
        request::RequestInfo,
    },
};

/// A token closer than this to its expiry is not handed out.
const MARGIN_SECS: u64 = 30;
/// Answers larger than this are not kept (a TokenRequest answer is ~1 KiB).
pub const MAX_ANSWER: usize = 64 * 1024;
const WARNING: &str = "299 - \"hub: the cloud is unreachable; this is the token the cloud issued for the same request, still valid\"";

/// A TokenRequest: `create` of the `token` subresource of a service account.
pub fn is_token_request(info: &RequestInfo) -> bool {
    info.verb == "create"
        && info.group.is_empty()
        && info.resource == "serviceaccounts"
        && info.subresource == "token"
        && !info.name.is_empty()
}

/// What makes two requests the same: namespace, service account and the request's spec
/// (audiences, lifetime, bound object), as its bytes. Hashed, so the key holds no name.
fn key(info: &RequestInfo, content_type: &str, body: &[u8]) -> Option<String> {
    let spec: Vec<u8> = match Encoding::of_content_type(content_type)? {
        Encoding::Json => {
            let v: Value = serde_json::from_slice(body).ok()?;
            // serde_json's maps are sorted: one spec, one string.
            serde_json::to_vec(&v["spec"]).ok()?
        }
        Encoding::Protobuf => {
            let u = kproto::unwrap(body)?;
            let fields = kproto::fields(u.raw)?;
            fields.iter().find_map(|(n, v)| match v {
                kproto::Value::Bytes(b) if *n == 2 => Some(b.to_vec()),
                _ => None,
            })?
        }
    };
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        info.namespace.as_bytes(),
        info.name.as_bytes(),
        content_type.as_bytes(),
    ] {
        ctx.update(part);
        ctx.update(b"\0");
    }
    ctx.update(&spec);
    let hex: String = ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(format!("tokenrequest:{hex}"))
}

/// When the token in a TokenRequest answer expires (Unix seconds).
fn expires(content_type: &str, answer: &[u8]) -> Option<u64> {
    match Encoding::of_content_type(content_type)? {
        Encoding::Json => {
            let v: Value = serde_json::from_slice(answer).ok()?;
            crate::x509::rfc3339_to_unix(v["status"]["expirationTimestamp"].as_str()?)
        }
        Encoding::Protobuf => {
            // TokenRequest { status 3: { expirationTimestamp 2: Time { seconds 1 } } }
            fn field(msg: &[u8], n: u64) -> Option<kproto::Value<'_>> {
                kproto::fields(msg)?
                    .into_iter()
                    .rev()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v)
            }
            let u = kproto::unwrap(answer)?;
            let kproto::Value::Bytes(status) = field(u.raw, 3)? else {
                return None;
            };
            let kproto::Value::Bytes(time) = field(status, 2)? else {
                return None;
            };
            match field(time, 1)? {
                kproto::Value::Varint(s) => Some(s),
                _ => None,
            }
        }
    }
}

impl Cache {
    /// Keeps the cloud's answer to a TokenRequest of the node identity.
    pub fn remember_token(
        &self,
        info: &RequestInfo,
        request_type: &str,
        request: &[u8],
        answer_type: &str,
        answer: &Bytes,
    ) {
        if answer.len() > MAX_ANSWER || expires(answer_type, answer).is_none() {
            return;
        }
        let Some(path) = key(info, request_type, request) else {
            return;
        };
        let write = Write::Raw {
            path,
            content_type: answer_type.to_string(),
            body: answer.to_vec(),
        };
        if let Err(e) = self.store.apply(&[write]) {
            self.stats
                .error(format!("keeping a service-account token: {e}"));
        }
    }

    /// The offline answer to a TokenRequest: the cloud's last answer to the same request
    /// while its token is valid, else a 503 saying why.
    pub fn token_offline(
        &self,
        info: &RequestInfo,
        request_type: &str,
        request: &[u8],
    ) -> Response<ProxyBody> {
        let unavailable = |why: &str| {
            status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &format!("hub: the node is offline from the cloud: {why}"),
            )
        };
        let Some(path) = key(info, request_type, request) else {
            return unavailable("the TokenRequest body cannot be read");
        };
        let kept = match self.store.raw(&path) {
            Ok(k) => k,
            Err(e) => return unavailable(&e.to_string()),
        };
        let now = super::store::now();
        let valid = kept
            .into_iter()
            .find(|(ct, body)| expires(ct, body).is_some_and(|t| t > now + MARGIN_SECS));
        match valid {
            Some((ct, body)) => Response::builder()
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, ct)
                .header("warning", WARNING)
                .body(full(body))
                .expect("valid response parts"),
            None => unavailable(&format!(
                "no valid token was issued by the cloud for service account {}/{} and this request",
                info.namespace, info.name
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_has_the_same_key_and_expiry_is_read_in_both_encodings() {
        let info = RequestInfo::parse(
            &hyper::Method::POST,
            "/api/v1/namespaces/ns1/serviceaccounts/default/token",
            "",
        );
        assert!(is_token_request(&info));
        let a = br#"{"kind":"TokenRequest","spec":{"audiences":["api"],"expirationSeconds":3607,"boundObjectRef":{"kind":"Pod","name":"p","uid":"u1"}}}"#;
        let b = br#"{"spec":{"expirationSeconds":3607,"boundObjectRef":{"uid":"u1","name":"p","kind":"Pod"},"audiences":["api"]},"kind":"TokenRequest"}"#;
        let other = br#"{"spec":{"audiences":["api"],"expirationSeconds":3607,"boundObjectRef":{"kind":"Pod","name":"p","uid":"u2"}}}"#;
        let k = |body: &[u8]| key(&info, "application/json", body).unwrap();
        assert_eq!(k(a), k(b));
        assert_ne!(k(a), k(other), "another pod's binding");
        let answer = br#"{"status":{"token":"t","expirationTimestamp":"2026-12-03T10:00:00Z"}}"#;
        assert_eq!(expires("application/json", answer), Some(1_796_292_000));
        // Protobuf: TokenRequest { status 3: { token 1, expirationTimestamp 2: { seconds 1 } } }
        let mut time = Vec::new();
        kproto::put_uint(&mut time, 1, 1_796_292_000);
        let mut status = Vec::new();
        kproto::put_bytes(&mut status, 1, b"t");
        kproto::put_bytes(&mut status, 2, &time);
        let mut msg = Vec::new();
        kproto::put_bytes(&mut msg, 3, &status);
        let env = kproto::envelope("authentication.k8s.io/v1", "TokenRequest", &msg);
        assert_eq!(
            expires("application/vnd.kubernetes.protobuf", &env),
            Some(1_796_292_000)
        );
    }
}
