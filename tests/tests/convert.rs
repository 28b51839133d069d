//! Protobuf <-> JSON conversion (hub::convert) against kube-apiserver's own answers: every
//! object recorded in both encodings (tests/fixtures/wire/kube-apiserver-*/dual-*) converts
//! to the JSON the apiserver wrote, decode-equal (key order free).

use serde_json::Value;
use std::path::{Path, PathBuf};

fn wire() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wire")
}

/// The `dual-<kind>` pairs of one apiserver version: (kind, protobuf body, JSON body).
fn dual_pairs(version: &str) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let dir = wire().join(format!("kube-apiserver-{version}"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(kind) = name
            .strip_prefix("dual-")
            .and_then(|n| n.strip_suffix("-protobuf"))
        else {
            continue;
        };
        let pb = std::fs::read(dir.join(&name).join("response.body")).unwrap();
        let json = std::fs::read(dir.join(format!("dual-{kind}-json/response.body"))).unwrap();
        out.push((kind.to_string(), pb, json));
    }
    out.sort();
    assert!(
        out.len() >= 21,
        "{version}: only {} dual-encoding pairs",
        out.len()
    );
    out
}

/// Where two JSON values differ, as `path: left != right` lines.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => differences(&format!("{path}.{k}"), v, w, out),
                    None => out.push(format!(
                        "{path}.{k}: converted {v}, absent in the recording"
                    )),
                }
            }
            for (k, w) in y {
                if !x.contains_key(k) {
                    out.push(format!("{path}.{k}: absent when converted, recorded {w}"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), v, w, out);
            }
        }
        _ if a != b => out.push(format!("{path}: converted {a}, recorded {b}")),
        _ => {}
    }
}

fn check_version(version: &str) {
    let mut failures = Vec::new();
    for (kind, pb, json) in dual_pairs(version) {
        let style = hub::convert::Style::for_minor(version[2..].parse().unwrap());
        let converted = match hub::convert::to_json(&pb, style) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{version} {kind}: {e}"));
                continue;
            }
        };
        let converted: Value = serde_json::from_slice(&converted).expect("converted JSON parses");
        let recorded: Value = serde_json::from_slice(&json).unwrap();
        let mut diffs = Vec::new();
        differences("", &converted, &recorded, &mut diffs);
        for d in diffs {
            failures.push(format!("{version} {kind}: {d}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_recorded_protobuf_object_converts_to_the_apiserver_s_json_1_32() {
    check_version("1.32");
}

#[test]
fn every_recorded_protobuf_object_converts_to_the_apiserver_s_json_1_36() {
    check_version("1.36");
}

#[test]
fn every_recorded_json_object_converts_to_protobuf_and_back_unchanged() {
    for version in ["1.32", "1.36"] {
        let style = hub::convert::Style::for_minor(version[2..].parse().unwrap());
        for (kind, _, json) in dual_pairs(version) {
            let pb = hub::convert::to_protobuf(&json)
                .unwrap_or_else(|e| panic!("{version} {kind}: {e}"));
            let back: Value =
                serde_json::from_slice(&hub::convert::to_json(&pb, style).unwrap()).unwrap();
            let recorded: Value = serde_json::from_slice(&json).unwrap();
            let mut diffs = Vec::new();
            differences("", &back, &recorded, &mut diffs);
            assert!(diffs.is_empty(), "{version} {kind}:\n{}", diffs.join("\n"));
        }
    }
}

/// The stand-in's pod, encoded to protobuf by the stand-in (k8s-pb's own types), converts to
/// the JSON the stand-in holds.
#[test]
fn the_stand_in_s_realistic_pod_converts_to_its_json() {
    let pod = hub_tests::apiserver::seed::realistic_pod();
    let pb = hub_tests::apiserver::protobuf::object("v1", "Pod", &pod);
    let converted: Value =
        serde_json::from_slice(&hub::convert::to_json(&pb, Default::default()).unwrap()).unwrap();
    let mut diffs = Vec::new();
    differences("", &converted, &pod, &mut diffs);
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// A small deterministic generator (xorshift64*), so a failing case names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn text(&mut self) -> String {
        const WORDS: &[&str] = &[
            "web",
            "kube-system",
            "10.0.0.1",
            "ä/ö",
            "\"quoted\"",
            "a\nb",
            "x",
            "Ready",
            "µs",
        ];
        (0..=self.below(3))
            .map(|_| WORDS[self.below(WORDS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join("-")
    }
}

use hub::convert::schema::{Card, DROP_ZERO, EMPTY_LIST, Field, INLINE, NULL_IF_ABSENT, Type};

/// A JSON object of message `m` as Go's encoder would write one: what it leaves out is absent,
/// what it writes as `null` is `null`.
fn random_object(rng: &mut Rng, m: u16, depth: u32, obj: &mut serde_json::Map<String, Value>) {
    let msg = hub::convert::message(m);
    for field in msg.fields {
        if field.flags & INLINE != 0 {
            if let Type::Message(inner) = field.ty
                && depth < 6
                && rng.chance(50)
            {
                random_object(rng, inner, depth + 1, obj);
            }
            continue;
        }
        let present = depth < 6 && rng.chance(if depth < 2 { 70 } else { 40 });
        match field.card {
            _ if !present => {
                if field.flags & NULL_IF_ABSENT != 0 {
                    obj.insert(field.json.into(), Value::Null);
                } else if field.flags & EMPTY_LIST != 0 {
                    obj.insert(field.json.into(), Value::Array(vec![]));
                }
            }
            Card::One => {
                if let Some(v) = random_value(rng, field, depth) {
                    obj.insert(field.json.into(), v);
                }
            }
            Card::Repeated => {
                let items: Vec<Value> = (0..=rng.below(3))
                    .filter_map(|_| random_value(rng, field, depth))
                    .collect();
                if !items.is_empty() {
                    obj.insert(field.json.into(), Value::Array(items));
                } else if field.flags & (NULL_IF_ABSENT | EMPTY_LIST) != 0 {
                    obj.insert(
                        field.json.into(),
                        if field.flags & EMPTY_LIST != 0 {
                            Value::Array(vec![])
                        } else {
                            Value::Null
                        },
                    );
                }
            }
            Card::Map => {
                let mut map = serde_json::Map::new();
                for _ in 0..=rng.below(3) {
                    if let Some(v) = random_value(rng, field, depth) {
                        map.insert(rng.text(), v);
                    }
                }
                obj.insert(
                    field.json.into(),
                    if map.is_empty() {
                        Value::Null
                    } else {
                        Value::Object(map)
                    },
                );
            }
        }
    }
}

fn random_value(rng: &mut Rng, field: &Field, depth: u32) -> Option<Value> {
    let zero_dropped = field.flags & DROP_ZERO != 0 && field.card == Card::One;
    Some(match field.ty {
        Type::String => {
            let s = if rng.chance(10) {
                String::new()
            } else {
                rng.text()
            };
            if s.is_empty() && zero_dropped {
                return None;
            }
            Value::String(s)
        }
        Type::Bool => {
            let b = rng.chance(50);
            if !b && zero_dropped {
                return None;
            }
            Value::Bool(b)
        }
        Type::Int32 | Type::Int64 => {
            let n: i64 = match rng.below(4) {
                0 => 0,
                1 => -(rng.below(1000) as i64),
                2 if field.ty == Type::Int64 => rng.next() as i64,
                _ => rng.below(i32::MAX as u64) as i64,
            };
            if n == 0 && zero_dropped {
                return None;
            }
            Value::from(n)
        }
        Type::Bytes => {
            use base64::Engine;
            let b: Vec<u8> = (0..rng.below(20)).map(|_| rng.next() as u8).collect();
            if b.is_empty() && zero_dropped {
                return None;
            }
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        Type::Time | Type::MicroTime => {
            let secs = rng.below(4_000_000_000) as i64;
            let (date, time) = civil(secs);
            if field.ty == Type::Time {
                Value::String(format!("{date}T{time}Z"))
            } else {
                Value::String(format!("{date}T{time}.{:06}Z", rng.below(1_000_000)))
            }
        }
        Type::Quantity => Value::String(
            ["100m", "1Gi", "5", "0", "1500Mi", "2.5", "1e3"][rng.below(7) as usize].into(),
        ),
        Type::IntOrString => {
            if rng.chance(50) {
                Value::from(rng.below(65536))
            } else {
                Value::String(format!("{}%", rng.below(100)))
            }
        }
        Type::RawJson => {
            serde_json::json!({"f:metadata": {"f:labels": {".": {}}}, "n": rng.below(9)})
        }
        Type::Message(m) => {
            let inner = hub::convert::message(m);
            if inner.items_only {
                return Some(Value::Array(
                    (0..=rng.below(2))
                        .map(|_| Value::String(rng.text()))
                        .collect(),
                ));
            }
            let mut obj = serde_json::Map::new();
            random_object(rng, m, depth + 1, &mut obj);
            Value::Object(obj)
        }
    })
}

/// Unix seconds -> ("YYYY-MM-DD", "HH:MM:SS"), by counting days (independent of the hub's).
fn civil(secs: i64) -> (String, String) {
    let (mut days, rem) = (secs / 86_400, secs % 86_400);
    let mut year = 1970;
    loop {
        let len = if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 {
            366
        } else {
            365
        };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let months = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut month = 0;
    while days >= months[month] {
        days -= months[month];
        month += 1;
    }
    (
        format!("{year:04}-{:02}-{:02}", month + 1, days + 1),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// Per kind: JSON objects of random shape, converted to protobuf and back, are unchanged; and
/// the protobuf is what k8s-pb's own Pod type reads (for pods, the kind a node holds most).
#[test]
fn every_kind_s_random_objects_convert_to_protobuf_and_back_unchanged() {
    let mut failures = Vec::new();
    for kind in hub::convert::kinds() {
        for case in 0..40u64 {
            let seed = 0x9E37_79B9_7F4A_7C15 ^ (case << 32) ^ u64::from(kind.message);
            let mut rng = Rng(seed);
            let mut obj = serde_json::Map::new();
            obj.insert("kind".into(), kind.kind.into());
            obj.insert("apiVersion".into(), kind.api_version.into());
            random_object(&mut rng, kind.message, 0, &mut obj);
            let json = Value::Object(obj);
            let pb = match hub::convert::to_protobuf(json.to_string().as_bytes()) {
                Ok(pb) => pb,
                Err(e) => {
                    failures.push(format!("{} seed {seed:#x}: to protobuf: {e}", kind.kind));
                    continue;
                }
            };
            if kind.kind == "Pod" {
                use prost::Message;
                let u = hub::kproto::unwrap(&pb).unwrap();
                k8s_pb::api::core::v1::Pod::decode(u.raw).expect("k8s-pb reads the converted pod");
            }
            let back: Value = match hub::convert::to_json(&pb, Default::default()) {
                Ok(j) => serde_json::from_slice(&j).unwrap(),
                Err(e) => {
                    failures.push(format!("{} seed {seed:#x}: to JSON: {e}", kind.kind));
                    continue;
                }
            };
            let mut diffs = Vec::new();
            differences("", &back, &json, &mut diffs);
            if let Some(d) = diffs.first() {
                failures.push(format!("{} seed {seed:#x}: {d}", kind.kind));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} kinds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every protobuf answer recorded from kube-apiserver 1.32 and 1.36 — objects, lists (gzipped
/// too), Status errors and each event of the watch streams — converts to JSON with no field
/// left out, and that JSON converts back to protobuf and to the same JSON again.
#[test]
fn every_recorded_protobuf_answer_converts_with_nothing_left_out() {
    use std::io::Read;
    let before = hub::convert::unknown_fields_total();
    let mut converted = 0;
    for version in ["1.32", "1.36"] {
        let style = hub::convert::Style::for_minor(version[2..].parse().unwrap());
        let dir = wire().join(format!("kube-apiserver-{version}"));
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("response.json").exists())
            .collect();
        names.sort();
        for exchange in names {
            let meta: Value =
                serde_json::from_slice(&std::fs::read(exchange.join("response.json")).unwrap())
                    .unwrap();
            let header = |h: &str| meta["headers"][h].as_str().unwrap_or_default().to_string();
            let content_type = header("Content-Type");
            if !content_type.starts_with("application/vnd.kubernetes.protobuf")
                || content_type.contains("as=APIGroupDiscoveryList")
            {
                continue;
            }
            let mut body = std::fs::read(exchange.join("response.body")).unwrap();
            if header("Content-Encoding") == "gzip" {
                let mut plain = Vec::new();
                flate2::read::GzDecoder::new(body.as_slice())
                    .read_to_end(&mut plain)
                    .unwrap();
                body = plain;
            }
            let name = exchange.file_name().unwrap().to_string_lossy().into_owned();
            let round_trip = |json: &[u8], what: &str, event: bool| {
                let first: Value = serde_json::from_slice(json)
                    .unwrap_or_else(|e| panic!("{version} {name} {what}: not JSON: {e}"));
                let object = if event { &first["object"] } else { &first };
                let pb = hub::convert::to_protobuf(object.to_string().as_bytes())
                    .unwrap_or_else(|e| panic!("{version} {name} {what}: back to protobuf: {e}"));
                let again: Value =
                    serde_json::from_slice(&hub::convert::to_json(&pb, style).unwrap()).unwrap();
                assert_eq!(&again, object, "{version} {name} {what}: round trip");
            };
            if content_type.contains("stream=watch") {
                let mut rest = body.as_slice();
                let mut n = 0;
                while rest.len() >= 4 {
                    let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
                    let json = hub::convert::watch_event_to_json(&rest[4..4 + len], style)
                        .unwrap_or_else(|e| panic!("{version} {name} event {n}: {e}"));
                    round_trip(&json, &format!("event {n}"), true);
                    rest = &rest[4 + len..];
                    n += 1;
                    converted += 1;
                }
                assert!(rest.is_empty() && n > 0, "{version} {name}: {n} events");
            } else {
                let json = hub::convert::to_json(&body, style)
                    .unwrap_or_else(|e| panic!("{version} {name}: {e}"));
                round_trip(&json, "answer", false);
                converted += 1;
            }
        }
    }
    assert!(converted > 60, "{converted} answers and events converted");
    assert_eq!(
        hub::convert::unknown_fields_total(),
        before,
        "fields left out of a conversion"
    );
}

/// A list as kubectl writes it (`kubectl get pods -o json`: items with their kind and
/// apiVersion) converts to protobuf with nothing left out; the items' TypeMeta is the
/// envelope's business, not a field.
#[test]
fn a_kubectl_list_with_typed_items_converts_with_nothing_left_out() {
    let before = hub::convert::unknown_fields_total();
    let list = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}],
    });
    // kubectl's "List" has no schema; its PodList twin does.
    let mut pod_list = list.clone();
    pod_list["kind"] = "PodList".into();
    assert!(matches!(
        hub::convert::to_protobuf(list.to_string().as_bytes()),
        Err(hub::convert::ConvertError::NoSchema(_))
    ));
    let pb = hub::convert::to_protobuf(pod_list.to_string().as_bytes()).unwrap();
    let back: Value =
        serde_json::from_slice(&hub::convert::to_json(&pb, Default::default()).unwrap()).unwrap();
    assert_eq!(
        back["items"][0]["spec"]["containers"][0]["image"],
        "busybox"
    );
    assert_eq!(
        hub::convert::unknown_fields_total(),
        before,
        "fields left out"
    );
}

/// Random objects of every kind, filled and encoded by Kubernetes' own Go code (k8s.io/api
/// and apimachinery's API fuzzer and serializers, `xtask/kube-schema/oracle`): each one's protobuf
/// converts to the JSON Go wrote for it, decode-equal, and that JSON converts back to
/// protobuf and to the same JSON again.
#[test]
fn kubernetes_own_random_objects_of_every_kind_convert_to_the_json_go_writes() {
    use std::io::BufRead;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kube-oracle/samples.jsonl.gz");
    let file = std::fs::File::open(&path).unwrap();
    let lines = std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines();
    let style = hub::convert::Style::for_minor(36);
    let (mut failures, mut samples, mut kinds) = (Vec::new(), 0, std::collections::BTreeSet::new());
    for line in lines {
        let sample: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let kind = format!(
            "{} {}",
            sample["apiVersion"].as_str().unwrap(),
            sample["kind"].as_str().unwrap()
        );
        let name = format!("{kind} seed {}", sample["seed"]);
        use base64::Engine;
        let pb = base64::engine::general_purpose::STANDARD
            .decode(sample["protobuf"].as_str().unwrap())
            .unwrap();
        samples += 1;
        kinds.insert(kind);
        let converted: Value = match hub::convert::to_json(&pb, style) {
            Ok(j) => serde_json::from_slice(&j).unwrap(),
            Err(e) => {
                failures.push(format!("{name}: to JSON: {e}"));
                continue;
            }
        };
        let mut diffs = Vec::new();
        differences("", &converted, &sample["json"], &mut diffs);
        if diffs.is_empty() {
            let again = hub::convert::to_protobuf(sample["json"].to_string().as_bytes())
                .and_then(|pb| hub::convert::to_json(&pb, style));
            match again {
                Ok(j) => differences(
                    "",
                    &serde_json::from_slice(&j).unwrap(),
                    &sample["json"],
                    &mut diffs,
                ),
                Err(e) => diffs.push(format!("JSON to protobuf and back: {e}")),
            }
        }
        failures.extend(diffs.into_iter().map(|d| format!("{name}: {d}")));
    }
    assert!(
        kinds.len() >= 100,
        "only {} kinds in {}",
        kinds.len(),
        path.display()
    );
    assert!(
        failures.is_empty(),
        "{} differences in {samples} objects:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A map entry with no value (found by the fuzz round, a PodDisruptionBudget's
/// `status.disruptedPods`) is the type's zero, as Go reads it: a null Time, which converts
/// back to protobuf and to the same JSON again.
#[test]
fn a_map_entry_without_its_value_converts_as_go_s_zero_and_back() {
    let found = "6b3873000a200a09706f6c6963792f76311213506f6444697372757074696f6e42756467657412d9010aaf010a0377656212001a046475616c22002a2433663532386134632d326164342d346166392d613938352d33366166316662623264303532033232333801420808a7a4cbd80610008a01660a076b75626563746c12065570646174651a09706f6c6963792f7631220808a7a4cbd806100032084669656c647356313a320a307b22663a73706563223a7b22663a6d696e417661696c61626c65223a7b7d2c22663a73656c6563746f72223a7b7d7d7d420012190a09080110001a03353025080c0a0a0a0361707012037765621a0a120018002000280030001a002200";
    let pb: Vec<u8> = (0..found.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&found[i..i + 2], 16).unwrap())
        .collect();
    let style = hub::convert::Style::default();
    let json: Value = serde_json::from_slice(&hub::convert::to_json(&pb, style).unwrap()).unwrap();
    assert_eq!(
        json["status"]["disruptedPods"],
        serde_json::json!({"": null})
    );
    let again = hub::convert::to_protobuf(json.to_string().as_bytes()).unwrap();
    let back: Value =
        serde_json::from_slice(&hub::convert::to_json(&again, style).unwrap()).unwrap();
    assert_eq!(back, json);
}
