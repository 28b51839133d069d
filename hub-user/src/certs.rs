//! The hub's own serving certificate when tls.certFile is not given: a key generated here
//! and a CertificateSigningRequest (signer kubernetes.io/kubelet-serving, the node's
//! identity) to the cloud, waited for, stored owner-only under cache.dir/pki, and renewed
//! when 80 % of its lifetime has passed. The stored pair lets an offline reboot serve at
//! once. The listeners read the files through the same reloading resolver as configured
//! certificates, so renewal never drops a connection.
use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::Engine;
use hyper::Method;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde_json::{Value, json};

use crate::{
    state::HubState,
    upstream::{Cloud, cloud::AsWho},
};

pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Renew when this share of the lifetime has passed.
const RENEW_AT: f64 = 0.8;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{0}")]
    Io(String),
    #[error("CSR {name}: {reason}")]
    Csr { name: String, reason: String },
    #[error("cloud: {0}")]
    Cloud(String),
}

/// A managed serving certificate: where it lives, and the lifetime asked for it.
pub struct Managed {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub lifetime: Duration,
}

impl Managed {
    pub fn under(cache_dir: &Path, lifetime: Duration) -> Managed {
        let dir = cache_dir.join("pki");
        Managed {
            cert: dir.join("hub-serving.crt"),
            key: dir.join("hub-serving.key"),
            lifetime,
        }
    }

    /// (notBefore, notAfter) of the stored certificate, if there is a readable one.
    pub fn validity(&self) -> Option<(u64, u64)> {
        let pem = std::fs::read(&self.cert).ok()?;
        let der = crate::upstream::identity::certs_from_pem(&pem, "managed certificate").ok()?;
        crate::x509::validity(der.first()?)
    }

    /// True if a stored pair exists and is not yet due for renewal.
    pub fn fresh(&self, now: u64) -> bool {
        self.key.exists()
            && self.validity().is_some_and(|(from, to)| {
                now < from + ((to.saturating_sub(from)) as f64 * RENEW_AT) as u64
            })
    }

    /// Writes key and certificate whole, owner-only.
    fn store(&self, key_pem: &str, cert_pem: &str) -> Result<(), CertError> {
        let io = |e: std::io::Error| CertError::Io(format!("{}: {e}", self.cert.display()));
        let dir = self.cert.parent().expect("pki dir");
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        for (path, text) in [(&self.key, key_pem), (&self.cert, cert_pem)] {
            crate::files::write_whole(path, text.as_bytes(), 0o600).map_err(io)?;
        }
        Ok(())
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn call(
    cloud: &Cloud,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), CertError> {
    cloud
        .json_call(AsWho::Node, None, "hub/csr", method, path, body)
        .await
        .map_err(CertError::Cloud)
}

/// After how long a CSR still waiting is announced as an Event on the hub's pod.
const ANNOUNCE_AFTER: Duration = Duration::from_secs(10);

/// Requests a serving certificate for `sans` and waits (up to `wait`) for the cloud to
/// approve and sign it; stores the pair in `managed`. While the CSR waits, `state` says
/// so (`hub status`, `/readyz`), and once, as an Event on the hub's pod.
pub async fn request(
    cloud: &Cloud,
    node: &str,
    sans: &[String],
    managed: &Managed,
    wait: Duration,
    state: &HubState,
) -> Result<(), CertError> {
    let key = KeyPair::generate().map_err(|e| CertError::Io(e.to_string()))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.subject_alt_names = sans
        .iter()
        .filter_map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(SanType::IpAddress(ip)),
            Err(_) => s.clone().try_into().ok().map(SanType::DnsName),
        })
        .collect();
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| CertError::Io(e.to_string()))?;
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": format!("hub-serving-{node}-")},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem),
            "signerName": SIGNER,
            "usages": ["digital signature", "key encipherment", "server auth"],
            // Short-lived: a leaked key is good only until then (the signer may shorten it).
            "expirationSeconds": managed.lifetime.as_secs().max(600),
        }
    });
    let base = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    let (code, created) = call(cloud, Method::POST, base, Some(&body)).await?;
    let name = created["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if code != 201 || name.is_empty() {
        return Err(CertError::Csr {
            name,
            reason: format!(
                "create answered {code}: {}",
                created["message"].as_str().unwrap_or("")
            ),
        });
    }
    tracing::info!(csr = %name, "serving certificate requested; waiting for approval");
    let asked = tokio::time::Instant::now();
    let deadline = asked + wait;
    let mut announced = false;
    let outcome = loop {
        let (_, csr) = call(cloud, Method::GET, &format!("{base}/{name}"), None).await?;
        let conditions = csr["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(c) = conditions
            .iter()
            .find(|c| c["type"] == "Denied" || c["type"] == "Failed")
        {
            break Err(CertError::Csr {
                name,
                reason: format!("{}: {}", c["type"], c["message"].as_str().unwrap_or("")),
            });
        }
        if let Some(cert) = csr["status"]["certificate"]
            .as_str()
            .filter(|c| !c.is_empty())
        {
            let cert_pem = base64::engine::general_purpose::STANDARD
                .decode(cert)
                .map_err(|e| CertError::Csr {
                    name: name.clone(),
                    reason: e.to_string(),
                })?;
            let cert_pem = String::from_utf8_lossy(&cert_pem).into_owned();
            managed.store(&key.serialize_pem(), &cert_pem)?;
            tracing::info!(csr = %name, "serving certificate issued");
            break Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            break Err(CertError::Csr {
                name,
                reason: "not approved and signed in time".into(),
            });
        }
        let approved = conditions.iter().any(|c| c["type"] == "Approved");
        let waiting = asked.elapsed().as_secs();
        state.set_serving_certificate(Some(if approved {
            format!("CSR {name} is approved and waits for the signer ({waiting} s)")
        } else {
            format!(
                "CSR {name} waits for approval ({waiting} s): {}",
                who_approves(&name)
            )
        }));
        if !announced && asked.elapsed() >= ANNOUNCE_AFTER {
            announced = true;
            announce_pending(cloud, node, &name).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    state.set_serving_certificate(None);
    outcome
}

/// Who can approve the CSR `name`, for the operator reading why the hub is not ready.
fn who_approves(name: &str) -> String {
    format!(
        "the hub's approver (deploy/base/approver.yaml) approves it, or \
         `kubectl certificate approve {name}`"
    )
}

/// A Warning Event on the hub's own pod (named by the downward API's POD_NAME,
/// POD_NAMESPACE and POD_UID) saying that its CSR waits; nothing outside a pod.
async fn announce_pending(cloud: &Cloud, node: &str, csr: &str) {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(pod), Some(namespace)) = (env("POD_NAME"), env("POD_NAMESPACE")) else {
        return;
    };
    let now = crate::x509::unix_to_rfc3339(now_unix() as i64);
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{pod}."), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod,
            "namespace": namespace, "uid": env("POD_UID").unwrap_or_default()},
        "reason": "ServingCertificatePending",
        "message": format!(
            "the hub's serving certificate request {csr} waits for approval, and the hub is \
             not ready until it is approved: {}",
            who_approves(csr)
        ),
        "type": "Warning",
        "source": {"component": "hub", "host": node},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let path = format!("/api/v1/namespaces/{namespace}/events");
    match call(cloud, Method::POST, &path, Some(&event)).await {
        Ok((201, _)) => tracing::info!(csr, pod, "said on the pod that the CSR waits"),
        Ok((code, answer)) => tracing::warn!(
            csr,
            "the pod's Event about the waiting CSR was refused ({code}): {}",
            answer["message"].as_str().unwrap_or("")
        ),
        Err(e) => tracing::warn!(csr, "the pod's Event about the waiting CSR: {e}"),
    }
}

/// Gets a fresh pair if needed: returns once `managed` holds a usable certificate,
/// retrying with backoff while the cloud is unreachable or the CSR is not approved.
pub async fn ensure(
    cloud: &Cloud,
    node: &str,
    sans: &[String],
    managed: &Managed,
    state: &HubState,
) {
    let mut backoff = Duration::from_secs(1);
    while !managed.fresh(now_unix()) {
        match request(cloud, node, sans, managed, Duration::from_secs(300), state).await {
            Ok(()) => return,
            Err(e) => {
                // An old pair that still works is used until the renewal succeeds.
                if managed.validity().is_some_and(|(_, to)| now_unix() < to) {
                    tracing::warn!(
                        "serving certificate renewal failed, using the current one: {e}"
                    );
                    return;
                }
                tracing::warn!("no serving certificate yet: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Seconds until the stored certificate is due for renewal (0 if it is due or unreadable).
fn until_renewal(managed: &Managed, now: u64) -> u64 {
    managed.validity().map_or(0, |(from, to)| {
        let due = from + (to.saturating_sub(from) as f64 * RENEW_AT) as u64;
        due.saturating_sub(now)
    })
}

/// Renews the managed certificate when 80 % of its lifetime has passed, until `stop`.
pub async fn renew_forever(
    cloud: Arc<Cloud>,
    node: String,
    sans: Vec<String>,
    managed: Managed,
    state: Arc<HubState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        // Wake when renewal is due, and at least every minute (clock changes, rewrites).
        let wait = Duration::from_secs(until_renewal(&managed, now_unix()).clamp(1, 60));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !managed.fresh(now_unix()) {
            ensure(&cloud, &node, &sans, &managed, &state).await;
        }
    }
}
