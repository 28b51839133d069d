#!/usr/bin/env python3
"""GETs at resourceVersion=0 through the hub's node-level watch cache against a real
kube-apiserver, by hand, outside CI (PEERS_DIR from ../shared/peers).

usage: real-apiserver-gets.py PEERS_DIR HUB_BIN
A user allowed to GET one service by name (RBAC resourceNames) reads it twice through the
hub: the first GET goes to the apiserver, the next comes from the set, equal to the
apiserver's own answer in JSON and protobuf; the other service stays refused. Prints what
it saw. Starts etcd, kube-apiserver and the hub on loopback ports 52379, 36443, 10443 and
10267, and stops them by PID.
"""
import json, shutil, ssl, sys, tempfile, time, urllib.request
from peers_hub import Procs, hub_yaml, request, start_cloud, wait_port
PEERS, HUB = sys.argv[1], sys.argv[2]
PKI = f"{PEERS}/pki"; ETCD, API, HUBP, ADMIN = 52379, 36443, 10443, 10267
toks = [l.split(",") for l in open(f"{PKI}/tokens.csv").read().splitlines()]
ADMIN_T = toks[0][0]; ALICE_T = toks[1][0]
work = tempfile.mkdtemp(prefix="getcheck-"); procs = Procs(work)
ctx = ssl.create_default_context(cafile=f"{PKI}/ca.crt")
def req(method, path, token, port=API, body=None, accept="application/json"):
    return request(ctx, port, method, path, token, body, accept)
def status(): return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/v1/status", timeout=10).read())["node_watch_cache"]
try:
    start_cloud(procs, PEERS, ETCD, API, ADMIN_T, ctx)
    print("version", json.loads(req("GET", "/version", ADMIN_T)[1])["gitVersion"])
    req("POST", "/api/v1/namespaces", ADMIN_T, body={"metadata": {"name": "a"}})
    for n in ("svc-a", "svc-b"):
        c, b = req("POST", "/api/v1/namespaces/a/services", ADMIN_T, body={"metadata": {"name": n}, "spec": {"ports": [{"port": 80}]}})
        assert c == 201, b
    c, b = req("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles", ADMIN_T, body={"metadata": {"name": "one"},
        "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["get"], "resourceNames": ["svc-a"]}]})
    assert c == 201, b
    c, b = req("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings", ADMIN_T, body={"metadata": {"name": "one"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "one"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
    assert c == 201, b
    open(f"{work}/hub.yaml", "w").write(hub_yaml(PKI, API, HUBP, ADMIN, f"{work}/cache"))
    procs.start([HUB, "run", "--config", f"{work}/hub.yaml"], "hub.log")
    wait_port(HUBP, "the hub")
    # The set starts on a list and must be current.
    for _ in range(100):
        req("GET", "/api/v1/services?resourceVersion=0", ADMIN_T, port=HUBP)
        sets = status()["sets"]
        if sets and all(s["state"] == "current" for s in sets): break
        time.sleep(0.3)
    print("sets", [(s["gvr"], s["state"], s["objects"]) for s in status()["sets"]])
    A = "/api/v1/namespaces/a/services/svc-a?resourceVersion=0"
    B = "/api/v1/namespaces/a/services/svc-b?resourceVersion=0"
    g0 = status()["gets_served"]
    r1 = req("GET", A, ALICE_T, port=HUBP); print("alice svc-a first", r1[0], "gets_served", status()["gets_served"] - g0)
    r2 = req("GET", A, ALICE_T, port=HUBP); d = req("GET", A, ALICE_T)
    print("alice svc-a second", r2[0], "gets_served", status()["gets_served"] - g0, "json equal to direct:", json.loads(r2[1]) == json.loads(d[1]))
    p2 = req("GET", A, ALICE_T, port=HUBP, accept="application/vnd.kubernetes.protobuf"); pd = req("GET", A, ALICE_T, accept="application/vnd.kubernetes.protobuf")
    print("alice svc-a protobuf", p2[0], "bytes equal to direct:", p2[1] == pd[1], len(p2[1]), "gets_served", status()["gets_served"] - g0)
    for i in range(2):
        rb = req("GET", B, ALICE_T, port=HUBP); print("alice svc-b", rb[0], json.loads(rb[1]).get("message", "")[:120], "svc-b in body:", b'"ports"' in rb[1])
    print("gets_served", status()["gets_served"] - g0, "last_passed:", status()["last_passed"])
    # The cloud changes svc-a; the set's answer shows it.
    c, b = req("GET", "/api/v1/namespaces/a/services/svc-a", ADMIN_T); o = json.loads(b); o["metadata"]["labels"] = {"changed": "yes"}
    c, b = req("PUT", "/api/v1/namespaces/a/services/svc-a", ADMIN_T, body=o); newrv = json.loads(b)["metadata"]["resourceVersion"]
    for _ in range(50):
        r = req("GET", A, ALICE_T, port=HUBP)
        if json.loads(r[1])["metadata"]["resourceVersion"] == newrv: break
        time.sleep(0.1)
    print("after the change: hub rv", json.loads(r[1])["metadata"]["resourceVersion"], "cloud rv", newrv, "gets_served", status()["gets_served"] - g0)
finally:
    procs.stop()
    shutil.rmtree(work, ignore_errors=True)
