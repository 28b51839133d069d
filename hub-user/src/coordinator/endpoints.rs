//! Keeps the etcd client's balance to the members that answer.
//!
//! etcd-client spreads requests over every configured endpoint and keeps giving a share to
//! one that is down (those fail with "tcp connect error"), so a single dead member of three
//! made the whole coordinator look unreachable although the other two held quorum. This
//! task asks each member on its own, once a second, and keeps in the balance only those
//! that answer — every one of them when none does, so nothing is lost by guessing.
use std::{collections::HashMap, time::Duration};

use etcd_client::{Client, TlsOptions};
use tokio::sync::watch;

use super::storage;

const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A member that takes longer than this to answer a status request counts as down.
const ANSWER_WITHIN: Duration = Duration::from_millis(800);

/// One member: its own client (None until a connection succeeds) and whether the shared
/// client's balance includes it.
struct Member {
    endpoint: String,
    probe: Option<Client>,
    balanced: bool,
}

impl Member {
    /// Whether the member answers a status request now.
    async fn answers(&mut self, tls: &Option<TlsOptions>) -> bool {
        if self.probe.is_none() {
            let connect = storage::connect(
                std::slice::from_ref(&self.endpoint),
                tls.clone(),
                ANSWER_WITHIN,
            );
            self.probe = tokio::time::timeout(ANSWER_WITHIN, connect)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(probe) = &self.probe else {
            return false;
        };
        let mut m = probe.maintenance_client();
        let ok = matches!(
            tokio::time::timeout(ANSWER_WITHIN, m.status()).await,
            Ok(Ok(_))
        );
        if !ok {
            // A fresh connection next time: the old one may be stuck on a frozen member.
            self.probe = None;
        }
        ok
    }
}

/// Tends `client`'s balance over `endpoints` until `stop`; `report` is told the members
/// that do not answer after every check.
pub async fn tend(
    client: Client,
    endpoints: Vec<String>,
    tls: Option<TlsOptions>,
    report: impl Fn(Vec<String>) + Send + 'static,
    mut stop: watch::Receiver<bool>,
) {
    if endpoints.len() < 2 {
        return;
    }
    let mut members: Vec<Member> = endpoints
        .into_iter()
        .map(|endpoint| Member {
            endpoint,
            probe: None,
            balanced: true,
        })
        .collect();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let mut up = HashMap::new();
        for m in &mut members {
            up.insert(m.endpoint.clone(), m.answers(&tls).await);
        }
        let any_up = up.values().any(|u| *u);
        report(
            members
                .iter()
                .filter(|m| !up[&m.endpoint])
                .map(|m| m.endpoint.clone())
                .collect(),
        );
        for m in &mut members {
            let want = up[&m.endpoint] || !any_up;
            if want == m.balanced {
                continue;
            }
            let changed = if want {
                client.add_endpoint(&m.endpoint).await
            } else {
                client.remove_endpoint(&m.endpoint).await
            };
            match changed {
                Ok(()) => {
                    m.balanced = want;
                    tracing::info!(
                        endpoint = m.endpoint,
                        "coordinator: member {}",
                        if want {
                            "answers again: back in the balance"
                        } else {
                            "does not answer: taken out of the balance"
                        }
                    );
                }
                Err(e) => tracing::warn!(endpoint = m.endpoint, "coordinator: {e}"),
            }
        }
    }
}
