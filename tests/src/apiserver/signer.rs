//! The certificate signer of the stand-in: an approved CertificateSigningRequest gets its
//! certificate (signed by the cloud CA) in status.certificate, as kube-controller-manager's
//! signers do. With `auto_approve_csrs` it also approves them on arrival.
use base64::Engine;
use hyper::Response;
use serde_json::{Value, json};

use super::{
    State,
    http::{Body, Target},
    resources,
    store::Key,
    time,
};

fn condition(csr: &Value, kind: &str) -> bool {
    csr["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

/// Called after every successful create/update/patch; acts on CSRs only.
pub fn after_write(state: &State, t: &Target, resp: &Response<Body>) {
    if !resp.status().is_success() || resources::get(t.resource).kind != "CertificateSigningRequest"
    {
        return;
    }
    // The name is in the response body for creates (generateName); re-read from the store.
    let names: Vec<String> = match &t.name {
        Some(n) => vec![n.clone()],
        None => state
            .store
            .list(t.resource, None, None, None, 0, |o| {
                o["status"]["certificate"].is_null()
            })
            .map(|p| {
                p.items
                    .iter()
                    .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
    };
    for name in names {
        sign(
            state,
            Key {
                resource: t.resource,
                namespace: String::new(),
                name,
            },
        );
    }
}

fn sign(state: &State, key: Key) {
    let Some(csr) = state.store.get(&key) else {
        return;
    };
    if csr["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
        || condition(&csr, "Denied")
        || condition(&csr, "Failed")
    {
        return;
    }
    let approved = condition(&csr, "Approved");
    if !approved && !state.options.auto_approve_csrs {
        return;
    }
    let signed = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap_or_default())
        .ok()
        .and_then(|pem| String::from_utf8(pem).ok())
        .ok_or_else(|| "spec.request is not base64 PEM".to_string())
        .and_then(|pem| {
            rcgen::CertificateSigningRequestParams::from_pem(&pem).map_err(|e| e.to_string())
        })
        .and_then(|mut params| {
            let now = time::now_unix() as i64;
            // spec.expirationSeconds shortens the signer's lifetime, never below 10 min.
            let asked = csr["spec"]["expirationSeconds"]
                .as_i64()
                .map(|s| s.max(600));
            let life = state.options.csr_cert_lifetime.as_secs() as i64;
            let life = asked.map_or(life, |a| a.min(life));
            params.params.not_before =
                ::time::OffsetDateTime::from_unix_timestamp(now - (life / 10).min(60))
                    .map_err(|e| e.to_string())?;
            params.params.not_after = ::time::OffsetDateTime::from_unix_timestamp(now + life)
                .map_err(|e| e.to_string())?;
            params
                .signed_by(state.ca.issuer())
                .map_err(|e| e.to_string())
        });
    let stamp = time::now_rfc3339();
    let _ = state.store.update(key, None, |cur| {
        let mut out = cur.clone();
        let mut conditions = out["status"]["conditions"].as_array().cloned().unwrap_or_default();
        if !approved {
            conditions.push(json!({"type": "Approved", "status": "True", "reason": "AutoApproved", "message": "approved by the stand-in", "lastUpdateTime": stamp}));
        }
        match &signed {
            Ok(cert) => out["status"]["certificate"] = json!(base64::engine::general_purpose::STANDARD.encode(cert.pem())),
            Err(e) => conditions.push(json!({"type": "Failed", "status": "True", "reason": "SignerError", "message": e, "lastUpdateTime": stamp})),
        }
        out["status"]["conditions"] = Value::Array(conditions);
        out
    });
}
