//! The pool coordinator: objects in the pool's etcd under kube-apiserver's own key layout.
//! So far: the key layout. Storage operations, ownership and sync follow (issues 7, 8).
pub mod keys;
