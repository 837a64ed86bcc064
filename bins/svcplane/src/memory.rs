//! Giving freed memory back to the system after the work that frees the most: the proxy's
//! full syncs, and cluster DNS's zone swaps (`dns.rs` calls [`trim`] after each).
//!
//! A full sync (the cold start above all) builds the whole ruleset and its netlink
//! messages, then drops them; glibc's allocator keeps most of such freed memory mapped in
//! its arenas, so the process's RSS would stay near its peak for good. After each full sync
//! this hook asks the allocator to return its free pages (`malloc_trim`); partial syncs
//! free little and are left alone.
//!
//! The proxy also limits glibc's malloc arenas ([`limit_arenas`], [`proxy_arenas`]): glibc
//! otherwise gives each thread that allocates an arena of its own (up to 8 per core), and
//! the watch thread's arena, where every object is converted, ends up holding the converted
//! model among the freed remains of the lists it was decoded from. At 10k Services x 10
//! endpoints `MALLOC_ARENA_MAX=2` took the kept RSS from 84.5 to 77.3 MiB. Fed by an API
//! server the proxy now runs on one arena: with two, which threads shared the sync
//! thread's arena depended on who allocated first, and five starts of fourteen kept 59-61
//! MiB instead of 52-53 (peak ~158 against ~146); with one, fourteen of fourteen kept 52-54
//! MiB (peak 142-143), the first sync 6 % later under load. The manifests feed parses on
//! parallel threads, which one arena would serialize, so it keeps two (`docs/benchmarks.md`,
//! "The API-mode starts that kept more"); in eBPF mode three. There the feed's first read
//! is the whole cold start, and with two arenas its two planning threads shared one arena
//! in about one start of five (hundreds of thousands of futex calls, the controller step
//! 0.75-0.85 s instead of ~0.33 s); a third arena ended that for ~4 MiB of RSS. nftables
//! mode keeps two: there a third arena kept 10-15 MiB more after the sync's ruleset. Fed by
//! manifests in eBPF mode, the proxy also fixes glibc's trim and mmap thresholds
//! ([`fix_thresholds`]), so that the free tops of the parse and planning threads' arenas
//! are given back.

use svcplane_sync::{AfterSync, Synced};

/// The after-sync hook that trims the allocator after every full sync.
#[derive(Debug, Default)]
pub struct ReturnFreedMemory;

impl AfterSync for ReturnFreedMemory {
    fn synced(&mut self, sync: &Synced<'_>) {
        if sync.report.full {
            trim();
        }
    }
}

/// Returns the allocator's free pages to the system.
#[allow(unsafe_code, reason = "one libc call without preconditions")]
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it touches no live
    // allocation and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How many malloc arenas `svcplane proxy` runs with: one fed by an API server (one watch
/// thread decodes, one sync thread keeps the model); for the manifests feed (its parse and
/// planning run on parallel threads) two, three in eBPF mode (see the module).
pub fn proxy_arenas(source: &crate::cli::SourceArgs, mode: crate::cli::Mode) -> i32 {
    match (source.manifests.is_some(), mode) {
        (false, _) => 1,
        (true, crate::cli::Mode::Ebpf) => 3,
        (true, _) => 2,
    }
}

/// At most `arenas` malloc arenas for this process, unless `MALLOC_ARENA_MAX` says otherwise.
#[allow(unsafe_code, reason = "one libc call without preconditions")]
pub fn limit_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes the allocator's parameters; M_ARENA_MAX takes
        // effect for arenas created later.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// The fixed trim threshold for a proxy fed by manifests (see [`fix_thresholds`]).
const TRIM_THRESHOLD: i32 = 1 << 20;
/// The fixed mmap threshold for a proxy fed by manifests (see [`fix_thresholds`]).
const MMAP_THRESHOLD: i32 = 4 << 20;

/// Whether `svcplane proxy` fixes glibc's trim and mmap thresholds (see [`fix_thresholds`]):
/// fed by manifests in eBPF mode, whose parse and planning threads allocate in three arenas.
/// Not in nftables mode: there it kept 77-78 MiB against 77-85, but the cold start took
/// ~5 % longer (the ruleset's large buffers mapped and unmapped, the heap trimmed as they
/// are freed), where in eBPF mode it took about as long.
pub fn proxy_fixes_thresholds(source: &crate::cli::SourceArgs, mode: crate::cli::Mode) -> bool {
    source.manifests.is_some() && mode == crate::cli::Mode::Ebpf
}

/// Fixes glibc's trim threshold at 1 MiB and its mmap threshold at 4 MiB, unless
/// `MALLOC_TRIM_THRESHOLD_` or `MALLOC_MMAP_THRESHOLD_` says otherwise.
///
/// By default glibc raises both thresholds as large blocks are freed (the trim threshold to
/// twice the mmap threshold, up to 64 MiB). `malloc_trim` returns the free pages inside
/// every arena but trims the top of the main arena only: the top of another arena shrinks
/// only when a free reaches it and the top exceeds the trim threshold. The manifests feed's
/// parse and planning threads leave tens of MiB free at the top of their arenas after a
/// first read, which the raised threshold then kept resident for good (in eBPF mode, with
/// three arenas, 92-97 MiB kept against 85-86 with the thresholds fixed, the first read no
/// slower; `docs/benchmarks.md`, "Names inline, arenas trimmed").
#[allow(unsafe_code, reason = "libc calls without preconditions")]
pub fn fix_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only changes the allocator's parameters; setting either threshold
        // also stops glibc from adjusting them.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn proxy_source(flags: &[&str]) -> crate::cli::SourceArgs {
        let argv = ["svcplane", "proxy"].iter().chain(flags).copied();
        match Cli::try_parse_from(argv).expect("flags parse").command {
            Command::Proxy(args) => args.source,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_proxy_runs_on_one_malloc_arena_fed_by_an_api_server_and_on_two_or_three_fed_by_manifests() {
        use crate::cli::Mode;
        assert_eq!(super::proxy_arenas(&proxy_source(&["--kubeconfig", "/nonexistent"]), Mode::Ebpf), 1);
        assert_eq!(super::proxy_arenas(&proxy_source(&[]), Mode::Nftables), 1, "in a Pod: the in-cluster config");
        assert_eq!(super::proxy_arenas(&proxy_source(&["--manifests", "/nonexistent"]), Mode::Nftables), 2);
        assert_eq!(super::proxy_arenas(&proxy_source(&["--manifests", "/nonexistent"]), Mode::Ebpf), 3);
    }

    #[test]
    fn the_proxy_fixes_the_allocator_s_thresholds_fed_by_manifests_in_ebpf_mode_only() {
        use crate::cli::Mode;
        let manifests = proxy_source(&["--manifests", "/nonexistent"]);
        assert!(super::proxy_fixes_thresholds(&manifests, Mode::Ebpf));
        assert!(!super::proxy_fixes_thresholds(&manifests, Mode::Nftables));
        assert!(!super::proxy_fixes_thresholds(&proxy_source(&["--kubeconfig", "/nonexistent"]), Mode::Ebpf));
        assert!(!super::proxy_fixes_thresholds(&proxy_source(&[]), Mode::Ebpf));
    }
}
