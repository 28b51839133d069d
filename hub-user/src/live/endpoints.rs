//! Services that follow their pods while the cloud is unreachable: the EndpointSlices
//! (discovery.k8s.io/v1) and Endpoints (v1) the node's clients are served are adjusted, at
//! serve time, as the cloud's endpointslice and endpoints controllers would write them from
//! the pods as the node knows them now (their live entries): an endpoint naming a known
//! pod gets that pod's current IPs, readiness and node; one whose pod left service
//! (finished, no IP, or terminating where the service does not publish those) is dropped.
//! What the node does not know is served as the cloud wrote it, objects managed by any
//! other writer are left alone, and nothing adjusted is ever stored.
//!
//! An adjusted object is served with a resourceVersion below the cloud's one it came from,
//! lower by the writes of the pods that changed it, for the reason `crate::live` gives.
use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Entry;
use crate::cache::objects::{self, Encoding, Item};

/// The gvr of pods, EndpointSlices and Endpoints, as `RequestInfo::gvr` writes them.
pub const PODS: &str = "/v1/pods";
const SLICES: &str = "discovery.k8s.io/v1/endpointslices";
const ENDPOINTS: &str = "/v1/endpoints";

/// The label naming a slice's service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const SLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
const ENDPOINTS_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
const ENDPOINTS_CONTROLLER: &str = "endpoint-controller";
/// Set by the endpoints controller on what it writes (before 1.33 its only mark).
const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";

/// The kinds of object this module adjusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Slice,
    Endpoints,
}

impl Kind {
    pub fn of(gvr: &str) -> Option<Kind> {
        match gvr {
            SLICES => Some(Kind::Slice),
            ENDPOINTS => Some(Kind::Endpoints),
            _ => None,
        }
    }

    /// The resource's name in a path (`endpointslices`).
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Slice => "endpointslices",
            Kind::Endpoints => "endpoints",
        }
    }

    /// The service `obj` (an object of this kind) belongs to.
    pub fn service_of(self, obj: &Value) -> &str {
        match self {
            Kind::Slice => text(&obj["metadata"]["labels"][SERVICE_NAME]),
            Kind::Endpoints => text(&obj["metadata"]["name"]),
        }
    }
}

/// A pod as the node knows it now (also what a node shares of its pods with its pool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodNow {
    uid: String,
    ips: Vec<String>,
    ready: bool,
    terminating: bool,
    finished: bool,
    node_name: Option<String>,
    /// The writes the node made to it: what an adjustment it causes lowers the
    /// resourceVersion by.
    writes: u64,
}

impl PodNow {
    fn of(pod: &Value, writes: u64) -> PodNow {
        let status = &pod["status"];
        let mut ips: Vec<String> = status["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["ip"].as_str())
            .map(str::to_string)
            .collect();
        if ips.is_empty()
            && let Some(ip) = status["podIP"].as_str().filter(|ip| !ip.is_empty())
        {
            ips.push(ip.to_string());
        }
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        PodNow {
            uid: text(&pod["metadata"]["uid"]).to_string(),
            ips,
            ready,
            terminating: !pod["metadata"]["deletionTimestamp"].is_null(),
            finished: matches!(text(&status["phase"]), "Succeeded" | "Failed"),
            node_name: pod["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            writes,
        }
    }

    /// The node it runs on, if scheduled.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// Whether a controller keeps it among a service's endpoints: the endpointslice
    /// controller keeps terminating pods (marked so), the endpoints controller only where
    /// the service publishes pods that are not ready.
    fn in_service(&self, keep_terminating: bool) -> bool {
        !self.finished && !self.ips.is_empty() && (keep_terminating || !self.terminating)
    }

    fn ips_like(&self, ipv6: bool) -> Vec<String> {
        self.ips
            .iter()
            .filter(|ip| ip.contains(':') == ipv6)
            .cloned()
            .collect()
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// A pod's (namespace, name).
pub type PodId = (String, String);

/// The pods the node (or its pool) wrote while offline, by (namespace, name).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Pods(HashMap<PodId, PodNow>);

impl Pods {
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Pods {
        Pods(
            entries
                .into_iter()
                .filter(|e| e.gvr == PODS)
                .map(|e| {
                    (
                        (e.namespace.clone(), e.name.clone()),
                        PodNow::of(&e.state, e.writes),
                    )
                })
                .collect(),
        )
    }

    /// These pods, and those of `others` (what other nodes of the pool shared) in
    /// `namespace` (None: all) that are not among them: a node's own writes are the
    /// freshest word on its pods.
    pub fn and_others(mut self, others: &Pods, namespace: Option<&str>) -> Pods {
        for (id, pod) in &others.0 {
            if namespace.is_none_or(|ns| ns == id.0) && !self.0.contains_key(id) {
                self.0.insert(id.clone(), pod.clone());
            }
        }
        self
    }

    /// These pods in `namespace` (None: all).
    pub fn within(&self, namespace: Option<&str>) -> Pods {
        match namespace {
            None => self.clone(),
            Some(ns) => Pods(
                self.0
                    .iter()
                    .filter(|((n, _), _)| n == ns)
                    .map(|(id, p)| (id.clone(), p.clone()))
                    .collect(),
            ),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PodId, &PodNow)> {
        self.0.iter()
    }

    /// The pods whose state differs between `self` and `other` (added, changed or gone).
    pub fn differing<'a>(&'a self, other: &'a Pods) -> impl Iterator<Item = &'a PodId> {
        let changed = self
            .0
            .iter()
            .filter(move |(id, p)| other.0.get(*id) != Some(p));
        let gone = other.0.keys().filter(move |id| !self.0.contains_key(*id));
        changed.map(|(id, _)| id).chain(gone)
    }

    /// The namespaces these pods are in.
    pub fn namespaces(&self) -> BTreeSet<&str> {
        self.0.keys().map(|(ns, _)| ns.as_str()).collect()
    }

    /// Whether `body` (an object of `namespace`, in either encoding) may name one of the
    /// pods: the cheap test that spares reading whole the objects that cannot. With many
    /// pods in the namespace, searching for each costs more than reading the object.
    pub fn named_in(&self, namespace: &str, body: &[u8]) -> bool {
        const SEARCHED_AT_MOST: usize = 16;
        let names: Vec<&str> = self
            .0
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, name)| name.as_str())
            .take(SEARCHED_AT_MOST + 1)
            .collect();
        names.len() > SEARCHED_AT_MOST
            || names
                .iter()
                .any(|name| memchr::memmem::find(body, name.as_bytes()).is_some())
    }

    /// The pod an endpoint's `targetRef` names, if the node knows it as that pod (a pod of
    /// the same name made anew is another pod).
    fn target(&self, target_ref: &Value, namespace: &str) -> Option<&PodNow> {
        if target_ref["kind"] != "Pod" {
            return None;
        }
        let ns = target_ref["namespace"].as_str().unwrap_or(namespace);
        let pod = self
            .0
            .get(&(ns.to_string(), text(&target_ref["name"]).to_string()))?;
        let uid = text(&target_ref["uid"]);
        (uid.is_empty() || pod.uid.is_empty() || uid == pod.uid).then_some(pod)
    }
}

impl FromIterator<(PodId, PodNow)> for Pods {
    fn from_iter<I: IntoIterator<Item = (PodId, PodNow)>>(iter: I) -> Pods {
        Pods(iter.into_iter().collect())
    }
}

/// The objects of one answer (a list, a watch's scope) as their controllers would write them
/// from `pods`, each service's `publishNotReadyAddresses` looked up once.
pub struct Follow<'a, P: FnMut(&str, &str) -> Option<bool>> {
    kind: Kind,
    pods: &'a Pods,
    /// The service's `publishNotReadyAddresses`, if the node knows the service.
    publish_of: P,
    publish: HashMap<(String, String), Option<bool>>,
}

impl<'a, P: FnMut(&str, &str) -> Option<bool>> Follow<'a, P> {
    pub fn new(kind: Kind, pods: &'a Pods, publish_of: P) -> Self {
        Follow {
            kind,
            pods,
            publish_of,
            publish: HashMap::new(),
        }
    }

    /// `held` (an object of this kind as the cloud wrote it, in either encoding) as its
    /// controller would write it now, in JSON; None when nothing changes. `json` gives the
    /// object in JSON; it is asked only of objects that may name one of the pods.
    pub fn adjusted<'b>(
        &mut self,
        held: &Item,
        json: impl FnOnce() -> Option<Cow<'b, Item>>,
    ) -> Option<Item> {
        if self.pods.is_empty() || !self.pods.named_in(&held.namespace, &held.body) {
            return None;
        }
        let obj = serde_json::from_slice::<Value>(&json()?.body).ok()?;
        let service = (
            held.namespace.clone(),
            self.kind.service_of(&obj).to_string(),
        );
        let publishes = match self.publish.get(&service) {
            Some(p) => *p,
            None => {
                let p = if service.1.is_empty() {
                    None
                } else {
                    (self.publish_of)(&service.0, &service.1)
                };
                self.publish.insert(service, p);
                p
            }
        };
        let adjusted = adjust(self.kind, &obj, self.pods, publishes)?;
        objects::from_json(self.kind.resource(), adjusted, "", "").ok()
    }

    /// [`Follow::adjusted`] for an object held in one encoding only.
    pub fn adjusted_item(&mut self, held: &Item) -> Option<Item> {
        self.adjusted(held, || held.in_encoding(Encoding::Json))
    }
}

/// `obj` (an EndpointSlice or Endpoints as the cloud wrote it) as its controller would
/// write it from `pods`; None when nothing changes or a controller does not manage it.
/// `publish_not_ready` is the service's `publishNotReadyAddresses` when the node knows the
/// service.
pub fn adjust(
    kind: Kind,
    obj: &Value,
    pods: &Pods,
    publish_not_ready: Option<bool>,
) -> Option<Value> {
    let namespace = text(&obj["metadata"]["namespace"]);
    let labels = &obj["metadata"]["labels"];
    let (adjusted, lowered) = match kind {
        Kind::Slice => {
            if labels[SLICE_MANAGED_BY] != SLICE_CONTROLLER {
                return None;
            }
            adjust_slice(obj, namespace, pods, publish_not_ready)?
        }
        Kind::Endpoints => {
            if labels[ENDPOINTS_MANAGED_BY] != ENDPOINTS_CONTROLLER && labels[SKIP_MIRROR] != "true"
            {
                return None;
            }
            adjust_endpoints(obj, namespace, pods, publish_not_ready)?
        }
    };
    let mut out = adjusted;
    let rv: u64 = text(&obj["metadata"]["resourceVersion"]).parse().ok()?;
    out["metadata"]["resourceVersion"] = super::below(rv, lowered).to_string().into();
    Some(out)
}

/// The slice's endpoints as the endpointslice controller writes them now, and the writes
/// of the pods that changed it (None: unchanged).
fn adjust_slice(
    slice: &Value,
    namespace: &str,
    pods: &Pods,
    publish_not_ready: Option<bool>,
) -> Option<(Value, u64)> {
    let ipv6 = match text(&slice["addressType"]) {
        "IPv4" => false,
        "IPv6" => true,
        _ => return None,
    };
    let endpoints = slice["endpoints"].as_array()?;
    // Unknown service: the controller made ready = publishNotReady || pod ready, so a ready
    // endpoint of a pod that is not serving says the service publishes those.
    let publish = publish_not_ready.unwrap_or_else(|| {
        endpoints
            .iter()
            .any(|e| e["conditions"]["ready"] == true && e["conditions"]["serving"] == false)
    });
    let mut lowered = 0;
    let mut kept = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let Some(pod) = pods.target(&ep["targetRef"], namespace) else {
            kept.push(ep.clone());
            continue;
        };
        let addresses = pod.ips_like(ipv6);
        if !pod.in_service(true) || addresses.is_empty() {
            lowered += pod.writes;
            continue;
        }
        let mut now = ep.clone();
        now["addresses"] = addresses.into();
        now["conditions"] = serde_json::json!({
            "ready": publish || (pod.ready && !pod.terminating),
            "serving": pod.ready,
            "terminating": pod.terminating,
        });
        if let Some(node) = &pod.node_name {
            now["nodeName"] = node.as_str().into();
        }
        if &now != ep {
            lowered += pod.writes;
        }
        kept.push(now);
    }
    if lowered == 0 {
        return None;
    }
    let mut out = slice.clone();
    out["endpoints"] = kept.into();
    Some((out, lowered))
}

/// The Endpoints' subsets as the endpoints controller writes them now: a pod's address in
/// `addresses` when it is ready (or the service publishes what is not), else in
/// `notReadyAddresses`; and the writes of the pods that changed it (None: unchanged).
fn adjust_endpoints(
    obj: &Value,
    namespace: &str,
    pods: &Pods,
    publish_not_ready: Option<bool>,
) -> Option<(Value, u64)> {
    let subsets = obj["subsets"].as_array()?;
    let publish = publish_not_ready.unwrap_or(false);
    let mut lowered = 0;
    let mut out_subsets = Vec::with_capacity(subsets.len());
    for subset in subsets {
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for (was_ready, list) in [(true, "addresses"), (false, "notReadyAddresses")] {
            for addr in subset[list].as_array().into_iter().flatten() {
                let Some(pod) = pods.target(&addr["targetRef"], namespace) else {
                    if was_ready {
                        ready.push(addr.clone());
                    } else {
                        not_ready.push(addr.clone());
                    }
                    continue;
                };
                let ip = pod
                    .ips_like(text(&addr["ip"]).contains(':'))
                    .into_iter()
                    .next();
                let Some(ip) = ip.filter(|_| pod.in_service(publish)) else {
                    lowered += pod.writes;
                    continue;
                };
                let mut now = addr.clone();
                now["ip"] = ip.into();
                if let Some(node) = &pod.node_name {
                    now["nodeName"] = node.as_str().into();
                }
                let is_ready = publish || pod.ready;
                if &now != addr || is_ready != was_ready {
                    lowered += pod.writes;
                }
                if is_ready {
                    ready.push(now);
                } else {
                    not_ready.push(now);
                }
            }
        }
        if ready.is_empty() && not_ready.is_empty() {
            continue;
        }
        let mut s = subset.clone();
        let map = s.as_object_mut()?;
        for (list, addrs) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            if addrs.is_empty() {
                map.remove(list);
            } else {
                map.insert(list.into(), addrs.into());
            }
        }
        out_subsets.push(s);
    }
    if lowered == 0 {
        return None;
    }
    let mut out = obj.clone();
    if out_subsets.is_empty() {
        out.as_object_mut()?.remove("subsets");
    } else {
        out["subsets"] = out_subsets.into();
    }
    Some((out, lowered))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, ip: &str, ready: bool, writes: u64) -> ((String, String), PodNow) {
        let v = json!({"metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "edge-1"},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}});
        (("shop".into(), name.into()), PodNow::of(&v, writes))
    }

    fn endpoint(name: &str, ip: &str) -> Value {
        json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false},
            "targetRef": {"kind": "Pod", "namespace": "shop", "name": name, "uid": format!("uid-{name}")},
            "nodeName": "edge-1"})
    }

    fn slice(endpoints: Vec<Value>) -> Value {
        json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "web-x1", "namespace": "shop", "resourceVersion": "500",
                "labels": {"kubernetes.io/service-name": "web", SLICE_MANAGED_BY: SLICE_CONTROLLER}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
    }

    #[test]
    fn a_slice_gets_its_pods_new_ips_and_readiness_and_loses_pods_out_of_service() {
        let mut finished = pod("c", "10.244.0.9", false, 1);
        finished.1.finished = true;
        let pods = Pods(
            [
                pod("a", "10.244.0.7", true, 3),
                pod("b", "10.244.0.8", false, 2),
                finished,
            ]
            .into_iter()
            .collect(),
        );
        let cloud = slice(vec![
            endpoint("a", "10.244.0.2"),
            endpoint("b", "10.244.0.3"),
            endpoint("c", "10.244.0.4"),
            endpoint("elsewhere", "10.244.1.5"),
        ]);
        let got = adjust(Kind::Slice, &cloud, &pods, None).expect("adjusted");
        let eps = got["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 3, "the finished pod is dropped: {eps:?}");
        assert_eq!(eps[0]["addresses"], json!(["10.244.0.7"]));
        assert_eq!(eps[1]["addresses"], json!(["10.244.0.8"]));
        assert_eq!(
            eps[1]["conditions"],
            json!({"ready": false, "serving": false, "terminating": false})
        );
        assert_eq!(
            eps[2],
            endpoint("elsewhere", "10.244.1.5"),
            "unknown pods as cached"
        );
        assert_eq!(
            got["metadata"]["resourceVersion"], "494",
            "500 - (3 + 2 + 1)"
        );
        assert_eq!(got["ports"], cloud["ports"]);
    }

    #[test]
    fn only_what_the_controllers_manage_and_what_changes_is_adjusted() {
        let pods = Pods([pod("a", "10.244.0.7", true, 1)].into_iter().collect());
        let same = slice(vec![endpoint("a", "10.244.0.7")]);
        assert_eq!(
            adjust(Kind::Slice, &same, &pods, None),
            None,
            "nothing changes"
        );
        let mut mirrored = slice(vec![endpoint("a", "10.244.0.2")]);
        mirrored["metadata"]["labels"][SLICE_MANAGED_BY] = "someone-else".into();
        assert_eq!(adjust(Kind::Slice, &mirrored, &pods, None), None);
        let mut v6 = slice(vec![endpoint("a", "fd00::2")]);
        v6["addressType"] = "IPv6".into();
        let got = adjust(Kind::Slice, &v6, &pods, None).expect("adjusted");
        assert_eq!(
            got["endpoints"],
            json!([]),
            "the pod has no IPv6 address now"
        );
        let mut recreated = endpoint("a", "10.244.0.2");
        recreated["targetRef"]["uid"] = "uid-of-an-older-a".into();
        assert_eq!(
            adjust(Kind::Slice, &slice(vec![recreated]), &pods, None),
            None
        );
    }

    #[test]
    fn terminating_pods_stay_serving_but_not_ready_unless_the_service_publishes_them() {
        let (k, mut p) = pod("a", "10.244.0.7", true, 1);
        p.terminating = true;
        let pods = Pods([(k, p)].into_iter().collect());
        let cloud = slice(vec![endpoint("a", "10.244.0.7")]);
        let got = adjust(Kind::Slice, &cloud, &pods, Some(false)).expect("adjusted");
        assert_eq!(
            got["endpoints"][0]["conditions"],
            json!({"ready": false, "serving": true, "terminating": true})
        );
        let got = adjust(Kind::Slice, &cloud, &pods, Some(true)).expect("adjusted");
        assert_eq!(
            got["endpoints"][0]["conditions"],
            json!({"ready": true, "serving": true, "terminating": true})
        );
    }

    #[test]
    fn endpoints_move_addresses_between_ready_and_not_ready() {
        let pods = Pods(
            [
                pod("a", "10.244.0.7", false, 1),
                pod("b", "10.244.0.8", true, 1),
            ]
            .into_iter()
            .collect(),
        );
        let addr = |name: &str, ip: &str| {
            json!({"ip": ip, "nodeName": "edge-1",
                "targetRef": {"kind": "Pod", "namespace": "shop", "name": name, "uid": format!("uid-{name}")}})
        };
        let cloud = json!({"kind": "Endpoints", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "90",
                "labels": {ENDPOINTS_MANAGED_BY: ENDPOINTS_CONTROLLER}},
            "subsets": [{"addresses": [addr("a", "10.244.0.2"), addr("z", "10.244.1.1")],
                "notReadyAddresses": [addr("b", "10.244.0.3")],
                "ports": [{"port": 8080, "protocol": "TCP"}]}]});
        let got = adjust(Kind::Endpoints, &cloud, &pods, None).expect("adjusted");
        assert_eq!(
            got["subsets"],
            json!([{"addresses": [addr("z", "10.244.1.1"), addr("b", "10.244.0.8")],
                "notReadyAddresses": [addr("a", "10.244.0.7")],
                "ports": [{"port": 8080, "protocol": "TCP"}]}])
        );
        assert_eq!(got["metadata"]["resourceVersion"], "88");
        let mut user_made = cloud.clone();
        user_made["metadata"]["labels"] = json!({});
        assert_eq!(adjust(Kind::Endpoints, &user_made, &pods, None), None);
    }

    #[test]
    fn a_node_s_own_writes_win_over_what_the_pool_shares_and_changes_are_named() {
        let own: Pods = [pod("web-0", "198.51.100.20", true, 2)]
            .into_iter()
            .collect();
        let shared: Pods = [
            pod("web-0", "192.0.2.10", false, 1),
            pod("web-1", "198.51.100.21", true, 1),
        ]
        .into_iter()
        .collect();
        let both = own.clone().and_others(&shared, Some("shop"));
        let ip = |p: &Pods, n: &str| p.0[&("shop".to_string(), n.to_string())].ips.clone();
        assert_eq!(ip(&both, "web-0"), ["198.51.100.20"], "the node's own word");
        assert_eq!(ip(&both, "web-1"), ["198.51.100.21"]);
        assert!(own.clone().and_others(&shared, Some("other")).0.len() == 1);
        let mut changed: Vec<&PodId> = both.differing(&own).collect();
        changed.sort();
        assert_eq!(changed, [&("shop".to_string(), "web-1".to_string())]);
        let gone: Vec<&PodId> = own.differing(&both).collect();
        assert_eq!(gone, [&("shop".to_string(), "web-1".to_string())]);
    }
}
