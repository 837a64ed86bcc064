use super::super::*;

/// `sessionAffinity: ClientIP` with a 3 s timeout.
pub const AFFINITY: &[Scenario] = &[
    row(
        "external clients to a ClientIP-affinity ClusterIP over UDP each stick to one endpoint, and pick afresh after a silence longer than the timeout",
        AFFINITY_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Udp,
        Outcome::StickyThenFreshAfterIdle { by: ALL_ECHO_PODS },
        Any,
    ),
    row(
        "external clients to a ClientIP-affinity NodePort over TCP each stick to one endpoint, and pick afresh after a silence longer than the timeout",
        AFFINITY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::StickyThenFreshAfterIdle { by: ALL_ECHO_PODS },
        Any,
    ),
    row(
        "external clients that keep connecting more often than the affinity timeout keep their endpoint beyond it",
        AFFINITY_RENEWED_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        Outcome::StickyWhileTalking { by: ALL_ECHO_PODS },
        Any,
    ),
];
