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
import concurrent.futures, json, os, shutil, signal, socket, ssl, subprocess, sys, tempfile, time, urllib.request
from peers_hub import hub_yaml

PEERS, HUB = sys.argv[1], sys.argv[2]
COUNT = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
PKI = f"{PEERS}/pki"
ETCD, API, HUBP, ADMIN = 52379, 36443, 10443, 10267
TOKEN = open(f"{PKI}/tokens.csv").read().split(",")[0]
UA = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0"
work = tempfile.mkdtemp(prefix="watch-burst-")
procs = []
ctx = ssl.create_default_context(cafile=f"{PKI}/ca.crt")


def start(args, log):
    p = subprocess.Popen(args, stdout=open(f"{work}/{log}", "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def wait_port(port):
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"nothing listens on {port}")


def req(method, path, port=API, body=None):
    r = urllib.request.Request(f"https://127.0.0.1:{port}{path}", method=method,
                               data=json.dumps(body).encode() if body else None,
                               headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, context=ctx, timeout=60) as x:
            return x.status, x.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


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
    etcd = [f for f in os.listdir(f"{PEERS}/bin") if f.startswith("etcd-")][0]
    start([f"{PEERS}/bin/{etcd}", "--data-dir", f"{work}/etcd", "--listen-client-urls", f"http://127.0.0.1:{ETCD}",
           "--advertise-client-urls", f"http://127.0.0.1:{ETCD}", "--listen-peer-urls", f"http://127.0.0.1:{ETCD + 1}",
           "--quota-backend-bytes", str(4 << 30)], "etcd.log")
    wait_port(ETCD)
    start([f"{PEERS}/tools/start-apiserver.sh", f"http://127.0.0.1:{ETCD}", str(API), "Node,RBAC"], "api.log")
    wait_port(API)
    for _ in range(240):
        if req("GET", "/readyz")[0] == 200:
            break
        time.sleep(0.5)
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
    start([HUB, "run", "--config", f"{work}/hub.yaml"], "hub.log")
    wait_port(HUBP)
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
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    shutil.rmtree(work, ignore_errors=True)
