//! A test PKI generated per run: one CA, serving certificates, client certificates
//! (CN = user, O = groups, as kube-apiserver reads them), and the identity of a verified
//! client certificate.
use std::{path::Path, sync::Arc};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    server::WebPkiClientVerifier,
};

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM and DER.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
}

impl Identity {
    /// Writes `<stem>.crt` and `<stem>.key` (owner-only) into `dir`.
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
    ) -> std::io::Result<(std::path::PathBuf, std::path::PathBuf)> {
        use std::os::unix::fs::PermissionsExt;
        let crt = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&crt, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        Ok((crt, key))
    }

    /// Reads a certificate and its PKCS#8 key back from the PEM files `write` made.
    pub fn read(crt: &Path, key: &Path) -> std::io::Result<Identity> {
        use rustls::pki_types::pem::PemObject;
        let cert_pem = std::fs::read_to_string(crt)?;
        let key_pem = std::fs::read_to_string(key)?;
        let bad = |e: rustls::pki_types::pem::Error| std::io::Error::other(e.to_string());
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(bad)?;
        let key_der = PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(bad)?
            .secret_pkcs8_der()
            .to_vec();
        Ok(Identity {
            cert_pem,
            key_pem,
            cert_der,
            key_der,
        })
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }
}

fn rustls_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA cert"),
        }
    }

    /// The signing side of the CA (for the CSR signer).
    pub fn issuer(&self) -> &rcgen::Issuer<'static, KeyPair> {
        &self.issuer
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    fn issue(&self, params: CertificateParams) -> Identity {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    /// A serving certificate for DNS names and IP addresses.
    pub fn server(&self, sans: &[&str]) -> Identity {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*s).try_into().expect("DNS SAN")),
            })
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate: CN is the user, O the group (rcgen writes one O at most).
    pub fn client(&self, user: &str, group: Option<&str>) -> Identity {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(g) = group {
            params.distinguished_name.push(DnType::OrganizationName, g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    /// rustls server config: this identity, client certificates optional but verified
    /// against this CA, ALPN h2 and http/1.1 (as kube-apiserver).
    pub fn server_config(&self, serving: &Identity) -> Arc<ServerConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der()).expect("CA into roots");
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), rustls_provider())
                .allow_unauthenticated()
                .build()
                .expect("client verifier");
        let mut config = ServerConfig::builder_with_provider(rustls_provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![serving.cert_der.clone()], serving.key())
            .expect("server cert");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// Files a hub needs to sit in front of a cloud whose CA is `ca`.
pub struct HubPki {
    pub ca: std::path::PathBuf,
    /// The hub's serving certificate (SANs: loopback, the default hub address, the
    /// in-cluster names) and key.
    pub serving: (std::path::PathBuf, std::path::PathBuf),
    /// The node identity the hub presents to the cloud: CN system:node:<node>.
    pub node: (std::path::PathBuf, std::path::PathBuf),
    /// A kubelet-style client certificate for clients of the hub (same CN).
    pub kubelet: Identity,
}

impl TestCa {
    pub fn write_hub_pki(
        &self,
        dir: &Path,
        node_name: &str,
        extra_sans: &[&str],
    ) -> std::io::Result<HubPki> {
        std::fs::create_dir_all(dir)?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, self.cert_pem())?;
        let mut sans = vec![
            "127.0.0.1",
            "::1",
            "localhost",
            "169.254.2.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        sans.extend_from_slice(extra_sans);
        let serving = self.server(&sans).write(dir, "hub-serving")?;
        let user = format!("system:node:{node_name}");
        let node = self
            .client(&user, Some("system:nodes"))
            .write(dir, "hub-node")?;
        Ok(HubPki {
            ca,
            serving,
            node,
            kubelet: self.client(&user, Some("system:nodes")),
        })
    }
}

/// (CN, [O...]) of a DER certificate's subject (the hub's own reader: the stand-in reads
/// client certificates the way the hub does, and kube-apiserver before both).
pub use hub::x509::subject_cn_and_orgs;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificate_subject_is_read_back() {
        let ca = TestCa::new("t");
        let id = ca.client("system:node:edge-1", Some("system:nodes"));
        let (cn, orgs) = subject_cn_and_orgs(&id.cert_der).unwrap();
        assert_eq!(cn, "system:node:edge-1");
        assert_eq!(orgs, vec!["system:nodes"]);
        // rcgen's default validity: 1975-01-01 (UTCTime) to 4096-01-01 (GeneralizedTime).
        let (from, to) = hub::x509::validity(&id.cert_der).unwrap();
        assert_eq!(from, 157_766_400);
        assert!(to > 60_000_000_000, "{to}");
    }
}
