//! `svcplane dns`: cluster DNS from a manifests directory.
//!
//! Three threads of work: the directory watcher (polling, as for `proxy`), a zone builder
//! that runs the controller's `reconcile` (allocation, EndpointSlices from Pods), converts
//! the result into the DNS view and publishes a new zone snapshot, and the tokio runtime
//! that answers over UDP and TCP from whatever snapshot is current. Until the directory has
//! been read once, names in the zone answer SERVFAIL. A directory that disappears keeps the
//! last zone served.
//!
//! Allocations: with `--allocations-file` the record `proxy` saves is read (never written),
//! so both agree on cluster IPs; without it both derive them from names alone.
//!
//! Later: serving this from inside `svcplane proxy --dns-listen`, sharing its snapshot.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use svcplane_controller::Allocator;
use svcplane_dns::{DnsServer, Forwarder, Handler, PodRecords, SharedZone, Zone, ZoneConfig};
use svcplane_source::{
    ClusterObjects, DEFAULT_POLL_INTERVAL, DirectoryWatcher, Loaded, ManifestError, ObjectKind, ObjectRef, dns_view,
};
use tracing::{info, warn};

use crate::cli::{SourceArgs, SourceKind};

/// How often the zone builder checks for a stop request while idle.
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PodsMode {
    /// `<a-b-c-d>.<ns>.pod.<zone>` answers the address written in the name (CoreDNS's
    /// `pods insecure`, the kubeadm default).
    Insecure,
    /// `*.pod.<zone>` answers NXDOMAIN.
    Disabled,
}

#[derive(Debug, Clone, Args)]
pub struct DnsArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Where to answer, over UDP and TCP. Port 0 picks a free port; the address is printed
    /// on standard output as `listening on ADDR:PORT`.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// The cluster domain.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local", value_parser = parse_zone)]
    pub zone: String,
    /// TTL of every answer (but `dns-version`) and of negative answers (the SOA minimum).
    #[arg(long, value_name = "SECONDS", default_value_t = svcplane_dns::DEFAULT_TTL,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(svcplane_dns::MAX_TTL)))]
    pub ttl: u32,
    /// A resolver for names outside the zone (repeatable, tried in order; port 53 when
    /// omitted). Without any, such names are refused.
    #[arg(long = "upstream", value_name = "ADDR:PORT", value_parser = parse_upstream)]
    pub upstreams: Vec<SocketAddr>,
    /// Records for `<dashed-ip>.<ns>.pod.<zone>`.
    #[arg(long, value_enum, default_value = "insecure")]
    pub pods: PodsMode,
    /// How long one upstream gets to answer, in milliseconds.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 2000, hide = true)]
    pub forward_timeout_ms: u64,
}

fn parse_zone(text: &str) -> Result<String, String> {
    ZoneConfig::new(text).map(|_| text.to_owned()).map_err(|error| error.to_string())
}

fn parse_upstream(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{text:?} is not an IP address with an optional port"))
}

/// Serves the zone until SIGTERM or SIGINT.
pub fn run(args: &DnsArgs) -> anyhow::Result<()> {
    let pods = match args.pods {
        PodsMode::Insecure => PodRecords::Insecure,
        PodsMode::Disabled => PodRecords::Disabled,
    };
    let config = ZoneConfig::new(&args.zone)
        .and_then(|config| config.with_ttl(args.ttl))
        .map_err(|error| anyhow::anyhow!("--zone / --ttl: {error}"))?
        .with_pod_records(pods)
        .with_forwarding(!args.upstreams.is_empty());
    let config = Arc::new(config);
    let dir = match args.source.kind()? {
        SourceKind::Api(access) => return run_from_api(args, &access, config),
        SourceKind::Manifests(dir) => dir,
    };
    if dir.exists() && !dir.is_dir() {
        bail!("--manifests: {} is not a directory", dir.display());
    }
    if !dir.exists() {
        warn!(dir = %dir.display(), "the manifests directory does not exist (yet); answering SERVFAIL until it does");
    }
    let builder = ZoneBuilder::new(&args.source, Arc::clone(&config))?;

    let zone = SharedZone::new(Zone::pending(Arc::clone(&config)));
    let stop = Arc::new(AtomicBool::new(false));
    let (sender, receiver) = mpsc::channel();
    let watcher = DirectoryWatcher::new(dir)
        .spawn(DEFAULT_POLL_INTERVAL, sender, Arc::clone(&stop))
        .context("starting the manifests watcher")?;
    let building = {
        let zone = zone.clone();
        let stop = Arc::clone(&stop);
        thread::Builder::new()
            .name("dns-zone".to_owned())
            .spawn(move || builder.run(&receiver, &zone, &stop))
            .context("starting the zone builder")?
    };

    let forwarder = (!args.upstreams.is_empty())
        .then(|| Forwarder::new(args.upstreams.clone(), Duration::from_millis(args.forward_timeout_ms)));
    let served = serve(args.listen, Handler::new(zone, forwarder));
    stop.store(true, Ordering::Release);
    join(watcher, "manifests watcher");
    join(building, "zone builder");
    served
}

/// `--kubeconfig` (or in a Pod): the zone follows the API's Services and EndpointSlices.
fn run_from_api(args: &DnsArgs, access: &svcplane_kube::ClusterAccess, config: Arc<ZoneConfig>) -> anyhow::Result<()> {
    let zone = SharedZone::new(Zone::pending(Arc::clone(&config)));
    let stop = Arc::new(AtomicBool::new(false));
    let threads = crate::api::spawn_zone_builder(access, config, zone.clone(), Arc::clone(&stop))?;
    let forwarder = (!args.upstreams.is_empty())
        .then(|| Forwarder::new(args.upstreams.clone(), Duration::from_millis(args.forward_timeout_ms)));
    let served = serve(args.listen, Handler::new(zone, forwarder));
    stop.store(true, Ordering::Release);
    for thread in threads {
        join(thread, "API zone builder");
    }
    served
}

fn join(handle: JoinHandle<()>, what: &str) {
    if handle.join().is_err() {
        warn!("the {what} thread panicked");
    }
}

fn serve(listen: SocketAddr, handler: Handler) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dns")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let server = DnsServer::bind(listen, handler).await.with_context(|| format!("--listen {listen}"))?;
        let local = server.local_addr();
        // Scripts and tests read the address from here (port 0 picks one).
        println!("listening on {local}");
        info!(%local, "serving cluster DNS over UDP and TCP");
        server.run_until(shutdown_signal()).await.context("serving DNS")?;
        info!("stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Turns each complete read of the directory into a zone snapshot.
struct ZoneBuilder {
    dir: PathBuf,
    config: Arc<ZoneConfig>,
    allocator: Allocator,
    serial: u32,
    /// The problems last reported, so an unchanged broken file is not reported on every reload.
    last_problems: Vec<String>,
    has_warned_unreadable: bool,
}

impl ZoneBuilder {
    fn new(source: &SourceArgs, config: Arc<ZoneConfig>) -> anyhow::Result<Self> {
        let allocator = crate::pipeline::allocator_from(source)?;
        Ok(Self {
            dir: source.manifests.clone().unwrap_or_default(),
            config,
            allocator,
            serial: 0,
            last_problems: Vec::new(),
            has_warned_unreadable: false,
        })
    }

    fn run(mut self, loads: &Receiver<Loaded>, zone: &SharedZone, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            match loads.recv_timeout(TICK) {
                Ok(first) => {
                    // Several reloads may be queued; only the newest matters.
                    let newest = loads.try_iter().last().unwrap_or(first);
                    if let Some(built) = self.build(newest) {
                        zone.publish(built);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// The zone of one read of the directory; `None` when the directory itself could not be
    /// listed (the previous zone stays).
    fn build(&mut self, loaded: Loaded) -> Option<Zone> {
        let started = Instant::now();
        if loaded.errors.iter().any(|error| is_unlisted(error, &self.dir)) {
            if !self.has_warned_unreadable {
                for error in &loaded.errors {
                    warn!("{error}; the previous zone stays");
                }
                self.has_warned_unreadable = true;
            }
            return None;
        }
        self.has_warned_unreadable = false;
        let Loaded { objects, origins, errors } = loaded;
        let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let reconciled = svcplane_controller::reconcile(&objects, &mut self.allocator);
        for error in &reconciled.errors {
            let object = ObjectRef::new(ObjectKind::Service, &error.service().namespace, &error.service().name);
            match origins.file_of(&object) {
                Some(file) => problems.push(format!("{}: {error}", file.display())),
                None => problems.push(error.to_string()),
            }
        }
        let view = dns_view(
            &ClusterObjects {
                services: reconciled.services,
                pods: objects.pods,
                nodes: Vec::new(),
                slices: reconciled.slices,
            },
            &origins,
        );
        problems.extend(view.errors.iter().map(ToString::to_string));
        if problems != self.last_problems {
            for problem in &problems {
                warn!("{problem}");
            }
            self.last_problems = problems;
        }
        self.serial = next_serial(self.serial);
        let zone = Zone::build(Arc::clone(&self.config), &view.view, self.serial);
        info!(
            services = zone.service_count(),
            serial = self.serial,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "zone updated"
        );
        Some(zone)
    }
}

fn is_unlisted(error: &ManifestError, dir: &Path) -> bool {
    matches!(error, ManifestError::ListDirectory { path, .. } if path == dir)
}

/// The Unix time, or one more than the previous serial when the clock has not moved on.
pub(crate) fn next_serial(previous: u32) -> u32 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
    let now = u32::try_from(now).unwrap_or(u32::MAX);
    now.max(previous.wrapping_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_take_an_address_with_or_without_a_port() {
        assert_eq!(parse_upstream("127.0.0.1:5353"), Ok("127.0.0.1:5353".parse().unwrap()));
        assert_eq!(parse_upstream("127.0.0.1"), Ok("127.0.0.1:53".parse().unwrap()));
        assert_eq!(parse_upstream("[::1]:5353"), Ok("[::1]:5353".parse().unwrap()));
        assert_eq!(parse_upstream("::1"), Ok("[::1]:53".parse().unwrap()));
        assert!(parse_upstream("dns.example").is_err());
    }

    #[test]
    fn serials_never_go_backwards() {
        let first = next_serial(0);
        assert!(first > 1_600_000_000);
        assert_eq!(next_serial(u32::MAX - 1), u32::MAX);
        assert!(next_serial(first) > first);
    }
}
