#!/usr/bin/env python3
"""Writes hub-user/src/convert/schema_table.rs: the Kubernetes protobuf <-> JSON schema of the
built-in kinds a node reads, as a static table the hub's converter walks.

Run by `cargo xtask kube-schema`. The one source is Kubernetes' Go API types (go_types.py,
from Debian's packages of k8s.io/api and k8s.io/apimachinery): each field's protobuf number
and its JSON name are in its struct tags, and its Go type and JSON options say how a zero, an
absent pointer or an empty list is written in JSON — as kube-apiserver's Go encoder does.
The output is committed, like the eBPF object: building the hub needs none of this.
"""
import os
import sys
import tempfile

import go_types

# The API groups converted (their directory under k8s.io/api), and their apiVersion.
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

# Types with a JSON form of their own (not an object of their fields).
SPECIAL = {
    META + "/Time": "Time",
    META + "/MicroTime": "MicroTime",
    META + "/FieldsV1": "RawJson",
    "apimachinery/pkg/runtime/RawExtension": "RawJson",
    "apimachinery/pkg/api/resource/Quantity": "Quantity",
    "apimachinery/pkg/util/intstr/IntOrString": "IntOrString",
}
# Go scalars and the table's types for them. No kind converted here holds a float or a
# metav1.Duration; a schema that did stops at scalar() below, to be added then.
SCALARS = {"string": "String", "bool": "Bool", "int32": "Int32", "int64": "Int64",
           "[]byte": "Bytes"}


class Schema:
    def __init__(self, structs, named):
        self.structs = structs
        self.named = named
        self.items_only = set()  # named slices that are a message {items} in protobuf

    def underlying(self, go_type):
        """A named non-struct type resolved to what it is made of (PullPolicy -> string,
        ResourceList -> map[...]...); a named slice is kept when it is a message of its own."""
        seen = set()
        while go_type in self.named and go_type not in seen:
            seen.add(go_type)
            go_type = self.named[go_type]
        if go_type.startswith("apimachinery/pkg/types/"):  # types.UID, types.NodeName
            return "string"
        return go_type

    def element(self, go_type, where):
        """The table type of one value of a field: a scalar, a special or a message name."""
        if go_type in SPECIAL:
            return SPECIAL[go_type]
        base = self.underlying(go_type)
        if go_type in self.named and base.startswith("[]") and base != "[]byte":
            self.items_only.add(go_type)  # `map[string]ExtraValue`
            return go_type
        if base in SCALARS:
            return SCALARS[base]
        if base in self.structs:
            return base
        sys.exit(f"{where}: no rule for Go type {go_type}")

    def shape(self, field, where):
        """(card, element type) of a field, from its Go type."""
        base = self.underlying(field.go_type) if field.go_type not in SPECIAL else field.go_type
        if base.startswith("map["):
            key, value = base[4:].split("]", 1)
            if self.underlying(key) != "string":
                sys.exit(f"{where}: map key {key} is not a string")
            return "Map", self.element(value, where)
        if base.startswith("[]") and base != "[]byte":
            return "Repeated", self.element(base[2:], where)
        return "One", self.element(field.go_type, where)

    def fields(self, full):
        if full in self.items_only:
            elem = self.underlying(full)[2:]
            return [("items", 1, "Repeated", self.element(elem, full), None)]
        out = []
        for f in self.structs[full].fields:
            card, ty = self.shape(f, f"{full}.{f.json or f.go_name}")
            out.append((f.json, f.tag, card, ty, f))
        return out


def flags_of(field, card, ty, is_list):
    """How the field's zero, absence or emptiness is written in JSON (see schema.rs)."""
    if field is None:  # the items of a named slice: Go decodes an empty one as []
        return ["EMPTY_LIST"]
    flags = []
    if field.inline:
        flags.append("INLINE")
    if card == "One":
        if ty in SCALARS.values() and not field.pointer and field.omitempty:
            # Always on the wire when held by value; omitempty drops its zero.
            flags.append("DROP_ZERO")
        elif (field.pointer or ty == "Bytes") and not field.omitempty:
            # A nil pointer (or nil []byte) is absent on the wire and `null` in JSON.
            flags.append("NULL_IF_ABSENT")
        if field.omitzero:
            flags.append("OMITZERO")
    elif is_list and field.json == "items":
        flags.append("EMPTY_LIST")  # kube-apiserver's lists always carry items
    elif not field.omitempty:
        flags.append("NULL_IF_ABSENT")
    strategies = field.patch_strategy.split(",") if field.patch_strategy else []
    for strategy, flag in (("merge", "PATCH_MERGE"), ("replace", "PATCH_REPLACE"),
                           ("retainKeys", "RETAIN_KEYS")):
        if strategy in strategies:
            flags.append(flag)
    return flags


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = os.path.join(here, "..", "..", "hub-user", "src", "convert", "schema_table.rs")
    with tempfile.TemporaryDirectory() as d:
        structs, named, versions = go_types.load(d, ["api/" + g for g in GROUPS] + [META])
    schema = Schema(structs, named)

    # Top-level kinds: the structs of a group that embed TypeMeta and whose field 1 is an
    # ObjectMeta (an object) or a ListMeta (its list).
    kinds = []
    for g, api_version in GROUPS.items():
        module = "api/" + g
        for full, s in sorted(structs.items()):
            if not full.startswith(module + "/") or full.count("/") != module.count("/") + 1:
                continue
            meta = [f for f in s.fields if f.tag == 1 and f.go_type in (META + "/ObjectMeta", META + "/ListMeta")]
            if s.embeds_type_meta and meta:
                kinds.append((api_version, full.rsplit("/", 1)[1], full))
    kinds.append(("v1", "Status", META + "/Status"))

    # Every message reachable from a kind, numbered in a stable order.
    order, seen = [], set()
    def visit(full):
        if full in seen:
            return
        seen.add(full)
        order.append(full)
        for _, _, _, ty, _ in schema.fields(full):
            if ty not in SCALARS.values() and ty not in SPECIAL.values():
                visit(ty)
    for _, _, full in kinds:
        visit(full)
    index = {full: i for i, full in enumerate(order)}

    go_sources = ", ".join(f"{p} {v}" for p, v in sorted(versions.items()))
    lines = ["// @generated by `cargo xtask kube-schema` (xtask/kube-schema/generate.py) from the",
             f"// Go types of Debian's {go_sources}. Do not edit.",
             "",
             "use super::schema::{Card::*, Field, Kind, Message, Type::*, DROP_ZERO, EMPTY_LIST, INLINE, NULL_IF_ABSENT, OMITZERO, PATCH_MERGE, PATCH_REPLACE, RETAIN_KEYS};",
             "",
             "pub static MESSAGES: &[Message] = &["]
    merge_keys = []
    for full in order:
        is_list = any(full == k and k.endswith("List") for _, _, k in kinds)
        items_only = str(full in schema.items_only).lower()
        lines.append(f'    Message {{ name: "{full}", items_only: {items_only}, fields: &[')
        for json_name, tag, card, ty, field in sorted(schema.fields(full), key=lambda f: f[1]):
            if field is not None and field.inline:
                json_name = ""
            table_ty = ty if ty in SCALARS.values() or ty in SPECIAL.values() else f"Message({index[ty]})"
            flags = "|".join(flags_of(field, card, ty, is_list)) or "0"
            if field is not None and field.patch_merge_key:
                merge_keys.append((index[full], tag, field.patch_merge_key))
            lines.append(f'        Field {{ tag: {tag}, json: "{json_name}", ty: {table_ty}, '
                         f'card: {card}, flags: {flags} }},')
        lines.append("    ] },")
    lines.append("];")
    lines.append("")
    lines.append("pub static KINDS: &[Kind] = &[")
    for api_version, kind, full in kinds:
        lines.append(f'    Kind {{ api_version: "{api_version}", kind: "{kind}", message: {index[full]} }},')
    lines.append("];")
    lines.append("")
    lines.append("/// (message, field tag, merge key) of every list a strategic merge patch merges by a key.")
    lines.append("pub static MERGE_KEYS: &[(u16, u32, &str)] = &[")
    for message, tag, key in sorted(merge_keys):
        lines.append(f'    ({message}, {tag}, "{key}"),')
    lines.append("];")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out_path}: {len(order)} messages, {len(kinds)} kinds")


if __name__ == "__main__":
    main()
