//! `svcplane render --mode iptables` for a fixed set of manifests (`iptables_golden/`),
//! compared with the checked-in dump after putting both in canonical order (tables by name,
//! built-in chains then user chains by name, each chain's rules in order; comments and
//! counters dropped), as kube-proxy's tests compare rulesets. No root needed.
//!
//! After an intended change, `SVCPLANE_BLESS=1 cargo test -p svcplane --test
//! iptables_render_golden` rewrites the expected file; review its diff like code.

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("iptables_golden")
}

fn render() -> String {
    let manifests = golden_dir().join("manifests");
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--mode", "iptables", "--manifests"])
        .arg(&manifests)
        .args(["--node-name", "node1", "--node-ip", "198.18.0.11", "--node-ip", "2001:db8::11"])
        .args(["--cluster-cidr", "198.18.128.0/17", "--cluster-cidr", "2001:db8:1::/48"])
        .args(["--service-cidr", "10.96.0.0/12", "--service-cidr", "2001:db8:f::/108"])
        .output()
        .expect("running svcplane render");
    assert!(output.status.success(), "svcplane render failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("render prints text")
}

/// Each family's dump in canonical order, under a `# IPv4` / `# IPv6` line.
fn canonical(dump: &str) -> String {
    let v6_at = dump.find("\n# IPv6").map(|at| at + 1).expect("an IPv6 section");
    let mut out = String::new();
    for (label, section) in [("IPv4", &dump[..v6_at]), ("IPv6", &dump[v6_at..])] {
        out.push_str(&format!("# {label}\n"));
        out.push_str(&svcplane_iptables::canonical(section).unwrap_or_else(|e| panic!("{label} section: {e}")));
    }
    out
}

#[test]
fn render_prints_the_iptables_save_dump_checked_in_for_the_golden_manifests() {
    let rendered = render();
    let expected_path = golden_dir().join("expected.txt");
    if std::env::var_os("SVCPLANE_BLESS").is_some() {
        std::fs::write(&expected_path, &rendered).expect("writing the expected dump");
    }
    let expected = std::fs::read_to_string(&expected_path).expect("the expected dump is checked in");
    let (got, want) = (canonical(&rendered), canonical(&expected));
    if got != want {
        let missing: Vec<&str> = want.lines().filter(|l| !got.lines().any(|g| g == *l)).collect();
        let extra: Vec<&str> = got.lines().filter(|l| !want.lines().any(|w| w == *l)).collect();
        panic!(
            "svcplane render --mode iptables differs from {}:\nmissing:\n  {}\nunexpected:\n  {}\n(SVCPLANE_BLESS=1 rewrites it after an intended change)",
            expected_path.display(),
            missing.join("\n  "),
            extra.join("\n  ")
        );
    }
}

#[test]
fn the_golden_dump_carries_the_chain_names_operators_know_from_kube_proxy() {
    let rendered = render();
    for (chain, what) in [
        ("KUBE-SVC-NPX46M4PTMTKRN6Y", "default/kubernetes:https"),
        ("KUBE-SVC-TCOU7JCQXEZGVUNU", "kube-system/kube-dns:dns"),
        ("KUBE-SVC-ERIFXISQEP7F7OF4", "kube-system/kube-dns:dns-tcp"),
        ("KUBE-SVC-JD5MR3NA4I4DYORP", "kube-system/kube-dns:metrics"),
        ("KUBE-EXT-V2OKYYMBY3REGZOG", "default/nginx-service"),
    ] {
        assert!(rendered.contains(&format!(":{chain} - [0:0]")), "{what} has chain {chain}");
    }
    let last = rendered
        .lines()
        .take_while(|l| !l.starts_with("# IPv6"))
        .filter(|l| {
            l.starts_with("-A KUBE-SERVICES ") && l.contains("KUBE-NODEPORTS") || l.starts_with("-A KUBE-SERVICES -d ")
        })
        .last()
        .expect("nat KUBE-SERVICES rules");
    assert!(
        last.contains("--dst-type LOCAL -j KUBE-NODEPORTS"),
        "KUBE-NODEPORTS is the last rule of KUBE-SERVICES: {last}"
    );
}
