//! TLS material for talking to the cloud: the cloud CA, and the node's own identity
//! (client certificate) from cloud.certFile/keyFile or the kubelet kubeconfig.
use std::{path::Path, sync::Arc};

use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{what}: {reason}")]
    Load { what: String, reason: String },
}

fn load_err(what: impl std::fmt::Display, reason: impl std::fmt::Display) -> IdentityError {
    IdentityError::Load {
        what: what.to_string(),
        reason: reason.to_string(),
    }
}

/// A client certificate chain and its key.
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for ClientIdentity {
    fn clone(&self) -> Self {
        ClientIdentity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

pub fn certs_from_pem(
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, IdentityError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| load_err(what, e))?;
    if certs.is_empty() {
        return Err(load_err(what, "no PEM certificate found"));
    }
    Ok(certs)
}

pub fn read(path: &Path) -> Result<Vec<u8>, IdentityError> {
    std::fs::read(path).map_err(|e| load_err(path.display(), e))
}

pub fn identity_from_pem(
    cert: &[u8],
    key: &[u8],
    what: &str,
) -> Result<ClientIdentity, IdentityError> {
    Ok(ClientIdentity {
        chain: certs_from_pem(cert, what)?,
        key: PrivateKeyDer::from_pem_slice(key).map_err(|e| load_err(what, format!("key: {e}")))?,
    })
}

pub fn roots(ca_pem: &[u8], what: &str) -> Result<RootCertStore, IdentityError> {
    let mut roots = RootCertStore::empty();
    for c in certs_from_pem(ca_pem, what)? {
        roots.add(c).map_err(|e| load_err(what, e))?;
    }
    Ok(roots)
}

/// What a kubeconfig says about the current user and cluster (PEM bytes, files resolved).
#[derive(Default)]
pub struct KubeconfigParts {
    pub server: Option<String>,
    pub ca_pem: Option<Vec<u8>>,
    pub cert_pem: Option<Vec<u8>>,
    pub key_pem: Option<Vec<u8>>,
}

pub fn read_kubeconfig(path: &Path) -> Result<KubeconfigParts, IdentityError> {
    read_kubeconfig_under(Path::new("/"), path)
}

/// A kubeconfig of a node whose root is `root` (`hub run --check --node-root`): its own
/// path and the files it names, resolved against the kubeconfig's directory as client-go
/// does, are read under `root`.
pub fn read_kubeconfig_under(root: &Path, path: &Path) -> Result<KubeconfigParts, IdentityError> {
    use base64::Engine;
    let what = path.display().to_string();
    let read =
        |p: &Path| crate::node_layout::read_under(root, p).map_err(|e| load_err(p.display(), e));
    let doc: serde_yaml::Value =
        serde_yaml::from_slice(&read(path)?).map_err(|e| load_err(&what, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let context_name = doc["current-context"].as_str().unwrap_or_default();
    let named = |list: &str, name: &str| -> serde_yaml::Value {
        doc[list]
            .as_sequence()
            .and_then(|s| {
                s.iter()
                    .find(|e| e["name"].as_str() == Some(name) || name.is_empty())
            })
            .cloned()
            .unwrap_or_default()
    };
    let context = named("contexts", context_name);
    let cluster = named(
        "clusters",
        context["context"]["cluster"].as_str().unwrap_or_default(),
    );
    let user = named(
        "users",
        context["context"]["user"].as_str().unwrap_or_default(),
    );
    let material = |node: &serde_yaml::Value,
                    data: &str,
                    file: &str|
     -> Result<Option<Vec<u8>>, IdentityError> {
        if let Some(d) = node[data].as_str() {
            return base64::engine::general_purpose::STANDARD
                .decode(d.trim())
                .map(Some)
                .map_err(|e| load_err(&what, format!("{data}: {e}")));
        }
        match node[file].as_str() {
            Some(f) => read(&dir.join(f)).map(Some),
            None => Ok(None),
        }
    };
    Ok(KubeconfigParts {
        server: cluster["cluster"]["server"].as_str().map(String::from),
        ca_pem: material(
            &cluster["cluster"],
            "certificate-authority-data",
            "certificate-authority",
        )?,
        cert_pem: material(
            &user["user"],
            "client-certificate-data",
            "client-certificate",
        )?,
        key_pem: material(&user["user"], "client-key-data", "client-key")?,
    })
}

/// A rustls client config trusting `roots`, presenting `identity` if given.
pub fn client_config(
    roots: &RootCertStore,
    identity: Option<&ClientIdentity>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, IdentityError> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| load_err("TLS", e))?
            .with_root_certificates(roots.clone());
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| load_err("node client certificate", e))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
