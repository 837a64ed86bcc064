//! One error type for the mechanism, keeping each cause and naming what is missing.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the BPF object {object} (needs root or CAP_BPF + CAP_NET_ADMIN, and a kernel with BPF and BTF)")]
    Load {
        object: &'static str,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("BPF program {program}: {what} (the kernel may lack cgroup sock_addr / tcx support, or we lack CAP_BPF)")]
    Program {
        program: &'static str,
        what: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("BPF link of {program}: {what}")]
    Link {
        program: &'static str,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("BPF map {map}: {what}")]
    Map {
        map: &'static str,
        what: String,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("BPF map {map} is missing from the object")]
    MissingMap { map: &'static str },
    #[error("BPF map {map} is full ({capacity} entries): raise its size{}", crate::upgrade::size_option(map).map(|option| format!(" (`svcplane proxy {option}`)")).unwrap_or_default())]
    MapFull { map: &'static str, capacity: u32 },
    #[error("cgroup v2 directory {path}: {what}")]
    Cgroup {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no cgroup2 file system is mounted (looked in /proc/self/mountinfo): the kernel lacks cgroup v2 or it is not mounted"
    )]
    NoCgroup2,
    #[error("bpffs at {path}: {what}")]
    BpfFs {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}
