//! What a store knows of its server: whether the latest probe found it
//! down ([down or overloaded](crate::guide#down-or-overloaded)), and about
//! how long a round trip takes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::BoxError;

/// How long a probe's answer stands for every call of the store.
pub(crate) const STANDS: Duration = Duration::from_secs(1);

/// How long a probe waits for an answer before it reads the server as down.
pub(crate) const PROBE_BOUND: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    probe: Mutex<Probed>,
    /// Whether the latest probe found the server down: read without the
    /// lock, so calls to a server that is up never take it.
    down: AtomicBool,
    /// Woken when a probe in flight is answered (or dropped).
    answered: Notify,
    /// About the link's round trip: the shortest answered statement of the
    /// last two windows of [`RTT_WINDOW`], which slow ones cannot raise.
    rtt: Mutex<Shortest>,
}

/// The latest probe's answer, and whether one is in flight.
#[derive(Debug, Default)]
struct Probed {
    /// When the latest probe was answered, and whether it found it down.
    latest: Option<(Instant, bool)>,
    asking: bool,
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
            probe: Mutex::default(),
            down: AtomicBool::new(false),
            answered: Notify::new(),
            rtt: Mutex::default(),
        }
    }
}

/// What a call does before it tries the server.
enum Before {
    Go,
    /// Found down and still standing, or another call asks: answer at once.
    Down,
    /// The latest probe found the server down and has aged: ask again.
    Ask,
}

impl Health {
    /// Whether the server is down for a call about to try it: the latest
    /// probe found it so and still stands, or another call is asking again.
    /// A call that finds an aged "down" probes.
    pub(crate) async fn down_before(&self, ask: impl Future<Output = Startup>) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return false;
        }
        let before = {
            let probed = self.probed();
            match probed.latest {
                None | Some((_, false)) => Before::Go,
                Some((at, true)) if at.elapsed() < STANDS || probed.asking => Before::Down,
                Some(_) => Before::Ask,
            }
        };
        match before {
            Before::Go => false,
            Before::Down => true,
            Before::Ask => self.down(ask).await,
        }
    }

    /// Whether the server is down, for a call that got no answer: the
    /// latest probe's answer if it stands, else the answer of `ask` or of
    /// the probe already in flight (then `ask` is dropped unpolled).
    pub(crate) async fn down(&self, ask: impl Future<Output = Startup>) -> bool {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let mine = {
                let mut probed = self.probed();
                match probed.latest {
                    Some((at, down)) if at.elapsed() < STANDS => return down,
                    _ if probed.asking => false,
                    _ => {
                        probed.asking = true;
                        true
                    }
                }
            };
            if mine {
                let asking = Asking(self);
                let down = read(tokio::time::timeout(PROBE_BOUND, ask).await);
                asking.answered(down);
                return down;
            }
            answered.await;
        }
    }

    fn probed(&self) -> std::sync::MutexGuard<'_, Probed> {
        self.probe.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An answered statement took `took`, from sending to its answer.
    pub(crate) fn took(&self, took: Duration) {
        let window = self.window_now();
        let mut rtt = self.rtt.lock().unwrap_or_else(PoisonError::into_inner);
        rtt.roll(window);
        rtt.current = Some(rtt.current.map_or(took, |shortest| shortest.min(took)));
    }

    /// About the link's round trip (zero when nothing was measured lately).
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
}

/// What a probe heard: `None` from a source that cannot probe; else a
/// completed startup, or the driver's error.
pub(crate) type Startup = Option<Result<(), BoxError>>;

/// Whether a probe's answer (`Err`: none within [`PROBE_BOUND`]) is a
/// server that is down. A source that cannot probe is never read as down.
fn read(heard: Result<Startup, tokio::time::error::Elapsed>) -> bool {
    let down = match heard {
        Err(_) => true,
        Ok(None | Some(Ok(()))) => false,
        Ok(Some(Err(error))) => !crate::driver::server_answered(&*error),
    };
    crate::metric::probed(down);
    down
}

/// A probe in flight: whoever waits is woken, even if its call is dropped.
struct Asking<'a>(&'a Health);

impl Asking<'_> {
    fn answered(self, down: bool) {
        self.0.probed().latest = Some((Instant::now(), down));
        self.0.down.store(down, Ordering::Relaxed);
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.probed().asking = false;
        self.0.answered.notify_waiters();
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A probe that counts its askers and answers `heard` after `takes`.
    async fn asked(count: &AtomicUsize, takes: Duration, heard: Startup) -> Startup {
        count.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(takes).await;
        heard
    }

    fn refused() -> Startup {
        Some(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )
        .into()))
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_answers_every_call_and_its_answer_stands_a_while() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        let calls =
            (0..1000).map(|_| health.down(asked(&count, Duration::from_millis(5), Some(Ok(())))));
        let answers = futures::future::join_all(calls).await;
        assert!(
            answers.iter().all(|down| !down),
            "an answered startup is up"
        );
        assert_eq!(
            count.load(Ordering::Relaxed),
            1,
            "one probe for 1,000 calls"
        );

        tokio::time::advance(STANDS / 2).await;
        assert!(!health.down(asked(&count, Duration::ZERO, refused())).await);
        assert_eq!(count.load(Ordering::Relaxed), 1, "the answer stands");

        tokio::time::advance(STANDS).await;
        assert!(health.down(asked(&count, Duration::ZERO, refused())).await);
        assert_eq!(count.load(Ordering::Relaxed), 2, "aged: asked again");
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_within_the_bound_is_down_and_a_source_that_cannot_probe_is_never() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        assert!(
            health
                .down(asked(&count, PROBE_BOUND * 2, Some(Ok(()))))
                .await,
            "no answer within the bound"
        );
        tokio::time::advance(STANDS).await;
        assert!(!health.down(asked(&count, Duration::ZERO, None)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn while_down_calls_are_answered_at_once_and_one_probe_per_interval_looks_for_the_way_back()
     {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        assert!(
            !health
                .down_before(asked(&count, Duration::ZERO, refused()))
                .await
        );
        assert_eq!(count.load(Ordering::Relaxed), 0, "nothing heard: go");

        assert!(health.down(asked(&count, Duration::ZERO, refused())).await);
        for _ in 0..100 {
            assert!(
                health
                    .down_before(asked(&count, Duration::ZERO, Some(Ok(()))))
                    .await
            );
        }
        assert_eq!(count.load(Ordering::Relaxed), 1, "answered at once");

        tokio::time::advance(STANDS).await;
        assert!(
            !health
                .down_before(asked(&count, Duration::ZERO, Some(Ok(()))))
                .await,
            "aged: the call that finds it asks, and the first answer ends it"
        );
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_mid_flight_lets_the_next_call_ask() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        let dropped = tokio::time::timeout(
            Duration::from_millis(1),
            health.down(asked(&count, Duration::from_secs(5), Some(Ok(())))),
        )
        .await;
        assert!(dropped.is_err());
        assert!(
            !health
                .down(asked(&count, Duration::ZERO, Some(Ok(()))))
                .await
        );
        assert_eq!(count.load(Ordering::Relaxed), 2);
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
