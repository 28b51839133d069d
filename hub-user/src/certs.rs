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

use crate::upstream::{Cloud, cloud::AsWho};

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

/// Requests a serving certificate for `sans` and waits (up to `wait`) for the cloud to
/// approve and sign it; stores the pair in `managed`.
pub async fn request(
    cloud: &Cloud,
    node: &str,
    sans: &[String],
    managed: &Managed,
    wait: Duration,
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
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (_, csr) = call(cloud, Method::GET, &format!("{base}/{name}"), None).await?;
        let conditions = csr["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(c) = conditions
            .iter()
            .find(|c| c["type"] == "Denied" || c["type"] == "Failed")
        {
            return Err(CertError::Csr {
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
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(CertError::Csr {
                name,
                reason: "not approved and signed in time".into(),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Gets a fresh pair if needed: returns once `managed` holds a usable certificate,
/// retrying with backoff while the cloud is unreachable or the CSR is not approved.
pub async fn ensure(cloud: &Cloud, node: &str, sans: &[String], managed: &Managed) {
    let mut backoff = Duration::from_secs(1);
    while !managed.fresh(now_unix()) {
        match request(cloud, node, sans, managed, Duration::from_secs(300)).await {
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
            ensure(&cloud, &node, &sans, &managed).await;
        }
    }
}
