#!/usr/bin/env python3
"""CPU per 1000-pod list and its latency against a real kube-apiserver: straight to it,
through the hub (and a second hub build), and through nginx (HTTP/2 to the client,
HTTP/1.1 keep-alive upstream, no buffering). By hand, outside CI: the apiserver comes
from ../shared/peers (PEERS_DIR holds bin/kube-apiserver, bin/etcd-*, pki/, tools/).

usage: real-apiserver-lists.py PEERS_DIR HUB_BIN ROUNDS LISTS [HUB2_BIN]
  PROFILE=json|protobuf  perf-record the hub and nginx over LISTS reads instead
                         (DWARF=1: with DWARF call graphs, whose inclusive shares are whole)
  STRACE=json|protobuf   count the hub's and nginx's system calls over LISTS reads instead
  RECORD=1               print how the apiserver chunks the list over HTTP/1.1 instead
  COMPARE=1              check that every base answers the same list instead (JSON items
                         with the list's resourceVersion set aside; protobuf byte for byte)
  HUB2_CACHES_NOTHING=1  the second hub caches no component (what caching costs)
  GET=1                  GETs of one pod instead of lists (LISTS GETs a round, one connection)
Starts etcd, kube-apiserver, the hub(s) and nginx on loopback ports 52379, 36443,
10443/10453 and 10544, and stops them all by PID. Per round, every base lists in a
shuffled order, each opened by one unmeasured list; CPU is the processes' schedstat.
"""
import json, os, random, shutil, signal, socket, ssl, statistics, subprocess, sys, tempfile, time, urllib.request
from peers_hub import Procs, hub_yaml, request, start_cloud, wait_port

PEERS, HUB_BIN, ROUNDS, LISTS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
HUB2_BIN = sys.argv[5] if len(sys.argv) > 5 else None
READ = "/api/v1/namespaces/bench/pods" + ("/pod-0000" if os.environ.get("GET") else "")
PKI = f"{PEERS}/pki"
ETCD_PORT, API_PORT, HUB_PORT, HUB_ADMIN, NGINX_PORT = 52379, 36443, 10443, 10267, 10544
HUB2_PORT, HUB2_ADMIN = 10453, 10277
TOKEN = open(f"{PKI}/tokens.csv").read().split(",")[0]
work = tempfile.mkdtemp(prefix="real-apiserver-lists-")
procs = Procs(work)
start, stop_all = procs.start, procs.stop
ctx = ssl.create_default_context(cafile=f"{PKI}/ca.crt")


def api(method, path, body=None, port=API_PORT):
    return request(ctx, port, method, path, TOKEN, body)


def task_cpu_ns(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except OSError:
            pass
    return total


def cpu_ns(pids):
    return sum(task_cpu_ns(p) for p in pids)


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return out


def pod(i):
    env = [{"name": f"SETTING_{k}", "value": f"value-{k}-" + "x" * 40} for k in range(20)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pod-{i:04d}", "namespace": "bench",
                         "labels": {"app": "bench", "tier": f"t{i % 7}", "release": "stable", "team": "edge"},
                         "annotations": {"example.com/config": "y" * 400, "example.com/owner": "edge-team"}},
            "spec": {"nodeName": "edge-node-1", "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": "registry.invalid/app:1.2.3",
                                     "args": ["--port=8080", "--verbose"], "env": env,
                                     "ports": [{"containerPort": 8080, "name": "http"}],
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                                     "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}},
                                    {"name": "sidecar", "image": "registry.invalid/sidecar:0.9",
                                     "env": env[:8]}],
                     "tolerations": [{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}]}}


def curl(accept, ua):
    """curl over HTTP/2 as the measured client: the CA, the token, Accept, User-Agent."""
    return ["curl", "-s", "--http2", "--cacert", f"{PKI}/ca.crt", "-H", f"Authorization: Bearer {TOKEN}",
            "-H", f"Accept: {accept}", "-H", f"User-Agent: {ua}"]


def curl_lists(port, accept, n, ua, first_bytes=None):
    """n lists over one HTTP/2 connection; seconds each (and to each one's first byte,
    appended to `first_bytes`)."""
    url = f"https://127.0.0.1:{port}{READ}"
    args = curl(accept, ua) + ["-w", "%{time_total} %{size_download} %{http_code} %{time_starttransfer}\n"]
    for _ in range(n):
        args += ["-o", "/dev/null", url]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout.split("\n")
    times = []
    for line in out:
        if line.strip():
            t, size, code, first = line.split()
            assert code == "200", line
            times.append(float(t))
            if first_bytes is not None:
                first_bytes.append(float(first))
    assert len(times) == n, out
    return times


def ratios(values, against):
    """The median of the per-round ratios, and their range."""
    r = [v / a for v, a in zip(values, against)]
    return f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"


def compare_bodies(bases, encodings, ua):
    """One list from every base per encoding: the same objects everywhere, or it fails."""
    for enc, accept in encodings.items():
        seen = {}
        for label, (port, _) in bases.items():
            out = f"{work}/{label}.{enc}"
            subprocess.run(curl(accept, ua) + ["-o", out, f"https://127.0.0.1:{port}{READ}"], check=True, timeout=600)
            body = open(out, "rb").read()
            if enc == "json":
                doc = json.loads(body)
                doc["metadata"].pop("resourceVersion", None)
                body = json.dumps(doc, sort_keys=True).encode()
            seen[label] = body
        same = all(b == seen["direct"] for b in seen.values())
        print(f"{enc}: " + ", ".join(f"{l} {len(b)} bytes" for l, b in seen.items())
              + (": all the same" if same else ": THEY DIFFER"))
        assert same, f"{enc} lists differ between bases"


try:
    apiserver = start_cloud(procs, PEERS, ETCD_PORT, API_PORT, TOKEN, ctx)
    version = json.loads(api("GET", "/version")[1])["gitVersion"]
    api("POST", "/api/v1/namespaces", {"metadata": {"name": "bench"}})
    api("POST", "/api/v1/namespaces/bench/serviceaccounts", {"metadata": {"name": "default"}})
    for i in range(1000):
        code, body = api("POST", "/api/v1/namespaces/bench/pods", pod(i))
        assert code in (201, 409), body[:300]
    size_json = len(api("GET", "/api/v1/namespaces/bench/pods")[1])
    print(f"kube-apiserver {version}; 1000 pods, JSON list {size_json} bytes", flush=True)

    if os.environ.get("RECORD"):
        # The chunks of a list answered over HTTP/1.1 (what a hub's h1 client yields one at a time).
        out = {}
        for enc, accept in (("json", "application/json"), ("protobuf", "application/vnd.kubernetes.protobuf"),
                            ("json_gzip", "application/json"), ("protobuf_gzip", "application/vnd.kubernetes.protobuf")):
            c = ssl.create_default_context(cafile=f"{PKI}/ca.crt")
            c.set_alpn_protocols(["http/1.1"])
            sock = c.wrap_socket(socket.create_connection(("127.0.0.1", API_PORT)), server_hostname="127.0.0.1")
            gz = "Accept-Encoding: gzip\r\n" if enc.endswith("gzip") else ""
            sock.sendall((f"GET /api/v1/namespaces/bench/pods HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n{gz}"
                          f"Authorization: Bearer {TOKEN}\r\nUser-Agent: kubelet/v1.36.3\r\nConnection: close\r\n\r\n").encode())
            raw = b""
            while True:
                d = sock.recv(1 << 20)
                if not d:
                    break
                raw += d
            head, body = raw.split(b"\r\n\r\n", 1)
            assert b"chunked" in head.lower(), head
            sizes, at = [], 0
            while True:
                nl = body.index(b"\r\n", at)
                n = int(body[at:nl].split(b";")[0], 16)
                at = nl + 2 + n + 2
                if n == 0:
                    break
                sizes.append(n)
            from collections import Counter
            out[enc] = {"head": head.decode().split("\r\n")[0], "body_bytes": sum(sizes), "chunks": len(sizes),
                        "chunk_sizes_most_common": Counter(sizes).most_common(5),
                        "max_chunk": max(sizes), "min_chunk": min(sizes)}
            print(enc, json.dumps(out[enc]))
        json.dump(out, open(f"{work}/h1-framing.json", "w"), indent=1)
        raise SystemExit(0)
    bases = {"direct": (API_PORT, [apiserver.pid])}
    for label, binary, port, admin in [("hub", HUB_BIN, HUB_PORT, HUB_ADMIN), ("hub2", HUB2_BIN, HUB2_PORT, HUB2_ADMIN)]:
        if not binary:
            continue
        os.makedirs(f"{work}/{label}", exist_ok=True)
        extra = "  sharedResources: []\n"
        if label == "hub2" and os.environ.get("HUB2_CACHES_NOTHING"):
            extra += "  components: [nothing]\n"
        cfg = hub_yaml(PKI, API_PORT, port, admin, f"{work}/{label}/cache", extra)
        open(f"{work}/{label}/hub.yaml", "w").write(cfg)
        h = start([binary, "run", "--config", f"{work}/{label}/hub.yaml"], f"{label}.log")
        wait_port(port, label)
        bases[label] = (port, [h.pid])
    if shutil.which("nginx"):
        os.makedirs(f"{work}/nginx", exist_ok=True)
        open(f"{work}/nginx/nginx.conf", "w").write(f"""
worker_processes 1;
pid {work}/nginx/nginx.pid;
error_log {work}/nginx/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {work}/nginx/body; proxy_temp_path {work}/nginx/proxy;
  fastcgi_temp_path {work}/nginx/fcgi; uwsgi_temp_path {work}/nginx/uwsgi; scgi_temp_path {work}/nginx/scgi;
  upstream api {{ server 127.0.0.1:{API_PORT}; keepalive 16; }}
  server {{
    listen 127.0.0.1:{NGINX_PORT} ssl http2;
    ssl_certificate {PKI}/serving.crt; ssl_certificate_key {PKI}/serving.key;
    location / {{
      proxy_pass https://api;
      proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_ssl_trusted_certificate {PKI}/ca.crt; proxy_ssl_verify on; proxy_ssl_name localhost; proxy_ssl_server_name on;
      proxy_ssl_session_reuse on;
      proxy_buffering off; proxy_request_buffering off;
    }}
  }}
}}
""")
        ng = start(["nginx", "-c", f"{work}/nginx/nginx.conf", "-g", "daemon off;"], "nginx.log")
        wait_port(NGINX_PORT, "nginx")
        time.sleep(0.5)
        bases["nginx"] = (NGINX_PORT, [ng.pid] + children(ng.pid))
    ua = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0"
    encodings = {"json": "application/json", "protobuf": "application/vnd.kubernetes.protobuf"}
    # Warm every path once (TLS sessions, the hub's first cached copy).
    for label, (port, _) in bases.items():
        for accept in encodings.values():
            curl_lists(port, accept, 2, ua)
    if os.environ.get("COMPARE"):
        compare_bodies(bases, encodings, ua)
        raise SystemExit(0)
    if os.environ.get("PROFILE"):
        enc = os.environ["PROFILE"]
        for label in ("hub", "nginx"):
            port, pids = bases[label]
            curl_lists(port, encodings[enc], 3, ua)
            data = f"{work}/perf-{label}.data"
            graph = ["-F", "999", "--call-graph", "dwarf,16384"] if os.environ.get("DWARF") else ["-F", "1999", "-g"]
            perf = subprocess.Popen(["perf", "record", *graph, "-p", ",".join(map(str, pids)), "-o", data],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            curl_lists(port, encodings[enc], LISTS, ua)
            perf.send_signal(signal.SIGINT)
            perf.wait()
            subprocess.run(f"perf report -i {data} --no-children --percent-limit 0.5 --stdio -g none > {work}/perf-{label}.txt 2>/dev/null", shell=True)
            subprocess.run(f"perf report -i {data} --children --percent-limit 1.5 --stdio -g none > {work}/perf-{label}-children.txt 2>/dev/null", shell=True)
            print(f"profile: {work}/perf-{label}.txt")
        raise SystemExit(0)
    if os.environ.get("STRACE"):
        enc = os.environ["STRACE"]
        for label in ("hub", "nginx"):
            port, pids = bases[label]
            pid = pids[-1]
            st = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", f"{work}/strace-{label}.txt"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            curl_lists(port, encodings[enc], LISTS, ua)
            st.send_signal(signal.SIGINT)
            st.wait()
            print(f"== {label} ({LISTS} {enc} reads)")
            print(open(f"{work}/strace-{label}.txt").read())
        raise SystemExit(0)
    results = {}
    rng = random.Random(7)
    for rnd in range(ROUNDS):
        order = list(bases)
        rng.shuffle(order)
        for enc, accept in encodings.items():
            for label in order:
                port, pids = bases[label]
                # One list unmeasured: a cache that stores each encoding's list as its own
                # copy re-reads the list after the other encoding's (a real client keeps
                # to one encoding); then the writer's queue is left to drain.
                curl_lists(port, accept, 1, ua)
                time.sleep(1)
                before, api_before = cpu_ns(pids), cpu_ns([apiserver.pid])
                first_bytes = []
                times = curl_lists(port, accept, LISTS, ua, first_bytes)
                cpu = (cpu_ns(pids) - before) / LISTS / 1e6
                api_cpu = (cpu_ns([apiserver.pid]) - api_before) / LISTS / 1e6
                r = results.setdefault((enc, label), {"cpu": [], "p50": [], "first_byte": [], "api": []})
                r["cpu"].append(cpu)
                r["p50"].append(statistics.median(times) * 1000)
                r["first_byte"].append(statistics.median(first_bytes) * 1000)
                r["api"].append(api_cpu)
                print(f"round {rnd} {enc:8} {label:6} proxy CPU/list {cpu if label != 'direct' else 0:7.3f} ms  "
                      f"p50 {statistics.median(times) * 1000:6.1f} ms  apiserver CPU/list {api_cpu:6.1f} ms", flush=True)
    print("\nsummary (ranges over rounds): proxy CPU per list, p50 latency, apiserver CPU per list (ms)")
    for (enc, label), r in sorted(results.items()):
        rng_ = lambda v: f"{min(v):.1f}-{max(v):.1f}"
        cpu = "-" if label == "direct" else rng_(r["cpu"])
        print(f"{version} {enc:8} {label:6} proxy {cpu:>12}  p50 {rng_(r['p50']):>12}  apiserver {rng_(r['api']):>12}")
    print("\nmedians of the per-round ratios (range): CPU against nginx's, p50 against direct's;"
          " time to the first byte, ms")
    for (enc, label), r in sorted(results.items()):
        nginx, direct = results.get((enc, "nginx")), results[(enc, "direct")]
        cpu = ratios(r["cpu"], nginx["cpu"]) if nginx and label != "direct" else "-"
        print(f"{version} {enc:8} {label:6} CPU {cpu:>18}  p50 {ratios(r['p50'], direct['p50']):>18}"
              f"  first byte {statistics.median(r['first_byte']):6.1f}")
    json.dump({f"{e}/{l}": r for (e, l), r in results.items()}, open(f"{work}/results.json", "w"))
    print(f"raw: {work}/results.json")
finally:
    stop_all()
    shutil.rmtree(f"{work}/etcd", ignore_errors=True)
