//! kube-proxy's configuration file and flags, end to end through the real binary: `render`
//! (no root, no kernel) and `--write-config-to` against the lab's example manifests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SERVICE_CIDR: &str = "198.19.0.0/16";

fn lab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab")
}

fn kubeadm_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/kubeadm-kube-proxy-config.conf")
}

/// `svcplane render` of the lab with `args`; returns the output whatever the exit.
fn render(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .arg("render")
        .arg("--manifests")
        .arg(lab())
        .args(["--service-cidr", SERVICE_CIDR])
        .args(args)
        .env("SVCPLANE_LOG", "info")
        .output()
        .expect("running svcplane render")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn warnings(output: &Output) -> Vec<String> {
    stderr(output).lines().filter(|line| line.contains(" WARN ")).map(str::to_owned).collect()
}

/// A configuration file in a fresh directory (kept alive by the returned guard).
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).expect("writing the configuration");
    (dir, path)
}

const HEADER: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

#[test]
fn kubeadms_config_file_and_daemonset_arguments_are_accepted_as_they_are() {
    let config = kubeadm_config();
    let config_arg = format!("--config={}", config.display());
    let output = render(&[&config_arg, "--hostname-override=node1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    // kubeadm leaves `mode` empty: kube-proxy's Linux default, iptables.
    assert!(stdout(&output).contains("what `iptables-save` shows"), "{}", stdout(&output));
    // Every field kubeadm writes is at kube-proxy's default or applied; the one warning is
    // that kube-proxy's iptables mode would answer NodePorts on 127.0.0.1 and svcplane won't.
    let warnings = warnings(&output);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("iptables.localhostNodePorts is not applied"), "{warnings:?}");

    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("effective.yaml");
    let output = render(&[&config_arg, "--hostname-override=node1", "--write-config-to", written.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = std::fs::read_to_string(&written).unwrap();
    for line in [
        "hostnameOverride: node1",
        "clusterCIDR: 198.18.128.0/17",
        "healthzBindAddress: 0.0.0.0:10256",
        "metricsBindAddress: 127.0.0.1:10249",
        "oomScoreAdj: -999",
        "  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf",
        "  syncPeriod: 30s",
        "  minSyncPeriod: 1s",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
    }
}

#[test]
fn an_unknown_field_is_an_error_naming_the_field() {
    let (_dir, path) = config_file(&format!("{HEADER}nftables:\n  tableName: kube-proxy\n"));
    let output = render(&["--config", path.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.contains(&format!("--config {}: nftables.tableName", path.display())), "{text}");
}

#[test]
fn a_bad_duration_is_an_error_naming_the_field() {
    let (_dir, path) = config_file(&format!("{HEADER}nftables:\n  syncPeriod: 30x\n"));
    let output = render(&["--config", path.to_str().unwrap(), "--node-name", "node1"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(
        text.contains(&format!("--config {}: nftables.syncPeriod: \"30x\" is not a duration", path.display())),
        "{text}"
    );
}

#[test]
fn bad_values_and_a_wrong_type_are_errors_naming_the_field() {
    for (body, expected) in [
        ("clusterCIDR: 198.18.128.0/33\n", "clusterCIDR: \"198.18.128.0/33\" is not a CIDR"),
        ("mode: winkernel\n", "mode: \"winkernel\" is not a proxy mode"),
        ("nodePortAddresses: [all-of-them]\n", "nodePortAddresses[0]: \"all-of-them\" is not a CIDR"),
        ("healthzBindAddress: here:there\n", "healthzBindAddress: \"here:there\" is not IP:PORT"),
        ("oomScoreAdj: -2000\n", "oomScoreAdj: -2000 is not within"),
    ] {
        let (_dir, path) = config_file(&format!("{HEADER}{body}"));
        let output = render(&["--config", path.to_str().unwrap(), "--node-name", "node1"]);
        assert_eq!(output.status.code(), Some(1), "{body}: {}", stderr(&output));
        assert!(stderr(&output).contains(expected), "{body}: {}", stderr(&output));
    }
    let (_dir, path) = config_file("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n");
    let output = render(&["--config", path.to_str().unwrap(), "--node-name", "node1"]);
    assert!(stderr(&output).contains("apiVersion: \"kubelet.config.k8s.io/v1beta1\" is not"), "{}", stderr(&output));
}

#[test]
fn a_field_svcplane_does_not_apply_is_named_in_exactly_one_warning() {
    let (_dir, path) = config_file(&format!("{HEADER}mode: ipvs\nenableProfiling: true\n"));
    let output = render(&["--config", path.to_str().unwrap(), "--node-name", "node1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let warnings = warnings(&output);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].matches("enableProfiling").count(), 1, "{warnings:?}");
}

#[test]
fn kube_proxy_flags_svcplane_does_not_apply_are_accepted_with_one_warning_each() {
    let output = render(&[
        "--hostname-override=node1",
        "--proxy-mode=nftables",
        "--cluster-cidr=198.18.128.0/17",
        "--conntrack-max-per-core=131072",
        "--oom-score-adj=-998",
        "--masquerade-all",
        "--v=2",
        "--profiling=false",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let warnings = warnings(&output);
    for flag in ["--conntrack-max-per-core", "--masquerade-all", "--v", "--profiling"] {
        let naming = warnings.iter().filter(|w| w.contains(&format!("{flag} is not applied"))).count();
        assert_eq!(naming, 1, "{flag}: {warnings:?}");
    }
    assert_eq!(warnings.len(), 4, "{warnings:?}");
}

#[test]
fn the_file_wins_over_flags_as_in_kube_proxy_but_hostname_override_wins_over_the_file() {
    let (_dir, path) = config_file(&format!(
        "{HEADER}mode: ipvs\nhostnameOverride: somewhere-else\nclusterCIDR: 198.18.128.0/17\nipvs:\n  scheduler: lc\n"
    ));
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("effective.yaml");
    let config = path.to_str().unwrap();
    let flags = ["--proxy-mode", "nftables", "--hostname-override", "Node1", "--ipvs-scheduler", "sh"];
    let output = render(&[&["--config", config], &flags[..]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("kube-ipvs0") && text.contains(" lc"), "the file's mode and scheduler: {text}");
    let warnings = warnings(&output);
    for flag in ["--mode/--proxy-mode", "--ipvs-scheduler"] {
        assert_eq!(warnings.iter().filter(|w| w.contains(&format!("{flag} is ignored"))).count(), 1, "{warnings:?}");
    }
    assert!(!warnings.iter().any(|w| w.contains("hostname")), "{warnings:?}");
    let output = render(&[&["--config", config, "--write-config-to", written.to_str().unwrap()], &flags[..]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let effective = std::fs::read_to_string(&written).unwrap();
    assert!(effective.lines().any(|l| l == "hostnameOverride: node1"), "{effective}");
    assert!(effective.lines().any(|l| l == "mode: ipvs"), "{effective}");
}

#[test]
fn a_written_config_reads_back_to_the_same_configuration_and_the_same_rules() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.yaml");
    let second = dir.path().join("second.yaml");
    let flags = [
        "--node-name=node1",
        "--mode=iptables",
        "--cluster-cidr=198.18.128.0/17,2001:db8:128::/64",
        "--nodeport-addresses=198.18.0.0/24",
        "--healthz-bind-address=127.0.0.1:10300",
        "--metrics-bind-address=[::1]:10301",
        "--sync-period=1m0s",
        "--min-sync-period=250ms",
        "--oom-score-adj=-500",
        "--bind-address-hard-fail",
    ];
    let output = render(&[&flags[..], &["--write-config-to", first.to_str().unwrap()]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let output = render(&["--config", first.to_str().unwrap(), "--write-config-to", second.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let (first_text, second_text) =
        (std::fs::read_to_string(&first).unwrap(), std::fs::read_to_string(&second).unwrap());
    assert_eq!(first_text, second_text);
    for line in [
        "  syncPeriod: 1m0s",
        "  minSyncPeriod: 250ms",
        "bindAddressHardFail: true",
        "metricsBindAddress: '[::1]:10301'",
    ] {
        assert!(
            first_text.lines().any(|l| l == line || l.replace('"', "'") == line),
            "{line:?} missing from\n{first_text}"
        );
    }
    let from_flags = render(&flags);
    let from_file = render(&["--config", first.to_str().unwrap()]);
    assert!(from_flags.status.success() && from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(stdout(&from_flags), stdout(&from_file));
}

#[test]
fn proxy_writes_the_configuration_and_exits_without_touching_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("effective.yaml");
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["proxy", "--manifests"])
        .arg(lab())
        .args(["--proxy-mode=ipvs", "--hostname-override=node1", "--write-config-to"])
        .arg(&written)
        .output()
        .expect("running svcplane proxy");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(text.starts_with("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"), "{text}");
    assert!(text.lines().any(|l| l == "kind: KubeProxyConfiguration"), "{text}");
    assert!(text.lines().any(|l| l == "mode: ipvs"), "{text}");
}

/// A short `proxy` run in a lab node of its own: the file's conntrack timeouts land in the
/// node's network namespace, its oomScoreAdj on the process (a positive one: lowering it
/// needs CAP_SYS_RESOURCE, which a container may lack), its metrics address serves the
/// effective configuration on `/configz`, and the node gets synced.
#[test]
fn a_short_proxy_run_applies_the_files_settings_in_its_own_network_namespace() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_short_proxy_run_applies_the_files_settings") {
        return;
    }
    let sandbox = svcplane_testbed::Lab::builder().nodes(1).build().expect("a one-node lab");
    let node = sandbox.node(1).namespace_name().to_owned();
    let (dir, config) = config_file(&format!(
        "{HEADER}mode: nftables\nclusterCIDR: 198.18.128.0/17\noomScoreAdj: 321\n\
         metricsBindAddress: 127.0.0.1:10311\nhealthzBindAddress: 127.0.0.1:10312\n\
         nftables:\n  minSyncPeriod: 100ms\nconntrack:\n  tcpEstablishedTimeout: 2h0m0s\n  udpTimeout: 41s\n"
    ));
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let lab_dir = lab();
    let args = [
        env!("CARGO_BIN_EXE_svcplane"),
        "proxy",
        "--manifests",
        lab_dir.to_str().unwrap(),
        "--service-cidr",
        SERVICE_CIDR,
        "--config",
        config.to_str().unwrap(),
        "--hostname-override=node1",
    ];
    let mut proxy = sandbox
        .command(&node, &args)
        .expect("a command in the lab node")
        .stderr(log.try_clone().unwrap())
        .stdout(log)
        .spawn()
        .expect("starting svcplane proxy in the lab node");
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let started = std::time::Instant::now();
    while !log_text().contains("synced") && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let configz = svcplane_testbed::run_in_namespace(&node, || {
        svcplane_ops::http::get("127.0.0.1:10311".parse().unwrap(), "/configz")
    });
    // `ip netns exec` execs the proxy: the child is the proxy itself.
    let oom = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", proxy.id()));
    let sysctl = |name: &str| {
        sandbox
            .exec_ok(&node, &["cat", &format!("/proc/sys/net/netfilter/{name}")])
            .map(|text| text.trim().to_owned())
            .unwrap_or_else(|error| panic!("{name}: {error}"))
    };
    let (established, udp) = (sysctl("nf_conntrack_tcp_timeout_established"), sysctl("nf_conntrack_udp_timeout"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy.id() as i32), nix::sys::signal::Signal::SIGTERM).ok();
    let status = proxy.wait().expect("the proxy exits");
    let text = log_text();
    assert!(text.contains("synced"), "{text}");
    assert!(!text.contains(" WARN "), "{text}");
    assert!(status.success(), "{status}: {text}");
    assert_eq!((established.as_str(), udp.as_str()), ("7200", "41"), "{text}");
    assert_eq!(oom.map(|o| o.trim().to_owned()).ok().as_deref(), Some("321"), "{text}");
    let (code, _, body) = configz.expect("namespace").expect("GET /configz");
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("/configz is JSON");
    let inner = &json["kubeproxy.config.k8s.io"];
    assert_eq!(inner["Mode"], "nftables", "{body}");
    assert_eq!(inner["MinSyncPeriod"], "100ms", "{body}");
    assert_eq!(inner["Linux"]["OOMScoreAdj"], 321, "{body}");
    assert_eq!(inner["DetectLocal"]["ClusterCIDRs"][0], "198.18.128.0/17", "{body}");
}

/// kube-proxy v1.36 itself (`scripts/k8s/build`): svcplane reads the file kube-proxy's
/// `--write-config-to` writes, and kube-proxy reads (strictly) the one svcplane writes,
/// which svcplane then reads back to the same configuration.
#[test]
fn svcplane_and_kube_proxy_read_each_others_written_configuration() {
    let Some(binaries) = svcplane_control_plane::binaries_for_test("svcplane_and_kube_proxy_read_each_others") else {
        return;
    };
    let kube_proxy = binaries.require("kube-proxy").expect("scripts/k8s/build builds kube-proxy");
    let dir = tempfile::tempdir().unwrap();
    let [upstream_defaults, ours, upstream_reading_ours, ours_again, ours_again_written] =
        ["upstream.yaml", "ours.yaml", "upstream-reading-ours.yaml", "ours-again.yaml", "ours-again-written.yaml"]
            .map(|name| dir.path().join(name));
    let run_kube_proxy = |args: &[&std::ffi::OsStr]| {
        let output = Command::new(&kube_proxy).args(args).output().expect("running kube-proxy");
        let log = stderr(&output);
        assert!(output.status.success(), "kube-proxy {args:?}: {log}");
        assert!(!log.contains("lenient"), "kube-proxy decoded leniently: {log}");
    };

    // What kube-proxy writes with its defaults: read with the defaults it names.
    run_kube_proxy(&["--write-config-to".as_ref(), upstream_defaults.as_os_str()]);
    let output = render(&["--config", upstream_defaults.to_str().unwrap(), "--hostname-override=node1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("what `iptables-save` shows"), "kube-proxy's default mode is iptables");
    // kube-proxy's default `localhostNodePorts: true` is the one thing svcplane does not do.
    let warnings = warnings(&output);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("iptables.localhostNodePorts is not applied"), "{warnings:?}");

    // What svcplane writes: kube-proxy reads it, and what kube-proxy writes back from it
    // reads to the same configuration in svcplane.
    let flags = [
        "--node-name=node1",
        "--mode=nftables",
        "--cluster-cidr=198.18.128.0/17,2001:db8:128::/64",
        "--nodeport-addresses=primary",
        "--healthz-bind-address=0.0.0.0:10300",
        "--metrics-bind-address=127.0.0.1:10301",
        "--sync-period=1m0s",
        "--min-sync-period=2s",
        "--oom-score-adj=-500",
    ];
    let output = render(&[&flags[..], &["--write-config-to", ours.to_str().unwrap()]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    run_kube_proxy(&[
        "--config".as_ref(),
        ours.as_os_str(),
        "--write-config-to".as_ref(),
        upstream_reading_ours.as_os_str(),
    ]);
    for (file, written) in [(&ours, &ours_again), (&upstream_reading_ours, &ours_again_written)] {
        let output = render(&["--config", file.to_str().unwrap(), "--write-config-to", written.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let read = |path: &Path| std::fs::read_to_string(path).unwrap();
    assert_eq!(read(&ours_again), read(&ours));
    assert_eq!(read(&ours_again_written), read(&ours), "kube-proxy's rewrite of svcplane's file reads differently");
}
