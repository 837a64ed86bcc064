//! Lab name prefixes (`sp` + 4 hex digits) and the lock files that say a prefix is in use.
//!
//! A live lab holds an exclusive `flock` on `/run/svcplane-testbed/<prefix>.lock` from before
//! it creates its first namespace until after it deleted its last one. The kernel drops the
//! lock when the process dies, so namespaces whose prefix has an unlocked lock file are
//! leftovers of a crashed run and may be removed.

use std::collections::hash_map::RandomState;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the lock files live (a tmpfs, emptied at boot like `/var/run/netns`).
pub const LOCK_DIR: &str = "/run/svcplane-testbed";

const PREFIX_START: &str = "sp";
const PREFIX_LEN: usize = 6;
const MAX_ATTEMPTS: u32 = 64;

/// Whether `name` is a lab prefix: `sp` followed by four lowercase hex digits.
pub fn is_prefix(name: &str) -> bool {
    name.len() == PREFIX_LEN
        && name.starts_with(PREFIX_START)
        && name[PREFIX_START.len()..].bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The lab prefix of a namespace name like `sp1a2b-n1p1`, if it has one.
pub fn prefix_of(namespace: &str) -> Option<&str> {
    let (prefix, rest) = namespace.split_once('-')?;
    (is_prefix(prefix) && !rest.is_empty()).then_some(prefix)
}

/// An exclusive claim on a prefix; released (and its lock file removed) on drop.
#[derive(Debug)]
pub struct PrefixLock {
    prefix: String,
    path: PathBuf,
    file: File,
    keep_file: bool,
}

impl PrefixLock {
    /// Claims a prefix nobody else holds. Candidates mix the pid, a process-wide counter and
    /// a per-process random key, so parallel labs in one process and in several processes
    /// pick different prefixes; the lock settles any collision.
    pub fn acquire() -> std::io::Result<PrefixLock> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(LOCK_DIR)?;
        let seed = RandomState::new();
        for _ in 0..MAX_ATTEMPTS {
            let mut hasher = seed.build_hasher();
            hasher.write_u32(std::process::id());
            hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
            let prefix = format!("{PREFIX_START}{:04x}", hasher.finish() & 0xffff);
            if let Some(lock) = PrefixLock::try_claim(&prefix, true)? {
                return Ok(lock);
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free lab prefix after {MAX_ATTEMPTS} attempts"),
        ))
    }

    /// Claims `prefix` if nobody holds it. With `create` false, a missing lock file counts as
    /// "not ours to claim" (the namespaces were not made by a lab, or are being torn down).
    pub fn try_claim(prefix: &str, create: bool) -> std::io::Result<Option<PrefixLock>> {
        let path = PathBuf::from(LOCK_DIR).join(format!("{prefix}.lock"));
        let file = match OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&path) {
            Ok(file) => file,
            Err(error) if !create && error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(error)) => return Err(error),
        }
        // The previous holder may have unlinked the file between our open and our lock:
        // then we locked an orphan inode and the claim does not count.
        let still_there = fs::metadata(&path)
            .map(|meta| meta.ino() == file.metadata().map(|own| own.ino()).unwrap_or(0))
            .unwrap_or(false);
        if !still_there {
            return Ok(None);
        }
        Ok(Some(PrefixLock { prefix: prefix.to_owned(), path, file, keep_file: false }))
    }

    /// The claimed prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Releases the claim but keeps the lock file, so that the next lab removes the
    /// namespaces this one could not.
    pub fn release_for_sweep(mut self) {
        self.keep_file = true;
    }
}

impl Drop for PrefixLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock, so nobody can claim the old inode.
        if !self.keep_file {
            let _ = fs::remove_file(&self.path);
        }
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_sp_and_four_hex_digits() {
        assert!(is_prefix("sp1a2b"));
        assert!(!is_prefix("sp1A2b"));
        assert!(!is_prefix("sp1a2"));
        assert!(!is_prefix("svcp-x"));
        assert_eq!(prefix_of("sp00ff-n1p2"), Some("sp00ff"));
        assert_eq!(prefix_of("sp00ff-"), None);
        assert_eq!(prefix_of("svcp-exp"), None);
        assert_eq!(prefix_of("sp00ffn1"), None);
    }
}
