//! The routing decision (design.md §5, from the user's seed), as one pure function.
//!
//! ```text
//! cloud healthy:
//!     coordinator healthy && not the pool leader && pool-scope resource -> coordinator
//!         (once a leader has synced it; until then the cloud)
//!     otherwise -> cloud; on a transport error fall through
//! coordinator healthy -> coordinator; on error fall through
//! otherwise -> local cache
//! ```
//! With one refinement: once the cloud cannot answer, the node's own data (every resource
//! that is not pool-scope) is read from the local cache before the coordinator. A hub
//! pushes that data from its cache, a second or so later, and no other hub writes it: the
//! coordinator's copy is never newer, and may be older — a pod whose deletion the node
//! already passed on would come back. The coordinator answers what the cache lacks.
//! Just after start, before any probe has reported, the cloud's health is unknown: reads
//! the local cache can answer are answered from it first, so an offline restart answers
//! at once instead of waiting for a frozen cloud to time out.
//! Requests only the cloud can answer truthfully (exec, attach, port-forward, logs, most
//! writes) always go to the cloud and fail with a clear Status when it is unreachable.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    Cloud,
    Coordinator,
    LocalCache,
    /// The node-level watch cache (`crate::shared`): the cloud's data, held once for the
    /// node, answered in the cloud's stead while the cloud is up.
    NodeWatchCache,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Cloud => "cloud",
            Route::Coordinator => "coordinator",
            Route::LocalCache => "local-cache",
            Route::NodeWatchCache => "node-watch-cache",
        }
    }
}

/// Everything the decision depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inputs {
    pub cloud_healthy: bool,
    /// No probe or request has reported on the cloud yet (the hub just started).
    pub cloud_unknown: bool,
    pub coordinator_healthy: bool,
    /// This hub is the pool leader (it serves pool-scope resources from the cloud).
    pub leader: bool,
    /// The resource is in coordinator.poolScopeResources.
    pub pool_scope: bool,
    /// Only the cloud can answer it truthfully (streams, upgrades, most writes).
    pub cloud_only: bool,
}

/// The routes to try, in order; the next one is tried when one fails.
pub fn plan(i: Inputs) -> Vec<Route> {
    use Route::*;
    if i.cloud_only {
        return vec![Cloud];
    }
    if i.cloud_unknown {
        return vec![LocalCache, Cloud];
    }
    if i.cloud_healthy {
        if i.coordinator_healthy && !i.leader && i.pool_scope {
            // The cloud answers when no leader has synced the resource yet.
            return vec![Coordinator, Cloud, LocalCache];
        }
        let mut p = vec![Cloud];
        p.extend(offline(i));
        return p;
    }
    offline(i)
}

/// Where a read goes when the cloud cannot answer it.
fn offline(i: Inputs) -> Vec<Route> {
    use Route::*;
    match (i.coordinator_healthy, i.pool_scope) {
        (true, true) => vec![Coordinator, LocalCache],
        (true, false) => vec![LocalCache, Coordinator],
        (false, _) => vec![LocalCache],
    }
}

#[cfg(test)]
mod tests {
    use super::{Route::*, *};

    fn inputs(cloud: bool, coord: bool, leader: bool, pool: bool) -> Inputs {
        Inputs {
            cloud_healthy: cloud,
            cloud_unknown: false,
            coordinator_healthy: coord,
            leader,
            pool_scope: pool,
            cloud_only: false,
        }
    }

    #[test]
    fn every_row_of_the_table() {
        // cloud healthy, follower, pool-scope, coordinator healthy -> coordinator first
        // (the cloud when no leader has synced it yet).
        assert_eq!(
            plan(inputs(true, true, false, true)),
            vec![Coordinator, Cloud, LocalCache]
        );
        // the leader serves pool-scope resources from the cloud itself.
        assert_eq!(
            plan(inputs(true, true, true, true)),
            vec![Cloud, Coordinator, LocalCache]
        );
        // not pool-scope -> cloud, falling through to the node's cache, then the
        // coordinator (for what the cache lacks).
        assert_eq!(
            plan(inputs(true, true, false, false)),
            vec![Cloud, LocalCache, Coordinator]
        );
        // coordinator down -> cloud, then the cache.
        assert_eq!(
            plan(inputs(true, false, false, true)),
            vec![Cloud, LocalCache]
        );
        assert_eq!(
            plan(inputs(true, false, true, false)),
            vec![Cloud, LocalCache]
        );
        // cloud down, coordinator up -> pool-scope from the coordinator, the node's own
        // data from its cache first.
        assert_eq!(
            plan(inputs(false, true, false, false)),
            vec![LocalCache, Coordinator]
        );
        assert_eq!(
            plan(inputs(false, true, true, true)),
            vec![Coordinator, LocalCache]
        );
        // both down -> local cache.
        assert_eq!(plan(inputs(false, false, false, true)), vec![LocalCache]);
        assert_eq!(plan(inputs(false, false, true, false)), vec![LocalCache]);
    }

    #[test]
    fn unknown_cloud_health_tries_the_cache_first() {
        let mut i = inputs(true, false, false, false);
        i.cloud_unknown = true;
        assert_eq!(plan(i), vec![LocalCache, Cloud]);
        i.cloud_only = true;
        assert_eq!(plan(i), vec![Cloud]);
    }

    #[test]
    fn cloud_only_requests_never_go_elsewhere() {
        for (cloud, coord) in [(true, true), (false, true), (false, false)] {
            let mut i = inputs(cloud, coord, false, true);
            i.cloud_only = true;
            assert_eq!(plan(i), vec![Cloud]);
        }
    }
}
