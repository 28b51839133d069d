#!/usr/bin/env python3
"""Writes tests/fixtures/kube-oracle/samples.jsonl.gz: random objects of every kind the hub
converts, filled, encoded to protobuf and decoded and written as JSON by Kubernetes' own Go
code (oracle/main.go), for tests/tests/convert.rs to check the hub's converter against.

Run by `cargo xtask kube-oracle [--seed S] [--count N]`. Go, k8s.io/api and k8s.io/apimachinery
come from Debian's packages (debian.py) and are built in GOPATH mode in a temporary directory.

With --check-hub HUB it writes no fixture: instead each sample's JSON goes through
`HUB convert` to protobuf (what the hub stores in the coordinator for JSON it read) and the
Go program decodes that protobuf as kube-apiserver reads it from etcd; each must give back
the sample's JSON.
"""
import argparse
import base64
import gzip
import json
import os
import subprocess
import sys
import tempfile

import debian

PACKAGES = ["golang-go", "golang-k8s-api-dev", "golang-k8s-apimachinery-dev"]


def main():
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--seed", type=int, default=1)
    args.add_argument("--count", type=int, default=10, help="objects per kind")
    args.add_argument("--check-hub", metavar="HUB", help="check HUB's JSON -> protobuf instead")
    args = args.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = os.path.join(here, "..", "..", "tests", "fixtures", "kube-oracle")
    with tempfile.TemporaryDirectory() as d:
        root, versions = debian.fetch(d, PACKAGES, with_dependencies=True)
        oracle = os.path.join(d, "kube-oracle")
        debian.go_build(root, d, os.path.join(here, "oracle", "main.go"), oracle)
        samples = subprocess.run([oracle, str(args.seed), str(args.count)], check=True,
                                 capture_output=True).stdout
        if args.check_hub:
            return check_hub(args.check_hub, oracle, samples)
    os.makedirs(out_dir, exist_ok=True)
    with gzip.GzipFile(os.path.join(out_dir, "samples.jsonl.gz"), "wb", 9, mtime=0) as f:
        f.write(samples)
    with open(os.path.join(out_dir, "SOURCES"), "w") as f:
        f.write(f"seed {args.seed}, {args.count} objects per kind, written by "
                "xtask/kube-schema/oracle/main.go built with Debian's\n")
        for p in ("golang-go", "golang-k8s-api-dev", "golang-k8s-apimachinery-dev"):
            f.write(f"{p} {versions[p]}\n")
    objects = samples.count(b"\n")
    print(f"{out_dir}/samples.jsonl.gz: {objects} objects")


def check_hub(hub, oracle, samples):
    samples = [json.loads(line) for line in samples.splitlines()]
    encoded = []
    for s in samples:
        pb = subprocess.run([hub, "convert"], input=json.dumps(s["json"]).encode(),
                            capture_output=True, check=True).stdout
        encoded.append(base64.b64encode(pb).decode())
    decoded = subprocess.run([oracle, "decode"], input="\n".join(encoded).encode() + b"\n",
                             capture_output=True, check=True).stdout.splitlines()
    wrong = [f"{s['apiVersion']} {s['kind']} seed {s['seed']}: Go read {line[:300]!r}"
             for s, line in zip(samples, decoded) if json.loads(line) != s["json"]]
    print(f"{len(samples)} objects converted to protobuf by {hub}; "
          f"{len(samples) - len(wrong)} read back by Go as the same object")
    for w in wrong:
        print(w)
    sys.exit(1 if wrong or len(decoded) != len(samples) else 0)


if __name__ == "__main__":
    main()
