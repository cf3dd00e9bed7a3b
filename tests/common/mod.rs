//! What the test files share, defined once: `tests/suite.rs` declares
//! `mod common;` for every file it holds (each uses `crate::common`), and so
//! does each test binary of its own. A binary of its own uses only some of
//! it, and so does the suite built without some features (hence `dead_code`
//! is allowed here).
//!
//! Here: the budgets and the limit over a long window, the clock the attack
//! tests pin, and the assertions on verdicts and on how long a call took.
//! [`db`]: the databases, the connections a test holds or lends, and what a
//! test reads of them as the system, the superuser or a stranger.
//! [`http`]: a bare HTTP/1.1 client for the example services.
//! [`latency`]: a TCP proxy that lengthens the round trip.
//! [`metrics`]: what a `DebuggingRecorder` saw.
#![allow(dead_code, reason = "each test binary uses only some of the helpers")]

pub mod bouncer;
pub mod db;
pub mod faults;
pub mod hostile_keys;
pub mod http;
pub mod latency;
pub mod metrics;
pub mod verdicts;
pub mod wire;

use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{ErrorKind, Limit, ManualClock, Verdict};
use tokio::time::Instant;

/// A window long enough that no test straddles two windows of the database's
/// clock (they open every 30 days since the Unix epoch).
pub const LONG_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The budget of the tests that make the store unreachable.
pub const BUDGET: Duration = Duration::from_millis(500);

/// How long a probe's answer stands, and the most a probe waits for the
/// server: the guide's "down or overloaded" gives both as one second.
pub const PROBE: Duration = Duration::from_millis(1000);

/// How much longer than its budget an unreachable call may take: scheduling
/// on a busy machine, not a speed target. A call that ignored its budget
/// would take as long as the fault lasts (forever, for a silent server, a
/// held lock or a source that never yields).
pub const SLACK: Duration = Duration::from_millis(1500);

/// The budget of calls that must be counted, far longer than the default of
/// 2 seconds on purpose: a call that ran out of budget would fail open
/// without counting, and fail a test about counting for the wrong reason.
/// Under load, 32 connections queue on one row lock on a machine with two
/// busy cores; after a failover, a call connects to a server that may have
/// just been promoted. The budget itself is tested with [`BUDGET`].
pub const PATIENT: Duration = Duration::from_secs(10);

/// A limit over [`LONG_WINDOW`].
pub fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, LONG_WINDOW).expect("a valid limit")
}

/// The time the attack tests pin: 2026-01-01 10:30:00 UTC, in the middle of
/// the hour window 10:00–11:00 UTC.
pub const JAN_1_1030_UTC: u64 = 1_767_263_400;
pub const JAN_1_1000_UTC: u64 = JAN_1_1030_UTC - 30 * 60;
pub const JAN_1_1100_UTC: u64 = JAN_1_1030_UTC + 30 * 60;

/// The clock of every limiter of the attack tests, pinned at 10:30 UTC, so
/// that no test straddles two windows.
pub fn pinned_clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(JAN_1_1030_UTC))
}

/// How many cases a property test plays: `PROPTEST_CASES` if set, else
/// `full` under CI (`CI` set, as `.ci/run` sets it) and a quarter of it, at
/// least 8, on a developer's machine, for a fast loop.
pub fn cases(full: u32) -> u32 {
    let local = || {
        if std::env::var_os("CI").is_some() {
            full
        } else {
            (full / 4).max(8)
        }
    };
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(local)
}

/// Runs `call` and returns its output and how long it took. Fails the test
/// when the call is still running after `bound`, instead of hanging with it.
pub async fn timed<T>(
    bound: Duration,
    what: &str,
    call: impl IntoFuture<Output = T>,
) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(bound, call.into_future()).await {
        Ok(output) => (output, started.elapsed()),
        Err(_) => panic!("{what}: still running after {bound:?}"),
    }
}

/// Asserts that the call was shed: the store was up and too busy to answer
/// within the budget, so it was refused, counted nowhere, with a short
/// `Retry-After`, and never read as unreachable.
#[track_caller]
pub fn assert_shed(verdict: &Verdict, what: &str) {
    assert!(
        verdict.is_shed() && verdict.is_refused() && !verdict.is_unreachable(),
        "{what}: expected shed, got {verdict:?}"
    );
    let cause = verdict.shed().expect("a shed verdict has a cause");
    assert_eq!(cause.kind(), ErrorKind::Overloaded, "{what}: {cause:?}");
    assert!(!cause.is_unreachable(), "{what}: {cause:?}");
    assert_eq!(verdict.count(), None, "{what}: nothing counted");
    assert_eq!(
        verdict.retry_after(),
        Some(Verdict::SHED_RETRY_AFTER),
        "{what}"
    );
}

/// Asserts that the verdict was counted by the store, not allowed blindly.
#[track_caller]
pub fn assert_counted(verdict: &Verdict, what: &str) {
    assert!(
        !verdict.is_unreachable(),
        "{what}: the store was unreachable: {:?}",
        verdict.unreachable()
    );
}
