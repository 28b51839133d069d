#!/usr/bin/env python3
"""Writes hub-user/src/convert/schema_table.rs: the Kubernetes protobuf <-> JSON schema of the
built-in kinds a node reads, as a static table the hub's converter walks.

Run by `cargo xtask kube-schema` (which fetches the two source crates first). Inputs:
  * k8s-pb (prost types generated from Kubernetes' generated.proto): per message, each field's
    number, wire type, repeated/map, and message type;
  * k8s-openapi (generated from Kubernetes' OpenAPI): per definition, each field's exact JSON
    name and whether it is required (no `omitempty` in the Go tag);
  * overrides.txt beside this script: what neither source says (see its header).
The output is committed, like the eBPF object: building the hub needs neither crate.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

# The API groups converted (directory under k8s-pb's src/api), and their apiVersion prefix.
GROUPS = {
    "core/v1": "v1",
    "apps/v1": "apps/v1",
    "batch/v1": "batch/v1",
    "certificates/v1": "certificates.k8s.io/v1",
    "coordination/v1": "coordination.k8s.io/v1",
    "discovery/v1": "discovery.k8s.io/v1",
    "events/v1": "events.k8s.io/v1",
    "networking/v1": "networking.k8s.io/v1",
    "node/v1": "node.k8s.io/v1",
    "policy/v1": "policy/v1",
    "rbac/v1": "rbac.authorization.k8s.io/v1",
    "resource/v1": "resource.k8s.io/v1",
    "scheduling/v1": "scheduling.k8s.io/v1",
    "storage/v1": "storage.k8s.io/v1",
}
META = "apimachinery/pkg/apis/meta/v1"

# Messages with a JSON form of their own (not an object of their fields).
SPECIAL = {
    META + "/Time": "Time",
    META + "/MicroTime": "MicroTime",
    META + "/FieldsV1": "RawJson",
    "apimachinery/pkg/runtime/RawExtension": "RawJson",
    "apimachinery/pkg/api/resource/Quantity": "Quantity",
    "apimachinery/pkg/util/intstr/IntOrString": "IntOrString",
}
# (No kind converted here holds a double or a metav1.Duration; a schema that did would stop
# the generator at SCALARS[kind] or the Message lookup below, to be added then.)
SCALARS = {"string": "String", "bool": "Bool", "int32": "Int32", "int64": "Int64",
           "bytes": "Bytes"}


def crate_sources():
    """Fetches k8s-pb and k8s-openapi (versions pinned here) and returns their source dirs."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "src"))
        open(os.path.join(d, "src", "lib.rs"), "w").close()
        with open(os.path.join(d, "Cargo.toml"), "w") as f:
            f.write('[package]\nname = "kube-schema-sources"\nversion = "0.0.0"\nedition = "2021"\n'
                    '[dependencies]\nk8s-pb = "=0.9.0"\n'
                    'k8s-openapi = { version = "=0.29.0", features = ["v1_35"] }\n')
        out = subprocess.run(["cargo", "metadata", "--format-version", "1",
                              "--manifest-path", os.path.join(d, "Cargo.toml")],
                             check=True, capture_output=True, text=True).stdout
    dirs = {}
    for p in json.loads(out)["packages"]:
        if p["name"] in ("k8s-pb", "k8s-openapi"):
            dirs[p["name"]] = os.path.dirname(p["manifest_path"])
    return dirs["k8s-pb"], os.path.join(dirs["k8s-openapi"], "src", "v1_35")


def norm(rust):
    """prost and k8s-openapi split acronyms apart differently (pod_cid_rs / pod_cidrs)."""
    return rust.replace("_", "").lower()


def split_top(s, sep=","):
    depth, cur, parts = 0, "", []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def resolve(module, path):
    """A Rust type path inside module (e.g. 'super::super::x::Y') -> 'dir/of/x/Y'."""
    segs = path.split("::")
    mod = module.split("/")
    while segs and segs[0] == "super":
        segs.pop(0)
        mod.pop()
    return "/".join(mod + segs)


def inner_type(ty):
    """The message path inside Option<...>, Vec<...>, Box<...> or the value of a BTreeMap."""
    ty = re.sub(r"\s+", "", ty)
    m = re.match(r"^(?:::core::option::Option|::prost::alloc::vec::Vec|::prost::alloc::boxed::Box)<(.*)>$", ty)
    if m:
        return inner_type(m.group(1))
    m = re.match(r"^::prost::alloc::collections::BTreeMap<(.*)>$", ty)
    if m:
        return inner_type(split_top(m.group(1))[1])
    return ty


def parse_pb(root, module):
    text = open(os.path.join(root, "src", module, "mod.rs")).read()
    messages = {}
    for m in re.finditer(r"pub struct (\w+) \{\n(.*?)\n\}", text, re.S):
        name, body = m.group(1), m.group(2)
        fields = []
        for f in re.finditer(r"#\[prost\((.*?)\)\]\s*pub (?:r#)?(\w+):\s*(.*?),\n(?=\s*(?:///|#\[|$))",
                             body + "\n", re.S):
            attr, rust, ty = f.group(1), f.group(2), f.group(3)
            tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
            kind = attr.split(",")[0].split("=")[0].strip()
            card = "Repeated" if "repeated" in attr else "One"
            if kind == "btree_map":
                card = "Map"
                kind = re.search(r'btree_map = "string, (\w+)"', attr).group(1)
            if kind == "message":
                target = resolve(module, inner_type(ty))
            else:
                target = SCALARS[kind]
            fields.append({"tag": tag, "rust": rust.rstrip("_"), "key": norm(rust), "card": card, "type": target})
        messages[module + "/" + name] = fields
    return messages


def parse_openapi(root):
    """definition dir/Name -> {rust field: (json name, required)}"""
    out = {}
    for dirpath, _, files in os.walk(root):
        for fn in files:
            text = open(os.path.join(dirpath, fn)).read()
            m = re.search(r"// Generated from definition io\.k8s\.([\w.]+)\.(\w+)\n", text)
            if not m:
                continue
            module = m.group(1).replace(".", "/")
            module = module.replace("apiextensions-apiserver", "apiextensions_apiserver")
            s = re.search(r"pub struct \w+ \{\n(.*?)\n\}", text, re.S)
            if not s:
                continue
            required = {}
            for f in re.finditer(r"^    pub (\w+): (.*),$", s.group(1), re.M):
                required[norm(f.group(1))] = not f.group(2).startswith("Option<")
            names = {}
            for f in re.finditer(r'"([\w$-]+)" => Field::Key_(\w+),', text):
                rust = norm(f.group(2))
                names[rust] = (f.group(1), required.get(rust, False))
            out[module + "/" + m.group(2)] = names
    return out


def canonical_names(pb, openapi):
    """prost renames messages (CSIDriver -> CsiDriver); give them back their Kubernetes names,
    which are the kinds' names, from OpenAPI's definitions."""
    exact = {k.lower(): k for k in openapi}
    def name(full):
        if full.lower() in exact:
            return exact[full.lower()]
        if full.endswith("List") and full[:-4].lower() in exact:
            return exact[full[:-4].lower()] + "List"
        return full
    renamed = {}
    for full, fields in pb.items():
        for f in fields:
            if f["type"] not in SCALARS.values():
                f["type"] = name(f["type"])
        renamed[name(full)] = fields
    return renamed


def camel(snake):
    first, *rest = snake.split("_")
    return first + "".join(w[:1].upper() + w[1:] for w in rest)


def read_overrides(path):
    """Rule lines (drop-zero, emit-zero, omitzero) for message/field pairs (see overrides.txt)."""
    rules = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        what, message, *fields = line.split()
        for f in fields:
            rules[(message, f)] = what
    return rules


def main():
    pb_root, openapi_root = crate_sources()
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = os.path.join(here, "..", "..", "hub-user", "src", "convert", "schema_table.rs")
    overrides = read_overrides(os.path.join(here, "overrides.txt"))
    pb = {}
    for module in [ "api/" + g for g in GROUPS ] + [META, "apimachinery/pkg/runtime",
                                                     "apimachinery/pkg/api/resource",
                                                     "apimachinery/pkg/util/intstr"]:
        pb.update(parse_pb(pb_root, module))
    openapi = parse_openapi(openapi_root)
    pb = canonical_names(pb, openapi)

    # Top-level kinds: the messages of a group whose field 1 is ObjectMeta, and their lists.
    kinds = []
    for g, api_version in GROUPS.items():
        module = "api/" + g
        for full, fields in sorted(pb.items()):
            if not full.startswith(module + "/") or full.count("/") != module.count("/") + 1:
                continue
            name = full.rsplit("/", 1)[1]
            meta = [f for f in fields if f["tag"] == 1 and f["type"] in (META + "/ObjectMeta", META + "/ListMeta")]
            known = full in openapi or (full.endswith("List") and full[:-4] in openapi)
            if meta and known:
                kinds.append((api_version, name, full))
    kinds.append(("v1", "Status", META + "/Status"))

    # Every message reachable from a kind, numbered in a stable order.
    order, seen = [], set()
    def visit(full):
        if full in seen or full in SPECIAL:
            return
        seen.add(full)
        order.append(full)
        for f in pb[full]:
            if f["type"] not in SCALARS.values():
                visit(f["type"])
    for _, _, full in kinds:
        visit(full)
    index = {full: i for i, full in enumerate(order)}

    # Go structs embedded with `json:",inline"` are a field of their own in protobuf and their
    # fields sit in the parent's JSON object: an unnamed message field of a named message.
    # Their fields take their names from the parent's definition when they have none.
    names_of = {full: dict(openapi.get(full, {})) for full in order}
    inline = set()
    for full in order:
        for f in pb[full]:
            t = f["type"]
            if (t in index and f["key"] not in names_of[full] and names_of[full]
                    and not full.endswith("List")):
                inline.add((full, f["tag"]))
                for k, v in names_of[full].items():
                    names_of[t].setdefault(k, v)
    # A named slice (`type ExtraValue []string`) is a message {items} in protobuf, an array in JSON.
    items_only = {full for full in order if full not in openapi
                  and [(f["tag"], f["key"], f["card"]) for f in pb[full]] == [(1, "items", "Repeated")]}

    unnamed, rules_used = [], set()
    lines = ["// @generated by `cargo xtask kube-schema` (xtask/kube-schema/generate.py) from",
             "// k8s-pb 0.9.0 and k8s-openapi 0.29.0 (Kubernetes 1.35) and overrides.txt. Do not edit.",
             "",
             "use super::schema::{Card::*, Field, Kind, Message, Type::*, DROP_ZERO, EMPTY_LIST, INLINE, NULL_IF_ABSENT, OMITZERO};",
             "",
             "pub static MESSAGES: &[Message] = &["]
    for full in order:
        names = names_of[full]
        is_list = full.endswith("List") and [f["tag"] for f in pb[full]] == [1, 2]
        lines.append(f'    Message {{ name: "{full}", items_only: {str(full in items_only).lower()}, fields: &[')
        for f in sorted(pb[full], key=lambda f: f["tag"]):
            if (full, f["tag"]) in inline:
                json_name, required = "", False
            elif f["key"] in names:
                json_name, required = names[f["key"]]
            elif is_list or full in items_only:
                json_name, required = camel(f["rust"]), f["rust"] == "items"
            else:
                json_name, required = camel(f["rust"]), False
                unnamed.append(f"{full}.{f['rust']}")
            t = f["type"]
            if t in SPECIAL:
                ty = SPECIAL[t]
            elif t in SCALARS.values():
                ty = t
            else:
                ty = f"Message({index[t]})"
            flags = []
            rule = None
            for key in ((full.rsplit("/", 1)[1], json_name), (full.split("/", 1)[1], json_name)):
                if key in overrides:
                    rule = overrides[key]
                    rules_used.add(key)
            if f["card"] == "One" and t in SCALARS.values() and not required:
                # An omitempty scalar the Go type holds by value is always on the protobuf
                # wire; its zero is dropped in JSON. A pointer's zero is kept. Strings are
                # values unless listed, numbers and booleans pointers unless listed.
                default = "drop-zero" if t in ("String", "Bytes") else "emit-zero"
                if (rule or default) == "drop-zero":
                    flags.append("DROP_ZERO")
            if (full, f["tag"]) in inline:
                flags.append("INLINE")
            if rule == "omitzero":
                flags.append("OMITZERO")
            if f["card"] != "One" and required:
                flags.append("EMPTY_LIST" if is_list else "NULL_IF_ABSENT")
            lines.append(f'        Field {{ tag: {f["tag"]}, json: "{json_name}", ty: {ty}, '
                         f'card: {f["card"]}, flags: {"|".join(flags) or 0} }},')
        lines.append("    ] },")
    lines.append("];")
    lines.append("")
    lines.append("pub static KINDS: &[Kind] = &[")
    for api_version, kind, full in kinds:
        lines.append(f'    Kind {{ api_version: "{api_version}", kind: "{kind}", message: {index[full]} }},')
    lines.append("];")
    stale = sorted(set(overrides) - rules_used)
    if stale:
        sys.exit(f"overrides.txt names fields not in the schema: {stale}")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out_path}: {len(order)} messages, {len(kinds)} kinds")
    if unnamed:
        print(f"{len(unnamed)} fields without an OpenAPI name (camel-cased): {', '.join(unnamed)}")


if __name__ == "__main__":
    main()
