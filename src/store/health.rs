//! What this process last heard from PostgreSQL: the line between a server
//! that is down and one that is busy (the guide's
//! [down or overloaded](crate::guide#down-or-overloaded)).
//!
//! A call whose budget runs out is answered by what the store heard while
//! the call waited: if PostgreSQL answered any of this store's statements
//! since the call began, the server is up and the call waited because of
//! load (a full pool, a queue of merged writes, a slow shared statement):
//! it is shed. If nothing was answered since, the server is down when this
//! call's own statement went unanswered, when its connection source was
//! opening a connection, when this store has never been answered, or when
//! its latest news of the server is a failure (a lost connection, a
//! statement with no answer at all).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The latest answer from the server and the latest failure to get one, as
/// microseconds since `base` plus one (0: never).
#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    answered: AtomicU64,
    failed: AtomicU64,
    /// About the link's round trip, in microseconds: the time answered
    /// statements took, falling at once to a shorter one and rising slowly
    /// to longer ones (the server's own work included, so never less than
    /// the round trip).
    rtt_micros: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            base: Instant::now(),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rtt_micros: AtomicU64::new(0),
        }
    }
}

impl Health {
    fn stamp(&self, at: Instant) -> u64 {
        let micros = at.saturating_duration_since(self.base).as_micros();
        u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1
    }

    /// PostgreSQL answered a statement (a row, or an error with a SQLSTATE).
    pub(crate) fn answered(&self) {
        self.answered
            .fetch_max(self.stamp(Instant::now()), Ordering::Relaxed);
    }

    /// A connection failed or was lost, or a statement got no answer at all.
    pub(crate) fn failed(&self) {
        self.failed
            .fetch_max(self.stamp(Instant::now()), Ordering::Relaxed);
    }

    /// An answered statement took `took`, from sending to its answer.
    pub(crate) fn took(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .rtt_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |rtt| {
                Some(if rtt == 0 || sample <= rtt {
                    sample
                } else {
                    rtt + (sample - rtt) / 16
                })
            });
    }

    /// About the link's round trip (zero before the first answer).
    pub(crate) fn round_trip(&self) -> Duration {
        Duration::from_micros(self.rtt_micros.load(Ordering::Relaxed))
    }

    /// Whether the server is down, by what was heard, for a call that began
    /// at `since` and ran out of budget without an answer of its own:
    /// nothing was answered since, and either nothing ever was, the latest
    /// news is a failure, or the call itself is evidence (`own`: its own
    /// statement went unanswered, or its connection source was opening a
    /// connection).
    pub(crate) fn down_since(&self, since: Instant, own: bool) -> bool {
        let answered = self.answered.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        answered < self.stamp(since) && (answered == 0 || failed >= answered || own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_server_is_down_only_when_nothing_was_answered_while_the_call_waited() {
        let health = Health::default();
        let start = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            health.down_since(start, false),
            "never answered: no sign it is up"
        );

        health.answered();
        tokio::time::advance(Duration::from_millis(1)).await;
        let later = Instant::now();
        assert!(
            !health.down_since(start, false),
            "answered while the call waited"
        );
        assert!(
            !health.down_since(later, false),
            "answered before, and no failure since: a wait is load"
        );

        tokio::time::advance(Duration::from_millis(1)).await;
        health.failed();
        assert!(
            health.down_since(later, false),
            "the latest news of the server is a failure"
        );
        assert!(
            !health.down_since(start, false),
            "but it answered after `start`"
        );

        tokio::time::advance(Duration::from_millis(1)).await;
        health.answered();
        assert!(!health.down_since(later, false), "answered again");

        tokio::time::advance(Duration::from_millis(1)).await;
        let last = Instant::now();
        assert!(
            !health.down_since(last, false),
            "a wait after an answer is load"
        );
        assert!(
            health.down_since(last, true),
            "but not when the call's own statement went unanswered"
        );
    }
}
