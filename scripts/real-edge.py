#!/usr/bin/env python3
"""A node's real clients through link cuts, straight to a real kube-apiserver and through
the hub, side by side in one run: what `cargo xtask bench edge` measures with emulated
clients, measured with the real kubelet and kube-proxy (run as root, by hand: CI has no
Kubernetes builds).

usage: real-edge.py PEERS_DIR HUB_BIN XTASK_BIN [MINUTES=60] [CUT_EVERY=600] [PODS=30] [SERVICES=50]

PEERS_DIR is a ../shared/peers build (kube-apiserver, kubelet, kube-proxy, etcd). XTASK_BIN
is target/*/xtask: its `relay` carries each node's link to the cloud, counts the bytes on
it (TLS records, HTTP/2 frames, headers) and cuts both links at once every CUT_EVERY
seconds for 30 s (every packet held, then every open connection reset).

Two nodes, each in a network namespace of its own holding a private containerd (CRI, its
own root, state and socket), a kubelet and a kube-proxy (iptables mode: its rules stay in
that namespace). Their apiserver address, 127.0.0.1:6443 inside the namespace, is carried
out of it by this script:
- node edge-node-0 ("direct"): to the relay, then the cloud;
- node edge-node-1 ("hub"): to the hub on the host's loopback, whose cloud is the relay.
Each kubelet runs PODS host-network pods (a busybox `sleep`, imported into its
containerd). The cloud's admin, whose traffic is no node's, changes a pod of each node
every 10 s, an EndpointSlice every 30 s, each Node every minute, and replaces a service
every 2 minutes. The apiserver's audit log tells requests by node and verb.

At the end, with the changes stopped, each kube-proxy's iptables rules must send every
service's address to the cloud's endpoints, and each kubelet's pods (its read-only /pods)
must carry the cloud's annotations, or the run fails. Results: results.json in the run's
directory (also printed): bytes each way and connections per side (from the relay), the
requests by verb and by client and the relists (LISTs and streamed lists) per side (from
the apiserver's audit log), and each side's ratio to direct.
REAL_EDGE_CONTAINERD_LOG=debug gives the runtimes' debug log."""
import ctypes, glob, hashlib, io, json, os, shutil, socket, ssl, subprocess, sys, tarfile, tempfile, threading, time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers_hub import Procs, hub_yaml, request, start_cloud, wait_port  # noqa: E402

CUT_SECONDS = 30
SETTLE = 180
IMAGE = "registry.local/sleep:1"
PAUSE = "registry.local/pause:1"
# (side, node, network namespace, kube-proxy's user); the namespaces are named per run, so
# that two runs can go side by side.
NODES = [("direct", "edge-node-0", f"real-edge-{os.getpid()}-a", "kube-proxy-a"),
         ("hub", "edge-node-1", f"real-edge-{os.getpid()}-b", "kube-proxy-b")]
# Each node's address, on a dummy interface inside its own namespace (a kubelet refuses a
# loopback node IP); data in the Node objects, never dialled.
NODE_IP = {"edge-node-0": "10.250.0.10", "edge-node-1": "10.250.0.11"}
PROXY_ROLE = "system:node-proxier"
CLONE_NEWNET = 0x40000000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


# --- the cloud's side ------------------------------------------------------------------------

def make_pki(peers, pki):
    """The kit's PKI plus a certificate for edge-node-0 and a token per kube-proxy."""
    shutil.copytree(f"{peers}/pki", pki)
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{pki}/node-edge-node-0.key",
        "-subj", "/O=system:nodes/CN=system:node:edge-node-0", "-out", f"{pki}/node-edge-node-0.csr")
    open(f"{pki}/client.ext", "w").write("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    run("openssl", "x509", "-req", "-in", f"{pki}/node-edge-node-0.csr", "-CA", f"{pki}/ca.crt", "-CAkey",
        f"{pki}/ca.key", "-CAcreateserial", "-days", "2", "-extfile", f"{pki}/client.ext",
        "-out", f"{pki}/node-edge-node-0.crt")
    tokens = {}
    with open(f"{pki}/tokens.csv", "a") as f:
        for _, _, _, user in NODES:
            tokens[user] = os.urandom(16).hex()
            f.write(f"{tokens[user]},{user},{user}-uid\n")
    admin = open(f"{pki}/tokens.csv").readline().split(",")[0]
    return admin, tokens


AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


class Cloud:
    """Requests of the cloud's admin, straight to the apiserver."""

    def __init__(self, port, token, ctx):
        self.port, self.token, self.ctx = port, token, ctx

    def __call__(self, method, path, body=None, ok=(200, 201)):
        status, out = request(self.ctx, self.port, method, path, self.token, body)
        if status not in ok:
            raise SystemExit(f"{method} {path}: {status} {out[:300]!r}")
        return json.loads(out) if out else None

    def patch(self, path, body):
        """A JSON merge patch."""
        status, out = request(self.ctx, self.port, "PATCH", path, self.token, body,
                              content_type="application/merge-patch+json")
        if status != 200:
            raise SystemExit(f"PATCH {path}: {status} {out[:300]!r}")
        return json.loads(out)


def service(i):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}


def slice_of(i, tick):
    """svc-i's EndpointSlice: two documentation addresses (data in objects and in the
    namespaces' iptables rules; never dialled)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-x", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": f"svc-{i}",
                                    "endpointslice.kubernetes.io/managed-by": "real-edge.hub"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [f"192.0.2.{1 + (i + tick) % 250}"], "conditions": {"ready": True}},
                          {"addresses": [f"198.51.100.{1 + (i * 7 + tick) % 250}"], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}


def seed(cloud, services, peers, work):
    # What deploying the hub grants the nodes (deploy/base/hub.yaml): list and watch of the
    # shared resources the default system:node role leaves out. Without a controller
    # manager its DaemonSet stays a record.
    kubectl = next(f for f in os.listdir(f"{peers}/bin") if f.startswith("kubectl"))
    open(f"{work}/admin.kubeconfig", "w").write(
        kubeconfig(f"https://127.0.0.1:{cloud.port}", f"{work}/pki/ca.crt", token=cloud.token))
    run(f"{peers}/bin/{kubectl}", "--kubeconfig", f"{work}/admin.kubeconfig", "apply", "-f",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "../deploy/base/hub.yaml"))
    cloud("POST", "/api/v1/namespaces/default/serviceaccounts",
          {"metadata": {"name": "default"}}, ok=(201, 409))
    for _, _, _, user in NODES:
        cloud("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
              {"metadata": {"name": f"real-edge-{user}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PROXY_ROLE},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    for i in range(services):
        cloud("POST", "/api/v1/namespaces/default/services", service(i))
        cloud("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", slice_of(i, 0))


def pod(node, i):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{node}-p{i:02}", "namespace": "default", "annotations": {"tick": "0"}},
            "spec": {"nodeName": node, "hostNetwork": True, "automountServiceAccountToken": False,
                     "enableServiceLinks": False, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never"}]}}


class Changes(threading.Thread):
    """The cloud's admin at work, until `stop`."""

    def __init__(self, cloud, services, pods):
        super().__init__(daemon=True)
        self.cloud, self.services, self.pods = cloud, services, pods
        self.done, self.errors, self.count = threading.Event(), [], Counter()

    def run(self):
        t = 0
        while not self.done.wait(10):
            t += 10
            try:
                for _, node, _, _ in NODES:
                    self.cloud.patch(f"/api/v1/namespaces/default/pods/{node}-p{(t // 10) % self.pods:02}",
                                     {"metadata": {"annotations": {"tick": str(t)}}})
                    self.count["pod"] += 1
                if t % 30 == 0:
                    i = (t // 30) % self.services
                    cur = self.cloud("GET", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/svc-{i}-x")
                    body = slice_of(i, t)
                    body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                    self.cloud("PUT", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/svc-{i}-x", body)
                    self.count["endpointslice"] += 1
                if t % 60 == 0:
                    for _, node, _, _ in NODES:
                        self.cloud.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"tick": str(t)}}})
                        self.count["node"] += 1
                if t % 120 == 0:
                    i = (t // 120 * 7) % self.services
                    self.cloud("DELETE", f"/api/v1/namespaces/default/services/svc-{i}")
                    self.cloud("POST", "/api/v1/namespaces/default/services", service(i))
                    self.count["service replaced"] += 1
            except Exception as e:  # the admin talks to the cloud directly; any error is the run's
                self.errors.append(f"t={t}: {e}")

    def stop(self):
        self.done.set()
        self.join(60)


# --- a node ----------------------------------------------------------------------------------

def sleep_image(path):
    """A docker-archive of one layer, busybox with `sleep` and `sh`, tagged as the pods'
    image and as the sandbox image: no registry is reachable here."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        info = t.gettarinfo("/bin/busybox", "bin/busybox")
        info.uid = info.gid = 0
        with open("/bin/busybox", "rb") as f:
            t.addfile(info, f)
        for name in ("sleep", "sh"):
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(link)
    layer = layer.getvalue()
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Cmd": ["/bin/sleep", "2147483647"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    with tarfile.open(path, "w") as t:
        for name, data in ((cfg_name, config), ("layer.tar", layer),
                           ("manifest.json", json.dumps([{"Config": cfg_name, "RepoTags": [IMAGE, PAUSE],
                                                          "Layers": ["layer.tar"]}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def containerd_config(d):
    os.makedirs(f"{d}/cni", exist_ok=True)
    # Host-network pods need no CNI plugin; the runtime reports its network ready once it
    # has loaded a configuration, and loopback is one.
    json.dump({"cniVersion": "1.0.0", "name": "lo-only", "plugins": [{"type": "loopback"}]},
              open(f"{d}/cni/10-lo.conflist", "w"))
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
  level = "{os.environ.get('REAL_EDGE_CONTAINERD_LOG', 'info')}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  disable_apparmor = true
  # A sandbox asks for oom_score_adj -998, which a machine may refuse (this one does);
  # no lower than the runtime's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
"""


def kubelet_config(d, pki):
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {pki}/ca.crt}}
authorization: {{mode: AlwaysAllow}}
address: 127.0.0.1
port: 10250
readOnlyPort: 10255
healthzPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd.sock
podLogsDir: {d}/pod-logs
resolvConf: /etc/resolv.conf
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
localStorageCapacityIsolation: false
serializeImagePulls: false
"""


def kubeconfig(server, ca, cert=None, key=None, token=None):
    user = {"token": token} if token else {"client-certificate": cert, "client-key": key}
    return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                       "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
                       "users": [{"name": "u", "user": user}],
                       "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})


libc = ctypes.CDLL(None, use_errno=True)


def listen_in_netns(netns, port):
    """A listening socket on 127.0.0.1:`port` inside `netns`; the calling thread comes back
    to its own namespace (sockets keep the one they were made in)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(there, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back")
        os.close(home)
        os.close(there)
    return s


def carry(listener, target_port):
    """Every connection to `listener` carried to 127.0.0.1:`target_port` on the host, both
    ways, byte for byte; each end's close passed on."""
    def pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s, how in ((b, socket.SHUT_WR), (a, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass

    def serve():
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", target_port), 10)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            threading.Thread(target=pump, args=(c, u), daemon=True).start()
            threading.Thread(target=pump, args=(u, c), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()


class Node:
    """One node's namespace and processes."""

    def __init__(self, work, procs, side, name, netns):
        self.side, self.name, self.netns, self.procs = side, name, netns, procs
        self.d = f"{work}/{side}"
        self.sock = f"{self.d}/containerd.sock"
        self.listener = None
        self.containers = []

    def make(self, pki, proxy_token, upstream_port):
        """The namespace, its way out to `upstream_port`, and the node's configuration."""
        netns, name = self.netns, self.name
        os.makedirs(f"{self.d}/pod-logs", exist_ok=True)
        run("ip", "netns", "add", netns)
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", netns, "link", "add", "node", "type", "veth", "peer", "name", "node-peer")
        run("ip", "-n", netns, "addr", "add", f"{NODE_IP[name]}/24", "dev", "node")
        run("ip", "-n", netns, "link", "set", "node", "up")
        run("ip", "-n", netns, "link", "set", "node-peer", "up")
        self.listener = listen_in_netns(netns, 6443)
        carry(self.listener, upstream_port)
        open(f"{self.d}/containerd.toml", "w").write(containerd_config(self.d))
        open(f"{self.d}/kubelet.yaml", "w").write(kubelet_config(self.d, pki))
        server = "https://127.0.0.1:6443"
        cert = f"{pki}/node-{name}"
        open(f"{self.d}/kubelet.kubeconfig", "w").write(
            kubeconfig(server, f"{pki}/ca.crt", f"{cert}.crt", f"{cert}.key"))
        open(f"{self.d}/proxy.kubeconfig", "w").write(kubeconfig(server, f"{pki}/ca.crt", token=proxy_token))

    def exec(self, *args):
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys, which hides the cgroup
        # mounts the kubelet and runc need.
        return ["nsenter", f"--net=/run/netns/{self.netns}", *args]

    def start(self, peers, image):
        self.procs.start(self.exec("containerd", "--config", f"{self.d}/containerd.toml"), f"{self.side}-containerd.log")
        end = time.time() + 60
        while subprocess.run(["ctr", "--address", self.sock, "version"], capture_output=True).returncode != 0:
            if time.time() > end:
                raise SystemExit(f"{self.side}: containerd did not answer")
            time.sleep(0.3)
        run("ctr", "--address", self.sock, "-n", "k8s.io", "images", "import", "--platform", "linux/amd64", image)
        self.procs.start(self.exec(f"{peers}/bin/kubelet", "--config", f"{self.d}/kubelet.yaml",
                                   "--kubeconfig", f"{self.d}/kubelet.kubeconfig", "--root-dir", f"{self.d}/kubelet",
                                   "--cert-dir", f"{self.d}/kubelet-pki", "--hostname-override", self.name,
                                   "--node-ip", NODE_IP[self.name], "--v=2"),
                         f"{self.side}-kubelet.log")

    def start_proxy(self, peers):
        self.procs.start(self.exec(f"{peers}/bin/kube-proxy", "--kubeconfig", f"{self.d}/proxy.kubeconfig",
                                   "--hostname-override", self.name, "--proxy-mode", "iptables",
                                   "--conntrack-max-per-core", "0", "--metrics-bind-address", "127.0.0.1:10249",
                                   "--healthz-bind-address", "127.0.0.1:10256", "--v=2"),
                         f"{self.side}-kube-proxy.log")

    def kubelet_pods(self):
        out = subprocess.run(self.exec("curl", "-s", "--max-time", "10", "http://127.0.0.1:10255/pods"),
                             capture_output=True, text=True).stdout
        return json.loads(out)["items"] if out else []

    def service_rules(self):
        """{service address:port -> sorted endpoint addresses} as kube-proxy programmed them."""
        out = subprocess.run(self.exec("iptables-save", "-t", "nat"), capture_output=True, text=True).stdout
        svc_chain, chain_seps, sep_dest = {}, {}, {}
        for line in out.splitlines():
            w = line.split()
            if len(w) < 3 or w[0] != "-A":
                continue
            jump = w[w.index("-j") + 1] if "-j" in w else None
            if w[1] == "KUBE-SERVICES" and "-d" in w and jump and jump.startswith("KUBE-SVC-"):
                svc_chain[f"{w[w.index('-d') + 1].split('/')[0]}:{w[w.index('--dport') + 1]}"] = jump
            elif w[1].startswith("KUBE-SVC-") and jump and jump.startswith("KUBE-SEP-"):
                chain_seps.setdefault(w[1], []).append(jump)
            elif w[1].startswith("KUBE-SEP-") and "--to-destination" in w:
                sep_dest[w[1]] = w[w.index("--to-destination") + 1]
        return {addr: sorted(sep_dest.get(s, "?") for s in chain_seps.get(chain, []))
                for addr, chain in svc_chain.items()}

    def stop_pods_and_runtime(self, cloud):
        # Sandboxes and containers alike; their cgroups are this run's to remove.
        self.containers = subprocess.run(["ctr", "--address", self.sock, "-n", "k8s.io", "containers", "ls", "-q"],
                                         capture_output=True, text=True).stdout.split()
        for p in cloud("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={self.name}")["items"]:
            cloud("DELETE", f"/api/v1/namespaces/default/pods/{p['metadata']['name']}?gracePeriodSeconds=0",
                  ok=(200, 404))
        end = time.time() + 90
        while time.time() < end:
            out = subprocess.run(["ctr", "--address", self.sock, "-n", "k8s.io", "tasks", "ls", "-q"],
                                 capture_output=True, text=True).stdout.split()
            if not out:
                return
            time.sleep(1)
        print(f"{self.side}: containers still running after 90 s; killing their tasks", file=sys.stderr)
        for task in out:
            subprocess.run(["ctr", "--address", self.sock, "-n", "k8s.io", "tasks", "kill", "-s", "KILL", task],
                           capture_output=True)

    def remove(self):
        if self.listener:
            self.listener.close()
        # The shims the runtime started outlive it; they name its socket.
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and self.sock.encode() in b" ".join(cmd):
                    os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


# --- what the run measured -------------------------------------------------------------------

def audit_counts(path, users_of):
    """Per side: requests by verb, relists (LISTs and streamed lists), failures. A request
    counts once, at its first of ResponseStarted (a watch's answer begins; its
    ResponseComplete waits for the watch's end) and ResponseComplete."""
    out = {side: {"verbs": Counter(), "relists": 0, "failed": Counter(), "by_agent": Counter()} for side in users_of}
    seen = set()
    for line in open(path):
        e = json.loads(line)
        if e.get("stage") not in ("ResponseStarted", "ResponseComplete") or e["auditID"] in seen:
            continue
        seen.add(e["auditID"])
        user = e.get("user", {}).get("username", "")
        side = next((s for s, users in users_of.items() if user in users), None)
        if side is None:
            continue
        verb, uri = e.get("verb", ""), e.get("requestURI", "")
        o = out[side]
        o["verbs"][verb] += 1
        o["by_agent"][(e.get("userAgent") or "-").split("/")[0]] += 1
        if verb == "list" or (verb == "watch" and "sendInitialEvents=true" in uri):
            o["relists"] += 1
        code = e.get("responseStatus", {}).get("code", 0)
        if code >= 400:
            o["failed"][f"{verb} {code}"] += 1
    return out


def relay_lines(path):
    last = {}
    for line in open(path):
        r = json.loads(line)
        last[r["pair"]] = r
    return last


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    peers, hub_bin, xtask = (os.path.abspath(a) for a in sys.argv[1:4])
    minutes, cut_every, pods, services = (int(a) for a in (sys.argv[4:8] + ["60", "600", "30", "50"][len(sys.argv[4:8]):]))
    if os.geteuid() != 0:
        raise SystemExit("real-edge.py: run as root (network namespaces, containerd, kubelet)")
    work = tempfile.mkdtemp(prefix="real-edge-")
    print(f"real-edge: work dir {work}", flush=True)
    pki = f"{work}/pki"
    admin, tokens = make_pki(peers, pki)
    open(f"{work}/audit-policy.yaml", "w").write(AUDIT_POLICY)
    etcd_port, api_port, relay_direct, relay_hub, hub_port, hub_admin = (free_port() for _ in range(6))
    ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
    procs, nodes, changes = Procs(work), [], None
    cgroups_before = set(glob.glob("/sys/fs/cgroup/*/k8s.io"))
    try:
        start_cloud(procs, peers, etcd_port, api_port, admin, ctx,
                    extra=(f"--audit-policy-file={work}/audit-policy.yaml", f"--audit-log-path={work}/audit.log",
                           "--audit-log-maxsize=0", "--audit-log-format=json"),
                    env={**os.environ, "PEERS_PKI": pki})
        cloud = Cloud(api_port, admin, ctx)
        seed(cloud, services, peers, work)
        cut_args = ["--cut-every", str(cut_every), "--cut-seconds", str(CUT_SECONDS),
                    "--cuts", str(minutes * 60 // cut_every if cut_every else 0),
                    "--minutes", str(minutes + 30)]
        procs.start([xtask, "relay", "--pair", f"direct:{relay_direct}:{api_port}",
                     "--pair", f"hub:{relay_hub}:{api_port}", "--report", f"{work}/relay.jsonl", *cut_args],
                    "relay.log")
        started = time.time()
        wait_port(relay_hub, "the relay")
        open(f"{work}/hub.yaml", "w").write(
            hub_yaml(pki, relay_hub, hub_port, hub_admin, f"{work}/hub-cache"))
        procs.start([hub_bin, "run", "--config", f"{work}/hub.yaml"], "hub.log")
        wait_port(hub_port, "the hub")
        image = f"{work}/sleep.tar"
        sleep_image(image)
        for (side, name, netns, user), upstream in zip(NODES, (relay_direct, hub_port)):
            node = Node(work, procs, side, name, netns)
            nodes.append(node)
            node.make(pki, tokens[user], upstream)
            node.start(peers, image)
        wait_until("both nodes Ready", 240, lambda: all(
            any(c["type"] == "Ready" and c["status"] == "True"
                for c in node_conditions(cloud, n.name))
            for n in nodes))
        for n in nodes:
            for i in range(pods):
                cloud("POST", "/api/v1/namespaces/default/pods", pod(n.name, i))
            n.start_proxy(peers)
        wait_until(f"{pods} pods running on each node", 300, lambda: all(
            sum(p["status"].get("phase") == "Running"
                for p in cloud("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={n.name}")["items"]) == pods
            for n in nodes))
        ready_at = time.time() - started
        print(f"real-edge: every client has its first view at {ready_at:.0f} s; the hour runs", flush=True)
        first_view = relay_lines(f"{work}/relay.jsonl")
        changes = Changes(cloud, services, pods)
        changes.start()
        end = started + minutes * 60
        while time.time() < end:
            time.sleep(min(60, max(0, end - time.time())))
            r = relay_lines(f"{work}/relay.jsonl")
            print(f"real-edge: {(time.time() - started) / 60:.0f} min: " + ", ".join(
                f"{p} {v['to_cloud'] + v['from_cloud']} B{' (cut)' if v['silent'] else ''}" for p, v in r.items()),
                flush=True)
        changes.stop()
        carried = relay_lines(f"{work}/relay.jsonl")
        views = settle(cloud, nodes)
        users_of = {side: {f"system:node:{name}", user} for side, name, _, user in NODES}
        audit = audit_counts(f"{work}/audit.log", users_of)
        report(work, minutes, cut_every, pods, services, ready_at, first_view, carried, audit, views, changes)
    finally:
        if changes:
            changes.done.set()
        for n in nodes:
            try:
                n.stop_pods_and_runtime(Cloud(api_port, admin, ctx))
            except (SystemExit, Exception) as e:  # cleanup goes on whatever failed
                print(f"cleanup {n.side}: {e}", file=sys.stderr)
        procs.stop()
        for n in nodes:
            n.remove()
        remove_cgroups({id for n in nodes for id in n.containers}, cgroups_before)
        print(f"real-edge: logs in {work}", flush=True)


def remove_cgroups(ids, tops_before):
    """The cgroups of the containers this run's runtimes ran (`k8s.io/<id>` under each
    hierarchy), once they are gone, and `k8s.io` itself where this run made it and it is
    empty: another run's containers may share it."""
    for d in sorted(glob.glob("/sys/fs/cgroup/*/k8s.io")):
        for id in ids:
            if os.path.isdir(f"{d}/{id}"):
                try:
                    os.rmdir(f"{d}/{id}")
                except OSError as e:
                    print(f"cleanup: {d}/{id}: {e}", file=sys.stderr)
        if d not in tops_before:
            try:
                os.rmdir(d)
            except OSError:
                pass  # still used by another run's containers


def node_conditions(cloud, name):
    node = cloud("GET", f"/api/v1/nodes/{name}", ok=(200, 404))
    return node["status"].get("conditions", []) if node.get("kind") == "Node" else []


def wait_until(what, secs, cond):
    end = time.time() + secs
    while not cond():
        if time.time() > end:
            raise SystemExit(f"real-edge: {what}: not within {secs} s")
        time.sleep(1)


def settle(cloud, nodes):
    """Waits (up to SETTLE s) until every node's kube-proxy rules and kubelet pods match the
    cloud; returns what each view held at the end."""
    def expected():
        svcs = cloud("GET", "/api/v1/namespaces/default/services")["items"]
        slices = {s["metadata"]["labels"]["kubernetes.io/service-name"]: s for s in
                  cloud("GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices")["items"]}
        rules = {}
        for s in svcs:
            sl = slices.get(s["metadata"]["name"])
            if s["spec"].get("clusterIP") in (None, "None") or not sl:
                continue
            rules[f"{s['spec']['clusterIP']}:80"] = sorted(f"{e['addresses'][0]}:8080" for e in sl["endpoints"])
        ticks = {n.name: {p["metadata"]["name"]: p["metadata"]["annotations"].get("tick") for p in
                          cloud("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={n.name}")["items"]} for n in nodes}
        return rules, ticks

    end = time.time() + SETTLE
    while True:
        rules, ticks = expected()
        views = {}
        for n in nodes:
            got = n.service_rules()
            kubelet = {p["metadata"]["name"]: p["metadata"].get("annotations", {}).get("tick") for p in n.kubelet_pods()}
            views[n.side] = {"rules_equal": got == rules, "services": len(got),
                             "rules_differ": sorted(set(got.items()) ^ set(rules.items()), key=str)[:5] if got != rules else [],
                             "kubelet_equal": kubelet == ticks[n.name], "kubelet_pods": len(kubelet)}
        if all(v["rules_equal"] and v["kubelet_equal"] for v in views.values()) or time.time() > end:
            views["settled_in_s"] = round(SETTLE - (end - time.time()), 1)
            return views
        time.sleep(2)


def report(work, minutes, cut_every, pods, services, ready_at, first_view, carried, audit, views, changes):
    def total(r, side):
        return r[side]["to_cloud"] + r[side]["from_cloud"]

    res = {"minutes": minutes, "cut_every_s": cut_every, "pods_per_node": pods, "services": services,
           "first_view_at_s": round(ready_at, 1), "changes": dict(changes.count), "change_errors": changes.errors,
           "views": views, "sides": {}}
    for side in ("direct", "hub"):
        a = audit[side]
        res["sides"][side] = {
            "bytes": total(carried, side), "bytes_after_first_view": total(carried, side) - total(first_view, side),
            "to_cloud": carried[side]["to_cloud"], "from_cloud": carried[side]["from_cloud"],
            "connections": carried[side]["connections"], "abandoned": carried[side]["abandoned"],
            "requests_by_verb": dict(a["verbs"]), "relists": a["relists"], "failed": dict(a["failed"]),
            "requests_by_agent": dict(a["by_agent"])}
    d, h = res["sides"]["direct"], res["sides"]["hub"]
    res["ratios"] = {"bytes": h["bytes"] / max(1, d["bytes"]),
                     "bytes_after_first_view": h["bytes_after_first_view"] / max(1, d["bytes_after_first_view"]),
                     "relists": h["relists"] / max(1, d["relists"]),
                     "list_requests": h["requests_by_verb"].get("list", 0) / max(1, d["requests_by_verb"].get("list", 0)),
                     "connections": h["connections"] / max(1, d["connections"])}
    json.dump(res, open(f"{work}/results.json", "w"), indent=1, default=str)
    print(json.dumps(res, indent=1, default=str))
    ok = all(v["rules_equal"] and v["kubelet_equal"] for k, v in views.items() if k != "settled_in_s")
    if not ok or changes.errors:
        raise SystemExit("real-edge: a view did not match the cloud, or the admin's changes failed (results.json)")


if __name__ == "__main__":
    main()
