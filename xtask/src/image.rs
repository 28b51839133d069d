//! `cargo xtask image`: the hub's container image, built here with no container engine.
//! One layer holds one file: the release binary at /usr/local/bin/hub, linked statically
//! (glibc, static-pie), on no base image. Static because the DaemonSet's init container
//! copies this same binary onto the host for boots with no cloud (`hub install`): it must
//! run there whatever glibc the host has, and it needs no library in the image either.
//! glibc's resolver reads /etc/hosts and /etc/resolv.conf itself (files and dns are built
//! into glibc since 2.34), which is all the hub asks of name lookup. Every byte is fixed
//! by the inputs — sorted entries, zero times and owners, no timestamps in the config,
//! paths remapped out of the binary, the committed eBPF object — so the same commit gives
//! the same digest. Written as an OCI image layout (`target/image/oci/`) and as one
//! archive that is both that layout and what `docker load` reads (`target/image/hub.tar`,
//! with `manifest.json`); `ctr images import` takes it too.
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

/// The image name deploy/base's manifests use: an image imported on a node under this
/// name (`ctr -n k8s.io images import`) is the one the DaemonSet runs, with no registry.
const DEFAULT_NAME: &str = "registry.local/hub";

/// The image's one file tree: (path inside the image, bytes, mode).
type Files = Vec<(String, Vec<u8>, u32)>;

pub fn run(args: &[String]) -> Result<()> {
    let flag = |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
    let tag = flag("--tag").unwrap_or_else(default_tag);
    let out = flag("--out").map_or_else(|| super::root().join("target/image"), PathBuf::from);
    build(&tag, &out).map(|_| ())
}

/// `registry.local/hub:<version>`.
pub fn default_tag() -> String {
    format!("{DEFAULT_NAME}:{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the image named `tag` into `out` (`oci/` and `hub.tar`); the archive's path.
pub fn build(tag: &str, out: &Path) -> Result<PathBuf> {
    let root = super::root();
    let bin = build_binary(&root)?;
    let files = runtime_files(&bin)?;
    let image = Image::assemble(&files, tag)?;
    image.write(out)?;
    let size: usize = image.blobs.iter().map(|(_, b)| b.len()).sum();
    println!(
        "image {tag}\n  manifest {}\n  {} file(s), {:.1} MB compressed ({:.1} MB unpacked)\n  {}\n  {}",
        image.manifest_digest,
        files.len(),
        size as f64 / 1e6,
        files.iter().map(|(_, b, _)| b.len()).sum::<usize>() as f64 / 1e6,
        out.join("oci").display(),
        out.join("hub.tar").display()
    );
    Ok(out.join("hub.tar"))
}

/// The target the image's binary is built for; named explicitly so that `crt-static`
/// applies to the binary only, not to build scripts and proc macros.
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The release binary, static, built with the committed eBPF object and this checkout's
/// paths remapped out of it (its own target directory, so ordinary builds are not redone).
fn build_binary(root: &Path) -> Result<PathBuf> {
    let target = root.join("target/image-build");
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|_| PathBuf::from("/root/.cargo"));
    let flags = format!(
        "-C target-feature=+crt-static -C strip=debuginfo --remap-path-prefix={}=/src --remap-path-prefix={}=/cargo",
        root.display(),
        home.display()
    );
    let mut c = super::cargo();
    c.args([
        "build",
        "--release",
        "-j2",
        "-p",
        "hub-user",
        "--bin",
        "hub",
        "--target",
        TARGET,
    ])
    .arg("--target-dir")
    .arg(&target)
    .env("HUB_EBPF_PREBUILT", "1")
    .env("RUSTFLAGS", flags);
    super::run(c, "release build of hub for the image")?;
    Ok(target.join(TARGET).join("release/hub"))
}

/// The image's files: the binary alone, once it is shown to load no shared object.
fn runtime_files(bin: &Path) -> Result<Files> {
    let out = Command::new("ldd").arg(bin).output().context("ldd")?;
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    // ldd says "statically linked" of a static-pie and "not a dynamic executable" of a
    // static non-PIE binary; anything else lists what it would load.
    if !(said.contains("statically linked") || said.contains("not a dynamic executable")) {
        bail!(
            "{} loads shared objects, so it would not run on no base image:\n{said}",
            bin.display()
        );
    }
    Ok(vec![(
        "usr/local/bin/hub".into(),
        std::fs::read(bin).with_context(|| bin.display().to_string())?,
        0o755,
    )])
}

/// A ustar archive of `files` and their directories: sorted, owned by root, time zero.
fn tar(files: &Files) -> Vec<u8> {
    let mut dirs: Vec<String> = Vec::new();
    for (path, _, _) in files {
        let mut at = Path::new(path).parent();
        while let Some(d) = at.filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(format!("{}/", d.display()));
            at = d.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    let mut out = Vec::new();
    for d in &dirs {
        out.extend(header(d, 0, 0o755, b'5'));
    }
    for (path, bytes, mode) in files {
        out.extend(header(path, bytes.len(), *mode, b'0'));
        out.extend_from_slice(bytes);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn header(name: &str, size: usize, mode: u32, kind: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(s.as_bytes());
    };
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size as u64);
    octal(&mut h, 136, 12, 0);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

/// An image name as container runtimes spell it in full: one with no registry (no dot,
/// colon or "localhost" in its first part) is Docker Hub's.
fn full_name(name: &str) -> String {
    match name.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => name.into(),
        Some(_) => format!("docker.io/{name}"),
        None => format!("docker.io/library/{name}"),
    }
}

fn sha256(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

struct Image {
    /// (digest, bytes) of the layer, the config and the manifest.
    blobs: Vec<(String, Vec<u8>)>,
    index: Vec<u8>,
    docker_manifest: Vec<u8>,
    manifest_digest: String,
}

impl Image {
    fn assemble(files: &Files, tag: &str) -> Result<Image> {
        let layer_tar = tar(files);
        let mut gz = flate2::GzBuilder::new()
            .mtime(0)
            .write(Vec::new(), flate2::Compression::best());
        gz.write_all(&layer_tar)?;
        let layer = gz.finish()?;
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Labels": {"org.opencontainers.image.version": tag.rsplit_once(':').map_or("latest", |(_, v)| v)},
                "Entrypoint": ["/usr/local/bin/hub"],
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [sha256(&layer_tar)]},
        }))?;
        let descriptor = |media: &str, bytes: &[u8]| json!({"mediaType": media, "digest": sha256(bytes), "size": bytes.len()});
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
        }))?;
        let manifest_digest = sha256(&manifest);
        let (name, version) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
        let mut m = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        m["annotations"] = json!({
            "io.containerd.image.name": format!("{}:{version}", full_name(name)),
            "org.opencontainers.image.ref.name": version,
        });
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [m],
        }))?;
        let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
        let docker_manifest = serde_json::to_vec(&json!([{
            "Config": blob(&sha256(&config)),
            "RepoTags": [tag],
            "Layers": [blob(&sha256(&layer))],
        }]))?;
        Ok(Image {
            blobs: vec![
                (sha256(&layer), layer),
                (sha256(&config), config),
                (manifest_digest.clone(), manifest),
            ],
            index,
            docker_manifest,
            manifest_digest,
        })
    }

    /// The layout's files: (path, bytes), sorted.
    fn layout(&self) -> Files {
        let mut files: Files = vec![
            (
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
                0o644,
            ),
            ("index.json".into(), self.index.clone(), 0o644),
        ];
        for (digest, bytes) in &self.blobs {
            let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
            files.push((name, bytes.clone(), 0o644));
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        files
    }

    fn write(&self, out: &Path) -> Result<()> {
        std::fs::create_dir_all(out)?;
        let oci = out.join("oci");
        if oci.exists() {
            std::fs::remove_dir_all(&oci)?;
        }
        for (path, bytes, _) in self.layout() {
            let p = oci.join(path);
            std::fs::create_dir_all(p.parent().expect("a parent"))?;
            std::fs::write(&p, bytes)?;
        }
        let mut archive = self.layout();
        archive.push(("manifest.json".into(), self.docker_manifest.clone(), 0o644));
        archive.sort_by(|a, b| a.0.cmp(&b.0));
        std::fs::write(out.join("hub.tar"), tar(&archive))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Files {
        vec![
            ("lib/x/libc.so.6".into(), vec![7; 1000], 0o755),
            ("usr/local/bin/hub".into(), b"#!hub".to_vec(), 0o755),
        ]
    }

    #[test]
    fn names_are_spelled_in_full_as_runtimes_do() {
        assert_eq!(full_name("hub"), "docker.io/library/hub");
        assert_eq!(full_name("me/hub"), "docker.io/me/hub");
        assert_eq!(full_name("registry.local/hub"), "registry.local/hub");
        assert_eq!(full_name("localhost:5000/hub"), "localhost:5000/hub");
    }

    /// The same inputs give the same bytes, and so the same digest.
    #[test]
    fn the_same_files_give_the_same_digest() {
        let a = Image::assemble(&files(), "hub:1").unwrap();
        let b = Image::assemble(&files(), "hub:1").unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        let mut changed = files();
        changed[1].1.push(b'!');
        let c = Image::assemble(&changed, "hub:1").unwrap();
        assert_ne!(a.manifest_digest, c.manifest_digest);
    }

    /// The layer is a tar GNU tar reads back: directories first, then each file whole.
    #[test]
    fn the_layer_is_a_tar_that_tar_reads() {
        let dir = std::env::temp_dir().join(format!("hub-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let archive = dir.join("layer.tar");
        std::fs::write(&archive, tar(&files())).unwrap();
        let out = Command::new("tar")
            .arg("-tvf")
            .arg(&archive)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        let names: Vec<&str> = listing
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        assert_eq!(
            names,
            [
                "lib/",
                "lib/x/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "lib/x/libc.so.6",
                "usr/local/bin/hub"
            ]
        );
        let unpacked = dir.join("root");
        std::fs::create_dir_all(&unpacked).unwrap();
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(
            std::fs::read(unpacked.join("usr/local/bin/hub")).unwrap(),
            b"#!hub"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
