//! `Accept: application/json;as=Table;g=meta.k8s.io;v=v1`: server-side printing, as kubectl
//! asks for it (`kubectl get` columns, `-o wide` shows priority-1 columns).
use serde_json::{Value, json};

use super::resources::Resource;

fn age(created: &str) -> String {
    let Some(then) = super::time::parse_rfc3339(created) else {
        return "<unknown>".into();
    };
    let secs = super::time::now_unix().saturating_sub(then);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn columns(kind: &str) -> Vec<(&'static str, &'static str, u8)> {
    match kind {
        "Pod" => vec![
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
        ],
        "Node" => vec![
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Age", "string", 0),
        ],
        "Service" => vec![
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("Age", "string", 0),
        ],
        _ => vec![("Name", "string", 0), ("Age", "string", 0)],
    }
}

fn cells(kind: &str, obj: &Value) -> Vec<Value> {
    let meta = &obj["metadata"];
    let name = meta["name"].clone();
    let age = Value::String(age(meta["creationTimestamp"].as_str().unwrap_or("")));
    let s = |v: &Value| Value::String(v.as_str().unwrap_or("<none>").to_string());
    match kind {
        "Pod" => {
            let statuses = obj["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let total = obj["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: u64 = statuses
                .iter()
                .filter_map(|c| c["restartCount"].as_u64())
                .sum();
            vec![
                name,
                json!(format!("{ready}/{total}")),
                s(&obj["status"]["phase"]),
                json!(restarts.to_string()),
                age,
                s(&obj["status"]["podIP"]),
                s(&obj["spec"]["nodeName"]),
            ]
        }
        "Node" => {
            let ready = obj["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map_or("Unknown", |c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                });
            vec![name, json!(ready), age]
        }
        "Service" => vec![
            name,
            s(&obj["spec"]["type"]),
            s(&obj["spec"]["clusterIP"]),
            age,
        ],
        _ => vec![name, age],
    }
}

/// A Table of `objects`, each row carrying the object's metadata as kubectl expects.
pub fn table(resource: &Resource, objects: &[&Value], list_meta: Value) -> Value {
    let defs: Vec<Value> = columns(resource.kind)
        .into_iter()
        .map(|(name, ty, priority)| {
            json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": cells(resource.kind, o),
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}
