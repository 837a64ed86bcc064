//! Explain against the kernel: before a row's probes are sent, `svcplane explain` (the
//! binary, from the same manifests and flags as the node's proxy) predicts what happens to
//! the row's packet on the node that handles it; after the probes, what the real kernel did
//! ([`Seen`]) must be that prediction. The runner ([`super::real`]) knows no mode, so every
//! mode it runs is held to the same plan-level answer.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use serde_json::Value;

use super::cluster::{Cluster, node_port_address_args};
use super::manifests::{self, CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, SERVICE_CIDR_V4, SERVICE_CIDR_V6};
use super::real::Resolved;
use super::{Family, Scenario, Sender};

/// What the real kernel did with a row's probes, as far as explain predicts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Pods answered. `masqueraded`: for the replies of pods other than the sender, whether
    /// the pod saw a node address (`true`) or the sender's (`false`); `hairpin_masqueraded`
    /// the same for replies of the sender itself. `all`: every eligible pod was expected to
    /// answer (enough probes were sent); otherwise the pods seen are a sample.
    Answered { pods: BTreeSet<String>, masqueraded: BTreeSet<bool>, hairpin_masqueraded: BTreeSet<bool>, all: bool },
    /// Clients stuck to endpoints (session affinity); the pods seen are a sample.
    Sticky { pods: BTreeSet<String> },
    /// Refused at once.
    Refused,
    /// Silence.
    Silent,
    /// Not answered by any pod, whatever the node's own stack did.
    NotServed,
    /// The health-check node port answered with this count.
    Health { local_endpoints: usize },
    /// Not answered (the first step of a row whose Service has no endpoint yet): refused or
    /// silent, as `refused` says.
    Unanswered { refused: bool },
}

/// explain's JSON answer for a row's first packet.
#[derive(Debug, Clone)]
pub struct Prediction(pub Value);

impl Prediction {
    pub fn verdict(&self) -> &str {
        self.0["verdict"].as_str().unwrap_or("(none)")
    }

    /// The eligible endpoints as pod names (an address of no lab pod is kept as the address).
    pub fn pods(&self) -> BTreeSet<String> {
        self.0["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|endpoint| endpoint["address"].as_str())
            .map(|address| match address.parse::<SocketAddr>() {
                Ok(address) => manifests::pod_at(address.ip()).map_or_else(|| address.to_string(), str::to_owned),
                Err(_) => address.to_owned(),
            })
            .collect()
    }

    fn flag(&self, name: &str) -> bool {
        self.0[name].as_bool().unwrap_or(false)
    }

    /// One line for reports.
    pub fn summary(&self) -> String {
        let reason = self.0["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default();
        match self.verdict() {
            "forwarded" => format!(
                "explain: forwarded via {} to {:?}, masquerade {}",
                self.0["frontend"]["kind"].as_str().unwrap_or("?"),
                self.pods(),
                self.flag("masquerade")
            ),
            "health-check" => {
                format!("explain: health check, {} local endpoint(s)", self.0["healthCheck"]["localEndpoints"])
            }
            other => format!("explain: {other}{reason}"),
        }
    }
}

/// Asks `svcplane explain` about `row`'s packet on the node that handles it, with the flags
/// that node's proxy runs with. `None` when the row has no address to ask about.
pub fn predict(cluster: &Cluster, row: &Scenario, resolved: &Resolved) -> Result<Option<Prediction>, String> {
    let Some(target) = resolved.target else {
        return Ok(None);
    };
    let node = resolved.entry_node;
    // A process on the node talking to loopback sends from loopback.
    let source = if target.ip().is_loopback() { target.ip() } else { resolved.client_ip };
    let mut args: Vec<String> = vec![
        "explain".into(),
        "--manifests".into(),
        cluster.manifests_dir().to_string_lossy().into_owned(),
        "--node".into(),
        manifests::node_name(node),
        "--from".into(),
        source.to_string(),
        "--to".into(),
        format!("{target}/{}", row.protocol),
        "--output".into(),
        "json".into(),
    ];
    for family in [Family::V4, Family::V6] {
        args.extend(["--node-ip".into(), manifests::node_ip(node, family).to_string()]);
    }
    for address in manifests::node_addresses(node) {
        args.extend(["--local-address".into(), address.to_string()]);
    }
    for cidr in [CLUSTER_CIDR_V4, CLUSTER_CIDR_V6] {
        args.extend(["--cluster-cidr".into(), cidr.into()]);
    }
    for cidr in [SERVICE_CIDR_V4, SERVICE_CIDR_V6] {
        args.extend(["--service-cidr".into(), cidr.into()]);
    }
    args.extend(node_port_address_args(cluster.node_port_addresses(), node));
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(&args)
        .env("SVCPLANE_LOG", "error")
        .output()
        .map_err(|error| format!("running svcplane explain: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "svcplane explain {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let json = serde_json::from_slice(&output.stdout).map_err(|error| {
        format!("svcplane explain printed no JSON ({error}): {}", String::from_utf8_lossy(&output.stdout))
    })?;
    Ok(Some(Prediction(json)))
}

/// Whether what the kernel did is what explain said; the error says how they differ.
/// `relayed`: the mode relays every connection from the node, so which address the pods
/// saw is not explain's masquerade flag (the scenario rows check it instead).
pub fn agree(row: &Scenario, prediction: &Prediction, seen: &Seen, relayed: bool) -> Result<(), String> {
    let verdict = prediction.verdict();
    let expect_verdict = |wanted: &[&str]| {
        if wanted.contains(&verdict) {
            Ok(())
        } else {
            Err(format!("the kernel {seen:?} but {}", prediction.summary()))
        }
    };
    match seen {
        Seen::Answered { pods, masqueraded, hairpin_masqueraded, all } => {
            expect_verdict(&["forwarded"])?;
            let predicted = prediction.pods();
            let same = if *all { *pods == predicted } else { pods.is_subset(&predicted) };
            if !same {
                return Err(format!("the kernel's answers came from {pods:?} but {}", prediction.summary()));
            }
            // From the node itself the sender's address is a node address: nothing to tell apart.
            if row.from != Sender::ThisNode && !relayed {
                let masquerade = prediction.flag("masquerade");
                if masqueraded.iter().any(|m| *m != masquerade) {
                    return Err(format!(
                        "pods saw {} but {}",
                        if masquerade { "the sender's own address" } else { "a node address" },
                        prediction.summary()
                    ));
                }
                let hairpin = masquerade || prediction.flag("hairpinMasquerade");
                if hairpin_masqueraded.iter().any(|m| *m != hairpin) {
                    return Err(format!(
                        "the sender answering itself saw {} but explain says hairpin masquerade {hairpin}",
                        if hairpin { "its own address" } else { "a node address" }
                    ));
                }
            }
            Ok(())
        }
        Seen::Sticky { pods } => {
            expect_verdict(&["forwarded"])?;
            if prediction.0["affinity"].is_null() {
                return Err(format!(
                    "clients stuck to their endpoints but explain reports no session affinity: {}",
                    prediction.summary()
                ));
            }
            if !pods.is_subset(&prediction.pods()) {
                return Err(format!("the kernel's answers came from {pods:?} but {}", prediction.summary()));
            }
            Ok(())
        }
        Seen::Refused => expect_verdict(&["rejected"]),
        Seen::Silent => expect_verdict(&["dropped"]),
        Seen::NotServed => expect_verdict(&["not-served"]),
        Seen::Health { local_endpoints } => {
            expect_verdict(&["health-check"])?;
            let predicted = prediction.0["healthCheck"]["localEndpoints"].as_u64();
            if predicted != u64::try_from(*local_endpoints).ok() {
                return Err(format!(
                    "the health check said {local_endpoints} local endpoint(s) but {}",
                    prediction.summary()
                ));
            }
            Ok(())
        }
        Seen::Unanswered { refused: true } => expect_verdict(&["rejected"]),
        Seen::Unanswered { refused: false } => expect_verdict(&["dropped", "not-served"]),
    }
}

/// Whether the pod that answered saw a node address (masqueraded) rather than `client`.
pub fn saw_node_address(client: IpAddr, seen: IpAddr) -> bool {
    seen != client
}
