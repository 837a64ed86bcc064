//! etcd and kube-apiserver in a network namespace, and the upstream components around them.

use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::binaries::UpstreamBinaries;
use crate::error::ControlPlaneError;
use crate::pki::{self, Credentials};

/// The API server's port, on every address of its namespace.
pub const API_PORT: u16 = 6443;
/// etcd's client port, on loopback of the control plane's namespace only.
const ETCD_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;
/// A cold kube-apiserver on two busy cores needs well over envtest's 20 s.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Inside the emulated guest kernel (`scripts/in-guest`) it needs about two minutes.
const READY_TIMEOUT_IN_GUEST: Duration = Duration::from_secs(600);

/// How long a component gets to become ready: [`READY_TIMEOUT`], or
/// [`READY_TIMEOUT_IN_GUEST`] where `SVCPLANE_IN_GUEST=1` (set by `scripts/in-guest`).
fn ready_timeout() -> Duration {
    if std::env::var_os("SVCPLANE_IN_GUEST").is_some_and(|value| value == "1") {
        READY_TIMEOUT_IN_GUEST
    } else {
        READY_TIMEOUT
    }
}
const POLL: Duration = Duration::from_millis(250);

/// Where and how to run the control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// The network namespace etcd and the API server run in.
    pub namespace: String,
    /// An address of that namespace: the API server's advertised address (the endpoint of
    /// the `kubernetes` Service) and the server of the kubeconfig.
    pub address: IpAddr,
    /// `--service-cluster-ip-range`, one CIDR per family.
    pub service_cidrs: Vec<String>,
    /// `--service-node-port-range`.
    pub node_port_range: String,
    /// More kube-apiserver flags.
    pub extra_apiserver_args: Vec<String>,
}

impl ControlPlaneConfig {
    pub fn new(namespace: impl Into<String>, address: IpAddr) -> Self {
        Self {
            namespace: namespace.into(),
            address,
            service_cidrs: vec!["198.19.0.0/16".to_owned()],
            node_port_range: "30000-32767".to_owned(),
            extra_apiserver_args: Vec::new(),
        }
    }
}

/// A process of the control plane, killed on drop.
#[derive(Debug)]
pub struct Upstream {
    what: String,
    log: PathBuf,
    child: Child,
}

impl Upstream {
    pub fn log(&self) -> &Path {
        &self.log
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }

    /// Fails when the process has exited.
    pub fn check_running(&mut self) -> Result<(), ControlPlaneError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(ControlPlaneError::Exited {
                what: self.what.clone(),
                status,
                log: self.log.clone(),
                tail: self.log_tail(),
            }),
            _ => Ok(()),
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// etcd plus kube-apiserver in one network namespace, with credentials and an admin
/// kubeconfig. Dropping it kills every process it started (API server, etcd and whatever
/// [`ControlPlane::spawn`] started) and removes its directory.
#[derive(Debug)]
pub struct ControlPlane {
    config: ControlPlaneConfig,
    binaries: UpstreamBinaries,
    credentials: Credentials,
    kubeconfig: PathBuf,
    /// Started by `spawn`, stopped first.
    others: Mutex<Vec<Upstream>>,
    apiserver: Option<Upstream>,
    etcd: Option<Upstream>,
    apiserver_starts: u32,
    etcd_starts: u32,
    /// Last: removed after every process is gone.
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Generates credentials, starts etcd and kube-apiserver in `config.namespace`, and waits
    /// until the API server is ready and the `default` namespace exists.
    pub fn start(binaries: &UpstreamBinaries, config: ControlPlaneConfig) -> Result<Self, ControlPlaneError> {
        let dir = tempfile::Builder::new().prefix("svcplane-control-plane-").tempdir().map_err(|source| {
            ControlPlaneError::File { what: "creating a directory in", path: std::env::temp_dir(), source }
        })?;
        // etcd listens on loopback only; a lab's LAN namespace may not have it up yet.
        crate::namespace::ip_cmd(&["-n", &config.namespace, "link", "set", "lo", "up"])?;
        let credentials = pki::generate(dir.path(), &[config.address])?;
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let server = match config.address {
            IpAddr::V4(ip) => format!("https://{ip}:{API_PORT}"),
            IpAddr::V6(ip) => format!("https://[{ip}]:{API_PORT}"),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: svcplane-test\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: \
             svcplane-test\n  context:\n    cluster: svcplane-test\n    user: admin\ncurrent-context: svcplane-test\n",
            ca = credentials.ca_cert.display(),
            token = credentials.token,
        );
        std::fs::write(&kubeconfig, text).map_err(|source| ControlPlaneError::File {
            what: "writing",
            path: kubeconfig.clone(),
            source,
        })?;
        let mut plane = Self {
            config,
            binaries: binaries.clone(),
            credentials,
            kubeconfig,
            others: Mutex::new(Vec::new()),
            apiserver: None,
            etcd: None,
            apiserver_starts: 0,
            etcd_starts: 0,
            dir,
        };
        plane.start_etcd()?;
        plane.start_apiserver()?;
        Ok(plane)
    }

    pub fn config(&self) -> &ControlPlaneConfig {
        &self.config
    }

    pub fn namespace(&self) -> &str {
        &self.config.namespace
    }

    pub fn address(&self) -> IpAddr {
        self.config.address
    }

    /// The admin kubeconfig (bearer token, CA file), pointing at the API server's address.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The control plane's directory: credentials, kubeconfig, logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn binaries(&self) -> &UpstreamBinaries {
        &self.binaries
    }

    /// The API server's log.
    pub fn apiserver_log(&self) -> Option<&Path> {
        self.apiserver.as_ref().map(Upstream::log)
    }

    fn start_etcd(&mut self) -> Result<(), ControlPlaneError> {
        let etcd = self.binaries.require("etcd")?;
        let data = self.dir.path().join("etcd-data");
        let client = format!("http://127.0.0.1:{ETCD_PORT}");
        let peer = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
        let args = vec![
            "--name=svcplane-test".to_owned(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=svcplane-test={peer}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let namespace = self.config.namespace.clone();
        self.etcd_starts += 1;
        let what = if self.etcd_starts == 1 { "etcd".to_owned() } else { format!("etcd-{}", self.etcd_starts) };
        let mut process = self.spawn_process(&what, &netns_exec(&namespace), &etcd, &args)?;
        let url = format!("{client}/readyz");
        self.wait_until(&mut process, |plane| plane.curl_ok(&namespace, &[&url]))?;
        self.etcd = Some(process);
        Ok(())
    }

    fn apiserver_args(&self) -> Vec<String> {
        let c = &self.credentials;
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{ETCD_PORT}"),
            "--bind-address=0.0.0.0".to_owned(),
            format!("--secure-port={API_PORT}"),
            format!("--advertise-address={}", self.config.address),
            format!("--tls-cert-file={}", c.serving_cert.display()),
            format!("--tls-private-key-file={}", c.serving_key.display()),
            format!("--client-ca-file={}", c.ca_cert.display()),
            format!("--token-auth-file={}", c.token_file.display()),
            "--authorization-mode=RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", c.service_account_key.display()),
            format!("--service-account-signing-key-file={}", c.service_account_key.display()),
            format!("--service-cluster-ip-range={}", self.config.service_cidrs.join(",")),
            format!("--service-node-port-range={}", self.config.node_port_range),
            // No serviceaccount controller runs, so no namespace has a `default` account.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--profiling=false".to_owned(),
            "--v=1".to_owned(),
        ];
        args.extend(self.config.extra_apiserver_args.iter().cloned());
        args
    }

    fn start_apiserver(&mut self) -> Result<(), ControlPlaneError> {
        let binary = self.binaries.require("kube-apiserver")?;
        self.apiserver_starts += 1;
        let what = if self.apiserver_starts == 1 {
            "kube-apiserver".to_owned()
        } else {
            format!("kube-apiserver-{}", self.apiserver_starts)
        };
        let namespace = self.config.namespace.clone();
        let mut process = self.spawn_process(&what, &netns_exec(&namespace), &binary, &self.apiserver_args())?;
        let ca = self.credentials.ca_cert.display().to_string();
        let token = format!("Authorization: Bearer {}", self.credentials.token);
        let base = match self.config.address {
            IpAddr::V4(ip) => format!("https://{ip}:{API_PORT}"),
            IpAddr::V6(ip) => format!("https://[{ip}]:{API_PORT}"),
        };
        let readyz = format!("{base}/readyz");
        let default_namespace = format!("{base}/api/v1/namespaces/default");
        self.wait_until(&mut process, |plane| {
            plane.curl_ok(&namespace, &["--cacert", &ca, &readyz])
                && plane.curl_ok(&namespace, &["--cacert", &ca, "-H", &token, &default_namespace])
        })?;
        self.apiserver = Some(process);
        Ok(())
    }

    /// Kills the API server (SIGKILL, as a crash) and leaves it down until
    /// [`Self::start_apiserver_again`]. etcd keeps running.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop();
        }
    }

    /// Kills the API server and etcd (SIGKILL: the whole control plane crashes) and leaves
    /// them down until [`Self::start_etcd_and_apiserver_again`]. etcd's data stays.
    pub fn kill_etcd_and_apiserver(&mut self) {
        self.kill_apiserver();
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop();
        }
    }

    /// Starts etcd (same data) and the API server again and waits until both are ready.
    pub fn start_etcd_and_apiserver_again(&mut self) -> Result<(), ControlPlaneError> {
        self.kill_etcd_and_apiserver();
        self.start_etcd()?;
        self.start_apiserver()
    }

    /// Starts the API server again (same flags, same etcd) and waits until it is ready.
    pub fn start_apiserver_again(&mut self) -> Result<(), ControlPlaneError> {
        self.kill_apiserver();
        self.start_apiserver()
    }

    /// Starts `binary` (a name in the upstream directory, or a path) in `namespace` with
    /// `args`, its output in `<dir>/<what>.log`; it is killed when the control plane drops.
    pub fn spawn(
        &self,
        what: &str,
        namespace: &str,
        binary: &str,
        args: &[String],
    ) -> Result<(u32, PathBuf), ControlPlaneError> {
        self.spawn_entering(what, &netns_exec(namespace), binary, args)
    }

    /// [`Self::spawn`] entering only the network namespace (`nsenter --net`): the program
    /// keeps this process's mounts, so it sees the cgroup2 mount under /sys and a bpffs it
    /// mounts outlives it (what eBPF mode needs; `ip netns exec` gives it a fresh /sys).
    pub fn spawn_sharing_mounts(
        &self,
        what: &str,
        namespace: &str,
        binary: &str,
        args: &[String],
    ) -> Result<(u32, PathBuf), ControlPlaneError> {
        self.spawn_entering(what, &["nsenter".to_owned(), format!("--net=/run/netns/{namespace}")], binary, args)
    }

    fn spawn_entering(
        &self,
        what: &str,
        launcher: &[String],
        binary: &str,
        args: &[String],
    ) -> Result<(u32, PathBuf), ControlPlaneError> {
        let program = if binary.contains('/') { PathBuf::from(binary) } else { self.binaries.require(binary)? };
        let process = self.spawn_process(what, launcher, &program, args)?;
        let result = (process.pid(), process.log.clone());
        self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(process);
        Ok(result)
    }

    /// Fails with the log's tail when a process started by [`Self::spawn`] has exited.
    pub fn check_running(&self, what: &str) -> Result<(), ControlPlaneError> {
        let mut others = self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match others.iter_mut().find(|process| process.what == what) {
            Some(process) => process.check_running(),
            None => Ok(()),
        }
    }

    /// Sends SIGTERM to a process started by [`Self::spawn`] (it stays tracked: see
    /// [`Self::check_running`] for how it ended).
    pub fn terminate(&self, what: &str) {
        let others = self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for process in others.iter().filter(|process| process.what == what) {
            if let Ok(pid) = i32::try_from(process.pid()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
        }
    }

    /// Kills a process started by [`Self::spawn`] now.
    pub fn stop(&self, what: &str) {
        let mut others = self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        others.retain(|process| process.what != what);
    }

    /// kube-controller-manager in the control plane's namespace, running only `controllers`
    /// (e.g. `endpointslice-controller,garbage-collector-controller`). Never the default set:
    /// its node lifecycle controller would mark the hand-made Nodes unready.
    pub fn start_controller_manager(&self, controllers: &str) -> Result<PathBuf, ControlPlaneError> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--secure-port=10257".to_owned(),
            "--leader-elect=false".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            format!("--controllers={controllers}"),
            "--v=1".to_owned(),
        ];
        let namespace = self.config.namespace.clone();
        let (_, log) = self.spawn("kube-controller-manager", &namespace, "kube-controller-manager", &args)?;
        let started = Instant::now();
        while started.elapsed() < ready_timeout() {
            self.check_running("kube-controller-manager")?;
            if self.curl_ok(&namespace, &["-k", "https://127.0.0.1:10257/healthz"]) {
                return Ok(log);
            }
            thread::sleep(POLL);
        }
        Err(ControlPlaneError::NotReady {
            what: "kube-controller-manager".into(),
            after: ready_timeout(),
            log: log.clone(),
            tail: tail(&log),
        })
    }

    fn spawn_process(
        &self,
        what: &str,
        launcher: &[String],
        program: &Path,
        args: &[String],
    ) -> Result<Upstream, ControlPlaneError> {
        let log = self.dir.path().join(format!("{what}.log"));
        let file = File::create(&log).map_err(|source| ControlPlaneError::File {
            what: "creating",
            path: log.clone(),
            source,
        })?;
        let error_file = file.try_clone().map_err(|source| ControlPlaneError::File {
            what: "opening",
            path: log.clone(),
            source,
        })?;
        let (first, rest) = launcher.split_first().expect("a launcher command");
        let child = Command::new(first)
            .args(rest)
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(error_file)
            .spawn()
            .map_err(|source| ControlPlaneError::Spawn { what: what.to_owned(), source })?;
        Ok(Upstream { what: what.to_owned(), log, child })
    }

    fn wait_until(&self, process: &mut Upstream, ready: impl Fn(&Self) -> bool) -> Result<(), ControlPlaneError> {
        let started = Instant::now();
        while started.elapsed() < ready_timeout() {
            process.check_running()?;
            if ready(self) {
                return Ok(());
            }
            thread::sleep(POLL);
        }
        Err(ControlPlaneError::NotReady {
            what: process.what.clone(),
            after: ready_timeout(),
            log: process.log.clone(),
            tail: process.log_tail(),
        })
    }

    /// `curl -fs` inside `namespace`, bounded to two seconds.
    fn curl_ok(&self, namespace: &str, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", namespace, "curl", "-fsS", "-o", "/dev/null", "--max-time", "2"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut others = std::mem::take(self.others.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        for process in &mut others {
            process.stop();
        }
        drop(others);
        self.kill_apiserver();
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop();
        }
        if std::env::var_os("SVCPLANE_KEEP_CONTROL_PLANE_DIR").is_some() {
            let kept = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("a temporary directory"));
            eprintln!("svcplane-control-plane: kept {}", kept.keep().display());
        }
    }
}

/// The command prefix that runs a program in `namespace` the usual way.
fn netns_exec(namespace: &str) -> Vec<String> {
    ["ip", "netns", "exec", namespace].map(String::from).to_vec()
}
