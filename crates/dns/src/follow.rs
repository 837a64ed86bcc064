//! Keeping the served zone in step with a feed: every discovery view that arrives becomes a
//! new zone, built off to the side and swapped in whole.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use svcplane_core::discovery::ClusterView;
use tracing::info;

use crate::handler::SharedZone;
use crate::zone::{Zone, ZoneConfig};

/// Builds and publishes a zone for every view `views` delivers (of views queued meanwhile,
/// only the newest) until the sender is gone. `published` runs after each swap, once the
/// view and the zone it replaced are dropped (the binary returns freed memory then).
pub fn follow_views(
    views: Receiver<ClusterView>,
    config: Arc<ZoneConfig>,
    zone: SharedZone,
    published: impl Fn() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("dns-zone".to_owned()).spawn(move || {
        let mut serial = 0u32;
        while let Ok(first) = views.recv() {
            let view = views.try_iter().last().unwrap_or(first);
            let started = Instant::now();
            serial = next_serial(serial);
            let built = Zone::build(Arc::clone(&config), &view, serial);
            info!(
                services = built.service_count(),
                serial,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "zone updated"
            );
            zone.publish(built);
            drop(view);
            published();
        }
    })
}

/// The Unix time, or one more than the previous serial when the clock has not moved on.
pub fn next_serial(previous: u32) -> u32 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
    let now = u32::try_from(now).unwrap_or(u32::MAX);
    now.max(previous.wrapping_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_never_go_backwards() {
        let now = next_serial(0);
        assert!(next_serial(now) > now);
        assert_eq!(next_serial(u32::MAX - 1), u32::MAX);
    }
}
