//! What the benchmarks against a real API server share (`tests/kube_benchmark.rs`, upstream
//! kube-proxy in nftables mode on the host; `benches/ipvs.rs`, IPVS mode in the guest
//! kernel): the bulk input (S selector-less ClusterIP Services, each with one IPv4
//! EndpointSlice of 10 endpoints) written through the API, the probe that tells when a
//! node's rules are in the kernel, and a process's peak RSS.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};

use super::{KubeLab, echo_service, echo_slice};

pub const ENDPOINTS_PER_SERVICE: usize = 10;
const CREATE_CONCURRENCY: usize = 32;
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(50);

/// Service `svc-<index>` (single-stack IPv4) and its slice of [`ENDPOINTS_PER_SERVICE`]
/// endpoints (198.18.140.0 and up, alternately on node1 and node2).
pub fn bulk_service(index: usize) -> (Service, EndpointSlice) {
    let name = format!("svc-{index:05}");
    let mut service = echo_service(&name, false, &[]);
    if let Some(spec) = service.spec.as_mut() {
        spec.ip_family_policy = Some("SingleStack".into());
    }
    let endpoints: Vec<(IpAddr, &str)> = (0..ENDPOINTS_PER_SERVICE)
        .map(|e| {
            let k = (index * ENDPOINTS_PER_SERVICE + e) % 25_000;
            let ip: IpAddr = format!("198.18.{}.{}", 140 + k / 250, k % 250 + 1).parse().unwrap();
            (ip, if e % 2 == 0 { "node1" } else { "node2" })
        })
        .collect();
    let slice = echo_slice(&format!("{name}-1"), &name, &endpoints, &[]);
    (service, slice)
}

/// Creates `services` bulk Services and their slices, 32 requests at a time.
pub fn create_bulk(kube: &KubeLab, services: usize) {
    let client = kube.client.client();
    kube.client.run(async move {
        let services_api = Api::<Service>::namespaced(client.clone(), "default");
        let slices_api = Api::<EndpointSlice>::namespaced(client, "default");
        let results: Vec<Result<(), kube::Error>> = futures::stream::iter(0..services)
            .map(|index| {
                let (services_api, slices_api) = (services_api.clone(), slices_api.clone());
                async move {
                    let (service, slice) = bulk_service(index);
                    services_api.create(&PostParams::default(), &service).await?;
                    slices_api.create(&PostParams::default(), &slice).await?;
                    Ok(())
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        for result in results {
            result.expect("creating a Service and its slice");
        }
    });
}

/// Probes `target` from `namespace` every 10 ms (each probe waits at most 50 ms) until
/// lab pod `pod` answers; the time since `from`, or `None` once `limit` has passed.
pub fn until_answered(
    kube: &KubeLab,
    namespace: &str,
    target: SocketAddr,
    pod: &str,
    limit: Duration,
    from: Instant,
) -> Option<Duration> {
    while from.elapsed() < limit {
        if let Ok(reply) = kube.lab.tcp_request(namespace, target, PROBE_TIMEOUT)
            && reply.server_name == pod
        {
            return Some(from.elapsed());
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
    None
}

/// Upstream kube-proxy's arguments on lab node `node` in `mode` (`nftables`, `ipvs`): the
/// admin kubeconfig, the lab's cluster CIDRs, metrics on loopback, and its conntrack sysctls
/// left alone (a node's namespace has none of its own to size).
pub fn upstream_kube_proxy_args(kube: &KubeLab, node: &str, mode: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kube.plane.kubeconfig().display()),
        format!("--hostname-override={node}"),
        format!("--proxy-mode={mode}"),
        format!("--cluster-cidr={}", super::CLUSTER_CIDRS.join(",")),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0s".into(),
        "--conntrack-tcp-timeout-close-wait=0s".into(),
        "--metrics-bind-address=127.0.0.1:10249".into(),
        "--v=1".into(),
    ]
}

/// The peak RSS (`VmHWM`) of process `pid`, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
