//! The manifests in `deploy/` against a real API server: read as the API takes them (one
//! JSON value per YAML document), applied server-side with strict field validation, the
//! ServiceAccounts' tokens from the TokenRequest API, and a process run the way a Pod runs
//! it: the token, CA and namespace at `/var/run/secrets/kubernetes.io/serviceaccount` (in a
//! private mount namespace, the machine's own mounts untouched) and `KUBERNETES_SERVICE_*`
//! in its environment.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use serde_json::Value;
use svcplane_control_plane::{API_PORT, ControlPlane};

/// The field manager of everything the tests apply.
pub const FIELD_MANAGER: &str = "svcplane-deploy-test";
/// Where a Pod finds its ServiceAccount's credentials (what kube-rs's in-cluster config reads).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every `*.yaml` file in `deploy/`, sorted by name.
pub fn deploy_files() -> Vec<PathBuf> {
    let dir = deploy_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// The documents of one file in `deploy/` (`proxy.yaml`) or a path, as JSON.
pub fn manifest_documents(file: impl AsRef<Path>) -> Vec<Value> {
    let path = deploy_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|error| panic!("parsing {}: {error}", path.display()));
    documents.into_iter().filter(|document| !document.is_null()).collect()
}

/// `Kind namespace/name` of a document, for messages.
pub fn describe(document: &Value) -> String {
    let kind = document["kind"].as_str().unwrap_or("?");
    let name = document["metadata"]["name"].as_str().unwrap_or("?");
    match document["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The one document of `kind` named `name`.
pub fn find_document<'a>(documents: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    documents
        .iter_mut()
        .find(|document| document["kind"] == kind && document["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifest"))
}

/// Applies `document` server-side (`fieldValidation=Strict`: a field the API does not know
/// fails the request) and returns the object as stored.
pub async fn apply_strict(client: Client, document: Value) -> Result<Value, kube::Error> {
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = document["kind"].as_str().unwrap_or_default();
    let name = document["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let (resource, capabilities) =
        kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, kind)).await?;
    let api: Api<DynamicObject> = match (capabilities.scope, document["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(namespace)) => Api::namespaced_with(client, namespace, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client, &resource),
        (Scope::Cluster, _) => Api::all_with(client, &resource),
    };
    let params = PatchParams::apply(FIELD_MANAGER).validation_strict();
    let stored = api.patch(&name, &params, &Patch::Apply(&document)).await?;
    Ok(serde_json::to_value(stored).expect("an object serializes"))
}

/// The paths of `applied` whose value `stored` does not have (lists compared by position):
/// what the API dropped or changed.
pub fn missing_from(applied: &Value, stored: &Value) -> Vec<String> {
    let mut missing = Vec::new();
    collect_missing(applied, stored, String::new(), &mut missing);
    missing
}

fn collect_missing(applied: &Value, stored: &Value, path: String, missing: &mut Vec<String>) {
    match (applied, stored) {
        (Value::Object(applied), Value::Object(stored)) => {
            for (key, value) in applied {
                match stored.get(key) {
                    Some(stored) => collect_missing(value, stored, format!("{path}.{key}"), missing),
                    None => missing.push(format!("{path}.{key}")),
                }
            }
        }
        (Value::Array(applied), Value::Array(stored)) => {
            for (index, value) in applied.iter().enumerate() {
                match stored.get(index) {
                    Some(stored) => collect_missing(value, stored, format!("{path}[{index}]"), missing),
                    None => missing.push(format!("{path}[{index}]")),
                }
            }
        }
        (applied, stored) if applied == stored => {}
        (applied, stored) => missing.push(format!("{path}: {applied} became {stored}")),
    }
}

/// A token of ServiceAccount `namespace/name` from the TokenRequest API (one hour).
pub async fn service_account_token(client: Client, namespace: &str, name: &str) -> Result<String, kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() },
        ..TokenRequest::default()
    };
    let issued = api.create_token_request(name, &PostParams::default(), &request).await?;
    Ok(issued.status.expect("a TokenRequest answers with a status").token)
}

/// The API server's URL (its address on the namespace it runs in).
pub fn api_server_url(plane: &ControlPlane) -> String {
    match plane.address() {
        IpAddr::V4(ip) => format!("https://{ip}:{API_PORT}"),
        IpAddr::V6(ip) => format!("https://[{ip}]:{API_PORT}"),
    }
}

/// Writes a kubeconfig for the control plane that authenticates with `token` to `path`.
pub fn write_token_kubeconfig(plane: &ControlPlane, token: &str, path: &Path) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: deploy-test\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: account\n  user:\n    token: {token}\ncontexts:\n- name: \
         deploy-test\n  context:\n    cluster: deploy-test\n    user: account\ncurrent-context: deploy-test\n",
        server = api_server_url(plane),
        ca = plane.dir().join("ca.crt").display(),
    );
    std::fs::write(path, text).unwrap_or_else(|error| panic!("writing {}: {error}", path.display()));
}

/// A directory laid out as a Pod's service-account volume: `token`, `ca.crt`, `namespace`.
pub fn service_account_volume(plane: &ControlPlane, token: &str, namespace: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("svcplane-sa-").tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("token"), token).expect("writing the token");
    std::fs::copy(plane.dir().join("ca.crt"), dir.path().join("ca.crt")).expect("copying the CA");
    std::fs::write(dir.path().join("namespace"), namespace).expect("writing the namespace");
    dir
}

/// The HTTP status of an API call's result: 200 for success, the API's code for a refusal.
/// Any other failure (no connection) fails the test.
pub fn status_code<T>(what: &str, result: &Result<T, kube::Error>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(error) => panic!("{what}: no answer from the API server: {error}"),
    }
}

/// What [`spawn_as_pod`] runs: `command` (program first) with `env` added to its
/// environment and `account` (see [`service_account_volume`]) at [`SERVICE_ACCOUNT_DIR`];
/// `scratch` is an empty directory for the mounts' own use.
#[derive(Debug, Clone)]
pub struct PodProcess<'a> {
    pub account: &'a Path,
    pub scratch: &'a Path,
    pub env: Vec<(String, String)>,
    pub command: Vec<String>,
}

/// Runs `process` in network namespace `netns` as a Pod's container would see its
/// credentials: in a private mount namespace of its own, `/run` is overlaid (the overlay's
/// upper layer on a tmpfs mounted over `scratch`) so that the account's directory can be
/// bind-mounted at [`SERVICE_ACCOUNT_DIR`]. Nothing is mounted outside that mount
/// namespace; its mounts go with its last process. Killed when the control plane drops.
pub fn spawn_as_pod(plane: &ControlPlane, what: &str, netns: &str, process: &PodProcess<'_>) -> (u32, PathBuf) {
    const SCRIPT: &str = r#"set -eu
account=$1; scratch=$2; shift 2
mount -t tmpfs svcplane-pod-scratch "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay svcplane-pod-run -o "lowerdir=/run,upperdir=$scratch/upper,workdir=$scratch/work" /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind -o ro "$account" /run/secrets/kubernetes.io/serviceaccount
exec env "$@"
"#;
    assert!(Path::new("/var/run").canonicalize().is_ok_and(|run| run == Path::new("/run")), "/var/run is not /run");
    let mut args = vec![
        "--mount".to_owned(),
        "--propagation".to_owned(),
        "private".to_owned(),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        SCRIPT.to_owned(),
        "svcplane-pod".to_owned(),
        process.account.display().to_string(),
        process.scratch.display().to_string(),
    ];
    args.extend(process.env.iter().map(|(name, value)| format!("{name}={value}")));
    args.extend(process.command.iter().cloned());
    plane.spawn(what, netns, &program_path("unshare"), &args).unwrap_or_else(|error| panic!("starting {what}: {error}"))
}

/// `name` looked up in `PATH`.
fn program_path(name: &str) -> String {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{name} is not in PATH"))
        .display()
        .to_string()
}

/// A container of a Pod template, resolved as the kubelet would for one node: its command
/// (command then args, `$(VAR)` expanded) and the environment its `env` spells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedContainer {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Resolves `container` (a Pod template's container as JSON) on node `node_name`:
/// `fieldRef: spec.nodeName`, `value`, and `configMapKeyRef` looked up in `config_maps`
/// (`(name, data)`; a missing optional key leaves the variable out, as the kubelet does).
pub fn resolve_container(container: &Value, node_name: &str, config_maps: &[(&str, &Value)]) -> ResolvedContainer {
    let mut env: Vec<(String, String)> = Vec::new();
    for variable in container["env"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().expect("an env name").to_owned();
        let value = if let Some(value) = variable["value"].as_str() {
            Some(value.to_owned())
        } else if let Some(field) = variable["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            assert_eq!(field, "spec.nodeName", "env {name}: only spec.nodeName is resolved here");
            Some(node_name.to_owned())
        } else if variable["valueFrom"]["configMapKeyRef"].is_object() {
            let reference = &variable["valueFrom"]["configMapKeyRef"];
            let map = reference["name"].as_str().expect("a ConfigMap name");
            let key = reference["key"].as_str().expect("a ConfigMap key");
            let data = config_maps
                .iter()
                .find(|(candidate, _)| *candidate == map)
                .map(|(_, data)| *data)
                .unwrap_or_else(|| panic!("env {name}: ConfigMap {map} is not given"));
            let value = data[key].as_str().map(str::to_owned);
            assert!(value.is_some() || reference["optional"] == true, "env {name}: {map} has no key {key}");
            value
        } else {
            panic!("env {name}: {variable} is not resolved here")
        };
        if let Some(value) = value {
            env.push((name, value));
        }
    }
    let expand =
        |text: &str| env.iter().fold(text.to_owned(), |text, (name, value)| text.replace(&format!("$({name})"), value));
    let command = ["command", "args"]
        .iter()
        .flat_map(|field| container[*field].as_array().cloned().unwrap_or_default())
        .map(|word| expand(word.as_str().expect("command words are strings")))
        .collect();
    ResolvedContainer { command, env }
}
