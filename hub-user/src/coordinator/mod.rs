//! The pool coordinator: objects in the pool's etcd under kube-apiserver's own key layout
//! (`keys`), written by single-Txn operations with freshness decided inside etcd
//! (`storage`), and the local record of which keys this hub owns (`owned`).
pub mod keys;
pub mod owned;
pub mod storage;
