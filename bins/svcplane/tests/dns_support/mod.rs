//! What the DNS tests share: a manifests directory in a temporary folder, `svcplane dns`
//! started as a process on 127.0.0.1 (killed on drop), the real `dig` with its output parsed,
//! and raw UDP/TCP exchanges for packets `dig` will not send.

#![allow(dead_code, reason = "each test file uses a different part of this module")]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the server gets to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a change in the manifests may take to show in answers. The watcher polls every
/// 200 ms and a change typically shows within 100-250 ms; the target is about a second, and
/// the margin above it is for a loaded CI machine.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// A temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let name = format!("svcplane-{tag}-{}-{}-{nanos}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let path = std::env::temp_dir().join(name);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// Writes `contents` to `name` atomically (write, then rename), as an editor or a
    /// ConfigMap update would, so the watcher never reads half a file.
    pub fn write(&self, name: &str, contents: &str) {
        let path = self.0.join(name);
        let temporary = self.0.join(format!(".{name}.tmp"));
        fs::write(&temporary, contents).unwrap();
        fs::rename(&temporary, &path).unwrap();
    }

    pub fn remove(&self, name: &str) {
        fs::remove_file(self.0.join(name)).unwrap();
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A running `svcplane dns`, killed when dropped.
#[derive(Debug)]
pub struct DnsServer {
    child: Child,
    pub addr: SocketAddr,
    /// Where it serves `/metrics` (tests get a free port on 127.0.0.1 unless they pass
    /// `--metrics-bind-address` themselves).
    pub metrics_addr: Option<SocketAddr>,
    log: PathBuf,
    /// Holds the log file (and, when the test made it, the manifests) until the end.
    _scratch: TempDir,
}

impl DnsServer {
    /// Starts `svcplane dns --manifests DIR --listen 127.0.0.1:0` with `extra` arguments, and
    /// waits for it to print its address.
    pub fn start(manifests: &Path, extra: &[&str]) -> Self {
        let scratch = TempDir::new("dns-log");
        let log = scratch.0.join("server.log");
        let stderr = fs::File::create(&log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_svcplane"))
            .arg("dns")
            .arg("--manifests")
            .arg(manifests)
            .args(["--listen", "127.0.0.1:0"])
            .args(if extra.contains(&"--metrics-bind-address") {
                &[][..]
            } else {
                &["--metrics-bind-address", "127.0.0.1:0"][..]
            })
            .args(extra)
            .env("SVCPLANE_LOG", "info,hickory_server=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting svcplane dns");
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server =
            Self { child, addr: "127.0.0.1:0".parse().unwrap(), metrics_addr: None, log, _scratch: scratch };
        loop {
            match receiver.recv_timeout(START_TIMEOUT) {
                Ok(line) => {
                    if let Some(address) = line.strip_prefix("metrics on ") {
                        server.metrics_addr = Some(address.parse().unwrap());
                        continue;
                    }
                    let address =
                        line.strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected output {line:?}"));
                    server.addr = address.parse().unwrap();
                    break;
                }
                Err(_) => panic!("svcplane dns did not start within {START_TIMEOUT:?}:\n{}", server.log()),
            }
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `dig @server -p PORT <args>` with one try and a 2-second timeout.
    pub fn dig(&self, args: &[&str]) -> Dig {
        dig(self.addr, args)
    }

    /// Asks until `wanted` holds, up to `timeout`; returns the last answer and how long it took.
    pub fn dig_until(&self, args: &[&str], timeout: Duration, wanted: impl Fn(&Dig) -> bool) -> (Dig, Duration) {
        let started = Instant::now();
        loop {
            let answer = self.dig(args);
            if wanted(&answer) {
                return (answer, started.elapsed());
            }
            if started.elapsed() > timeout {
                panic!(
                    "no wanted answer to dig {args:?} within {timeout:?}; last:\n{}\nserver log:\n{}",
                    answer.raw,
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits for the first complete snapshot: `dns-version` answers.
    pub fn wait_ready(&self) {
        self.dig_until(&["dns-version.cluster.local", "TXT"], Duration::from_secs(5), |d| d.status == "NOERROR");
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- svcplane dns log ---\n{}", self.log());
        }
    }
}

/// One resource record as dig prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rr {
    pub name: String,
    pub ttl: u32,
    pub class: String,
    pub rtype: String,
    /// The rest of the line, single-spaced.
    pub data: String,
}

/// dig's answer, parsed.
#[derive(Debug, Clone, Default)]
pub struct Dig {
    pub status: String,
    pub flags: Vec<String>,
    pub answer: Vec<Rr>,
    pub authority: Vec<Rr>,
    pub additional: Vec<Rr>,
    pub raw: String,
}

impl Dig {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// `TYPE data` of the answer section, in order.
    pub fn answers(&self) -> Vec<String> {
        self.answer.iter().map(|rr| format!("{} {}", rr.rtype, rr.data)).collect()
    }

    /// `TYPE data` of the answer section, sorted.
    pub fn sorted_answers(&self) -> Vec<String> {
        let mut answers = self.answers();
        answers.sort();
        answers
    }

    /// NXDOMAIN or NODATA with the zone SOA, whose minimum (and TTL) is `ttl`.
    pub fn assert_negative(&self, status: &str, ttl: u32) {
        assert_eq!(self.status, status, "{}", self.raw);
        assert!(self.has_flag("aa"), "AA must be set:\n{}", self.raw);
        assert!(self.answer.is_empty(), "a negative answer has no records:\n{}", self.raw);
        let [soa] = self.authority.as_slice() else { panic!("expected the SOA in authority:\n{}", self.raw) };
        assert_eq!(soa.rtype, "SOA", "{}", self.raw);
        assert_eq!(soa.name, "cluster.local.", "{}", self.raw);
        assert_eq!(soa.ttl, ttl, "{}", self.raw);
        let minimum: u32 = soa.data.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(minimum, ttl, "SOA minimum:\n{}", self.raw);
    }
}

/// Runs the real dig against `server`. Panics when dig is missing (Debian: `dnsutils`).
pub fn dig(server: SocketAddr, args: &[&str]) -> Dig {
    let output = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+tries=1", "+time=2", "+nocookie"])
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running dig ({error}); install it with `apt-get install dnsutils`"));
    parse_dig(&String::from_utf8_lossy(&output.stdout))
}

fn parse_rr(line: &str) -> Option<Rr> {
    let mut fields = line.split_whitespace();
    let name = fields.next()?.to_owned();
    let ttl = fields.next()?.parse().ok()?;
    let class = fields.next()?.to_owned();
    let rtype = fields.next()?.to_owned();
    let data = fields.collect::<Vec<_>>().join(" ");
    Some(Rr { name, ttl, class, rtype, data })
}

fn parse_dig(raw: &str) -> Dig {
    let mut dig = Dig { raw: raw.to_owned(), ..Dig::default() };
    let mut section: Option<&str> = None;
    for line in raw.lines() {
        if let Some(rest) = line.strip_prefix(";; ->>HEADER<<-") {
            dig.status = rest.split("status: ").nth(1).and_then(|s| s.split(',').next()).unwrap_or("").to_owned();
        } else if let Some(rest) = line.strip_prefix(";; flags:") {
            let flags = rest.split(';').next().unwrap_or("");
            dig.flags = flags.split_whitespace().map(str::to_owned).collect();
        } else if line.starts_with(";; ANSWER SECTION") {
            section = Some("answer");
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = Some("authority");
        } else if line.starts_with(";; ADDITIONAL SECTION") {
            section = Some("additional");
        } else if line.trim().is_empty() || line.starts_with(';') {
            section = if line.trim().is_empty() { None } else { section };
        } else if let (Some(section), Some(rr)) = (section, parse_rr(line)) {
            match section {
                "answer" => dig.answer.push(rr),
                "authority" => dig.authority.push(rr),
                _ => dig.additional.push(rr),
            }
        }
    }
    dig
}

/// Sends `packet` over UDP and returns the reply, or `None` after `wait`.
pub fn udp_exchange(server: SocketAddr, packet: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(wait)).unwrap();
    socket.send_to(packet, server).unwrap();
    let mut buffer = vec![0u8; 65_535];
    match socket.recv_from(&mut buffer) {
        Ok((length, _)) => Some(buffer[..length].to_vec()),
        Err(_) => None,
    }
}

/// Sends `packet` over TCP (length-prefixed) and returns the reply, or `None` when the
/// server closes the connection or says nothing within `wait`.
pub fn tcp_exchange(server: SocketAddr, packet: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&server, wait).ok()?;
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut framed = (u16::try_from(packet.len()).unwrap()).to_be_bytes().to_vec();
    framed.extend_from_slice(packet);
    stream.write_all(&framed).ok()?;
    let mut length = [0u8; 2];
    stream.read_exact(&mut length).ok()?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut reply).ok()?;
    Some(reply)
}

/// A YAML Service.
pub fn service(namespace: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{}\n---\n",
        indent(spec)
    )
}

/// A YAML Pod, running on node-1, ready or not, with `extra` spec lines (hostname, subdomain).
pub fn pod(namespace: &str, name: &str, app: &str, ips: &[&str], ready: bool, extra: &str) -> String {
    let ip_list: Vec<String> = ips.iter().map(|ip| format!("{{ip: \"{ip}\"}}")).collect();
    let status = if ready { "True" } else { "False" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{app: {app}}}\nspec:\n  nodeName: node-1\n  containers: [{{name: c, image: x}}]\n{}status:\n  phase: Running\n  podIP: \"{}\"\n  podIPs: [{}]\n  conditions: [{{type: Ready, status: \"{status}\"}}]\n---\n",
        if extra.is_empty() { String::new() } else { format!("{}\n", indent(extra)) },
        ips[0],
        ip_list.join(", "),
    )
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}")).collect::<Vec<_>>().join("\n")
}
