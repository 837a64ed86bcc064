//! How svcplane reaches a kube-apiserver: a kubeconfig file, or the in-cluster config of a
//! Pod (service-account token, `KUBERNETES_SERVICE_HOST`).

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::KubeError;

/// Where the API server is and how to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAccess {
    /// A kubeconfig file, its current context.
    Kubeconfig(PathBuf),
    /// Running in a Pod: the service account's token and CA, and the `kubernetes` Service
    /// from the environment.
    InCluster,
}

impl ClusterAccess {
    /// The access for an optional `--kubeconfig`: the file when given, else the in-cluster
    /// config when this process runs in a Pod, else `None`.
    pub fn from_flag(kubeconfig: Option<PathBuf>) -> Option<Self> {
        match kubeconfig {
            Some(path) => Some(Self::Kubeconfig(path)),
            None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => Some(Self::InCluster),
            None => None,
        }
    }

    /// The client configuration. Reads the files now, so a bad path fails at startup.
    pub async fn config(&self) -> Result<Config, KubeError> {
        match self {
            Self::Kubeconfig(path) => {
                let file = Kubeconfig::read_from(path)
                    .map_err(|source| KubeError::ReadKubeconfig { path: path.clone(), source: Box::new(source) })?;
                Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| KubeError::ReadKubeconfig { path: path.clone(), source: Box::new(source) })
            }
            Self::InCluster => {
                Config::incluster().map_err(|source| KubeError::InClusterConfig { source: Box::new(source) })
            }
        }
    }

    /// A client; must be called inside a tokio runtime.
    pub async fn client(&self) -> Result<Client, KubeError> {
        let mut config = self.config().await?;
        // Watches are long; individual requests (lists of 10k objects included) are not.
        config.read_timeout = Some(std::time::Duration::from_secs(300));
        Client::try_from(config).map_err(|source| KubeError::BuildClient { source })
    }
}

impl std::fmt::Display for ClusterAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kubeconfig(path) => write!(f, "kubeconfig {}", path.display()),
            Self::InCluster => f.write_str("in-cluster config"),
        }
    }
}
