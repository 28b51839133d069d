//! The hub's serving certificate: loaded from tls.certFile/keyFile, re-read when the files
//! change (rotation without dropping connections: new handshakes get the new certificate),
//! with client certificates optional but verified against tls.clientCaFile — re-read
//! when it changes too (a rotated cluster CA).
//!
//! Intercepted clients connect by IP and send no SNI, so one certificate whose SANs cover
//! every name and address clients use serves every listener.
use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use rustls::{
    DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::{
        ClientHello, ResolvesServerCert, WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::CertifiedKey,
};

use crate::upstream::identity::{certs_from_pem, read, roots};

#[derive(Debug, thiserror::Error)]
#[error("serving certificate: {0}")]
pub struct ServingError(String);

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, ServingError> {
    let chain: Vec<CertificateDer<'static>> = certs_from_pem(
        &read(cert).map_err(|e| ServingError(e.to_string()))?,
        &cert.display().to_string(),
    )
    .map_err(|e| ServingError(e.to_string()))?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ServingError(format!("{}: {e}", key.display())))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| ServingError(format!("{}: {e}", key.display())))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Hands out the current certificate; `reload_if_changed` swaps it when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>, Option<SystemTime>)>,
}

impl ReloadingCert {
    pub fn new(cert_file: &Path, key_file: &Path) -> Result<Self, ServingError> {
        Ok(ReloadingCert {
            current: RwLock::new((
                load(cert_file, key_file)?,
                mtime(cert_file),
                mtime(key_file),
            )),
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
        })
    }

    /// Re-reads the files if either changed; a broken new pair keeps the old one.
    pub fn reload_if_changed(&self) -> Result<bool, ServingError> {
        let (c, k) = (mtime(&self.cert_file), mtime(&self.key_file));
        {
            let cur = self.current.read().unwrap();
            if cur.1 == c && cur.2 == k {
                return Ok(false);
            }
        }
        let fresh = load(&self.cert_file, &self.key_file)?;
        *self.current.write().unwrap() = (fresh, c, k);
        Ok(true)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap().0.clone())
    }
}

/// A verifier of client certificates against the CA in tls.clientCaFile (client
/// certificates stay optional: tokens authenticate too).
fn client_verifier(ca: &Path) -> Result<Arc<dyn ClientCertVerifier>, ServingError> {
    let roots = roots(
        &read(ca).map_err(|e| ServingError(e.to_string()))?,
        &ca.display().to_string(),
    )
    .map_err(|e| ServingError(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| ServingError(e.to_string()))
}

/// Verifies client certificates against tls.clientCaFile as it is now: the file is
/// re-read when it changes, and a broken new file keeps the old CA.
#[derive(Debug)]
pub struct ReloadingClientCa {
    file: PathBuf,
    current: RwLock<(Arc<dyn ClientCertVerifier>, Option<SystemTime>)>,
}

impl ReloadingClientCa {
    pub fn new(file: &Path) -> Result<Self, ServingError> {
        Ok(ReloadingClientCa {
            current: RwLock::new((client_verifier(file)?, mtime(file))),
            file: file.to_owned(),
        })
    }

    pub fn reload_if_changed(&self) -> Result<bool, ServingError> {
        let m = mtime(&self.file);
        if self.current.read().unwrap().1 == m {
            return Ok(false);
        }
        let fresh = client_verifier(&self.file)?;
        *self.current.write().unwrap() = (fresh, m);
        Ok(true)
    }

    fn now(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().unwrap().0.clone()
    }
}

impl ClientCertVerifier for ReloadingClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The hints are optional; a changing CA cannot lend out a borrowed list.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.now()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.now().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.now().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.now().supported_verify_schemes()
    }
}

/// The server config for every TLS listener of the hub (ALPN h2 and http/1.1).
pub fn server_config(
    cert: Arc<ReloadingCert>,
    client_ca: Option<Arc<ReloadingClientCa>>,
) -> Result<Arc<ServerConfig>, ServingError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServingError(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(ca),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks the certificate files (and the client CA) every `every` until `stop`.
pub async fn watch_files(
    cert: Arc<ReloadingCert>,
    client_ca: Option<Arc<ReloadingClientCa>>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        match cert.reload_if_changed() {
            Ok(true) => tracing::info!("serving certificate reloaded"),
            Ok(false) => {}
            Err(e) => tracing::warn!("keeping the current serving certificate: {e}"),
        }
        match client_ca.as_ref().map(|c| c.reload_if_changed()) {
            Some(Ok(true)) => tracing::info!("client CA (tls.clientCaFile) reloaded"),
            Some(Err(e)) => tracing::warn!("keeping the current client CA: {e}"),
            _ => {}
        }
    }
}
