//! Builds the eBPF object (hub-ebpf, for bpfel-unknown-none) and tells the crate where it is.
//!
//! With nightly + rust-src + bpf-linker present, the object is compiled from source every
//! time hub-ebpf changes. Without them the build stops with one line naming
//! scripts/setup.sh, unless HUB_EBPF_PREBUILT=1 asks for the object committed under
//! hub-ebpf/prebuilt/ (refreshed by `cargo xtask build-ebpf`).
use std::{env, path::PathBuf, process::Command};

const PREBUILT: &str = "../hub-ebpf/prebuilt/hub-ebpf.bpf.o";

fn main() {
    println!("cargo:rerun-if-env-changed=HUB_EBPF_PREBUILT");
    println!("cargo:rerun-if-changed={PREBUILT}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

    let want_prebuilt = env::var("HUB_EBPF_PREBUILT").is_ok_and(|v| v == "1");
    let (object, source) = if want_prebuilt {
        let path = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join(PREBUILT);
        if !path.exists() {
            fail(
                "HUB_EBPF_PREBUILT=1 but hub-ebpf/prebuilt/hub-ebpf.bpf.o is missing; run `cargo xtask build-ebpf`",
            );
        }
        println!("cargo:warning=using the committed eBPF object {PREBUILT} (HUB_EBPF_PREBUILT=1)");
        (path, "prebuilt")
    } else {
        if let Some(missing) = missing_toolchain() {
            fail(&format!(
                "eBPF toolchain incomplete ({missing}); run `bash scripts/setup.sh` (or set HUB_EBPF_PREBUILT=1 to use the committed object)"
            ));
        }
        let ebpf = aya_build::Package {
            name: "hub-ebpf",
            root_dir: "../hub-ebpf",
            ..Default::default()
        };
        if let Err(e) = aya_build::build_ebpf([ebpf], aya_build::Toolchain::Nightly) {
            fail(&format!("building the eBPF object failed: {e:#}"));
        }
        (out_dir.join("hub-ebpf"), "built from source")
    };
    println!("cargo:rustc-env=HUB_EBPF_OBJECT={}", object.display());
    println!("cargo:rustc-env=HUB_EBPF_OBJECT_SOURCE={source}");
}

/// What is missing for building eBPF from source, if anything.
fn missing_toolchain() -> Option<&'static str> {
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(sysroot) = sysroot else {
        return Some("nightly toolchain missing");
    };
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        return Some("nightly rust-src component missing");
    }
    let on_path = env::var_os("PATH")
        .map(|p| env::split_paths(&p).any(|d| d.join("bpf-linker").is_file()))
        .unwrap_or(false);
    if !on_path {
        return Some("bpf-linker not on PATH");
    }
    None
}

fn fail(msg: &str) -> ! {
    println!("cargo::error={msg}");
    std::process::exit(1);
}
