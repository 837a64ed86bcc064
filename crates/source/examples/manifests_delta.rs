//! The manifests feed's own work at scale, in process: the incremental feed
//! (`ManifestsFeed::poll_changes`) against the complete pipeline it replaced for the proxy
//! (`load_directory` + reconcile + convert + diff of everything, `ManifestsFeed::changes`),
//! same inputs, same run.
//!
//! ```text
//! cargo run --release -p svcplane-source --example manifests_delta -- 10000 10 3
//! ```
//!
//! Arguments: Services, endpoints per Service, repeats (one Pod edit each). Inputs are the
//! scale benchmark's: 100 part files plus `nodes.yaml`, explicit ClusterIPs, ready Pods on
//! `node1..node10`. Each mode runs in a child process of its own, so its VmRSS / VmHWM are
//! its own: cold (first read of the whole directory), then per repeat one Pod's address
//! changed by rewriting its part file (a 1% file), timed from the rewrite to the changes.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use svcplane_controller::{AllocatorConfig, NodePortRange};
use svcplane_source::{ManifestsFeed, ManifestsSettings, load_directory};

#[path = "support/proc_status.rs"]
mod proc_status;
use proc_status::status_mib;

const FILES: usize = 100;
const NODES: usize = 10;

type Error = Box<dyn std::error::Error>;

fn write_part(
    dir: &Path,
    file: usize,
    services: usize,
    endpoints: usize,
    moved: &[(usize, Ipv4Addr)],
) -> Result<(), Error> {
    let mut text = String::new();
    for s in file * services / FILES..(file + 1) * services / FILES {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 16)) + s as u32);
        writeln!(
            text,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{s}\n  namespace: bench\nspec:\n  type: ClusterIP\n  clusterIP: {ip}\n  selector:\n    app: svc-{s}\n  ports:\n    - name: http\n      protocol: TCP\n      port: 80\n      targetPort: 8080\n---"
        )?;
        for e in 0..endpoints {
            let ip = match moved.iter().rev().find(|(service, _)| *service == s) {
                Some(&(_, ip)) if e == 0 => ip,
                _ => {
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + ((s * endpoints + e) % 32000) as u32 + 1)
                }
            };
            let node = (s * endpoints + e) % NODES + 1;
            writeln!(
                text,
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: svc-{s}-{e}\n  namespace: bench\n  labels:\n    app: svc-{s}\nspec:\n  nodeName: node{node}\n  containers:\n    - name: app\n      image: bench\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n    - ip: {ip}\n  conditions:\n    - type: Ready\n      status: \"True\"\n---"
            )?;
        }
    }
    let path = dir.join(format!("part-{file:03}.yaml"));
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, &path)?;
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// One mode, in this process: prints one result line.
fn run_mode(mode: &str, dir: &Path, services: usize, endpoints: usize, repeat: usize) -> Result<(), Error> {
    let settings = ManifestsSettings {
        dir: dir.to_path_buf(),
        allocator: AllocatorConfig {
            service_cidrs: vec!["198.19.0.0/16".parse()?],
            node_port_range: NodePortRange::DEFAULT,
        },
        allocations_file: None,
        saves_allocations: false,
    };
    let mut feed = ManifestsFeed::new(settings)?;
    let incremental = mode == "feed";
    let read = |feed: &mut ManifestsFeed| -> Result<usize, Error> {
        let changes = if incremental { feed.poll_changes() } else { feed.changes(load_directory(dir)) };
        Ok(changes.ok_or("nothing read")?.len())
    };
    let started = Instant::now();
    let cold_changes = read(&mut feed)?;
    let cold = started.elapsed();
    let rss_cold = status_mib("VmRSS:");
    if incremental {
        eprintln!("{mode}: cold read phases: {:?}", feed.phases());
    }
    let mut edits = Vec::new();
    let mut moved = Vec::new();
    for k in 0..repeat {
        let service = (k * services / repeat + services / (2 * repeat)) | 1;
        moved.push((service, Ipv4Addr::new(198, 18, 96, k as u8 + 1)));
        // The file's times must differ from the previous version's.
        std::thread::sleep(Duration::from_millis(20));
        write_part(dir, service * FILES / services, services, endpoints, &moved)?;
        let started = Instant::now();
        let changes = read(&mut feed)?;
        edits.push(started.elapsed());
        if changes != 1 {
            return Err(format!("{mode}: expected one change, got {changes}").into());
        }
    }
    edits.sort();
    let counters = feed.counters();
    let reads = if incremental {
        format!("{} files read, {} documents parsed in all", counters.files_read, counters.documents_parsed)
    } else {
        "every file and document, every time".to_owned()
    };
    println!(
        "| {mode} | {} ({cold_changes} changes) | {} | {} | {:.0} MiB | {:.0} MiB | {reads} |",
        ms(cold),
        ms(edits[edits.len() / 2]),
        ms(edits[0]),
        rss_cold,
        status_mib("VmHWM:"),
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--mode") {
        let [_, mode, dir, services, endpoints, repeat] = &args[..] else { return Err("bad child arguments".into()) };
        return run_mode(mode, Path::new(dir), services.parse()?, endpoints.parse()?, repeat.parse()?);
    }
    let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse::<usize>());
    let (services, endpoints, repeat) = (number(0, 10_000)?, number(1, 10)?, number(2, 3)?);
    if !(FILES..=60_000).contains(&services) || !(1..=50).contains(&endpoints) || !(1..=20).contains(&repeat) {
        return Err("services in 100..=60000, endpoints in 1..=50, repeats in 1..=20".into());
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let root = std::env::temp_dir().join(format!("svcplane-manifests-delta-{}-{nanos}", std::process::id()));
    println!("{services} Services x {endpoints} endpoints, {FILES} files, {repeat} Pod edits per mode\n");
    println!("| pipeline | cold read | one Pod edit (median) | min | VmRSS after cold | VmHWM | reads |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
    let result = (|| -> Result<(), Error> {
        for mode in ["complete", "feed"] {
            let dir: PathBuf = root.join(mode);
            std::fs::create_dir_all(&dir)?;
            let mut nodes = String::new();
            for n in 1..=NODES {
                writeln!(nodes, "apiVersion: v1\nkind: Node\nmetadata:\n  name: node{n}\n---")?;
            }
            std::fs::write(dir.join("nodes.yaml"), nodes)?;
            for file in 0..FILES {
                write_part(&dir, file, services, endpoints, &[])?;
            }
            let status = Command::new(std::env::current_exe()?)
                .args(["--mode", mode])
                .arg(&dir)
                .args([services.to_string(), endpoints.to_string(), repeat.to_string()])
                .status()?;
            if !status.success() {
                return Err(format!("{mode}: {status}").into());
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&root);
    result
}
