use super::super::*;

/// NodePorts with no `--nodeport-addresses`: every node address except loopback.
pub const NODEPORT_ADDRESSES_DEFAULT: &[Scenario] = &[
    row(
        "by default a NodePort answers on the node's primary address",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "by default a NodePort answers on every other node address too",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "a NodePort is never reachable on loopback over TCP",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "a NodePort is never reachable on loopback over UDP",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Udp,
        Outcome::NotServed,
        Any,
    ),
];

/// NodePorts with `--nodeport-addresses primary`.
pub const NODEPORT_ADDRESSES_PRIMARY: &[Scenario] = &[
    row(
        "with --nodeport-addresses primary a NodePort answers on the node's primary address",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "with --nodeport-addresses primary a NodePort does not answer on the node's other addresses",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "with --nodeport-addresses primary a NodePort is not reachable on loopback",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
];

/// NodePorts with `--nodeport-addresses` set to CIDRs that exclude the primary address.
pub const NODEPORT_ADDRESSES_CIDRS: &[Scenario] = &[
    row(
        "with --nodeport-addresses CIDRs a NodePort answers on node addresses inside them",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "with --nodeport-addresses CIDRs a NodePort does not answer on a node address outside them",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "with --nodeport-addresses CIDRs a NodePort without endpoints is refused on node addresses inside them",
        EMPTY_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
];
