//! The manifests in `deploy/` against a real kube-apiserver (RBAC authorization, as every
//! control plane of these tests runs): every document applies server-side under strict
//! field validation and reads back whole; each ServiceAccount's token, from the
//! TokenRequest API, is allowed what its role grants and refused (403) the rest; and the
//! real `svcplane proxy` runs the DaemonSet's container command on nothing but that token
//! and the in-cluster config (the token, CA and namespace mounted where a Pod has them,
//! `KUBERNETES_SERVICE_*` in its environment), in a lab node's network namespace, and
//! programs what is written to the API.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_support::deploy::{
    PodProcess, apply_strict, deploy_files, describe, find_document, manifest_documents, missing_from,
    resolve_container, service_account_token, service_account_volume, spawn_as_pod, status_code,
    write_token_kubeconfig,
};
use kube_support::{
    API_ADDRESS, CLUSTER_CIDRS, KubeLab, cluster_ip_v4, echo_service, echo_slice, eventually, log_tail,
};
use serde_json::{Value, json};
use svcplane_control_plane::{
    API_PORT, BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, UpstreamBinaries, binaries_for_test,
    objects,
};
use svcplane_testbed::Lab;

/// How long the proxy may take from start to a Service in the kernel.
const SYNCED_WITHIN: Duration = Duration::from_secs(30);
/// What [`status_code`] says of a call that succeeded (whatever its 2xx code).
const OK: u16 = 200;
/// The ServiceAccounts of deploy/, all in kube-system.
const PROXY_ACCOUNT: &str = "svcplane-proxy";
const CONTROLLER_ACCOUNT: &str = "svcplane-controller";
const DNS_ACCOUNT: &str = "svcplane-dns";
/// The Lease the controller's leader election holds (deploy/controller.yaml names it).
const CONTROLLER_LEASE: &str = "svcplane-controller";

/// A control plane alone in a namespace of its own. Fields drop in order: client, control
/// plane, namespace.
struct BarePlane {
    client: NetnsClient,
    plane: ControlPlane,
    namespace: BareNamespace,
}

/// kube-dns's ClusterIP in deploy/dns.yaml is kubeadm's 10.96.0.10, so this API server
/// allocates from kubeadm's default range. Nothing is routed or sent there: the range is
/// only the API server's bookkeeping, in a namespace with nothing but loopback.
fn bare_plane(binaries: &UpstreamBinaries) -> BarePlane {
    let namespace = BareNamespace::create().expect("a namespace for the control plane");
    let address: IpAddr = API_ADDRESS.parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let mut config = ControlPlaneConfig::new(namespace.name(), address);
    config.service_cidrs = vec!["10.96.0.0/12".to_owned()];
    let plane =
        ControlPlane::start(binaries, config).unwrap_or_else(|error| panic!("starting the control plane: {error}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).expect("an admin client");
    BarePlane { client, plane, namespace }
}

/// Applies `documents` in order (strict field validation), failing on the first refusal or
/// on anything the API dropped; returns what was stored.
fn apply_all(client: &NetnsClient, documents: &[Value]) -> Vec<Value> {
    documents
        .iter()
        .map(|document| {
            let what = describe(document);
            let stored = client
                .run(apply_strict(client.client(), document.clone()))
                .unwrap_or_else(|error| panic!("applying {what}: {error}"));
            let missing = missing_from(document, &stored);
            assert!(missing.is_empty(), "{what}: the API server did not keep {missing:#?}");
            stored
        })
        .collect()
}

/// A client authenticated as ServiceAccount `kube-system/<account>` with a token from the
/// TokenRequest API, connecting from `netns`; returns the token too.
fn account_client(admin: &NetnsClient, plane: &ControlPlane, netns: &str, account: &str) -> (NetnsClient, String) {
    let (client, name) = (admin.client(), account.to_owned());
    let token = admin
        .run(async move { service_account_token(client, "kube-system", &name).await })
        .unwrap_or_else(|error| panic!("a token for {account}: {error}"));
    let kubeconfig = plane.dir().join(format!("{account}.kubeconfig"));
    write_token_kubeconfig(plane, &token, &kubeconfig);
    let client = NetnsClient::connect(netns, &kubeconfig).expect("a client with the account's token");
    (client, token)
}

/// One API call as an account, with the status the test expects.
struct Call {
    what: &'static str,
    expected: u16,
    status: u16,
}

/// Runs `call` with `client` and records its HTTP status.
fn call<T: Send + 'static>(
    client: &NetnsClient,
    what: &'static str,
    expected: u16,
    call: impl Future<Output = Result<T, kube::Error>> + Send + 'static,
) -> Call {
    let result = client.run(call);
    Call { what, expected, status: status_code(what, &result) }
}

fn assert_calls(account: &str, calls: &[Call]) {
    let wrong: Vec<String> = calls
        .iter()
        .filter(|call| call.status != call.expected)
        .map(|call| format!("{}: expected {}, got {}", call.what, call.expected, call.status))
        .collect();
    assert!(wrong.is_empty(), "{account}:\n{}", wrong.join("\n"));
    for call in calls {
        eprintln!("{account}: {} -> {}", call.what, call.status);
    }
}

fn one() -> ListParams {
    ListParams::default().limit(1)
}

fn named<K: kube::Resource<DynamicType = ()> + Default>(namespace: Option<&str>, name: &str) -> K {
    let mut object = K::default();
    *object.meta_mut() =
        ObjectMeta { name: Some(name.to_owned()), namespace: namespace.map(str::to_owned), ..ObjectMeta::default() };
    object
}

#[test]
fn every_manifest_in_deploy_applies_under_strict_field_validation_and_reads_back_whole() {
    let Some(binaries) = binaries_for_test("kube_deploy") else { return };
    let bare = bare_plane(&binaries);
    let files: Vec<String> =
        deploy_files().iter().map(|path| path.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["controller.yaml", "dns.yaml", "proxy.yaml"] {
        assert!(files.iter().any(|file| file == expected), "deploy/{expected} is missing: {files:?}");
    }
    let image = format!("svcplane:{}", env!("CARGO_PKG_VERSION"));
    for file in &files {
        let documents = manifest_documents(file);
        assert!(!documents.is_empty(), "deploy/{file} has no document");
        let stored = apply_all(&bare.client, &documents);
        eprintln!("deploy/{file}: {} objects applied", stored.len());
        // Every workload runs this crate's version of the image.
        for object in &stored {
            for container in object["spec"]["template"]["spec"]["containers"].as_array().into_iter().flatten() {
                assert_eq!(container["image"], image.as_str(), "{}: {}", describe(object), container["name"]);
            }
        }
    }

    // Strict validation is in force: a field the schema lacks is refused, not dropped.
    let mut documents = manifest_documents("proxy.yaml");
    let config_map = find_document(&mut documents, "ConfigMap", PROXY_ACCOUNT);
    config_map["dataa"] = json!({ "typo": "x" });
    let refused = bare.client.run(apply_strict(bare.client.client(), config_map.clone()));
    match refused {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains("dataa"), "the refusal does not name the field: {status:?}");
        }
        other => panic!("an unknown field was not refused: {other:?}"),
    }
}

#[test]
fn the_controller_and_dns_service_accounts_may_do_what_their_roles_grant_and_nothing_else() {
    let Some(binaries) = binaries_for_test("kube_deploy") else { return };
    let bare = bare_plane(&binaries);
    for file in ["controller.yaml", "dns.yaml"] {
        apply_all(&bare.client, &manifest_documents(file));
    }
    let admin = &bare.client;
    admin.create(&echo_service("web", true, &[])).expect("a Service");
    // A Lease of someone else, which the controller's role does not name.
    admin.create(&named::<Lease>(Some("kube-system"), "someone-else")).expect("another Lease");

    let (controller, _) = account_client(admin, &bare.plane, bare.namespace.name(), CONTROLLER_ACCOUNT);
    let client = controller.client();
    let slice = echo_slice("web-svcplane", "web", &[("198.18.128.10".parse().unwrap(), "node1")], &[]);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-system");
    let services = Api::<Service>::namespaced(client.clone(), "default");
    let calls = vec![
        call(&controller, "list pods in every namespace", OK, {
            let api = Api::<Pod>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&controller, "list Nodes", OK, {
            let api = Api::<Node>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&controller, "create an EndpointSlice", OK, {
            let api = slices.clone();
            let slice = slice.clone();
            async move { api.create(&PostParams::default(), &slice).await }
        }),
        call(&controller, "replace that EndpointSlice", OK, {
            let api = slices.clone();
            // Unconditional (no resourceVersion): the role has no `get` to read one with.
            async move { api.replace("web-svcplane", &PostParams::default(), &slice).await }
        }),
        call(&controller, "delete that EndpointSlice", OK, {
            let api = slices.clone();
            async move { api.delete("web-svcplane", &DeleteParams::default()).await }
        }),
        call(&controller, "create its Lease", OK, {
            let api = leases.clone();
            async move { api.create(&PostParams::default(), &named::<Lease>(None, CONTROLLER_LEASE)).await }
        }),
        call(&controller, "read and renew its Lease", OK, {
            let api = leases.clone();
            async move {
                let mut lease = api.get(CONTROLLER_LEASE).await?;
                lease.spec =
                    Some(LeaseSpec { holder_identity: Some("svcplane-controller-0".into()), ..LeaseSpec::default() });
                api.replace(CONTROLLER_LEASE, &PostParams::default(), &lease).await
            }
        }),
        call(&controller, "patch its Lease (it only updates)", 403, {
            let api = leases.clone();
            let patch = json!({ "spec": { "holderIdentity": "svcplane-controller-1" } });
            async move { api.patch(CONTROLLER_LEASE, &PatchParams::default(), &Patch::Merge(&patch)).await }
        }),
        call(&controller, "read a Lease its role does not name", 403, {
            let api = leases.clone();
            async move { api.get("someone-else").await }
        }),
        call(&controller, "take over a Lease its role does not name", 403, {
            let api = leases.clone();
            let patch = json!({ "spec": { "holderIdentity": "svcplane-controller-0" } });
            async move { api.patch("someone-else", &PatchParams::default(), &Patch::Merge(&patch)).await }
        }),
        call(&controller, "change a Service", 403, {
            let api = services.clone();
            let patch = json!({ "metadata": { "labels": { "touched": "yes" } } });
            async move { api.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await }
        }),
        call(&controller, "list Secrets", 403, {
            let api = Api::<Secret>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&controller, "list Namespaces", 403, {
            let api = Api::<Namespace>::all(client.clone());
            async move { api.list(&one()).await }
        }),
    ];
    assert_calls(CONTROLLER_ACCOUNT, &calls);

    let (dns, _) = account_client(admin, &bare.plane, bare.namespace.name(), DNS_ACCOUNT);
    let client = dns.client();
    let calls = vec![
        call(&dns, "list Services in every namespace", OK, {
            let api = Api::<Service>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&dns, "list EndpointSlices in every namespace", OK, {
            let api = Api::<EndpointSlice>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&dns, "read one Service", 403, {
            let api = Api::<Service>::namespaced(client.clone(), "default");
            async move { api.get("web").await }
        }),
        call(&dns, "list Pods", 403, {
            let api = Api::<Pod>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&dns, "create an EndpointSlice", 403, {
            let api = Api::<EndpointSlice>::namespaced(client.clone(), "default");
            let slice = echo_slice("web-dns", "web", &[("198.18.128.10".parse().unwrap(), "node1")], &[]);
            async move { api.create(&PostParams::default(), &slice).await }
        }),
        call(&dns, "list Secrets", 403, {
            let api = Api::<Secret>::all(client.clone());
            async move { api.list(&one()).await }
        }),
    ];
    assert_calls(DNS_ACCOUNT, &calls);
}

/// Whether a `--help` text lists `flag` (`--config`).
fn has_flag(help: &str, flag: &str) -> bool {
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|word| word == flag)
}

/// `svcplane <subcommand> --help`.
fn help_of(subcommand: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args([subcommand, "--help"])
        .output()
        .expect("svcplane --help");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A container's command (`svcplane <subcommand> --flag=value...`) run with this build's
/// binary. Fails, naming them, when this build lacks flags the manifest uses.
fn runnable(command: &[String], subcommand: &str) -> Vec<String> {
    assert_eq!(command[..2], ["svcplane", subcommand], "{command:?}");
    let help = help_of(subcommand);
    let unknown: Vec<&str> = command[2..]
        .iter()
        .map(|word| {
            let flag = word.split('=').next().unwrap_or(word);
            assert!(flag.starts_with("--") && word.contains('='), "{word}: spell flags as --flag=value in deploy/");
            flag
        })
        .filter(|flag| !has_flag(&help, flag))
        .collect();
    assert!(unknown.is_empty(), "svcplane {subcommand} has no {unknown:?}, which deploy/ runs it with");
    std::iter::once(env!("CARGO_BIN_EXE_svcplane").to_owned()).chain(command[1..].iter().cloned()).collect()
}

/// The flags (`--name`, before any `=`) of a command line.
fn flags_of(command: &[String]) -> Vec<String> {
    command
        .iter()
        .filter(|word| word.starts_with("--"))
        .map(|word| word.split('=').next().unwrap_or(word).to_owned())
        .collect()
}

#[test]
fn the_proxy_syncs_a_node_on_its_service_accounts_token_and_the_in_cluster_config_alone() {
    let Some(binaries) = binaries_for_test("kube_deploy") else { return };
    let kube = KubeLab::start(&binaries, Lab::builder().nodes(1).build().expect("a lab"));
    let node = kube.lab.node(1);

    // deploy/proxy.yaml as an operator would fill it in for this cluster: the pod network,
    // and the API server's own address for a cluster whose ClusterIPs are not programmed.
    let mut documents = manifest_documents("proxy.yaml");
    let config_map = find_document(&mut documents, "ConfigMap", PROXY_ACCOUNT);
    let config = config_map["data"]["config.conf"].as_str().expect("config.conf").to_owned();
    let pod_network = config
        .lines()
        .find_map(|line| line.trim().strip_prefix("clusterCIDR:"))
        .expect("config.conf sets clusterCIDR")
        .trim()
        .to_owned();
    config_map["data"]["config.conf"] = config.replace(&pod_network, CLUSTER_CIDRS[0]).into();
    config_map["data"]["apiServerHost"] = API_ADDRESS.into();
    config_map["data"]["apiServerPort"] = API_PORT.to_string().into();
    let stored = apply_all(&kube.client, &documents);
    let stored_config = stored.iter().find(|object| object["kind"] == "ConfigMap").expect("the ConfigMap");
    let daemon_set = stored.iter().find(|object| object["kind"] == "DaemonSet").expect("the DaemonSet");
    let pod_spec = &daemon_set["spec"]["template"]["spec"];
    assert_eq!(pod_spec["serviceAccountName"], PROXY_ACCOUNT);
    assert_eq!(pod_spec["hostNetwork"], true, "the proxy programs the node's own network namespace");

    // The container's command and environment as the kubelet resolves them on node1, the
    // config volume's files in a directory of the test's.
    let container = &pod_spec["containers"][0];
    let resolved = resolve_container(container, node.name(), &[(PROXY_ACCOUNT, &stored_config["data"])]);
    let env_of = |name: &str| resolved.env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(env_of("KUBERNETES_SERVICE_HOST").as_deref(), Some(API_ADDRESS));
    assert_eq!(env_of("KUBERNETES_SERVICE_PORT"), Some(API_PORT.to_string()));
    assert_eq!(resolved.command[..2], ["svcplane", "proxy"], "{:?}", resolved.command);
    let flags = flags_of(&resolved.command);
    assert!(
        !flags.iter().any(|flag| flag == "--kubeconfig" || flag == "--manifests"),
        "the DaemonSet must run on the in-cluster config: {flags:?}"
    );
    let volumes = tempfile::tempdir().expect("a temporary directory");
    let config_dir = volumes.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    for (key, value) in stored_config["data"].as_object().expect("ConfigMap data") {
        std::fs::write(config_dir.join(key), value.as_str().expect("a string value")).unwrap();
    }
    let config_mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|mount| mount["name"] == "config")
        .and_then(|mount| mount["mountPath"].as_str())
        .expect("the config volume's mount")
        .to_owned();
    let in_volume: Vec<String> =
        resolved.command.iter().map(|word| word.replace(&config_mount, &config_dir.display().to_string())).collect();
    let command = runnable(&in_volume, "proxy");
    eprintln!("running {command:?} with {:?}", resolved.env);

    let (proxy, token) = account_client(&kube.client, &kube.plane, kube.lab.lan_namespace(), PROXY_ACCOUNT);
    let account = service_account_volume(&kube.plane, &token, "kube-system");
    let scratch = volumes.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let process = PodProcess { account: account.path(), scratch: &scratch, env: resolved.env.clone(), command };
    let (_, log) = spawn_as_pod(&kube.plane, "svcplane-proxy", node.namespace_name(), &process);

    // A Service and its slice written through the API reach the node's ruleset.
    let service: Service = kube.client.create(&echo_service("echo", false, &[])).expect("a Service");
    let endpoint: IpAddr = "198.18.128.10".parse().unwrap();
    kube.client.create(&echo_slice("echo-1", "echo", &[(endpoint, node.name())], &[])).expect("an EndpointSlice");
    let cluster_ip = cluster_ip_v4(&service);
    let ruleset = || kube.lab.exec_ok(node.namespace_name(), &["nft", "list", "ruleset"]).unwrap_or_default();
    let synced = eventually(SYNCED_WITHIN, || {
        let rules = ruleset();
        (rules.contains(&cluster_ip.to_string()) && rules.contains(&endpoint.to_string())).then_some(())
    });
    let check_running = || kube.plane.check_running("svcplane-proxy");
    if synced.is_none() {
        panic!(
            "{cluster_ip} -> {endpoint} is not in node1's ruleset within {SYNCED_WITHIN:?} ({:?})\nruleset:\n{}\nproxy log:\n{}",
            check_running().err(),
            ruleset(),
            log_tail(&log)
        );
    }
    check_running().expect("the proxy still runs");

    // The DaemonSet's probes, as the kubelet sends them: to the Pod's address, which the
    // host network makes the node's.
    for probe in ["livenessProbe", "readinessProbe"] {
        let get = &container[probe]["httpGet"];
        let url = format!("http://{}:{}{}", node.ip_v4(), get["port"], get["path"].as_str().expect("a probe path"));
        let answered = eventually(SYNCED_WITHIN, || {
            let code = kube
                .lab
                .exec_ok(
                    node.namespace_name(),
                    &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", &url],
                )
                .unwrap_or_default();
            (code.trim() == "200").then_some(())
        });
        assert!(answered.is_some(), "{probe}: {url} does not answer 200\nproxy log:\n{}", log_tail(&log));
    }

    // The same token is refused what the proxy's role does not grant.
    let client = proxy.client();
    let calls = vec![
        call(&proxy, "list Services in every namespace", OK, {
            let api = Api::<Service>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&proxy, "read its Node", OK, {
            let api = Api::<Node>::all(client.clone());
            let name = node.name().to_owned();
            async move { api.get(&name).await }
        }),
        call(&proxy, "create an EndpointSlice", 403, {
            let api = Api::<EndpointSlice>::namespaced(client.clone(), "default");
            let slice = echo_slice("echo-2", "echo", &[(endpoint, "node1")], &[]);
            async move { api.create(&PostParams::default(), &slice).await }
        }),
        call(&proxy, "change a Service", 403, {
            let api = Api::<Service>::namespaced(client.clone(), "default");
            let patch = json!({ "metadata": { "labels": { "touched": "yes" } } });
            async move { api.patch("echo", &PatchParams::default(), &Patch::Merge(&patch)).await }
        }),
        call(&proxy, "change its Node", 403, {
            let api = Api::<Node>::all(client.clone());
            let name = node.name().to_owned();
            let patch = json!({ "metadata": { "labels": { "touched": "yes" } } });
            async move { api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await }
        }),
        call(&proxy, "list Secrets", 403, {
            let api = Api::<Secret>::all(client.clone());
            async move { api.list(&one()).await }
        }),
        call(&proxy, "list Pods", 403, {
            let api = Api::<Pod>::all(client.clone());
            async move { api.list(&one()).await }
        }),
    ];
    assert_calls(PROXY_ACCOUNT, &calls);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log_text.contains("in-cluster config"), "the proxy did not say it used the in-cluster config:\n{log_text}");
}

/// `dig +short name A` against `127.0.0.1:port` inside `netns`.
fn dig(netns: &str, port: u16, name: &str) -> Vec<String> {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "dig", "+short", "+time=1", "+tries=1", "-p", &port.to_string(), "@127.0.0.1"])
        .args([name, "A"])
        .output()
        .expect("running dig");
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn the_controller_and_dns_run_their_containers_commands_on_their_service_accounts_tokens_alone() {
    let Some(binaries) = binaries_for_test("kube_deploy") else { return };
    let bare = bare_plane(&binaries);
    let admin = &bare.client;
    let mut workloads = Vec::new();
    for (file, account) in [("controller.yaml", CONTROLLER_ACCOUNT), ("dns.yaml", DNS_ACCOUNT)] {
        let mut documents = manifest_documents(file);
        apply_all(admin, &documents);
        workloads.push((
            account,
            find_document(&mut documents, "Deployment", account)["spec"]["template"]["spec"]["containers"][0].clone(),
        ));
    }
    // A Node, a running Pod on it and a Service selecting it: the controller's input.
    let node_ip: IpAddr = "198.18.0.11".parse().unwrap();
    let pod_ip: IpAddr = "198.18.128.10".parse().unwrap();
    admin.create_node(&objects::node("node1", &[node_ip], Some("zone-1"))).expect("a Node");
    let pod = objects::pod("default", "web-1", "node1", &[("app", "web")], &[("http", 8080, "TCP")]);
    objects::create_running_pod(admin, &pod, &[pod_ip], true).expect("a running Pod");
    let service: Service = admin.create(&echo_service("web", true, &[])).expect("a Service");
    let cluster_ip = cluster_ip_v4(&service);

    let volumes = tempfile::tempdir().expect("a temporary directory");
    let mut dns_port = 0;
    let mut logs = Vec::new();
    for (account, container) in &workloads {
        let subcommand = if *account == DNS_ACCOUNT { "dns" } else { "controller" };
        let resolved = resolve_container(container, "node1", &[]);
        let command = runnable(&resolved.command, subcommand);
        assert!(!flags_of(&command).iter().any(|flag| flag == "--kubeconfig"), "{account}: {command:?}");
        if *account == DNS_ACCOUNT {
            let port = container["ports"].as_array().into_iter().flatten().find(|port| port["name"] == "dns");
            dns_port = port.and_then(|port| port["containerPort"].as_u64()).expect("a dns port").try_into().unwrap();
        }
        let (_, token) = account_client(admin, &bare.plane, bare.namespace.name(), account);
        let volume = service_account_volume(&bare.plane, &token, "kube-system");
        let scratch = volumes.path().join(account);
        std::fs::create_dir(&scratch).unwrap();
        let mut env = resolved.env.clone();
        env.push(("KUBERNETES_SERVICE_HOST".into(), API_ADDRESS.into()));
        env.push(("KUBERNETES_SERVICE_PORT".into(), API_PORT.to_string()));
        eprintln!("running {command:?} as {account}");
        let process = PodProcess { account: volume.path(), scratch: &scratch, env, command };
        let (_, log) = spawn_as_pod(&bare.plane, account, bare.namespace.name(), &process);
        logs.push((*account, log, volume));
    }
    let tails = || {
        logs.iter().map(|(account, log, _)| format!("{account} log:\n{}", log_tail(log))).collect::<Vec<_>>().join("\n")
    };

    // The controller writes the Service's slice with the Pod in it.
    let selector =
        "endpointslice.kubernetes.io/managed-by=endpointslice-controller.svcplane.io,kubernetes.io/service-name=web";
    let written = eventually(SYNCED_WITHIN, || {
        let slices: Vec<EndpointSlice> = admin.list(Some("default"), Some(selector)).ok()?;
        slices
            .iter()
            .flat_map(|slice| &slice.endpoints)
            .any(|endpoint| endpoint.addresses.contains(&pod_ip.to_string()))
            .then_some(())
    });
    assert!(written.is_some(), "no slice of web holds {pod_ip} within {SYNCED_WITHIN:?}\n{}", tails());

    // Cluster DNS answers the Service's name from what it watches.
    let name = "web.default.svc.cluster.local";
    let answered = eventually(SYNCED_WITHIN, || {
        (dig(bare.namespace.name(), dns_port, name) == [cluster_ip.to_string()]).then_some(())
    });
    assert!(
        answered.is_some(),
        "{name} is not answered with {cluster_ip} (last: {:?})\n{}",
        dig(bare.namespace.name(), dns_port, name),
        tails()
    );
    for (account, log, _) in &logs {
        bare.plane.check_running(account).unwrap_or_else(|error| panic!("{account}: {error}"));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(text.contains("in-cluster config"), "{account} did not say it used the in-cluster config:\n{text}");
    }
}
