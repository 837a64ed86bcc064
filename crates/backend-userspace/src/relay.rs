//! The relay: a tokio runtime of its own inside the proxy process, one listener per
//! service port and endpoint set (on the node's address, a port the kernel picks), and
//! the pools they choose endpoints from.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use socket2::{Domain, Socket, Type};
use svcplane_core::{EndpointSetKind, PlanKey, Protocol, ServicePortPlan};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::options::Options;
use crate::pool::Pool;
use crate::stats::Stats;

#[derive(Debug)]
struct Listener {
    port: u16,
    address: IpAddr,
    task: JoinHandle<()>,
}

/// The running relay.
#[derive(Debug)]
pub struct Relay {
    runtime: Option<Runtime>,
    options: Arc<Options>,
    listeners: BTreeMap<(PlanKey, EndpointSetKind), Listener>,
    pools: BTreeMap<PlanKey, Arc<Pool>>,
    stats: Arc<Stats>,
    /// `RLIMIT_NOFILE` in effect.
    fd_limit: u64,
}

/// `namespace/name:port` (`:port` left out for an unnamed port).
pub fn port_label(plan: &ServicePortPlan) -> String {
    let name = &plan.name;
    if name.port_name.is_empty() {
        format!("{}/{}", name.service.namespace, name.service.name)
    } else {
        format!("{}/{}:{}", name.service.namespace, name.service.name, name.port_name)
    }
}

impl Relay {
    pub fn start(options: Options, stats: Arc<Stats>) -> io::Result<Self> {
        let limit = raise_fd_limit();
        stats.fd_budget.store(limit.saturating_sub(FD_RESERVE), std::sync::atomic::Ordering::Relaxed);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads.max(1))
            .thread_name("svcplane-relay")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
            options: Arc::new(options),
            listeners: BTreeMap::new(),
            pools: BTreeMap::new(),
            stats,
            fd_limit: limit,
        })
    }

    fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn pools(&self) -> impl Iterator<Item = (&PlanKey, &Arc<Pool>)> {
        self.pools.iter()
    }

    /// The port of every listener.
    pub fn ports(&self) -> BTreeMap<(PlanKey, EndpointSetKind), u16> {
        self.listeners.iter().map(|(key, listener)| (key.clone(), listener.port)).collect()
    }

    /// Where every listener is: the source of a relayed flow's replies, as the kernel's
    /// conntrack sees them.
    pub fn listener_addresses(&self) -> BTreeSet<SocketAddr> {
        self.listeners.values().map(|listener| SocketAddr::new(listener.address, listener.port)).collect()
    }

    /// Brings a service port's pool up to date, creating it if new.
    pub fn update_pool(&mut self, key: &PlanKey, plan: &ServicePortPlan) {
        let pool = self
            .pools
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Pool::new(port_label(plan), self.options.max_connections, self.stats.clone())));
        pool.update(plan);
    }

    /// Makes sure a listener for `key`'s `set` exists on `address`; returns its port.
    pub fn ensure_listener(
        &mut self,
        key: &PlanKey,
        set: EndpointSetKind,
        protocol: Protocol,
        address: IpAddr,
    ) -> io::Result<u16> {
        let id = (key.clone(), set);
        if let Some(listener) = self.listeners.get(&id) {
            if listener.address == address && !listener.task.is_finished() {
                return Ok(listener.port);
            }
            if let Some(old) = self.listeners.remove(&id) {
                old.task.abort();
            }
        }
        let pool = self.pools.get(key).cloned().expect("the pool is updated before its listeners");
        let options = self.options.clone();
        let domain = Domain::for_address(SocketAddr::new(address, 0));
        let (port, task) = match protocol {
            Protocol::Tcp => {
                let socket = Socket::new(domain, Type::STREAM, None)?;
                socket.set_reuse_address(true)?;
                if address.is_ipv6() {
                    socket.set_only_v6(true)?;
                }
                socket.bind(&SocketAddr::new(address, 0).into())?;
                socket.listen(self.options.backlog)?;
                socket.set_nonblocking(true)?;
                let std_listener: std::net::TcpListener = socket.into();
                let port = std_listener.local_addr()?.port();
                let _entered = self.runtime().enter();
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                (port, self.runtime().spawn(crate::tcp::accept_loop(listener, pool, set, options)))
            }
            Protocol::Udp => {
                let socket = Socket::new(domain, Type::DGRAM, None)?;
                if address.is_ipv6() {
                    socket.set_only_v6(true)?;
                }
                socket.bind(&SocketAddr::new(address, 0).into())?;
                socket.set_nonblocking(true)?;
                let std_socket: std::net::UdpSocket = socket.into();
                let port = std_socket.local_addr()?.port();
                let _entered = self.runtime().enter();
                let socket = tokio::net::UdpSocket::from_std(std_socket)?;
                (port, self.runtime().spawn(crate::udp::serve(socket, pool, set, options)))
            }
            Protocol::Sctp => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "the relay does not speak SCTP"));
            }
        };
        tracing::debug!(service_port = %key.name.service, ?set, %address, port, "relay listening");
        self.listeners.insert(id, Listener { port, address, task });
        Ok(port)
    }

    /// Closes listeners and pools not in `keep`. Open connections of a closed pool get
    /// their grace period. The connections' descriptor budget is what the listeners and
    /// the reserve leave.
    pub fn retain(&mut self, keep: &HashSet<(PlanKey, EndpointSetKind)>) {
        self.listeners.retain(|id, listener| {
            let kept = keep.contains(id);
            if !kept {
                listener.task.abort();
            }
            kept
        });
        let keys: HashSet<&PlanKey> = keep.iter().map(|(key, _)| key).collect();
        self.pools.retain(|key, pool| {
            let kept = keys.contains(key);
            if !kept {
                pool.retire();
            }
            kept
        });
        let budget = self.fd_limit.saturating_sub(FD_RESERVE + self.listeners.len() as u64);
        self.stats.fd_budget.store(budget, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Descriptors kept out of the connections' budget: listeners, the idle pipes, netlink,
/// the ops servers, the manifests watcher.
pub const FD_RESERVE: u64 = 384;

/// Raises the soft limit to the hard one (each relayed TCP connection holds two sockets);
/// returns the limit in effect.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    if soft < hard {
        if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!("raising the file descriptor limit from {soft} to {hard}: {error}");
            return soft;
        }
        tracing::info!("file descriptor limit raised from {soft} to {hard}");
    }
    hard.max(soft)
}
