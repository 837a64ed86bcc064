//! A log layer that keeps the last warnings for the status page (`/status`): each warning
//! names its object, so the page shows which Service or manifest is broken.

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use svcplane_ops::status::RecentWarnings;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

static RECENT: OnceLock<Arc<RecentWarnings>> = OnceLock::new();

/// The process's recent warnings (empty until the layer sees one).
pub fn warnings() -> Arc<RecentWarnings> {
    Arc::clone(RECENT.get_or_init(Arc::default))
}

/// Records WARN and ERROR events into [`warnings`].
pub struct RecentWarningsLayer;

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for RecentWarningsLayer {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        if *event.metadata().level() > Level::WARN {
            return;
        }
        let mut line = Line(String::new());
        event.record(&mut line);
        warnings().push(line.0);
    }
}
