//! The pool coordinator: objects in the pool's etcd under kube-apiserver's own key layout
//! (`keys`), written by single-Txn operations with freshness decided inside etcd
//! (`storage`), the local record of which keys this hub owns (`owned`), and the hub's part
//! in its pool: pushing (in kube-apiserver's storage encoding, converted on the node by
//! `crate::convert`), rebuild detection, serving the pool's data (`pool`, `watch`), and
//! the leader's sync of pool-scope resources from the cloud (`leader`, `cloud_get`) and its
//! sweep of what no live hub holds (`gc`), and the node's live pod state shared with the
//! pool while the cloud is unreachable (`live_pods`).
pub mod cloud_get;
pub mod election;
pub mod endpoints;
pub mod gc;
pub mod keys;
pub mod leader;
pub mod live_pods;
pub mod owned;
pub mod pool;
pub mod storage;
pub mod watch;
