//! Capturing what a service in the test's process logs, to assert that
//! something did not happen (a failed commit, a reload) where no answer or
//! metric shows it.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The events logged at WARN or ERROR, and any whose text contains one of
/// the `also` words, as `LEVEL target: field=value ...` lines.
#[derive(Clone, Default)]
pub struct Captured {
    lines: Arc<Mutex<Vec<String>>>,
    also: Arc<Vec<&'static str>>,
}

impl Captured {
    /// Captures this thread's events until the guard drops. Both backends'
    /// runners ([`crate::on_both_backends!`]) run the test and every task it
    /// spawns on one thread, so that is everything the services started by
    /// the test log.
    pub fn on_this_thread(also: &[&'static str]) -> (Self, DefaultGuard) {
        let captured = Self {
            lines: Arc::default(),
            also: Arc::new(also.to_vec()),
        };
        let subscriber = tracing_subscriber::registry().with(captured.clone());
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// The lines captured so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl<S: Subscriber> Layer<S> for Captured {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let level = *event.metadata().level();
        if level <= Level::WARN || self.also.iter().any(|word| fields.0.contains(word)) {
            let target = event.metadata().target();
            let line = format!("{level} {target}:{}", fields.0);
            self.lines.lock().unwrap().push(line);
        }
    }
}

/// An event's fields as ` name=value` text.
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}
