//! The cloud a scenario talks to: the API stand-in by default, or a real kube-apiserver
//! when HUB_TEST_APISERVER is set (design.md §8):
//!
//!   HUB_TEST_APISERVER=https://host:port
//!   HUB_TEST_APISERVER_CA=/path/ca.crt        (PEM)
//!   HUB_TEST_APISERVER_TOKEN=<bearer token>   (allowed to manage configmaps in a test namespace)
//!
//! Scenarios built on it use only what every apiserver has (namespaces, configmaps, list,
//! watch); scenarios that need the stand-in's knobs (faults, audit, seed) use it directly.
use std::{net::SocketAddr, sync::Arc};

use crate::apiserver::{ADMIN_TOKEN, Options, StandIn, tls::TestCa};

pub struct TestCloud {
    pub url: String,
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub token: String,
    /// Set when the cloud is the stand-in (kept alive for the scenario).
    pub standin: Option<StandIn>,
}

impl TestCloud {
    pub fn from_env_or_standin() -> TestCloud {
        match std::env::var("HUB_TEST_APISERVER") {
            Ok(url) if !url.is_empty() => {
                let ca = std::env::var("HUB_TEST_APISERVER_CA")
                    .expect("HUB_TEST_APISERVER_CA (PEM file)");
                let token =
                    std::env::var("HUB_TEST_APISERVER_TOKEN").expect("HUB_TEST_APISERVER_TOKEN");
                let authority = url.trim_start_matches("https://").trim_end_matches('/');
                let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
                    .ok()
                    .and_then(|mut a| a.next())
                    .unwrap_or_else(|| panic!("cannot resolve {authority}"));
                eprintln!("scenario cloud: real apiserver {url}");
                TestCloud {
                    url,
                    addr,
                    ca_pem: std::fs::read_to_string(&ca).unwrap_or_else(|e| panic!("{ca}: {e}")),
                    token,
                    standin: None,
                }
            }
            _ => {
                let s = StandIn::start_with_ca(
                    "127.0.0.1:0".parse().unwrap(),
                    Options::default(),
                    Arc::new(TestCa::new("cloud-ca")),
                )
                .expect("stand-in");
                TestCloud {
                    url: s.url(),
                    addr: s.addr,
                    ca_pem: s.ca.cert_pem(),
                    token: ADMIN_TOKEN.to_string(),
                    standin: Some(s),
                }
            }
        }
    }

    pub fn ca_der(&self) -> rustls::pki_types::CertificateDer<'static> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).expect("CA PEM")
    }
}
