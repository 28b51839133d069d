"""The hub's config for the by-hand checks against a real kube-apiserver built with
../shared/peers (real-apiserver-lists.py, real-apiserver-gets.py): the hub as the node
edge-node-1, on loopback, with the kit's certificates, interception off."""


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
