//! `svcplane explain`: flags -> the node's plan (as `render` builds it) -> the core's
//! explanation, printed as text or JSON. Every decision is `svcplane_core::explain`'s.

use std::net::IpAddr;

use serde_json::{Value, json};
use svcplane_core::explain::{
    Explanation, MatchedFrontend, Query, Verdict, describe_sources, endpoint_set_name, explain, frontend_kind_name,
};
use svcplane_core::{ClusterState, NodePlan, Refusal};

use crate::cli::{ExplainArgs, Output};
use crate::{feeds, proxy};

pub fn run(args: &ExplainArgs) -> anyhow::Result<()> {
    let mut state = ClusterState::new();
    for change in feeds::read_changes(&args.source, &args.node_name)? {
        state.apply(change);
    }
    let config = proxy::node_config_of(&args.node_name, &args.node_ips, &args.cluster_cidrs, &args.nodeport_addresses)?;
    let plan = NodePlan::build(&state, config);
    let mut local: Vec<IpAddr> = plan.config.node_ips.clone();
    if local.is_empty()
        && let Some(node) = state.node(&args.node_name)
    {
        local.extend(node.addresses.iter().copied());
    }
    local.extend(args.local_addresses.iter().copied());
    let (destination, protocol) = args.to;
    let explanation = explain(&plan, &state, &local, &Query { source: args.from, destination, protocol });
    match args.output {
        Output::Text => print!("{explanation}"),
        Output::Json => println!("{}", serde_json::to_string_pretty(&to_json(&explanation))?),
    }
    Ok(())
}

fn frontend_json(frontend: &MatchedFrontend) -> Value {
    json!({
        "servicePort": frontend.service_port.to_string(),
        "service": frontend.service_port.service.to_string(),
        "portName": frontend.service_port.port_name.as_str(),
        "family": frontend.family.to_string(),
        "kind": frontend_kind_name(frontend.kind),
        "address": frontend.address.to_string(),
    })
}

/// The JSON shape documented in `docs/explain.md`.
pub fn to_json(explanation: &Explanation) -> Value {
    let mut out = json!({
        "node": explanation.node,
        "packet": {
            "source": explanation.query.source.to_string(),
            "destination": explanation.query.destination.to_string(),
            "protocol": explanation.query.protocol.as_str(),
        },
        "fromThisNode": explanation.from_this_node,
        "verdict": explanation.verdict.name(),
    });
    let fields = match &explanation.verdict {
        Verdict::Forwarded(forwarding) => json!({
            "frontend": frontend_json(&forwarding.frontend),
            "route": {
                "number": forwarding.route.number,
                "of": forwarding.route.of,
                "sources": describe_sources(&forwarding.route.route.sources),
                "endpointSet": endpoint_set_name(forwarding.route.route.endpoints),
                "masquerade": forwarding.route.route.masquerade,
            },
            "endpoints": forwarding.endpoints.iter().map(|endpoint| json!({
                "address": endpoint.address.to_string(),
                "probability": endpoint.probability,
                "node": endpoint.node,
                "local": endpoint.local,
                "ready": endpoint.ready,
                "terminating": endpoint.terminating,
                "hairpin": endpoint.hairpin,
            })).collect::<Vec<_>>(),
            "masquerade": forwarding.masquerade,
            "masqueradeReason": forwarding.masquerade_reason,
            "hairpinMasquerade": forwarding.hairpin_masquerade,
            "affinity": forwarding.affinity.map(|affinity| json!({
                "type": "ClientIP",
                "timeoutSeconds": affinity.timeout.as_secs(),
            })),
        }),
        Verdict::Rejected { frontend, refusal, reason } => json!({
            "frontend": frontend_json(frontend),
            "refusal": match refusal {
                Refusal::TcpReset => "tcp-reset",
                Refusal::IcmpPortUnreachable => "icmp-port-unreachable",
            },
            "reason": reason,
        }),
        Verdict::Dropped { frontend, reason } => json!({ "frontend": frontend_json(frontend), "reason": reason }),
        Verdict::HealthCheck { service, port, local_endpoints } => json!({
            "healthCheck": {
                "service": service.to_string(),
                "port": port,
                "localEndpoints": local_endpoints,
                "status": if *local_endpoints > 0 { 200 } else { 503 },
            },
        }),
        Verdict::NotServed { reason } => json!({ "reason": reason }),
    };
    if let (Value::Object(out), Value::Object(fields)) = (&mut out, fields) {
        out.extend(fields);
    }
    out
}
