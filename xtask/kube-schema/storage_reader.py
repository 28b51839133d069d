#!/usr/bin/env python3
"""Checks that kube-apiserver's own storage code reads what hubs push to a pool.

Builds storage-reader/main.go with k8s.io/apiserver (Debian's packages, fetched by
debian.py; built in GOPATH mode in a temporary directory), then runs the pool test that
hands it a coordinator's etcd: kube_apiserver_s_storage_code_reads_every_object_the_pool_holds.

Run by `cargo xtask kube-storage [--reader PATH] [--keep PATH]`.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import debian

PACKAGES = ["golang-go", "golang-k8s-apiserver-dev"]
TEST = "kube_apiserver_s_storage_code_reads_every_object_the_pool_holds"


def main():
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--reader", help="a storage-reader built before (skips the download and build)")
    args.add_argument("--keep", help="copy the storage-reader built to this path")
    args = args.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if args.reader:
        return run_test(here, os.path.abspath(args.reader))
    with tempfile.TemporaryDirectory() as d:
        root, versions = debian.fetch(d, PACKAGES, with_dependencies=True)
        print("k8s.io/apiserver", versions["golang-k8s-apiserver-dev"],
              "client-go", versions["golang-k8s-client-go-dev"],
              "Go", versions["golang-go"], flush=True)
        reader = os.path.join(d, "storage-reader")
        debian.go_build(root, d, os.path.join(here, "storage-reader", "main.go"), reader)
        if args.keep:
            shutil.copy(reader, args.keep)
        return run_test(here, reader)


def run_test(here, reader):
    repo = os.path.join(here, "..", "..")
    test = subprocess.run(["cargo", "test", "-j2", "-p", "hub-tests", "--test", "pool", "--",
                           "--ignored", "--exact", TEST],
                          cwd=repo, env=dict(os.environ, HUB_STORAGE_READER=reader))
    return test.returncode


if __name__ == "__main__":
    sys.exit(main())
