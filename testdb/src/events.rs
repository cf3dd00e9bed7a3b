//! What a test sees of the `tracing` events a limiter emits: a subscriber
//! that keeps each event's level and fields.

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A subscriber that keeps every event, as its level and its fields written
/// `name=value ` (the message is the field `message`). Clones share what
/// they saw.
#[derive(Clone, Debug, Default)]
pub struct Seen(Arc<Mutex<Vec<(Level, String)>>>);

impl Seen {
    /// Runs the future `work` makes, to its end, on a current-thread runtime
    /// of its own with a fresh `Seen` as the subscriber; `work` is given a
    /// clone, to read what is seen as it goes. Returns what was seen.
    pub fn during<F: Future<Output = ()>>(work: impl FnOnce(Seen) -> F) -> Seen {
        let seen = Seen::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        tracing::subscriber::with_default(seen.clone(), || {
            runtime.block_on(work(seen.clone()));
        });
        seen
    }

    /// Every event seen so far, in order.
    pub fn events(&self) -> Vec<(Level, String)> {
        self.0.lock().expect("not poisoned").clone()
    }

    /// The fields of every event seen at `level`.
    pub fn at(&self, level: Level) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|(seen, _)| *seen == level)
            .map(|(_, fields)| fields)
            .collect()
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Seen {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .expect("not poisoned")
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
