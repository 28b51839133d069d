#!/usr/bin/env python3
"""A burst of watch events through the hub's cache against a real kube-apiserver, by hand,
outside CI (PEERS_DIR from ../shared/peers).

usage: real-apiserver-watch-burst.py PEERS_DIR HUB_BIN [CONFIGMAPS]
Creates CONFIGMAPS (default 10000) ConfigMaps of about 1 KiB, then watches them from
resourceVersion=0 as the kubelet would (its User-Agent), straight to the apiserver and
through the hub, and compares the two streams' events (type, name, resourceVersion, in
order). The initial events outrun the hub's cache writer, so the hub's stream waits for
it past its bound (`hub status`: writer_waits); the check is that nothing is lost on the
way or in the cache. Starts etcd, kube-apiserver and the hub on loopback ports 52379,
36443, 10443 and 10267, and stops them by PID.
"""
import concurrent.futures, json, shutil, ssl, subprocess, sys, tempfile, time, urllib.request
from peers_hub import Procs, hub_yaml, request, start_cloud, wait_port

PEERS, HUB = sys.argv[1], sys.argv[2]
COUNT = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
PKI = f"{PEERS}/pki"
ETCD, API, HUBP, ADMIN = 52379, 36443, 10443, 10267
TOKEN = open(f"{PKI}/tokens.csv").read().split(",")[0]
UA = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0"
work = tempfile.mkdtemp(prefix="watch-burst-")
procs = Procs(work)
ctx = ssl.create_default_context(cafile=f"{PKI}/ca.crt")


def req(method, path, body=None):
    return request(ctx, API, method, path, TOKEN, body, timeout=60)


def cache_status():
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/v1/status", timeout=10).read())["cache"]


def watch_events(port, count):
    """The first `count` events of a watch from resourceVersion=0: (type, name, rv)."""
    r = urllib.request.Request(f"https://127.0.0.1:{port}/api/v1/namespaces/burst/configmaps?watch=true&resourceVersion=0",
                               headers={"Authorization": f"Bearer {TOKEN}", "User-Agent": UA})
    seen = []
    started = time.time()
    with urllib.request.urlopen(r, context=ctx, timeout=120) as x:
        while len(seen) < count:
            line = x.readline()
            if not line:
                raise SystemExit(f"the watch on {port} ended after {len(seen)} events")
            e = json.loads(line)
            m = e["object"]["metadata"]
            seen.append((e["type"], m.get("name"), m["resourceVersion"]))
    return seen, time.time() - started


try:
    start_cloud(procs, PEERS, ETCD, API, TOKEN, ctx)
    print("version", json.loads(req("GET", "/version")[1])["gitVersion"], flush=True)
    req("POST", "/api/v1/namespaces", body={"metadata": {"name": "burst"}})
    filler = "x" * 1000

    def create(i):
        c, b = req("POST", "/api/v1/namespaces/burst/configmaps",
                   body={"metadata": {"name": f"cm-{i:05d}"}, "data": {"v": filler}})
        assert c == 201, b

    t = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(COUNT)))
    print(f"{COUNT} configmaps created in {time.time() - t:.1f} s", flush=True)
    open(f"{work}/hub.yaml", "w").write(hub_yaml(PKI, API, HUBP, ADMIN, f"{work}/cache"))
    procs.start([HUB, "run", "--config", f"{work}/hub.yaml"], "hub.log")
    wait_port(HUBP, "the hub")
    direct, direct_s = watch_events(API, COUNT)
    via, via_s = watch_events(HUBP, COUNT)
    print(f"direct: {len(direct)} events in {direct_s:.2f} s; through the hub: {len(via)} in {via_s:.2f} s")
    print("the same events in the same order:", direct == via)
    # The cache must end up holding every one of them.
    for _ in range(300):
        c = cache_status()
        if c["pending"] == 0:
            break
        time.sleep(0.2)
    c = cache_status()
    print(f"cache: {c['entries']} entries, {c['written']} written, {c['pending']} pending "
          f"({c.get('pending_bytes')} bytes), writer waits {c.get('writer_waits')}, rejected {c['rejected']}")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/metrics", timeout=10).read().decode()
    print("metrics:", "; ".join(l for l in metrics.splitlines()
                                if l.startswith(("hub_cache_writer_waits", "hub_cache_pending_bytes"))))
    out = subprocess.run([HUB, "cache", "ls", "--dir", f"{work}/cache", "--resource", "configmaps"], capture_output=True, text=True)
    names = sum(1 for l in out.stdout.splitlines() if "configmaps" in l and "cm-" in l)
    print(f"hub cache ls: {names} configmaps listed (exit {out.returncode}{', ' + out.stderr.strip()[:200] if out.returncode else ''})")
finally:
    procs.stop()
    shutil.rmtree(work, ignore_errors=True)
