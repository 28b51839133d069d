"""Debian packages fetched into a directory of their own: downloaded with apt from Debian
unstable (which carries Kubernetes' Go sources and a current Go) and unpacked there, with
nothing installed on the machine and the machine's apt state untouched."""
import glob
import os
import shutil
import subprocess

SUITE = "sid"


def fetch(workdir, packages, with_dependencies=False):
    """Downloads packages (and, with_dependencies, every golang-* package they depend on)
    and unpacks them under workdir/root. Returns (root, {package: version})."""
    lists = os.path.join(workdir, "apt", "lists")
    cache = os.path.join(workdir, "apt", "cache")
    debs = os.path.join(workdir, "debs")
    for d in (os.path.join(lists, "partial"), os.path.join(cache, "archives", "partial"), debs):
        os.makedirs(d)
    sources = os.path.join(workdir, "apt", "sources.list")
    with open(sources, "w") as f:
        f.write("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                f"http://deb.debian.org/debian {SUITE} main\n")
    opts = ["-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
    subprocess.run(["apt-get", *opts, "-qq", "update"], check=True)
    if with_dependencies:
        out = subprocess.run(["apt-cache", *opts, "depends", "--recurse", "--no-recommends",
                              "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                              "--no-enhances", *packages],
                             check=True, capture_output=True, text=True).stdout
        # Go libraries and the Go toolchain are all the build needs; the C runtime it
        # depends on is the machine's own.
        packages = sorted({line for line in out.splitlines()
                           if line.startswith("golang-") and not line.startswith(" ")})
    subprocess.run(["apt-get", *opts, "-qq", "download", *packages], check=True, cwd=debs)
    versions, root = {}, os.path.join(workdir, "root")
    for deb in sorted(os.listdir(debs)):
        path = os.path.join(debs, deb)
        name, version = subprocess.run(["dpkg-deb", "-f", path, "Package", "Version"], check=True,
                                       capture_output=True, text=True).stdout.split()[1::2]
        versions[name] = version
        subprocess.run(["dpkg-deb", "-x", path, root], check=True)
    return root, versions


def go_build(root, workdir, main_go, output):
    """Builds the one-file Go program main_go into output with the Go toolchain and
    libraries fetch() unpacked under root, in GOPATH mode (Debian's Go packages are
    GOPATH sources, not modules)."""
    goroot = glob.glob(os.path.join(root, "usr", "lib", "go-*"))[0]
    src = os.path.join(workdir, "src", os.path.basename(output))
    os.makedirs(src)
    shutil.copy(main_go, src)
    env = dict(os.environ, GOROOT=goroot, GOPATH=os.path.join(root, "usr", "share", "gocode"),
               GO111MODULE="off", GOTOOLCHAIN="local", GOFLAGS="",
               GOCACHE=os.path.join(workdir, "gocache"))
    subprocess.run([os.path.join(goroot, "bin", "go"), "build", "-o", output, "."],
                   cwd=src, env=env, check=True)
