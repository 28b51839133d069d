//! `hub approver`, run in the cloud: approves a node's `kubernetes.io/kubelet-serving`
//! CertificateSigningRequest only when every name and address in it is one the hub of that
//! node needs, and denies anything else with the reason on the CSR.
//!
//! A hub's serving certificate is trusted by the cluster as the apiserver, so an approver
//! that signs whatever a node asks for lets a compromised node pose as the apiserver for
//! any name. Allowed: the node's own addresses and host names (its Node object's
//! `status.addresses`), the hub addresses, the in-cluster names of the apiserver, the
//! `kubernetes` Service's cluster IPs and configured VIPs, and loopback. The subject must
//! be `CN=system:node:<node>, O=system:nodes` of the node that asked, and the usages those
//! of a TLS server.
use std::{collections::BTreeSet, net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use hyper::Method;
use rcgen::{CertificateSigningRequestParams, DnType, DnValue, SanType};
use serde_json::{Value, json};

use crate::upstream::{Cloud, cloud::AsWho, identity};

const SIGNER: &str = crate::certs::SIGNER;
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const SERVER_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// What the approver is told about the cluster beyond what it reads from it.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The hubs' addresses (intercept.hubAddress, hubAddress6).
    pub hub_addresses: Vec<IpAddr>,
    /// Names clients use for the apiserver (kubernetes.default.svc...).
    pub names: Vec<String>,
    /// VIPs beyond the `kubernetes` Service's cluster IPs.
    pub vips: Vec<IpAddr>,
}

impl Policy {
    /// The in-cluster names of the apiserver for cluster domain `domain`.
    pub fn in_cluster_names(domain: &str) -> Vec<String> {
        let mut names: Vec<String> = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
            .map(String::from)
            .to_vec();
        names.push(format!("kubernetes.default.svc.{domain}"));
        names.push("localhost".into());
        names
    }
}

/// Where and as whom the approver reaches the cloud.
pub struct Connection {
    pub server: String,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
}

/// The decision on one CSR of a node: Ok to approve, Err with the reason to deny.
pub fn judge(
    csr: &Value,
    node: &str,
    node_object: &Value,
    service_ips: &[IpAddr],
    policy: &Policy,
) -> Result<(), String> {
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap_or_default())
        .map_err(|e| format!("spec.request is not base64: {e}"))?;
    let pem = String::from_utf8(pem).map_err(|_| "spec.request is not PEM".to_string())?;
    let request = CertificateSigningRequestParams::from_pem(&pem)
        .map_err(|e| format!("spec.request is not a certificate request: {e}"))?;
    let params = &request.params;
    let text = |v: &DnValue| -> Option<String> {
        match v {
            DnValue::Utf8String(s) => Some(s.clone()),
            DnValue::PrintableString(p) => Some(p.as_str().to_string()),
            DnValue::Ia5String(i) => Some(i.as_str().to_string()),
            _ => None,
        }
    };
    let cn = params
        .distinguished_name
        .get(&DnType::CommonName)
        .and_then(text);
    let want = format!("system:node:{node}");
    if cn.as_deref() != Some(want.as_str()) {
        return Err(format!(
            "the subject is {cn:?}, not {want:?}, the node that asked"
        ));
    }
    let org = params
        .distinguished_name
        .get(&DnType::OrganizationName)
        .and_then(text);
    if org.as_deref() != Some("system:nodes") {
        return Err(format!(
            "the subject's organization is {org:?}, not \"system:nodes\""
        ));
    }
    let usages: Vec<&str> = csr["spec"]["usages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if let Some(u) = usages.iter().find(|u| !SERVER_USAGES.contains(u)) {
        return Err(format!("usage {u:?} is not one of a TLS server's"));
    }
    let mut names: BTreeSet<String> = policy.names.iter().cloned().collect();
    let mut ips: BTreeSet<IpAddr> = policy
        .hub_addresses
        .iter()
        .chain(&policy.vips)
        .chain(service_ips)
        .copied()
        .collect();
    ips.extend(["127.0.0.1", "::1"].map(|a| a.parse::<IpAddr>().expect("loopback")));
    for a in node_object["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(address) = a["address"].as_str() else {
            continue;
        };
        match address.parse::<IpAddr>() {
            Ok(ip) => {
                ips.insert(ip);
            }
            Err(_) => {
                names.insert(address.to_string());
            }
        }
    }
    let mut refused = Vec::new();
    for san in &params.subject_alt_names {
        match san {
            SanType::IpAddress(ip) if ips.contains(ip) => {}
            SanType::DnsName(n) if names.contains(n.as_str()) => {}
            SanType::IpAddress(ip) => refused.push(ip.to_string()),
            SanType::DnsName(n) => refused.push(n.as_str().to_string()),
            other => refused.push(format!("{other:?}")),
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not a name or address the hub of node {node} needs: {}",
            refused.join(", ")
        ))
    }
}

/// Pending: neither approved nor denied yet.
fn pending(csr: &Value) -> bool {
    !csr["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
}

/// The cloud, as the approver's service account.
struct Api {
    cloud: Cloud,
    token: String,
}

impl Api {
    fn connect(c: &Connection) -> Result<Api, String> {
        let ca = identity::read(&c.ca_file).map_err(|e| e.to_string())?;
        let roots = identity::roots(&ca, "approver CA").map_err(|e| e.to_string())?;
        let token = std::fs::read_to_string(&c.token_file)
            .map_err(|e| format!("{}: {e}", c.token_file.display()))?
            .trim()
            .to_string();
        let cloud = Cloud::new(std::slice::from_ref(&c.server), roots, None, 0)?;
        Ok(Api { cloud, token })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        self.cloud
            .json_call(
                AsWho::Caller,
                Some(&self.token),
                "hub/approver",
                method,
                path,
                body,
            )
            .await
    }
}

/// How one pass went.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub approved: usize,
    pub denied: usize,
}

/// One look at the pending kubelet-serving CSRs of nodes: each is approved or denied.
async fn pass(api: &Api, policy: &Policy) -> Result<Pass, String> {
    let (code, list) = api.call(Method::GET, CSRS, None).await?;
    if code != 200 {
        return Err(format!("listing CSRs answered {code}: {}", list["message"]));
    }
    let (_, svc) = api
        .call(
            Method::GET,
            "/api/v1/namespaces/default/services/kubernetes",
            None,
        )
        .await?;
    let service_ips: Vec<IpAddr> = svc["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&svc["spec"]["clusterIP"]))
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect();
    let mut done = Pass::default();
    for csr in list["items"].as_array().into_iter().flatten() {
        if csr["spec"]["signerName"] != SIGNER || !pending(csr) {
            continue;
        }
        let user = csr["spec"]["username"].as_str().unwrap_or_default();
        let is_node = csr["spec"]["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == "system:nodes"));
        let name = csr["metadata"]["name"].as_str().unwrap_or_default();
        let verdict = match user.strip_prefix("system:node:").filter(|_| is_node) {
            None => Err(format!("requested by {user:?}, not a node")),
            Some(node) => {
                let (code, node_object) = api
                    .call(Method::GET, &format!("/api/v1/nodes/{node}"), None)
                    .await?;
                if code == 200 {
                    judge(csr, node, &node_object, &service_ips, policy)
                } else {
                    Err(format!(
                        "node {node} is not registered (GET answered {code})"
                    ))
                }
            }
        };
        let (kind, reason, message) = match &verdict {
            Ok(()) => (
                "Approved",
                "HubApproverApproved",
                "every name and address is the node hub's own".to_string(),
            ),
            Err(why) => ("Denied", "HubApproverRefused", why.clone()),
        };
        let mut updated = csr.clone();
        let mut conditions = updated["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions
            .push(json!({"type": kind, "status": "True", "reason": reason, "message": message}));
        updated["status"]["conditions"] = Value::Array(conditions);
        let (code, answer) = api
            .call(
                Method::PUT,
                &format!("{CSRS}/{name}/approval"),
                Some(&updated),
            )
            .await?;
        if code != 200 {
            tracing::warn!(
                csr = name,
                "recording the decision answered {code}: {}",
                answer["message"]
            );
            continue;
        }
        match verdict {
            Ok(()) => {
                tracing::info!(csr = name, user, "approved");
                done.approved += 1;
            }
            Err(why) => {
                tracing::info!(csr = name, user, "denied: {why}");
                done.denied += 1;
            }
        }
    }
    Ok(done)
}

/// Approves and denies until stopped (or after one pass with `once`).
pub async fn run(
    connection: Connection,
    policy: Policy,
    every: Duration,
    once: bool,
) -> Result<Pass, String> {
    let api = Arc::new(Api::connect(&connection)?);
    loop {
        match pass(&api, &policy).await {
            Ok(p) if once => return Ok(p),
            Err(e) if once => return Err(e),
            Ok(_) => {}
            Err(e) => tracing::warn!("approver pass failed: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}
