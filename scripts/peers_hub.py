"""What the by-hand checks against a real kube-apiserver built with ../shared/peers share
(real-apiserver-lists.py, -gets.py, -watch-burst.py): the hub's config (the node
edge-node-1, on loopback, with the kit's certificates, interception off), the processes
they start and stop by PID, and their HTTPS requests."""
import json, os, signal, socket, subprocess, time, urllib.request


def hub_yaml(pki, api_port, port, admin, cache_dir, cache_extra=""):
    """The config text: the TLS listener on `port`, plain HTTP on `port + 1`, the admin
    listener on `admin`; `cache_extra` is more lines of the `cache:` section."""
    return f"""nodeName: edge-node-1
cloud:
  servers: ["https://127.0.0.1:{api_port}"]
  caFile: {pki}/ca.crt
  certFile: {pki}/node-edge-node-1.crt
  keyFile: {pki}/node-edge-node-1.key
intercept:
  enabled: false
listen:
  proxy: 127.0.0.1:{port + 1}
  tlsProxy: 127.0.0.1:{port}
  admin: 127.0.0.1:{admin}
tls:
  certFile: {pki}/serving.crt
  keyFile: {pki}/serving.key
  clientCaFile: {pki}/ca.crt
cache:
  dir: {cache_dir}
{cache_extra}"""


class Procs:
    """The processes a check starts, each logging to a file under `work`; `stop` ends them
    all by PID, the newest first."""

    def __init__(self, work):
        self.work, self.procs = work, []

    def start(self, args, log, **kw):
        p = subprocess.Popen(args, stdout=open(f"{self.work}/{log}", "w"), stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def wait_port(port, what, secs=60):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"{what} did not listen on {port}")


def request(ctx, port, method, path, token, body=None, accept="application/json", timeout=30,
            content_type="application/json"):
    """(status, body) of one HTTPS request to 127.0.0.1:`port`, errors included."""
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                          "Accept": accept})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_cloud(procs, peers, etcd_port, api_port, token, ctx, extra=(), env=None):
    """etcd and the kit's kube-apiserver (Node,RBAC, then `extra` arguments; `env` for
    PEERS_PKI and the like) on loopback, once /readyz answers; returns the apiserver's
    process."""
    etcd = next(f for f in os.listdir(f"{peers}/bin") if f.startswith("etcd-"))
    procs.start([f"{peers}/bin/{etcd}", "--data-dir", f"{procs.work}/etcd",
                 "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{etcd_port + 1}", "--quota-backend-bytes", str(4 << 30)],
                "etcd.log")
    wait_port(etcd_port, "etcd")
    apiserver = procs.start([f"{peers}/tools/start-apiserver.sh", f"http://127.0.0.1:{etcd_port}", str(api_port),
                             "Node,RBAC", *extra], "apiserver.log", env=env)
    wait_port(api_port, "kube-apiserver", 120)
    end = time.time() + 120
    while request(ctx, api_port, "GET", "/readyz", token)[0] != 200:
        if time.time() > end:
            raise SystemExit("kube-apiserver did not become ready")
        time.sleep(0.5)
    return apiserver
