//! The socket-level balancer on the real kernel (needs root): loaded into a bpffs of the
//! test's own, attached to a cgroup the test creates, exercised by a shell moved into that
//! cgroup inside a network namespace the test creates; all of it removed at the end.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use svcplane_bpf::maps::{PROTO_TCP, PROTO_UDP};
use svcplane_bpf::{BackendValue, Scope, ServiceFlags, ServiceKey, ServiceValue, SockLb, SockLbOptions};

struct Sandbox {
    netns: String,
    cgroup: PathBuf,
    bpf_root: tempfile::TempDir,
}

impl Sandbox {
    fn new(tag: &str) -> Self {
        let netns = format!("svcplane-bpftest-{}-{tag}", std::process::id());
        run(&["ip", "netns", "add", &netns]);
        run(&["ip", "-n", &netns, "link", "set", "lo", "up"]);
        let cgroup = svcplane_bpf::sys::cgroup2_mount()
            .expect("cgroup2 mount")
            .join(format!("svcplane-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&cgroup).expect("creating the test cgroup");
        Self { netns, cgroup, bpf_root: tempfile::tempdir().expect("temp dir") }
    }

    fn options(&self) -> SockLbOptions {
        SockLbOptions {
            bpf_root: self.bpf_root.path().join("svcplane"),
            cgroup: self.cgroup.clone(),
            sizes: Default::default(),
        }
    }

    /// Runs a bash script inside the cgroup and the namespace; its output and status.
    fn shell(&self, script: &str) -> (bool, String) {
        let procs = self.cgroup.join("cgroup.procs");
        let wrapper = format!(
            "echo $$ > {} && exec timeout 5 ip netns exec {} bash -c '{script}' 2>&1",
            procs.display(),
            self.netns
        );
        let output = Command::new("sh").args(["-c", &wrapper]).output().expect("running sh");
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A TCP listener inside the namespace answering `hello` to one connection at a time.
    fn listener(&self) -> SocketAddr {
        let file = std::fs::File::open(format!("/run/netns/{}", self.netns)).expect("netns file");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            sender.send(listener.local_addr().expect("address")).expect("send");
            let deadline = Instant::now() + Duration::from_secs(20);
            listener.set_nonblocking(true).expect("nonblocking");
            while Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let _ = stream.write_all(b"hello\n");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        receiver.recv_timeout(Duration::from_secs(5)).expect("listener address")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = svcplane_bpf::cleanup(&self.bpf_root.path().join("svcplane"));
        // The shell processes are gone (they exited); the cgroup is empty.
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

fn run(args: &[&str]) {
    let status = Command::new(args[0]).args(&args[1..]).status().expect("running a command");
    assert!(status.success(), "{args:?} failed");
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let required = std::env::var_os("SVCPLANE_REQUIRE_ROOT").is_some_and(|value| value == "1");
    assert!(!required, "loading BPF programs and creating cgroups needs root, and SVCPLANE_REQUIRE_ROOT=1");
    eprintln!("SKIPPED: loading BPF programs and creating cgroups needs root");
    false
}

/// Set `set`'s slots go to the backends array at `set * 16` (tests use small sets).
fn insert_service(lb: &mut SockLb, frontend: &str, proto: u8, set: u32, backends: &[SocketAddr], flags: u32) {
    let first = set * 16;
    for (index, backend) in (first..).zip(backends) {
        lb.backends.set(index, BackendValue::new(*backend), 0).expect("backend insert");
    }
    let key = ServiceKey::new(frontend.parse().unwrap(), proto, Scope::Pod);
    let count = backends.len() as u32;
    let value = ServiceValue { backend_set: set, count, flags, affinity_timeout: 0, port_id: 0, first };
    lb.services.insert(key, value, 0).expect("service insert");
}

#[test]
fn a_connect_to_a_service_address_reaches_its_backend_and_a_rejecting_service_refuses_at_once() {
    if !is_root() {
        return;
    }
    let sandbox = Sandbox::new("connect");
    let backend = sandbox.listener();
    let options = sandbox.options();
    {
        let mut lb = SockLb::open(&options, 0).expect("loading and attaching the balancer");
        assert!(!lb.adopted, "a fresh root has nothing to adopt");
        insert_service(&mut lb, "198.19.0.10:80", PROTO_TCP, 1, &[backend], 0);
        insert_service(&mut lb, "198.19.0.11:80", PROTO_TCP, 2, &[], ServiceFlags::REJECT);
        insert_service(&mut lb, "198.19.0.12:53", PROTO_UDP, 3, &[backend], 0);

        let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.10/80; head -n1 <&3");
        assert!(ok && out.trim() == "hello", "through the Service: {out:?}");

        let started = Instant::now();
        let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.11/80");
        assert!(!ok && out.contains("Connection refused"), "a Service without endpoints: {out:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "refused at once, took {:?}", started.elapsed());

        // Not a Service: untouched (the namespace has no route there).
        let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.13/80");
        assert!(!ok && out.contains("unreachable"), "an address that is no Service: {out:?}");
    }
    // The links are pinned: a second open adopts them.
    let lb = SockLb::open(&options, 0).expect("adopting");
    assert!(lb.adopted, "the second process adopts the pinned links");
    drop(lb);
    let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.10/80; head -n1 <&3");
    assert!(ok && out.trim() == "hello", "still balanced with no process holding the balancer: {out:?}");

    assert!(svcplane_bpf::cleanup(&options.bpf_root).expect("cleanup"), "cleanup found the pins");
    assert!(!Path::new(&options.bpf_root).exists(), "the bpf root is gone");
    let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.10/80");
    assert!(!ok && out.contains("unreachable"), "after cleanup nothing is balanced: {out:?}");
}

#[test]
fn maps_filled_while_the_programs_load_on_another_thread_are_what_the_programs_then_balance_by() {
    if !is_root() {
        return;
    }
    let sandbox = Sandbox::new("split");
    let backend = sandbox.listener();
    let options = sandbox.options();
    let (mut lb, programs) = SockLb::open_maps(&options, 0).expect("opening the maps");
    assert!(
        svcplane_bpf::sock_lb::missing_pins(&options.bpf_root)
            .iter()
            .all(|pin| pin.starts_with(options.bpf_root.join("links"))),
        "the maps are pinned before any program is loaded"
    );
    let loading = std::thread::spawn(move || programs.attach());
    insert_service(&mut lb, "198.19.0.20:80", PROTO_TCP, 7, &[backend], 0);
    let adopted = loading.join().expect("the loading thread").expect("loading and attaching on another thread");
    assert!(!adopted, "a fresh root has nothing to adopt");
    let (ok, out) = sandbox.shell("exec 3<>/dev/tcp/198.19.0.20/80; head -n1 <&3");
    assert!(ok && out.trim() == "hello", "the entry written while the programs loaded: {out:?}");
    drop(lb);

    // A later process adopts the pinned links, and what the maps hold.
    let (lb, programs) = SockLb::open_maps(&options, 0).expect("opening the pinned maps");
    assert!(programs.attach().expect("adopting"), "every program was already linked");
    assert_eq!(lb.services.keys().count(), 1, "the pinned services map is the one written before");
}

/// UDP sockets inside the namespace answering each datagram with `echo`, one per address.
fn udp_echoes(sandbox: &Sandbox, count: usize) -> Vec<SocketAddr> {
    let file = std::fs::File::open(format!("/run/netns/{}", sandbox.netns)).expect("netns file");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let sockets: Vec<std::net::UdpSocket> =
            (0..count).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("bind")).collect();
        sender.send(sockets.iter().map(|s| s.local_addr().expect("address")).collect::<Vec<_>>()).expect("send");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 64];
        while Instant::now() < deadline {
            let mut idle = true;
            for socket in &sockets {
                socket.set_nonblocking(true).expect("nonblocking");
                if let Ok((_, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(b"echo", from);
                    idle = false;
                }
            }
            if idle {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    receiver.recv_timeout(Duration::from_secs(5)).expect("echo addresses")
}

#[test]
fn an_unconnected_udp_socket_that_asked_four_services_sees_each_reply_come_from_the_service_it_asked() {
    if !is_root() {
        return;
    }
    let sandbox = Sandbox::new("udprev");
    let echoes = udp_echoes(&sandbox, 4);
    let options = sandbox.options();
    let mut lb = SockLb::open(&options, 0).expect("loading and attaching the balancer");
    for (i, echo) in echoes.iter().enumerate() {
        insert_service(&mut lb, &format!("198.19.0.{}:53", 40 + i), PROTO_UDP, 10 + i as u32, &[*echo], 0);
    }
    // One socket sends to all four Services before reading any reply: recvfrom must name
    // the Service each reply stands for, not the endpoint, for every one of them.
    let script = sandbox.bpf_root.path().join("client.py");
    std::fs::write(
        &script,
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.settimeout(2)\n\
         for i in range(4):\n    s.sendto(b'q', ('198.19.0.%d' % (40 + i), 53))\n\
         print(sorted('%s:%d' % s.recvfrom(64)[1] for _ in range(4)))\n",
    )
    .expect("writing the client");
    let (ok, out) = sandbox.shell(&format!("python3 {}", script.display()));
    assert!(ok, "the client failed: {out}");
    assert_eq!(
        out.trim(),
        "['198.19.0.40:53', '198.19.0.41:53', '198.19.0.42:53', '198.19.0.43:53']",
        "every reply shows its Service (the endpoints are {echoes:?})"
    );
    drop(lb);
}

#[test]
fn a_loader_made_without_the_kernel_btf_has_none_and_leaves_every_mount_the_process_sees_as_it_was() {
    if !is_root() {
        return;
    }
    // Other tests of this binary mount bpffs roots of their own meanwhile: those are left out.
    let mounts = || {
        let all = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
        all.lines().filter(|line| !line.contains(" - bpf ")).collect::<Vec<_>>().join("\n")
    };
    let before = mounts();
    let loader = svcplane_bpf::loader::loader_without_kernel_btf().expect("a mount namespace of the thread's own");
    assert!(format!("{loader:?}").starts_with("EbpfLoader { btf: None"), "{loader:?}");
    assert_eq!(mounts(), before);
    assert!(Path::new("/sys/kernel/btf/vmlinux").exists(), "the process still sees the kernel's BTF");
}

/// How many TCP sockets' reverse translations `svcplane_tcp_rev` holds under `bpf_root`.
fn tcp_translations(bpf_root: &Path) -> usize {
    let data = aya::maps::MapData::from_pin(bpf_root.join(svcplane_bpf::maps::TCP_REV_MAP)).expect("its pin");
    let map: aya::maps::HashMap<_, u64, [u8; 40]> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).expect("typing it");
    map.keys().count()
}

#[test]
fn a_balanced_tcp_socket_shows_the_service_as_its_peer_and_its_translation_goes_when_it_is_closed() {
    if !is_root() {
        return;
    }
    let sandbox = Sandbox::new("tcprev");
    let backend = sandbox.listener();
    let options = sandbox.options();
    let mut lb = SockLb::open(&options, 0).expect("loading and attaching the balancer");
    // The capacities the sync counts entries against are the kernel's.
    let capacity =
        |map: &str| aya::maps::MapInfo::from_pin(options.bpf_root.join(map)).expect("the map's info").max_entries();
    assert_eq!(capacity(svcplane_bpf::maps::TCP_REV_MAP), options.sizes.reverse);
    assert_eq!(capacity(svcplane_bpf::maps::PORT_NAMES_MAP), options.sizes.services, "one name per service port");
    insert_service(&mut lb, "198.19.0.50:80", PROTO_TCP, 20, &[backend], 0);
    // Three sockets stay open until the test says so: the map holds one translation each
    // meanwhile, and none once they are closed.
    let dir = sandbox.bpf_root.path();
    let (opened, closing) = (dir.join("opened"), dir.join("closing"));
    let script = dir.join("client.py");
    std::fs::write(
        &script,
        format!(
            "import os, socket, time\n\
             sockets = [socket.create_connection(('198.19.0.50', 80), timeout=2) for _ in range(3)]\n\
             print(sorted('%s:%d' % s.getpeername() for s in sockets))\n\
             open('{opened}', 'w').close()\n\
             deadline = time.time() + 4\n\
             while not os.path.exists('{closing}') and time.time() < deadline:\n    time.sleep(0.01)\n\
             for s in sockets:\n    s.close()\n",
            opened = opened.display(),
            closing = closing.display()
        ),
    )
    .expect("writing the client");
    let before = tcp_translations(&options.bpf_root);
    let (held, after) = std::thread::scope(|scope| {
        let client = scope.spawn(|| sandbox.shell(&format!("python3 {}", script.display())));
        let deadline = Instant::now() + Duration::from_secs(4);
        while !opened.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let held = tcp_translations(&options.bpf_root);
        std::fs::write(&closing, "").expect("telling the client to close");
        let (ok, out) = client.join().expect("the client thread");
        assert!(ok, "the client failed: {out}");
        assert_eq!(
            out.trim(),
            "['198.19.0.50:80', '198.19.0.50:80', '198.19.0.50:80']",
            "getpeername shows the Service"
        );
        (held, tcp_translations(&options.bpf_root))
    });
    assert_eq!((before, held, after), (0, 3, 0), "translations before, while open, after close");
    drop(lb);
}
