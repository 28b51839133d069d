"""Kubernetes' Go API types (k8s.io/api, k8s.io/apimachinery), read for everything the
protobuf <-> JSON schema needs: per struct field, its protobuf number, its JSON name and
options (`omitempty`, `omitzero`, `inline`), its strategic-merge-patch strategy and merge
key, and its Go type — which says whether it is held
by pointer or by value, a list, a map or another struct, and so its wire type (the protobuf
tag's own words for wire type and repetition are not always right).

The sources come from Debian's golang-k8s-api-dev and golang-k8s-apimachinery-dev packages
(debian.py).
"""
import os
import re

import debian

PACKAGES = ["golang-k8s-api-dev", "golang-k8s-apimachinery-dev"]


class Field:
    def __init__(self, go_name, go_type, json_tag, pb_tag, patch_strategy="", patch_merge_key=""):
        self.go_name = go_name
        # Strategic merge patch: "merge", "replace", "retainKeys" or "merge,retainKeys", and
        # the key list elements are matched by.
        self.patch_strategy = patch_strategy
        self.patch_merge_key = patch_merge_key
        name, *opts = json_tag.split(",")
        self.json = name
        self.inline = "inline" in opts
        self.omitempty = "omitempty" in opts
        self.omitzero = "omitzero" in opts
        self.tag = int(pb_tag.split(",")[1])
        self.pointer = go_type.startswith("*")
        self.go_type = go_type.lstrip("*")


class Struct:
    def __init__(self, fields, embeds_type_meta):
        self.fields = fields
        self.embeds_type_meta = embeds_type_meta


def parse(k8s_io, modules):
    """Reads the Go packages at k8s.io/<module> for each module ('api/core/v1',
    'apimachinery/pkg/apis/meta/v1'). Returns ({module/Struct: Struct}, {module/Name: Go
    type} of the named non-struct types, e.g. 'string' or '[]string')."""
    structs, named = {}, {}
    for module in modules:
        pkg = os.path.join(k8s_io, module)
        for fn in sorted(os.listdir(pkg)):
            if (not fn.endswith(".go") or fn.endswith("_test.go") or fn.startswith("zz_generated")
                    or fn == "generated.pb.go"):
                continue
            text = open(os.path.join(pkg, fn)).read()
            imports = file_imports(text)
            qualify = lambda t: qualified(t, module, imports)
            for m in re.finditer(r"^type (\w+) (\S+)$", text, re.M):
                named[module + "/" + m.group(1)] = qualify(m.group(2))
            for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", text, re.S | re.M):
                fields, type_meta = [], False
                for f in re.finditer(r'^\t(?:(\w+)\s+)?(\S+)\s+`([^`]*)`', m.group(2), re.M):
                    go_name, go_type, tags = f.group(1), f.group(2), f.group(3)
                    json_tag = re.search(r'json:"([^"]*)"', tags)
                    pb_tag = re.search(r'protobuf:"([^"]*)"', tags)
                    if go_type.endswith("TypeMeta") and not pb_tag:
                        type_meta = True
                    if not json_tag or not pb_tag or json_tag.group(1) == "-":
                        continue
                    strategy = re.search(r'patchStrategy:"([^"]*)"', tags)
                    merge_key = re.search(r'patchMergeKey:"([^"]*)"', tags)
                    fields.append(Field(go_name or go_type.rsplit(".", 1)[-1], qualify(go_type),
                                        json_tag.group(1), pb_tag.group(1),
                                        strategy.group(1) if strategy else "",
                                        merge_key.group(1) if merge_key else ""))
                structs[module + "/" + m.group(1)] = Struct(fields, type_meta)
    return structs, named


def file_imports(text):
    """{package name: import path under k8s.io} of one Go file's imports."""
    out = {}
    block = re.search(r"^import \((.*?)^\)", text, re.S | re.M)
    lines = block.group(1).splitlines() if block else re.findall(r"^import (.*)$", text, re.M)
    for line in lines:
        m = re.match(r'\s*(\w+\s+)?"k8s\.io/([^"]+)"', line)
        if m:
            path = m.group(2)
            out[(m.group(1) or path.rsplit("/", 1)[-1]).strip()] = path
    return out


def qualified(go_type, module, imports):
    """A Go type with every named type in it written module/Name ('*v1.PodSpec' in apps/v1 ->
    '*api/core/v1/PodSpec'); builtin types stay as they are."""
    def one(m):
        pkg, name = m.group(1), m.group(2)
        if pkg:
            return imports.get(pkg[:-1], pkg[:-1]) + "/" + name
        if name in ("string", "bool", "int32", "int64", "int", "float64", "byte", "map"):
            return name
        return module + "/" + name
    return re.sub(r"((?:\w+\.)?)([A-Za-z_]\w*)", one, go_type)


def load(workdir, modules):
    """Fetches the Go types into workdir and parses them (see parse); also returns the
    package versions."""
    root, versions = debian.fetch(workdir, PACKAGES)
    k8s_io = os.path.join(root, "usr", "share", "gocode", "src", "k8s.io")
    return (*parse(k8s_io, modules), versions)
