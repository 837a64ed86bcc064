//! Health-check node ports (`spec.healthCheckNodePort`): a small HTTP server per port that
//! tells an external load balancer whether this node has local endpoints for the Service,
//! in the JSON shape kube-proxy serves (200 with endpoints, 503 without, and 503 while the
//! proxy is not healthy: its last sync failed).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use svcplane_core::{HealthCheck, NamespacedName};
use tracing::warn;

/// How often an idle listener checks whether it should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    service: NamespacedName,
    local_endpoints: usize,
}

#[derive(Debug)]
struct Listener {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// The running health-check servers, one per port, kept in line with the plan.
#[derive(Debug)]
pub struct HealthServers {
    answers: Arc<RwLock<BTreeMap<u16, Answer>>>,
    listeners: BTreeMap<u16, Listener>,
    /// `serviceProxyHealthy`: false while the kernel may not hold what the counts say.
    proxy_healthy: Arc<AtomicBool>,
}

impl Default for HealthServers {
    fn default() -> Self {
        Self { answers: Arc::default(), listeners: BTreeMap::new(), proxy_healthy: Arc::new(AtomicBool::new(true)) }
    }
}

impl HealthServers {
    /// Whether the proxy is healthy; every port answers 503 while it is not.
    pub fn set_proxy_healthy(&self, healthy: bool) {
        self.proxy_healthy.store(healthy, Ordering::Release);
    }

    /// Starts servers for new ports, stops those no longer wanted, updates the counts.
    pub fn update(&mut self, checks: &BTreeMap<NamespacedName, HealthCheck>) {
        let wanted: BTreeMap<u16, Answer> = checks
            .iter()
            .map(|(service, check)| {
                (check.port, Answer { service: service.clone(), local_endpoints: check.local_endpoints })
            })
            .collect();
        *self.answers.write().expect("health answers lock") = wanted.clone();
        let stale: Vec<u16> = self.listeners.keys().filter(|port| !wanted.contains_key(port)).copied().collect();
        for port in stale {
            if let Some(listener) = self.listeners.remove(&port) {
                listener.stop.store(true, Ordering::Relaxed);
                for thread in listener.threads {
                    let _ = thread.join();
                }
            }
        }
        for port in wanted.keys() {
            if !self.listeners.contains_key(port) {
                match self.listen(*port) {
                    Ok(listener) => {
                        self.listeners.insert(*port, listener);
                    }
                    Err(error) => warn!("health-check node port {port}: {error}"),
                }
            }
        }
    }

    fn listen(&self, port: u16) -> std::io::Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        // IPv6 first: with the kernel's default (bindv6only=0) that one socket also takes
        // IPv4, and the IPv4 bind then finds the port taken; with bindv6only=1 both bind.
        // A node without IPv6 fails the first bind and serves IPv4 alone.
        let addresses =
            [SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port), SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)];
        let mut last_error = None;
        for address in addresses {
            let listener = match TcpListener::bind(address) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::debug!("health-check node port {port} on {address}: {error}");
                    last_error = Some(error);
                    continue;
                }
            };
            listener.set_nonblocking(true)?;
            let stop = Arc::clone(&stop);
            let answers = Arc::clone(&self.answers);
            let healthy = Arc::clone(&self.proxy_healthy);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("health-{port}"))
                    .spawn(move || serve(&listener, port, &answers, &healthy, &stop))?,
            );
        }
        if threads.is_empty() {
            return Err(last_error.unwrap_or_else(|| std::io::Error::other("no address to listen on")));
        }
        Ok(Listener { stop, threads })
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        self.update(&BTreeMap::new());
    }
}

fn serve(
    listener: &TcpListener,
    port: u16,
    answers: &RwLock<BTreeMap<u16, Answer>>,
    healthy: &AtomicBool,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let answer = answers.read().expect("health answers lock").get(&port).cloned();
                if let Err(error) = respond(stream, answer, healthy.load(Ordering::Acquire)) {
                    tracing::debug!("health-check node port {port}: {error}");
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(error) => {
                warn!("health-check node port {port}: accept: {error}");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// The response body kube-proxy's service health server writes.
fn body(answer: &Answer, healthy: bool) -> String {
    format!(
        "{{\"service\":{{\"namespace\":\"{}\",\"name\":\"{}\"}},\"localEndpoints\":{},\"serviceProxyHealthy\":{healthy}}}",
        answer.service.namespace, answer.service.name, answer.local_endpoints
    )
}

fn respond(mut stream: TcpStream, answer: Option<Answer>, healthy: bool) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    // Read the request head; its content does not matter (any path answers).
    let mut request = [0u8; 2048];
    let _ = stream.read(&mut request)?;
    // The weight header carries the count whatever the status, as kube-proxy's does.
    let (status, body, weight) = match &answer {
        Some(answer) if answer.local_endpoints > 0 && healthy => {
            ("200 OK", body(answer, healthy), answer.local_endpoints)
        }
        Some(answer) => ("503 Service Unavailable", body(answer, healthy), answer.local_endpoints),
        None => ("404 Not Found", String::new(), 0),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
         X-Load-Balancing-Endpoint-Weight: {weight}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(port: u16) -> String {
        get_from("127.0.0.1", port)
    }

    fn get_from(host: &str, port: u16) -> String {
        let mut stream = TcpStream::connect((host, port)).unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn a_node_with_local_endpoints_answers_200_with_their_count() {
        let port = free_port();
        let mut servers = HealthServers::default();
        let service = NamespacedName::new("default", "web");
        servers.update(&BTreeMap::from([(service.clone(), HealthCheck { port, local_endpoints: 2 })]));
        let response = get(port);
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(response.ends_with(
            r#"{"service":{"namespace":"default","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}"#
        ));
        servers.update(&BTreeMap::from([(service, HealthCheck { port, local_endpoints: 0 })]));
        assert!(get(port).starts_with("HTTP/1.1 503"), "the count follows the plan without a restart");
    }

    #[test]
    fn the_health_check_answers_over_ipv6_too() {
        let port = free_port();
        let mut servers = HealthServers::default();
        servers.update(&BTreeMap::from([(
            NamespacedName::new("default", "web"),
            HealthCheck { port, local_endpoints: 1 },
        )]));
        assert!(get_from("::1", port).starts_with("HTTP/1.1 200 OK"));
        assert!(get_from("127.0.0.1", port).starts_with("HTTP/1.1 200 OK"));
    }

    #[test]
    fn a_port_no_longer_planned_stops_listening() {
        let port = free_port();
        let mut servers = HealthServers::default();
        servers.update(&BTreeMap::from([(
            NamespacedName::new("default", "web"),
            HealthCheck { port, local_endpoints: 1 },
        )]));
        servers.update(&BTreeMap::new());
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
