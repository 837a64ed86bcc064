//! Manifests mode rejects what the kube-apiserver rejects, naming the same field: a corpus
//! of Services and EndpointSlices, each a valid object with one field broken, is sent to a
//! real kube-apiserver as a server-side dry run and through svcplane's own conversion (what
//! `--manifests` uses). For every object the verdicts must agree, and where both refuse,
//! svcplane's error must name a field the apiserver names.
//!
//! Where svcplane decides differently on purpose, [`DELIBERATE`] says why; everything else
//! must agree.
//! Skipped without the upstream binaries or root, unless SVCPLANE_REQUIRE_K8S=1 (CI).

mod kube_support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use kube_support::KubeLab;
use serde_json::{Value, json};
use svcplane_control_plane::binaries_for_test;
use svcplane_testbed::Lab;

/// Corpus entries where svcplane's verdict differs from the apiserver's on purpose, with why.
const DELIBERATE: &[(&str, &str)] = &[(
    "slice port 70000",
    "the apiserver stores an EndpointSlice port over 65535 (discovery/v1 does not range-check it), \
     but no kernel can forward to it: svcplane refuses the slice naming the port",
)];

/// The same field, named two ways: the apiserver reports `spec.clusterIP` through its
/// defaulted copy `spec.clusterIPs[0]`, capitalizes `LoadBalancerSourceRanges`, and names a
/// list where svcplane names the item in it (`endpoints[0].addresses` / `...addresses[0]`).
fn same_field(theirs: &str, ours: &str) -> bool {
    let normalize = |field: &str| field.to_ascii_lowercase().replace("spec.clusterips[0]", "spec.clusterip");
    let (theirs, ours) = (normalize(theirs), normalize(ours));
    let nested = |outer: &str, inner: &str| {
        inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
    };
    theirs == ours || nested(&theirs, &ours) || nested(&ours, &theirs)
}

fn valid_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "clusterIP": "198.19.7.7",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }
    })
}

fn valid_slice() -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["198.18.129.1"], "conditions": {"ready": true}}]
    })
}

/// `base` with the value at `pointer` (JSON pointer; parents must exist; an index one past
/// the end appends) set to `value`.
fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let target = base.pointer_mut(parent).unwrap_or_else(|| panic!("{parent} exists"));
    match target {
        Value::Array(items) => {
            let index = key.parse::<usize>().expect("an index");
            if index == items.len() {
                items.push(value);
            } else {
                items[index] = value;
            }
        }
        Value::Object(map) => {
            map.insert(key.to_owned(), value);
        }
        _ => panic!("{parent} is a container"),
    }
    base
}

fn service_corpus() -> Vec<(&'static str, Value)> {
    let s = valid_service;
    let port2 = |name: Value| json!({"name": name, "port": 81, "protocol": "TCP", "targetPort": 8081});
    vec![
        ("a valid Service", s()),
        ("port 0", with(s(), "/spec/ports/0/port", json!(0))),
        ("port 70000", with(s(), "/spec/ports/0/port", json!(70000))),
        ("protocol ICMP", with(s(), "/spec/ports/0/protocol", json!("ICMP"))),
        ("targetPort 0", with(s(), "/spec/ports/0/targetPort", json!(0))),
        ("targetPort 70000", with(s(), "/spec/ports/0/targetPort", json!(70000))),
        ("a targetPort name with a space", with(s(), "/spec/ports/0/targetPort", json!("no way"))),
        ("clusterIP not an address", with(s(), "/spec/clusterIP", json!("not-an-ip"))),
        ("type Weird", with(s(), "/spec/type", json!("Weird"))),
        ("sessionAffinity Sticky", with(s(), "/spec/sessionAffinity", json!("Sticky"))),
        (
            "affinity timeout 0",
            with(
                with(s(), "/spec/sessionAffinity", json!("ClientIP")),
                "/spec/sessionAffinityConfig",
                json!({"clientIP": {"timeoutSeconds": 0}}),
            ),
        ),
        (
            "affinity timeout over a day",
            with(
                with(s(), "/spec/sessionAffinity", json!("ClientIP")),
                "/spec/sessionAffinityConfig",
                json!({"clientIP": {"timeoutSeconds": 86401}}),
            ),
        ),
        ("two ports with one name", with(s(), "/spec/ports/1", port2(json!("http")))),
        ("a second port without a name", with(s(), "/spec/ports/1", port2(json!(null)))),
        ("an external IP that is no address", with(s(), "/spec/externalIPs", json!(["nope"]))),
        (
            "externalTrafficPolicy Local on a ClusterIP Service",
            with(s(), "/spec/externalTrafficPolicy", json!("Local")),
        ),
        ("internalTrafficPolicy Sideways", with(s(), "/spec/internalTrafficPolicy", json!("Sideways"))),
        (
            "healthCheckNodePort on a NodePort Service",
            with(with(s(), "/spec/type", json!("NodePort")), "/spec/healthCheckNodePort", json!(30500)),
        ),
        (
            "a load-balancer source range that is no CIDR",
            with(with(s(), "/spec/type", json!("LoadBalancer")), "/spec/loadBalancerSourceRanges", json!(["nope"])),
        ),
    ]
}

/// `count` ready endpoints with distinct addresses in the lab's pod range.
fn endpoints(count: u32) -> Value {
    let first = u32::from(std::net::Ipv4Addr::new(198, 18, 160, 1));
    (0..count).map(|i| json!({"addresses": [std::net::Ipv4Addr::from(first + i).to_string()]})).collect()
}

fn slice_ports(count: u16) -> Value {
    (0..count).map(|i| json!({"name": format!("p{i}"), "port": 8000 + i, "protocol": "TCP"})).collect()
}

fn slice_corpus() -> Vec<(&'static str, Value)> {
    let e = valid_slice;
    vec![
        ("a valid EndpointSlice", e()),
        ("addressType IPv5", with(e(), "/addressType", json!("IPv5"))),
        ("an endpoint address that is no address", with(e(), "/endpoints/0/addresses/0", json!("nope"))),
        ("an IPv6 address in an IPv4 slice", with(e(), "/endpoints/0/addresses/0", json!("2001:db8::1"))),
        ("an endpoint without addresses", with(e(), "/endpoints/0/addresses", json!([]))),
        ("slice port 70000", with(e(), "/ports/0/port", json!(70000))),
        (
            "an IPv4-mapped address in an IPv6 slice",
            with(with(e(), "/addressType", json!("IPv6")), "/endpoints/0/addresses/0", json!("::ffff:198.18.0.5")),
        ),
        (
            "an upper-case, uncompressed IPv6 address",
            with(with(e(), "/addressType", json!("IPv6")), "/endpoints/0/addresses/0", json!("2001:DB8:0:0:0:0:0:A")),
        ),
        ("a service port named with capitals", with(valid_service(), "/spec/ports/0/name", json!("HTTP"))),
        ("1000 endpoints in one slice (the most allowed)", with(e(), "/endpoints", endpoints(1000))),
        ("1001 endpoints in one slice", with(e(), "/endpoints", endpoints(1001))),
        ("100 ports in one slice (the most allowed)", with(e(), "/ports", slice_ports(100))),
        ("101 ports in one slice", with(e(), "/ports", slice_ports(101))),
        ("slice protocol ICMP", with(e(), "/ports/0/protocol", json!("ICMP"))),
    ]
}

/// The field paths an apiserver message names (`spec.ports[0].port: Invalid value: ...`).
fn apiserver_fields(message: &str) -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    let bytes = message.as_bytes();
    for (start, _) in message.match_indices(|c: char| c.is_ascii_lowercase()) {
        if start > 0 && !matches!(bytes[start - 1], b' ' | b'[' | b',') {
            continue;
        }
        let rest = &message[start..];
        let Some(end) = rest.find(": ") else { continue };
        let candidate = &rest[..end];
        let looks_like_path = candidate.contains('.')
            && candidate.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']'))
            || matches!(candidate, "addressType" | "endpoints" | "ports");
        if looks_like_path {
            fields.insert(candidate.to_owned());
        }
    }
    fields
}

/// `Ok(())` when the apiserver accepts the object, else the fields its refusal names.
fn apiserver_verdict<K>(kube: &KubeLab, object: &Value) -> Result<(), (String, BTreeSet<String>)>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    // Through the dynamic form: typed deserialization would already refuse some values.
    let client = kube.client.client();
    let object: K = match serde_json::from_value(object.clone()) {
        Ok(object) => object,
        Err(error) => return Err((format!("not even a {}: {error}", K::kind(&())), BTreeSet::new())),
    };
    let result = kube.client.run(async move {
        let api: Api<K> = Api::namespaced(client, "default");
        api.create(&PostParams { dry_run: true, ..PostParams::default() }, &object).await.map(|_| ())
    });
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) => {
            let fields = apiserver_fields(&status.message);
            Err((status.message.clone(), fields))
        }
        Err(other) => panic!("the dry run itself failed: {other}"),
    }
}

#[test]
fn manifests_mode_refuses_what_the_apiserver_refuses_naming_the_same_field() {
    let Some(binaries) = binaries_for_test("kube_validation_oracle") else { return };
    let lab = Lab::builder().nodes(1).pods_per_node(0).build().expect("a lab (needs root)");
    let kube = KubeLab::start_without_nodes(&binaries, lab);
    let mut disagreements = Vec::new();
    let mut compared = 0;
    let mut check = |label: &str, theirs: Result<(), (String, BTreeSet<String>)>, ours: Result<(), Vec<String>>| {
        compared += 1;
        match (&theirs, &ours) {
            (Ok(()), Ok(())) => {}
            (Err((_, their_fields)), Err(our_fields))
                if their_fields.is_empty()
                    || our_fields.iter().any(|ours| their_fields.iter().any(|theirs| same_field(theirs, ours))) => {}
            _ if DELIBERATE.iter().any(|(name, _)| *name == label) => {
                eprintln!("deliberate: {label}: apiserver {theirs:?}, svcplane {ours:?}");
            }
            _ => disagreements.push(format!("{label}\n    apiserver: {theirs:?}\n    svcplane:  {ours:?}")),
        }
    };
    for (label, object) in service_corpus() {
        let theirs = apiserver_verdict::<Service>(&kube, &object);
        let ours = match serde_json::from_value::<Service>(object) {
            Ok(service) => svcplane_source::service_to_core(&service)
                .map(|_| ())
                .map_err(|errors| errors.into_iter().map(|e| e.field).collect()),
            Err(error) => Err(vec![format!("(not a Service: {error})")]),
        };
        check(label, theirs, ours);
    }
    for (label, object) in slice_corpus() {
        let theirs = apiserver_verdict::<EndpointSlice>(&kube, &object);
        let ours = match serde_json::from_value::<EndpointSlice>(object) {
            // What manifests mode does with a slice: convert it, and refuse what the apiserver
            // refuses in a new object.
            Ok(slice) => {
                let mut fields: Vec<String> =
                    svcplane_source::new_slice_address_errors(&slice).into_iter().map(|e| e.field).collect();
                if let Err(errors) = svcplane_source::slice_to_core(&slice) {
                    fields.extend(errors.into_iter().map(|e| e.field));
                }
                if fields.is_empty() { Ok(()) } else { Err(fields) }
            }
            Err(error) => Err(vec![format!("(not an EndpointSlice: {error})")]),
        };
        check(label, theirs, ours);
    }
    eprintln!("{compared} objects compared, {} disagreements", disagreements.len());
    assert!(disagreements.is_empty(), "svcplane and the kube-apiserver disagree:\n{}", disagreements.join("\n"));
}
