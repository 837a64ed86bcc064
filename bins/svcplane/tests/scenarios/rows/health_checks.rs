use super::super::*;

/// `spec.healthCheckNodePort` of `externalTrafficPolicy: Local` load balancers.
pub const HEALTH_CHECKS: &[Scenario] = &[
    row(
        "the health-check node port of a Local load balancer with two ready endpoints on this node answers 200 with localEndpoints 2",
        LB_LOCAL_SERVICE,
        ExternalClient,
        HealthCheck,
        Both,
        Tcp,
        Outcome::HealthCheck { local_endpoints: 2 },
        Any,
    ),
    row(
        "the health-check node port of a Local load balancer without endpoints on this node answers 503 with localEndpoints 0",
        OTHER_NODE_LB_LOCAL_SERVICE,
        ExternalClient,
        HealthCheck,
        Both,
        Tcp,
        Outcome::HealthCheck { local_endpoints: 0 },
        Any,
    ),
];
