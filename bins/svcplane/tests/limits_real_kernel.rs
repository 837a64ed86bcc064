//! API objects at the limits, through manifests mode and into the real kernel: the most
//! endpoints a slice may hold, the most ports, port 65535, the same endpoint in two slices
//! of one Service, IPv4 and IPv6 slices side by side, and a broken slice beside good ones.
//! `svcplane render` must finish with the rules for all of them (never a panic, never a
//! stall), name the broken object and field, and the kernel must take the ruleset (loaded
//! with `nft -f` inside a network namespace of the test's own, dropped with it).

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node1\nstatus:\n  addresses:\n    - type: InternalIP\n      address: 198.18.0.11\n    - type: InternalIP\n      address: 2001:db8::11\n";

fn service(name: &str, cluster_ip: &str, ports: &[(String, u16)]) -> String {
    let mut text = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: limits\nspec:\n  clusterIP: {cluster_ip}\n  ports:\n"
    );
    for (port_name, port) in ports {
        let _ = writeln!(text, "    - name: {port_name}\n      port: {port}\n      protocol: TCP");
    }
    text
}

fn slice(name: &str, service: &str, family: &str, addresses: &[String], ports: &[(String, u16)]) -> String {
    let mut text = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: limits\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: {family}\nports:\n"
    );
    for (port_name, port) in ports {
        let _ = writeln!(text, "  - name: {port_name}\n    port: {port}\n    protocol: TCP");
    }
    text.push_str("endpoints:\n");
    for address in addresses {
        let _ = writeln!(text, "  - addresses: [\"{address}\"]\n    nodeName: node2");
    }
    text
}

fn pod_addresses(count: u32, first: Ipv4Addr) -> Vec<String> {
    (0..count).map(|i| Ipv4Addr::from(u32::from(first) + i).to_string()).collect()
}

fn manifests() -> String {
    let one = vec![("http".to_owned(), 80)];
    let mut text = NODE.to_owned();
    // The most endpoints one slice may hold.
    text += &service("big", "198.19.1.1", &one);
    text += &slice("big-1", "big", "IPv4", &pod_addresses(1000, Ipv4Addr::new(198, 18, 160, 1)), &one);
    // The most ports one slice may hold, and the highest port number.
    let ports: Vec<(String, u16)> = (0..100).map(|i| (format!("p{i}"), 65436 + i)).collect();
    text += &service("wide", "198.19.1.2", &ports);
    text += &slice("wide-1", "wide", "IPv4", &pod_addresses(2, Ipv4Addr::new(198, 18, 170, 1)), &ports);
    // The same endpoint in two slices of one Service: one endpoint, one rule.
    text += &service("dup", "198.19.1.3", &one);
    text += &slice("dup-1", "dup", "IPv4", &["198.18.171.1".into(), "198.18.171.2".into()], &one);
    text += &slice("dup-2", "dup", "IPv4", &["198.18.171.2".into()], &one);
    // Both families, one slice each.
    let mut dual = service("dual", "198.19.1.4", &one);
    dual = dual.replace("  clusterIP: 198.19.1.4\n", "  clusterIP: 198.19.1.4\n  clusterIPs: [198.19.1.4, \"2001:db8:f::4\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n");
    text += &dual;
    text += &slice("dual-4", "dual", "IPv4", &["198.18.172.1".into()], &one);
    text += &slice("dual-6", "dual", "IPv6", &["2001:db8:1:2::1".into()], &one);
    // A broken slice (an IPv6 address in an IPv4 slice) beside the good ones.
    text += &service("broken", "198.19.1.5", &one);
    text += &slice("broken-1", "broken", "IPv4", &["2001:db8:1:2::9".into()], &one);
    text
}

#[test]
fn objects_at_the_limits_render_whole_name_the_broken_one_and_load_into_the_kernel() {
    let dir = tempfile::tempdir().expect("a manifests directory");
    std::fs::write(dir.path().join("limits.yaml"), manifests()).expect("writing the manifests");
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--manifests"])
        .arg(dir.path())
        .args(["--node-name", "node1", "--service-cidr", "198.19.0.0/16", "--service-cidr", "2001:db8:f::/108"])
        .output()
        .expect("running svcplane render");
    let rules = String::from_utf8_lossy(&output.stdout).into_owned();
    let errors = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "render failed:\n{errors}");
    assert!(
        errors.contains("limits/broken-1") && errors.contains("endpoints[0].addresses[0]"),
        "the broken slice is named with its field:\n{errors}"
    );
    let dnat_to = |target: &str| rules.lines().filter(|l| l.ends_with(&format!(" to {target}"))).count();
    for address in pod_addresses(1000, Ipv4Addr::new(198, 18, 160, 1)) {
        assert_eq!(dnat_to(&format!("{address}:80")), 1, "big's endpoint {address} has its rule");
    }
    for port in [65436u32, 65535] {
        assert_eq!(dnat_to(&format!("198.18.170.1:{port}")), 1, "wide's port {port} is programmed");
    }
    assert_eq!(dnat_to("198.18.171.2:80"), 1, "a duplicated endpoint gets one rule");
    assert_eq!(dnat_to("[2001:db8:1:2::1]:80"), 1, "the IPv6 slice is programmed");
    assert!(!rules.contains("2001:db8:1:2::9"), "nothing of the broken slice is programmed");

    if !svcplane_testbed::can_run_real_kernel_tests(
        "objects_at_the_limits_render_whole_name_the_broken_one_and_load_into_the_kernel",
    ) {
        return;
    }
    // A network namespace of its own for `nft -f`: it and the tables go when `unshare` ends.
    let mut load = Command::new("unshare")
        .args(["--net", "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running unshare --net nft");
    std::io::Write::write_all(&mut load.stdin.take().expect("stdin"), rules.as_bytes()).expect("feeding nft");
    let loaded = load.wait_with_output().expect("waiting for nft");
    assert!(loaded.status.success(), "the kernel refused the ruleset: {}", String::from_utf8_lossy(&loaded.stderr));
}
