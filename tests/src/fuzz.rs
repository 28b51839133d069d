//! Fuzzing of every parser that takes bytes from outside the hub: kproto (objects, lists,
//! watch frames), the cache's object/list/event readers in both encodings, request paths,
//! label and field selectors, the config file, gzip, and the store's record decoding.
//!
//! A coverage-blind mutation fuzzer (no libFuzzer on this toolchain's stable channel): each
//! target starts from real inputs (the recorded kube-apiserver answers and kubelet trace in
//! `tests/fixtures/wire`, the example config, encoded store records) and feeds mutations of
//! them — bit flips, byte edits, inserted and deleted runs, splices, truncation, repeated
//! runs, extreme varints. A panic is a finding; so is a single allocation above
//! [`ALLOCATION_LIMIT`] (see the `hub-fuzz` binary, which counts them).
use std::{collections::BTreeMap, path::Path};

use hub::{
    cache::{
        objects::{self, Encoding},
        select::Selector,
        store::{ListMeta, ObjectKey, Record},
    },
    config::Config,
    kproto,
    proxy::request::RequestInfo,
};

/// The largest single allocation a parser may make for any input: the gzip bound
/// (64 MiB) and some room.
pub const ALLOCATION_LIMIT: usize = 80 << 20;

/// One parser under test.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "kproto",
            run: kproto_target,
            seeds: recorded_bodies,
        },
        Target {
            name: "objects",
            run: objects_target,
            seeds: small_recorded_bodies,
        },
        Target {
            name: "convert",
            run: convert_target,
            seeds: small_recorded_bodies,
        },
        Target {
            name: "gzip",
            run: gzip_target,
            seeds: gzip_seeds,
        },
        Target {
            name: "request-path",
            run: request_target,
            seeds: request_seeds,
        },
        Target {
            name: "selectors",
            run: selector_target,
            seeds: selector_seeds,
        },
        Target {
            name: "config",
            run: config_target,
            seeds: config_seeds,
        },
        Target {
            name: "store-records",
            run: store_target,
            seeds: store_seeds,
        },
    ]
}

fn kproto_target(data: &[u8]) {
    if let Some(u) = kproto::unwrap(data) {
        let _ = kproto::object_meta(u.raw);
        let _ = kproto::split_list(u.raw);
        let _ = kproto::with_resource_version(data, "7");
    }
    let _ = kproto::fields(data);
    let (frames, _) = kproto::watch_frames(data);
    for f in frames {
        let _ = kproto::watch_event(f);
    }
}

fn objects_target(data: &[u8]) {
    for enc in [Encoding::Json, Encoding::Protobuf] {
        let _ = objects::parse_object("pods", enc, data);
        let _ = objects::parse_list("pods", enc, data);
        let _ = objects::parse_event("pods", enc, data);
        let _ = hub::cache::fingerprint::of_list(enc, &[bytes::Bytes::copy_from_slice(data)]);
    }
}

/// Both directions of hub::convert, and a watch frame's event; what converts must convert
/// back.
fn convert_target(data: &[u8]) {
    let style = hub::convert::Style::default();
    if let Ok(json) = hub::convert::to_json(data, style) {
        hub::convert::to_protobuf(&json).expect("converted JSON converts back");
    }
    let _ = hub::convert::to_protobuf(data);
    let (frames, _) = kproto::watch_frames(data);
    for f in frames {
        let _ = hub::convert::watch_event_to_json(f, style);
    }
}

fn gzip_target(data: &[u8]) {
    let _ = hub::gzip::decode(&[bytes::Bytes::copy_from_slice(data)], 64 << 20);
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn request_target(data: &[u8]) {
    let t = text(data);
    let (path, query) = t.split_once('?').unwrap_or((&t, ""));
    for method in [
        hyper::Method::GET,
        hyper::Method::PATCH,
        hyper::Method::POST,
    ] {
        let info = RequestInfo::parse(&method, path, query);
        let _ = info.gvr();
    }
}

fn selector_target(data: &[u8]) {
    let t = text(data);
    let (labels, fields) = t.split_once('\n').unwrap_or((&t, ""));
    if let Ok(s) = Selector::parse(labels, fields) {
        let _ = s.single_name();
    }
}

fn config_target(data: &[u8]) {
    let _ = Config::parse(&text(data));
}

fn store_target(data: &[u8]) {
    let _ = Record::decode(data);
    let _ = ListMeta::decode(data);
    let _ = ObjectKey::decode(data);
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wire")
}

/// Every recorded kube-apiserver answer body, as a client reads it (gunzipped).
fn recorded_bodies() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let dirs = ["kube-apiserver-1.32", "kube-apiserver-1.36"].map(|v| fixtures().join(v));
    let exchanges = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten());
    for e in exchanges {
        if let Ok(body) = std::fs::read(e.path().join("response.body")) {
            match hub::gzip::decode(&[bytes::Bytes::from(body.clone())], 64 << 20) {
                Ok(plain) if body.starts_with(&[0x1f, 0x8b]) => out.push(plain),
                _ => out.push(body),
            }
        }
    }
    out
}

/// The recorded answers up to 64 KiB: a full parse of a 1.6 MB list per run would leave
/// few runs for the rest (kproto still takes the large ones).
fn small_recorded_bodies() -> Vec<Vec<u8>> {
    recorded_bodies()
        .into_iter()
        .filter(|b| b.len() <= 64 << 10)
        .collect()
}

fn gzip_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = recorded_bodies()
        .into_iter()
        .take(8)
        .map(|b| hub::gzip::encode(&b))
        .collect();
    out.push(hub::gzip::encode(&vec![0u8; 1 << 20]));
    out
}

/// The recorded kubelet's request paths (with their queries).
fn request_seeds() -> Vec<Vec<u8>> {
    let mut seen = BTreeMap::new();
    for v in ["1.32", "1.36"] {
        let trace = std::fs::read_to_string(
            fixtures().join(format!("kubelet-{v}/kubelet-{v}-requests.tsv")),
        )
        .unwrap_or_default();
        for line in trace.lines().skip(1) {
            if let Some(uri) = line.split('\t').nth(3) {
                seen.entry(uri.split('?').next().unwrap_or(uri).len())
                    .or_insert_with(|| uri.as_bytes().to_vec());
            }
        }
    }
    let mut out: Vec<Vec<u8>> = seen.into_values().collect();
    out.push(b"/apis/discovery.k8s.io/v1/namespaces/a/endpointslices/b/status".to_vec());
    out.push(b"/api/v1/namespaces/..%2F/pods/%00?watch=1".to_vec());
    out
}

fn selector_seeds() -> Vec<Vec<u8>> {
    [
        "app=web,tier!=db\nspec.nodeName=edge-node-1",
        "environment in (production, qa),!canary\nmetadata.name==x",
        "a notin (b),c\nspec.clusterIP!=None,metadata.namespace=ns",
        "k8s.io/x=y\nstatus.phase=Running,type=kubernetes.io/tls",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn config_seeds() -> Vec<Vec<u8>> {
    let full = "nodeName: edge-1\ncloud:\n  servers: [\"https://10.0.0.1:6443\"]\n  caFile: /etc/kubernetes/pki/ca.crt\nintercept:\n  cgroupPath: /sys/fs/cgroup\n  hubAddress: 169.254.2.1\n  vips: [\"10.96.0.1:443\"]\n  bypassMark: 0x2a6\nlisten:\n  proxy: 127.0.0.1:10261\n  admin: 127.0.0.1:10267\ncache:\n  dir: /var/lib/hub\n  components: [kubelet, kube-proxy]\ncoordinator:\n  endpoints: [\"https://127.0.0.1:2379\"]\n";
    vec![full.as_bytes().to_vec(), b"nodeName: n\n".to_vec()]
}

fn store_seeds() -> Vec<Vec<u8>> {
    let item = recorded_bodies()
        .iter()
        .find_map(|b| objects::parse_object("pods", Encoding::Protobuf, b).ok());
    let mut out = Vec::new();
    if let Some(item) = item {
        out.push(
            Record {
                deleted: false,
                one_off: true,
                left_selection: false,
                stored_at: 1_700_000_000,
                item,
            }
            .encode(),
        );
    }
    out.push(b"cred\0/v1/pods\0ns\0name\0kubelet".to_vec());
    out.push(b"\x01\x00\x00\x00\x00\x00\x00\x00\x07app=web\0\0PodList\x001700000000".to_vec());
    out
}

/// A small deterministic generator (xorshift), so a run is repeatable from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// One mutation of `input`, sometimes spliced with `other`.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = [0, 0xff, 0x7f, 0x80, b'\n', b'"', b'\0', b'=', b'/'][rng.below(9)];
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                out.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                out.drain(i..i + n);
            }
            4 if len > 0 => out.truncate(rng.below(len)),
            5 if !other.is_empty() => {
                let at = rng.below(len + 1);
                let from = rng.below(other.len());
                let n = 1 + rng.below((other.len() - from).min(256));
                out.splice(at..at, other[from..from + n].iter().copied());
            }
            6 if len > 0 => {
                // A run repeated: deep nesting, long lists.
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                let run = out[i..i + n].to_vec();
                for _ in 0..rng.below(64) {
                    out.splice(i..i, run.iter().copied());
                }
            }
            7 => {
                // An extreme varint (protobuf lengths and tags).
                let i = rng.below(len + 1);
                let v: &[u8] = match rng.below(3) {
                    0 => &[0xff, 0xff, 0xff, 0xff, 0x0f],
                    1 => &[0xff; 10],
                    _ => &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
                };
                out.splice(i..i, v.iter().copied());
            }
            _ if len > 1 => {
                let (a, b) = (rng.below(len), rng.below(len));
                out.swap(a, b);
            }
            _ => out.push(rng.next_u64() as u8),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every target takes its seeds and a few hundred mutations of them without a panic
    /// (the long runs are `cargo xtask fuzz`).
    #[test]
    fn every_target_survives_its_seeds_and_some_mutations() {
        let mut rng = Rng::new(7);
        for t in targets() {
            let seeds = (t.seeds)();
            assert!(!seeds.is_empty(), "{} has seeds", t.name);
            for s in &seeds {
                (t.run)(s);
            }
            for _ in 0..300 {
                let a = &seeds[rng.below(seeds.len())];
                let b = &seeds[rng.below(seeds.len())];
                (t.run)(&mutate(&mut rng, a, b));
            }
        }
    }
}
