//! Authorization stays the cloud's: a credential is answered from a shared set only while
//! the cloud has lately answered that credential's own request for the same verb,
//! resource, namespace and selectors. This memo holds those answers for a bounded time;
//! a real request of the credential renews one. A refusal is never kept as a permission:
//! it removes the entry.
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Entries kept at most; past this, expired ones go first, then any.
const MAX_ENTRIES: usize = 8192;

/// One request's authorization attributes, as kube-apiserver's authorizers see them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The cache's name for the credential (a SHA-256 of a token, or the node).
    pub credential: String,
    /// `get`, `list` or `watch` (kube-apiserver authorizes them apart).
    pub verb: &'static str,
    pub gvr: String,
    /// Empty for all namespaces.
    pub namespace: String,
    /// The object a GET names (RBAC may allow some names only); empty for a collection.
    pub name: String,
    pub label_selector: String,
    pub field_selector: String,
}

pub struct Memo {
    ttl: Duration,
    allowed: Mutex<HashMap<Scope, Instant>>,
}

impl Memo {
    pub fn new(ttl: Duration) -> Memo {
        Memo {
            ttl,
            allowed: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Instant>> {
        self.allowed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cloud answered this scope's own request within the memo's time.
    pub fn allows(&self, scope: &Scope) -> bool {
        self.lock()
            .get(scope)
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// The cloud answered a request of this scope (2xx).
    pub fn allowed(&self, scope: Scope) {
        let mut m = self.lock();
        if m.len() >= MAX_ENTRIES && !m.contains_key(&scope) {
            let ttl = self.ttl;
            m.retain(|_, at| at.elapsed() < ttl);
            if m.len() >= MAX_ENTRIES
                && let Some(any) = m.keys().next().cloned()
            {
                m.remove(&any);
            }
        }
        m.insert(scope, Instant::now());
    }

    /// The cloud refused a request of this scope: nothing is served to it from here.
    pub fn refused(&self, scope: &Scope) {
        self.lock().remove(scope);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(credential: &str, verb: &'static str, fields: &str) -> Scope {
        Scope {
            credential: credential.into(),
            verb,
            gvr: "/v1/services".into(),
            namespace: String::new(),
            name: String::new(),
            label_selector: String::new(),
            field_selector: fields.into(),
        }
    }

    #[test]
    fn only_the_answered_scope_of_the_answered_credential_is_allowed_and_only_for_a_while() {
        let memo = Memo::new(Duration::from_millis(300));
        let a = scope("token-a", "list", "");
        memo.allowed(a.clone());
        assert!(memo.allows(&a));
        // Another credential, verb or selector is not covered.
        assert!(!memo.allows(&scope("token-b", "list", "")));
        assert!(!memo.allows(&scope("token-a", "watch", "")));
        assert!(!memo.allows(&scope("token-a", "list", "spec.clusterIP!=None")));
        // A refusal removes it at once.
        memo.refused(&a);
        assert!(!memo.allows(&a));
        // And it lapses.
        memo.allowed(a.clone());
        std::thread::sleep(Duration::from_millis(350));
        assert!(!memo.allows(&a));
    }

    #[test]
    fn the_memo_stays_bounded() {
        let memo = Memo::new(Duration::from_secs(60));
        for n in 0..MAX_ENTRIES + 10 {
            memo.allowed(scope(&format!("t{n}"), "list", ""));
        }
        assert_eq!(memo.len(), MAX_ENTRIES);
    }
}
