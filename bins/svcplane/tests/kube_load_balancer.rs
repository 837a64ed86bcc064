//! `svcplane controller --load-balancer-ipam` on a real API server: the pool CRD and RBAC
//! from `deploy/loadbalancer-pools.yaml`, pools as objects of that CRD (its schema refuses
//! broken ones), addresses written to `status.loadBalancer.ingress`, and every reason an
//! address is missing written as the Service's condition (plus an Event) naming the cause.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};
use svcplane_control_plane::{
    BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, UpstreamBinaries, binaries_for_test,
};
use svcplane_kube::load_balancer::pool_resource;

use kube_support::{create_pool, install_pool_crd};

const CONDITION: &str = "svcplane.io/LoadBalancerAddress";
const WITHIN: Duration = Duration::from_secs(30);

fn start_api(binaries: &UpstreamBinaries) -> (BareNamespace, ControlPlane, NetnsClient) {
    let namespace = BareNamespace::create().expect("a namespace");
    let address: IpAddr = "198.18.0.2".parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let mut config = ControlPlaneConfig::new(namespace.name(), address);
    config.service_cidrs = vec!["198.19.0.0/16".into(), "2001:db8:f::/108".into()];
    let plane = ControlPlane::start(binaries, config).unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).unwrap();
    (namespace, plane, client)
}

fn pool_status(client: &NetnsClient, name: &str) -> Value {
    let kube = client.client();
    let name = name.to_owned();
    let object = client
        .run(async move { Api::<DynamicObject>::all_with(kube, &pool_resource()).get(&name).await })
        .expect("the pool");
    object.data.get("status").cloned().unwrap_or(Value::Null)
}

fn lb_service(name: &str, tweak: impl FnOnce(&mut Service)) -> Service {
    let mut service = Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..ObjectMeta::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort { port: 80, ..ServicePort::default() }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    tweak(&mut service);
    service
}

/// (ingress IPs, condition status, reason, message) of a Service.
fn lb_state(client: &NetnsClient, name: &str) -> (Vec<String>, String, String, String) {
    let service: Service = client.get("default", name).expect("the Service");
    let status = service.status.unwrap_or_default();
    let ips =
        status.load_balancer.and_then(|lb| lb.ingress).unwrap_or_default().into_iter().filter_map(|i| i.ip).collect();
    let condition = status.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == CONDITION);
    match condition {
        Some(c) => (ips, c.status, c.reason, c.message),
        None => (ips, String::new(), String::new(), String::new()),
    }
}

fn wait_for(
    client: &NetnsClient,
    name: &str,
    what: &str,
    done: impl Fn(&(Vec<String>, String, String, String)) -> bool,
) -> (Vec<String>, String, String, String) {
    let started = Instant::now();
    loop {
        let state = lb_state(client, name);
        if done(&state) {
            return state;
        }
        assert!(started.elapsed() < WITHIN, "{name}: {what}: still {state:?} after {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn in_range(ip: &str, first: u8, last: u8) -> bool {
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let [a, b, c, d] = ip.octets();
    (a, b, c) == (198, 18, 100) && (first..=last).contains(&d)
}

#[test]
fn pools_from_the_crd_give_load_balancers_addresses_and_every_missing_address_names_its_cause() {
    let Some(binaries) = binaries_for_test("kube_load_balancer") else { return };
    let (namespace, plane, client) = start_api(&binaries);
    install_pool_crd(&client);

    // The schema refuses a block that is neither a CIDR nor a range, and a bad CIDR.
    for (name, spec) in [
        ("both", json!({"blocks": [{"cidr": "198.18.100.0/30", "start": "198.18.100.1"}]})),
        ("badcidr", json!({"blocks": [{"cidr": "198.18.100.0/33"}]})),
        ("empty", json!({"blocks": []})),
    ] {
        let refused = create_pool(&client, name, spec);
        assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422), "{name}: {refused:?}");
    }
    // a-small: 198.18.100.1-2 for Services labelled pool=small; b-main: 198.18.100.16/29 for
    // the rest; c-overlap overlaps b-main and must not be used.
    create_pool(
        &client,
        "a-small",
        json!({"blocks": [{"start": "198.18.100.1", "stop": "198.18.100.2"}],
        "serviceSelector": {"matchLabels": {"pool": "small"}}}),
    )
    .unwrap();
    create_pool(
        &client,
        "b-main",
        json!({"blocks": [{"cidr": "198.18.100.16/29"}, {"cidr": "2001:db8:100::/125"}],
        "serviceSelector": {"matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}}),
    )
    .unwrap();
    create_pool(&client, "c-overlap", json!({"blocks": [{"cidr": "198.18.100.20/30"}]})).unwrap();

    let small = |s: &mut Service| s.metadata.labels = Some(BTreeMap::from([("pool".to_owned(), "small".to_owned())]));
    client
        .create(&lb_service("web", |s| s.spec.as_mut().unwrap().ip_family_policy = Some("PreferDualStack".into())))
        .unwrap();
    client.create(&lb_service("s1", small)).unwrap();
    client.create(&lb_service("s2", small)).unwrap();
    client
        .create(&lb_service("other-class", |s| {
            s.spec.as_mut().unwrap().load_balancer_class = Some("example.com/cloud".into());
        }))
        .unwrap();

    let kubeconfig = plane.kubeconfig().display().to_string();
    let args: Vec<String> = [
        "controller",
        "--kubeconfig",
        &kubeconfig,
        "--leader-elect=false",
        "--load-balancer-ipam",
        "--metrics-bind-address=",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (_, log) = plane.spawn("svcplane-controller", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();

    let web = wait_for(&client, "web", "two addresses from b-main", |s| s.0.len() == 2 && s.1 == "True");
    assert!(in_range(&web.0[0], 16, 23), "{web:?}");
    assert!(web.0[1].starts_with("2001:db8:100::"), "{web:?}");
    assert!(web.3.contains("pool b-main"), "{web:?}");
    let s1 = wait_for(&client, "s1", "an address from a-small", |s| s.0.len() == 1);
    let s2 = wait_for(&client, "s2", "an address from a-small", |s| s.0.len() == 1);
    assert!(in_range(&s1.0[0], 1, 2) && in_range(&s2.0[0], 1, 2) && s1.0 != s2.0, "{s1:?} {s2:?}");

    // Pool exhaustion: a third Service for a-small.
    client.create(&lb_service("s3", small)).unwrap();
    let s3 = wait_for(&client, "s3", "PoolExhausted", |s| s.2 == "PoolExhausted");
    assert!(s3.0.is_empty() && s3.1 == "False" && s3.3.contains("pool a-small"), "{s3:?}");
    let started = Instant::now();
    loop {
        let events: Vec<Event> = client.list(Some("default"), None).unwrap();
        if events
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("s3") && e.reason.as_deref() == Some("PoolExhausted"))
        {
            break;
        }
        assert!(started.elapsed() < WITHIN, "no PoolExhausted Event for s3: {events:?}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Overlapping pools: the later one says with which, and is not used.
    let started = Instant::now();
    loop {
        let status = pool_status(&client, "c-overlap");
        let condition = &status["conditions"][0];
        if condition["reason"] == "Conflict" {
            assert_eq!(condition["status"], "False");
            assert!(condition["message"].as_str().unwrap().contains("pool b-main"), "{status}");
            break;
        }
        assert!(started.elapsed() < WITHIN, "c-overlap has no Conflict condition: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pool_status(&client, "a-small")["used"], 2);
    // An IPv6 /64 has more addresses than a status count carries: its size saturates.
    create_pool(&client, "e-wide", json!({"blocks": [{"cidr": "2001:db8:200::/64"}], "namespaces": ["unused"]}))
        .unwrap();
    let started = Instant::now();
    loop {
        let status = pool_status(&client, "e-wide");
        if status["conditions"][0]["reason"] == "Ready" {
            assert_eq!(status["size"], svcplane_kube::load_balancer::MAX_STATUS_COUNT, "{status}");
            break;
        }
        assert!(
            started.elapsed() < WITHIN,
            "e-wide has no status: {status}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the schema cannot check (start after stop) is the pool's InvalidSpec condition.
    create_pool(&client, "d-backwards", json!({"blocks": [{"start": "198.18.100.50", "stop": "198.18.100.40"}]}))
        .unwrap();
    let started = Instant::now();
    loop {
        let status = pool_status(&client, "d-backwards");
        if status["conditions"][0]["reason"] == "InvalidSpec" {
            let message = status["conditions"][0]["message"].as_str().unwrap_or_default().to_owned();
            assert!(message.contains("spec.blocks[0]") && message.contains("after stop"), "{status}");
            break;
        }
        assert!(started.elapsed() < WITHIN, "d-backwards has no InvalidSpec condition: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A requested address outside every pool, and one another Service holds.
    client
        .create(&lb_service("outside", |s| s.spec.as_mut().unwrap().load_balancer_ip = Some("198.18.100.200".into())))
        .unwrap();
    let outside = wait_for(&client, "outside", "RequestedAddressOutsidePools", |s| !s.2.is_empty());
    assert_eq!(outside.2, "RequestedAddressOutsidePools", "{outside:?}");
    assert!(outside.3.contains("198.18.100.200") && outside.0.is_empty(), "{outside:?}");
    let taken = web.0[0].clone();
    client
        .create(&lb_service("thief", |s| {
            s.metadata.annotations =
                Some(BTreeMap::from([("metallb.universe.tf/loadBalancerIPs".to_owned(), taken.clone())]));
        }))
        .unwrap();
    let thief = wait_for(&client, "thief", "RequestedAddressInUse", |s| !s.2.is_empty());
    assert_eq!(thief.2, "RequestedAddressInUse", "{thief:?}");
    assert!(thief.3.contains("default/web") && thief.0.is_empty(), "{thief:?}");
    assert_eq!(lb_state(&client, "web").0, web.0, "the holder keeps its address");

    // Another class is left alone.
    assert_eq!(lb_state(&client, "other-class"), (vec![], String::new(), String::new(), String::new()));

    // Restart: nothing moves.
    plane.stop("svcplane-controller");
    plane.spawn("svcplane-controller", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lb_state(&client, "web").0, web.0);
    assert_eq!(lb_state(&client, "s1").0, s1.0);

    // s1 becomes a NodePort Service: its address is released and goes to the waiting s3.
    client
        .merge_patch::<Service>("default", "s1", json!({"spec": {"type": "NodePort"}}), false)
        .expect("changing the type");
    let released = wait_for(&client, "s1", "released", |s| s.0.is_empty() && s.1.is_empty());
    assert!(released.2.is_empty());
    let s3 = wait_for(&client, "s3", "the freed address", |s| s.1 == "True");
    assert_eq!(s3.0, s1.0, "s3 gets the address s1 gave up");
    // Deleting s2 frees its address for a new Service.
    client.delete::<Service>("default", "s2", None).unwrap();
    client.create(&lb_service("s4", small)).unwrap();
    let s4 = wait_for(&client, "s4", "s2's address", |s| s.1 == "True");
    assert_eq!(s4.0, s2.0);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}

/// The rights in deploy/ are enough: the controller runs on the `svcplane-controller`
/// account's token (deploy/controller.yaml + deploy/loadbalancer-pools.yaml) and writes
/// Service status, pool status and an Event; the agent runs on the `svcplane-announce`
/// account's token (deploy/announce.yaml) and takes its Service's Lease.
#[test]
fn the_controller_and_the_announcer_work_on_their_deployed_service_accounts_tokens_alone() {
    let Some(binaries) = binaries_for_test("kube_load_balancer") else { return };
    let (namespace, plane, client) = start_api(&binaries);
    install_pool_crd(&client);
    for file in ["controller.yaml", "announce.yaml"] {
        for document in kube_support::deploy::manifest_documents(file) {
            let kube = client.client();
            client.run(async move { kube_support::deploy::apply_strict(kube, document).await }).unwrap();
        }
    }
    let kubeconfig_of = |account: &str| {
        let (kube, name) = (client.client(), account.to_owned());
        let token = client
            .run(async move { kube_support::deploy::service_account_token(kube, "kube-system", &name).await })
            .unwrap();
        let path = plane.dir().join(format!("{account}.kubeconfig"));
        kube_support::deploy::write_token_kubeconfig(&plane, &token, &path);
        path.display().to_string()
    };
    create_pool(&client, "one", json!({"blocks": [{"cidr": "198.18.100.9/32"}]})).unwrap();
    client.create(&lb_service("first", |_| {})).unwrap();
    client.create(&lb_service("second", |_| {})).unwrap();

    let controller = kubeconfig_of("svcplane-controller");
    let args: Vec<String> = [
        "controller",
        "--kubeconfig",
        &controller,
        "--leader-elect=false",
        "--load-balancer-ipam",
        "--metrics-bind-address=",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (_, log) = plane.spawn("svcplane-controller", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    let first = wait_for(&client, "first", "its address", |s| s.1 == "True");
    assert_eq!(first.0, ["198.18.100.9"]);
    wait_for(&client, "second", "PoolExhausted", |s| s.2 == "PoolExhausted");
    let started = Instant::now();
    while pool_status(&client, "one")["used"] != 1 {
        assert!(started.elapsed() < WITHIN, "no pool status: {}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The Event is posted after the Service status, so it may still be on its way.
    let started = Instant::now();
    loop {
        let events: Vec<Event> = client.list(Some("default"), None).unwrap();
        if events.iter().any(|e| e.reason.as_deref() == Some("PoolExhausted")) {
            break;
        }
        assert!(started.elapsed() < WITHIN, "no Event: {}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(200));
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!mentions_a_refusal(&log_text), "{log_text}");

    // The agent: a veth pair gives it an interface with a MAC in the API's namespace.
    for args in [
        vec!["ip", "link", "add", "lbva", "type", "veth", "peer", "name", "lbvb"],
        vec!["ip", "link", "set", "lbva", "up"],
        vec!["ip", "link", "set", "lbvb", "up"],
    ] {
        let status = std::process::Command::new("ip")
            .args(["netns", "exec", namespace.name()])
            .args(&args)
            .status()
            .expect("running ip");
        assert!(status.success(), "{args:?}");
    }
    let announce = kubeconfig_of("svcplane-announce");
    let args: Vec<String> = ["announce", "--kubeconfig", &announce, "--node-name", "node-a", "--interface", "lbva"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let (_, log) = plane.spawn("svcplane-announce", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    let started = Instant::now();
    loop {
        let lease: Result<Lease, _> = client.get("kube-system", "svcplane-l2.default.first");
        if lease.ok().and_then(|l| l.spec).and_then(|s| s.holder_identity).as_deref() == Some("node-a") {
            break;
        }
        assert!(
            started.elapsed() < WITHIN,
            "the agent does not hold the Lease: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The Service without an address has no Lease: nothing to announce.
    assert!(client.get::<Lease>("kube-system", "svcplane-l2.default.second").is_err());
}

/// Whether a log shows the API server refusing a request for lack of rights. A bare "403"
/// is not enough: timestamps' microseconds contain it one time in a few hundred.
fn mentions_a_refusal(log: &str) -> bool {
    let log = log.to_lowercase();
    log.contains("forbidden") || log.contains("code: 403") || log.contains("status: 403")
}

#[test]
fn a_timestamp_containing_403_is_not_a_refusal_but_a_forbidden_status_is() {
    assert!(!mentions_a_refusal("2026-12-07T18:49:54.424036Z  INFO svcplane_kube::load_balancer: assigning"));
    assert!(mentions_a_refusal(r#"ApiError: services "x" is forbidden: User "y" cannot patch: Forbidden"#));
    assert!(mentions_a_refusal("ErrorResponse { status: \"Failure\", code: 403 }"));
}
