//! Reading this process's memory figures, shared by the examples (included by path).

/// A `/proc/self/status` field given in kB (`VmRSS:`, `VmHWM:`), in MiB; 0 when missing.
pub fn status_mib(field: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}
