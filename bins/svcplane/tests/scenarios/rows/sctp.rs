use super::super::*;

/// SCTP, where the kernel has it.
pub const SCTP: &[Scenario] = &[
    row(
        "pod on this node to ClusterIP over SCTP reaches endpoints on both nodes and keeps its own address",
        SCTP_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Sctp,
        ALL,
        ClientAddress,
    ),
    row(
        "the node itself to ClusterIP over SCTP reaches endpoints on both nodes",
        SCTP_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Sctp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to NodePort over SCTP reaches every endpoint, masqueraded to the node",
        SCTP_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Sctp,
        ALL,
        NodeAddress,
    ),
];
