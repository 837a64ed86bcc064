use super::super::*;

/// Services svcplane must not program at all.
pub const IGNORED: &[Scenario] = &[
    row(
        "a Service labelled for another proxy (service.kubernetes.io/service-proxy-name) is not programmed: its ClusterIP is not served",
        OTHER_PROXY_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "a Service labelled for another proxy is not programmed: its NodePort is not served",
        OTHER_PROXY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "a headless Service is not programmed",
        HEADLESS_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "an ExternalName Service is not programmed",
        EXTERNAL_NAME_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
];
