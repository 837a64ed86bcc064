//! A small HTTP/1.1 server for the operational endpoints: GET only, one short-lived thread
//! per client, `Connection: close`. Enough for probes and Prometheus scrapes, and it keeps
//! the proxy free of an async runtime and a web framework.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, warn};

/// How long a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read; probes and scrapers send a few hundred bytes.
const MAX_HEAD: u64 = 16 * 1024;
/// Clients served at once; more wait in the listen backlog.
const MAX_CLIENTS: usize = 64;

/// A request as a handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path without the query.
    pub path: String,
    pub query: String,
}

/// What a handler answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self { status, content_type, headers: Vec::new(), body: body.into() }
    }

    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body)
    }

    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self::new(status, "application/json", body)
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Paths and what answers them.
#[derive(Clone, Default)]
pub struct Routes {
    handlers: BTreeMap<String, Handler>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes").field("paths", &self.handlers.keys().collect::<Vec<_>>()).finish()
    }
}

impl Routes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers `path` (exactly) with `handler`.
    pub fn route(mut self, path: &str, handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> Self {
        self.handlers.insert(path.to_owned(), Arc::new(handler));
        self
    }

    /// Both sets of paths on one server (the second wins where both answer a path).
    pub fn merge(mut self, other: Routes) -> Self {
        self.handlers.extend(other.handlers);
        self
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    fn answer(&self, request: &Request) -> Response {
        if request.method != "GET" && request.method != "HEAD" {
            return Response::text(405, "method not allowed\n").with_header("Allow", "GET, HEAD");
        }
        match self.handlers.get(&request.path) {
            Some(handler) => handler(request),
            None => Response::text(404, "404 page not found\n"),
        }
    }
}

/// A running server; dropping it stops the listener (clients being served finish).
#[derive(Debug)]
pub struct Server {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `address` and serves `routes` on a thread of its own.
    pub fn start(name: &str, address: SocketAddr, routes: Routes) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            let routes = Arc::new(routes);
            std::thread::Builder::new().name(name.to_owned()).spawn(move || accept_loop(&listener, &routes, &stop))?
        };
        Ok(Self { address, stop, thread: Some(thread) })
    }

    /// Where it listens (the real port when started on port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.address;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, routes: &Arc<Routes>, stop: &AtomicBool) {
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                warn!("accepting a connection: {error}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= MAX_CLIENTS {
            debug!("too many clients; closing one");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let routes = Arc::clone(routes);
        let done = Arc::clone(&active);
        let spawned = std::thread::Builder::new().name("http-client".into()).spawn(move || {
            if let Err(error) = serve(stream, &routes) {
                debug!("serving a client: {error}");
            }
            done.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(error) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            warn!("starting a client thread: {error}");
        }
    }
}

fn serve(stream: TcpStream, routes: &Routes) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new((&stream).take(MAX_HEAD));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return write(&stream, &Response::text(400, "bad request\n"), false);
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let request = Request { method: method.to_owned(), path: path.to_owned(), query: query.to_owned() };
    // The rest of the head: read and ignore (no request bodies on GET).
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let response = routes.answer(&request);
    write(&stream, &response, request.method == "HEAD")
}

fn write(mut stream: &TcpStream, response: &Response, head_only: bool) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    for (name, value) in &response.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(&response.body)?;
    }
    stream.flush()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A GET for tests and benchmarks: status, headers (lower-cased names) and body.
pub fn get(address: SocketAddr, path: &str) -> std::io::Result<(u16, BTreeMap<String, String>, String)> {
    get_within(address, path, CLIENT_TIMEOUT)
}

/// [`get`], waiting up to `timeout` for the answer.
pub fn get_within(
    address: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, BTreeMap<String, String>, String)> {
    let mut stream = TcpStream::connect_timeout(&address, CLIENT_TIMEOUT)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other("no end of head"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    // Other servers (kube-proxy's, for the differential test) may send the body in chunks.
    let body = if headers.get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, headers, body))
}

/// The body of a `Transfer-Encoding: chunked` response: each chunk's size line (hex,
/// perhaps with extensions) taken out, up to the last (empty) chunk.
fn dechunk(mut rest: &str) -> std::io::Result<String> {
    let mut body = String::new();
    loop {
        let (size_line, after) =
            rest.split_once("\r\n").ok_or_else(|| std::io::Error::other("a chunk without its size line"))?;
        let size_text = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| std::io::Error::other(format!("a chunk size {size_text:?} that is not hexadecimal")))?;
        if size == 0 {
            return Ok(body);
        }
        let chunk = after.get(..size).ok_or_else(|| std::io::Error::other("a chunk shorter than its size"))?;
        body.push_str(chunk);
        rest = after[size..].strip_prefix("\r\n").ok_or_else(|| std::io::Error::other("a chunk not ended by CRLF"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn a_chunked_body_is_put_back_together_even_when_a_chunk_ends_mid_line() {
        let raw = "7\r\nfoo_buc\r\nd\r\nket{le=\"1\"} 3\r\n0\r\n\r\n";
        assert_eq!(dechunk(raw).unwrap(), "foo_bucket{le=\"1\"} 3");
        assert!(dechunk("zz\r\nabc").is_err(), "a size that is not hexadecimal is an error");
    }

    #[test]
    fn a_route_answers_and_an_unknown_path_is_404() {
        let routes = Routes::new().route("/hello", |r| Response::text(200, format!("hi {}", r.query)));
        let server = Server::start("test", local(), routes).unwrap();
        let (status, headers, body) = get(server.address(), "/hello?x=1").unwrap();
        assert_eq!((status, body.as_str()), (200, "hi x=1"));
        assert_eq!(headers["content-length"], "6");
        assert_eq!(get(server.address(), "/nope").unwrap().0, 404);
    }

    #[test]
    fn a_dropped_server_stops_listening() {
        let server = Server::start("test", local(), Routes::new()).unwrap();
        let address = server.address();
        drop(server);
        assert!(TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_err());
    }

    #[test]
    fn merged_routes_answer_every_path() {
        let a = Routes::new().route("/a", |_| Response::text(200, "a"));
        let b = Routes::new().route("/b", |_| Response::text(200, "b"));
        let server = Server::start("test", local(), a.merge(b)).unwrap();
        assert_eq!(get(server.address(), "/a").unwrap().2, "a");
        assert_eq!(get(server.address(), "/b").unwrap().2, "b");
    }
}
