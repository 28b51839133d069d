//! TokenRequest (`POST serviceaccounts/<sa>/token`), as kubelet asks for a pod's projected
//! service-account token: a fresh token for the service account, valid for the asked
//! `expirationSeconds` (at least 10 minutes, 1 hour by default), usable at once as a
//! bearer token of `system:serviceaccount:<ns>:<sa>`. The body may be JSON or protobuf;
//! the answer is JSON, made protobuf by the caller for protobuf clients. Unlike
//! kube-apiserver, the service account need not exist.
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::{Response, StatusCode};
use k8s_pb::{
    api::authentication::v1 as authentication,
    apimachinery::pkg::{apis::meta::v1::Time, runtime::Unknown},
};
use prost::Message;
use serde_json::{Value, json};

use super::{
    State,
    http::{Body, Target, bad_request, json_response},
    time,
};

/// A TokenRequest body in its JSON form.
pub fn decode(body: &[u8], protobuf: bool) -> Result<Value, String> {
    if !protobuf {
        return serde_json::from_slice(body).map_err(|e| e.to_string());
    }
    let raw = body
        .strip_prefix(hub::kproto::MAGIC)
        .ok_or("the body does not start with the protobuf magic")?;
    let u = Unknown::decode(raw).map_err(|e| e.to_string())?;
    let t = authentication::TokenRequest::decode(u.raw.unwrap_or_default().as_slice())
        .map_err(|e| e.to_string())?;
    let spec = t.spec.unwrap_or_default();
    let mut v = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": spec.audiences}});
    if let Some(e) = spec.expiration_seconds {
        v["spec"]["expirationSeconds"] = json!(e);
    }
    if let Some(r) = spec.bound_object_ref {
        v["spec"]["boundObjectRef"] = json!({"kind": r.kind, "apiVersion": r.api_version,
            "name": r.name, "uid": r.u_id});
    }
    Ok(v)
}

/// The answer's protobuf message bytes (without envelope).
pub fn encode(v: &Value) -> Vec<u8> {
    let spec = &v["spec"];
    let r = &spec["boundObjectRef"];
    let s = |v: &Value| v.as_str().map(String::from);
    authentication::TokenRequest {
        metadata: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: s(&v["metadata"]["name"]),
            namespace: s(&v["metadata"]["namespace"]),
            ..Default::default()
        }),
        spec: Some(authentication::TokenRequestSpec {
            audiences: spec["audiences"]
                .as_array()
                .map(|a| a.iter().filter_map(&s).collect())
                .unwrap_or_default(),
            expiration_seconds: spec["expirationSeconds"].as_i64(),
            bound_object_ref: r.is_object().then(|| authentication::BoundObjectReference {
                kind: s(&r["kind"]),
                api_version: s(&r["apiVersion"]),
                name: s(&r["name"]),
                u_id: s(&r["uid"]),
            }),
        }),
        status: Some(authentication::TokenRequestStatus {
            token: s(&v["status"]["token"]),
            expiration_timestamp: v["status"]["expirationTimestamp"]
                .as_str()
                .and_then(time::parse_rfc3339)
                .map(|secs| Time {
                    seconds: Some(secs as i64),
                    nanos: Some(0),
                }),
        }),
    }
    .encode_to_vec()
}

/// Issues a token for the service account `t` names.
pub fn request(state: &State, t: &Target, mut req: Value) -> Response<Body> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let (Some(ns), Some(sa)) = (t.namespace.as_deref(), t.name.as_deref()) else {
        return bad_request("a TokenRequest names a service account");
    };
    let secs = req["spec"]["expirationSeconds"]
        .as_u64()
        .unwrap_or(3600)
        .max(600);
    let token = format!(
        "standin-sa-{ns}-{sa}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    state.auth.write().unwrap().add_token(
        &token,
        &format!("system:serviceaccount:{ns}:{sa}"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{ns}"),
        ],
    );
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] =
        json!({"name": sa, "namespace": ns, "creationTimestamp": time::now_rfc3339()});
    req["spec"]["expirationSeconds"] = json!(secs);
    req["status"] = json!({
        "token": token,
        "expirationTimestamp": time::rfc3339(time::now_unix() + secs),
    });
    json_response(StatusCode::CREATED, &req)
}
