//! A Kubernetes client whose connections are made inside a network namespace.

use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ControlPlaneError;
use crate::namespace;

/// A namespaced API kind the test client reads and writes (every method's bounds in one place).
pub trait NamespacedKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

impl<K> NamespacedKind for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// A `kube::Client` on a runtime whose threads all live in one network namespace, so its
/// sockets do too, with blocking helpers for tests and benchmarks.
pub struct NetnsClient {
    runtime: tokio::runtime::Runtime,
    client: Client,
    kubeconfig: PathBuf,
}

impl Debug for NetnsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsClient").field("kubeconfig", &self.kubeconfig).finish_non_exhaustive()
    }
}

type ApiResult<T> = Result<T, ControlPlaneError>;

fn api_error(operation: String) -> impl FnOnce(kube::Error) -> ControlPlaneError {
    move |source| ControlPlaneError::Api { operation, source }
}

impl NetnsClient {
    /// A client for the cluster of `kubeconfig`, connecting from inside `namespace`.
    pub fn connect(namespace: &str, kubeconfig: &Path) -> Result<Self, ControlPlaneError> {
        let file = Arc::new(namespace::open(namespace)?);
        let name = namespace.to_owned();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name(format!("netns-client-{name}"))
            .on_thread_start(move || {
                if let Err(error) = namespace::enter(&file) {
                    panic!("entering network namespace {name}: {error}");
                }
            })
            .build()
            .map_err(|e| ControlPlaneError::Namespace { namespace: namespace.to_owned(), detail: e.to_string() })?;
        let failed =
            |detail: String| ControlPlaneError::Client { kubeconfig: kubeconfig.to_owned(), detail: detail.clone() };
        let text = Kubeconfig::read_from(kubeconfig).map_err(|e| failed(e.to_string()))?;
        let client = runtime
            .block_on(runtime.spawn(async move {
                let config = Config::from_custom_kubeconfig(text, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                Client::try_from(config).map_err(|e| e.to_string())
            }))
            .map_err(|e| failed(e.to_string()))?
            .map_err(failed)?;
        Ok(Self { runtime, client, kubeconfig: kubeconfig.to_owned() })
    }

    /// A clone of the client, for async code given to [`Self::run`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs `future` on the namespace's runtime and waits for it.
    pub fn run<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        match self.runtime.block_on(self.runtime.spawn(future)) {
            Ok(value) => value,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Creates a namespaced object in the namespace its metadata names (`default` when unset).
    pub fn create<K>(&self, object: &K) -> ApiResult<K>
    where
        K: NamespacedKind + Serialize,
    {
        let api = self.namespaced::<K>(object.meta().namespace.as_deref());
        let object = object.clone();
        let operation = format!("creating {} {}", K::kind(&()), object.meta().name.clone().unwrap_or_default());
        self.run(async move { api.create(&PostParams::default(), &object).await }).map_err(api_error(operation))
    }

    /// Reads a namespaced object.
    pub fn get<K>(&self, namespace: &str, name: &str) -> ApiResult<K>
    where
        K: NamespacedKind,
    {
        let api = self.namespaced::<K>(Some(namespace));
        let operation = format!("reading {} {namespace}/{name}", K::kind(&()));
        let name = name.to_owned();
        self.run(async move { api.get(&name).await }).map_err(api_error(operation))
    }

    /// Lists a kind in one namespace (`Some`) or all of them (`None`), with an optional label
    /// selector.
    pub fn list<K>(&self, namespace: Option<&str>, labels: Option<&str>) -> ApiResult<Vec<K>>
    where
        K: NamespacedKind,
    {
        let api = match namespace {
            Some(namespace) => self.namespaced::<K>(Some(namespace)),
            None => Api::<K>::all(self.client.clone()),
        };
        let mut params = ListParams::default();
        if let Some(labels) = labels {
            params = params.labels(labels);
        }
        let operation = format!("listing {}", K::plural(&()));
        self.run(async move { api.list(&params).await.map(|list| list.items) }).map_err(api_error(operation))
    }

    /// A JSON merge patch of a namespaced object (`status: true` for its status subresource).
    pub fn merge_patch<K>(&self, namespace: &str, name: &str, patch: serde_json::Value, status: bool) -> ApiResult<K>
    where
        K: NamespacedKind,
    {
        let api = self.namespaced::<K>(Some(namespace));
        let operation = format!("patching {} {namespace}/{name}", K::kind(&()));
        let name = name.to_owned();
        self.run(async move {
            let params = PatchParams::default();
            if status {
                api.patch_status(&name, &params, &Patch::Merge(&patch)).await
            } else {
                api.patch(&name, &params, &Patch::Merge(&patch)).await
            }
        })
        .map_err(api_error(operation))
    }

    /// Deletes a namespaced object with the given grace period (`None`: the kind's default).
    /// A missing object is no error.
    pub fn delete<K>(&self, namespace: &str, name: &str, grace_period_seconds: Option<u32>) -> ApiResult<()>
    where
        K: NamespacedKind,
    {
        let api = self.namespaced::<K>(Some(namespace));
        let operation = format!("deleting {} {namespace}/{name}", K::kind(&()));
        let name = name.to_owned();
        let params = DeleteParams { grace_period_seconds, ..DeleteParams::default() };
        self.run(async move {
            match api.delete(&name, &params).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
                Err(error) => Err(error),
            }
        })
        .map_err(api_error(operation))
    }

    /// Creates a Node and sets its status (addresses), as a kubelet would.
    pub fn create_node(&self, node: &Node) -> ApiResult<Node> {
        let api = Api::<Node>::all(self.client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        let status = serde_json::json!({ "status": node.status });
        let node = node.clone();
        let operation = format!("creating Node {name}");
        self.run(async move {
            api.create(&PostParams::default(), &node).await?;
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await
        })
        .map_err(api_error(operation))
    }

    fn namespaced<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), namespace.filter(|ns| !ns.is_empty()).unwrap_or("default"))
    }
}

impl Drop for NetnsClient {
    fn drop(&mut self) {
        // Dropping a runtime from inside another one panics; tests are plain threads, so this
        // only stops the workers without waiting for stuck connections.
        let runtime = std::mem::replace(
            &mut self.runtime,
            tokio::runtime::Builder::new_current_thread().build().expect("an empty runtime"),
        );
        runtime.shutdown_background();
    }
}
