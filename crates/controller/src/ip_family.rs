//! IP families as Services (`spec.ipFamilies`) and EndpointSlices (`addressType`) name them:
//! the shared vocabulary's type, whose Kubernetes spelling is `IPv4` / `IPv6`.

pub use svcplane_net::IpFamily;
