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
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The latest answer from the server and the latest failure to get one, as
/// microseconds since `base` plus one (0: never).
#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    answered: AtomicU64,
    failed: AtomicU64,
    /// About the link's round trip: the shortest answered statement of the
    /// last two windows of [`RTT_WINDOW`] (a statement's time includes the
    /// server's own work and waits, so never less than the round trip; the
    /// shortest of recent ones is the closest to it, and a flood of slow
    /// ones does not raise it while a fast one comes now and then).
    rtt: Mutex<Shortest>,
}

/// How long a shortest round trip is kept: two windows of this.
const RTT_WINDOW: Duration = Duration::from_secs(10);

/// The shortest statement of the current window and of the one before.
#[derive(Debug, Default)]
struct Shortest {
    window: u64,
    current: Option<Duration>,
    previous: Option<Duration>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            base: Instant::now(),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rtt: Mutex::default(),
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
        let window = self.window_now();
        let mut rtt = self.rtt.lock().unwrap_or_else(PoisonError::into_inner);
        rtt.roll(window);
        rtt.current = Some(rtt.current.map_or(took, |shortest| shortest.min(took)));
    }

    /// About the link's round trip (zero before the first answer, and after
    /// two windows without one).
    pub(crate) fn round_trip(&self) -> Duration {
        let window = self.window_now();
        let mut rtt = self.rtt.lock().unwrap_or_else(PoisonError::into_inner);
        rtt.roll(window);
        match (rtt.current, rtt.previous) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_default(),
        }
    }

    fn window_now(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.base);
        u64::try_from(since.as_nanos() / RTT_WINDOW.as_nanos()).unwrap_or(u64::MAX)
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

impl Shortest {
    /// Moves on to `window`, forgetting what is older than the one before.
    fn roll(&mut self, window: u64) {
        if window == self.window {
            return;
        }
        self.previous = if window == self.window + 1 {
            self.current
        } else {
            None
        };
        self.current = None;
        self.window = window;
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

    #[tokio::test(start_paused = true)]
    async fn the_round_trip_is_the_shortest_recent_statement_and_slow_ones_do_not_raise_it() {
        let health = Health::default();
        assert_eq!(health.round_trip(), Duration::ZERO, "nothing measured yet");
        health.took(Duration::from_millis(5));
        for _ in 0..100 {
            // A flood of statements that waited on a lock.
            health.took(Duration::from_millis(400));
        }
        assert_eq!(health.round_trip(), Duration::from_millis(5));
        tokio::time::advance(RTT_WINDOW).await;
        health.took(Duration::from_millis(400));
        assert_eq!(
            health.round_trip(),
            Duration::from_millis(5),
            "kept for the window after"
        );
        tokio::time::advance(RTT_WINDOW).await;
        assert_eq!(
            health.round_trip(),
            Duration::from_millis(400),
            "then forgotten"
        );
        tokio::time::advance(RTT_WINDOW * 2).await;
        assert_eq!(health.round_trip(), Duration::ZERO, "nothing recent");
    }
}
