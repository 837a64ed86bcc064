//! The live status page in a real browser: headless Chromium (Debian's package) loads
//! `/status` from the proxy running in a lab node, and the page shows the lab's Services
//! with their endpoints, and per-endpoint counters that grow by exactly the connections
//! sent through the ClusterIP. The same counters are exported on `/metrics`, capped.
//! Leaves a screenshot in `target/status-page.png` (the one in docs comes from here).

mod scenarios;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use scenarios::cluster::{Backend, Cluster, THIS_NODE};
use scenarios::manifests::{ECHO_SERVICE, POD_ON_THIS_NODE, pod_ip};
use scenarios::{Family, eventually};

const NFTABLES_EXPORTING_COUNTERS: Backend = Backend {
    proxy_args: &["--mode", "nftables", "--metrics-max-endpoint-series", "1000", "--status-max-series", "1000"],
    ..scenarios::backends::NFTABLES
};
const STATUS_URL: &str = "http://127.0.0.1:10249/status";
const SENT: u64 = 5;

/// The page as Chromium rendered it after its script ran (`--dump-dom`), in `namespace`.
fn rendered_page(namespace: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().expect("a browser profile directory");
    let mut command = Command::new("ip");
    command.args(["netns", "exec", namespace, "chromium", "--headless", "--no-sandbox", "--disable-gpu"]);
    command.arg(format!("--user-data-dir={}", profile.path().display()));
    command.args(["--virtual-time-budget=4000", "--window-size=1280,900"]);
    match screenshot {
        Some(path) => command.arg(format!("--screenshot={}", path.display())),
        None => command.arg("--dump-dom"),
    };
    let output = command.arg(STATUS_URL).output().expect("running chromium (scripts/install-deps installs it)");
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// `servicePort|protocol|endpoint` -> the count the page shows, for the echo Service.
fn page_counters(dom: &str) -> BTreeMap<String, u64> {
    let mut counters = BTreeMap::new();
    for piece in dom.split("data-endpoint=\"").skip(1) {
        let Some((key, rest)) = piece.split_once('"') else { continue };
        let element_end = rest.find("</span></span>").unwrap_or(rest.len());
        let count = rest[..element_end]
            .split("<span class=\"count\">")
            .nth(1)
            .and_then(|c| c.split('<').next())
            .and_then(|c| c.parse().ok());
        if let Some(count) = count
            && key.split(['|', ':']).next().is_some_and(|service| service.ends_with(&format!("/{ECHO_SERVICE}")))
        {
            counters.insert(key.to_owned(), count);
        }
    }
    counters
}

#[test]
fn the_status_page_shows_the_labs_services_and_counters_that_grow_with_traffic_in_headless_chromium() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_status_page_shows_the_labs_services_and_counters_that_grow_with_traffic_in_headless_chromium",
    ) {
        return;
    }
    let cluster = Cluster::start(NFTABLES_EXPORTING_COUNTERS);
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name().to_owned();
    let echo = cluster.service(ECHO_SERVICE).expect("the echo Service");
    let target = echo.cluster_ip_address(false).expect("an IPv4 ClusterIP");

    let before = rendered_page(&node, None);
    assert!(before.contains("node node1") && before.contains("nftables mode"), "the page names node and mode");
    for service in ["/echo", "/empty", "/external-local"] {
        assert!(before.contains(service), "the page lists {service}:\n{before}");
    }
    assert!(before.contains(&format!("ClusterIp {target}")), "the echo ClusterIP frontend is drawn");
    let counted_before = page_counters(&before);

    let pod = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let mut answered: BTreeMap<String, u64> = BTreeMap::new();
    for sent in 1..=SENT {
        let reply = svcplane_testbed::tcp_request_in(&pod, target, Duration::from_secs(5))
            .unwrap_or_else(|error| panic!("connection {sent} to {target}: {error}"));
        let endpoint = SocketAddr::new(pod_ip(&reply.server_name, Family::V4), echo.target_port);
        let key = counted_before
            .keys()
            .find(|key| key.ends_with(&format!("|tcp|{endpoint}")))
            .cloned()
            .unwrap_or_else(|| panic!("the page had a counter for {endpoint} before:\n{before}"));
        *answered.entry(key).or_default() += 1;
    }

    // The page refreshes itself; a new load shows what the kernel counted since.
    let grown = eventually(Duration::from_secs(10), || {
        let after = page_counters(&rendered_page(&node, None));
        let grown: BTreeMap<String, u64> = after
            .iter()
            .map(|(key, now)| (key.clone(), now.saturating_sub(counted_before.get(key).copied().unwrap_or(0))))
            .filter(|(_, grew)| *grew > 0)
            .collect();
        (grown == answered).then_some(grown)
    });
    assert!(grown.is_some(), "the page's counters grew by exactly {answered:?}");

    // The same counters on /metrics.
    let metrics = svcplane_testbed::run_in_namespace(&node, || {
        svcplane_ops::http::get("127.0.0.1:10249".parse().unwrap(), "/metrics")
    })
    .unwrap()
    .unwrap()
    .2;
    for key in answered.keys() {
        let endpoint = key.rsplit('|').next().unwrap();
        assert!(
            metrics.lines().any(|l| l.starts_with("svcplane_endpoint_connections_total{")
                && l.contains(&format!("endpoint=\"{endpoint}\""))
                && l.contains("protocol=\"tcp\"")),
            "/metrics exports {endpoint}'s counter:\n{metrics}"
        );
    }

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    rendered_page(&node, Some(&screenshot));
    assert!(std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 10_000), "a screenshot was taken");
    cluster.teardown();
}
