//! Slow commits, in a database of its own: its commits wait
//! [`COMMIT_DELAY_US`] before their WAL flush (`commit_delay`, with
//! `commit_siblings` 0 so that every commit waits), as on a server whose
//! flushes are slow. [`WIDE`] callers over [`WIDE`] connections run
//! `failed` on random keys through one limiter shared by them all, in each
//! round one right after the other: one statement per call (merging and
//! the refusal cache off), the defaults, and one write in flight fixed.
//!
//! `commit_delay` waits only before a flush: on a server whose commits do
//! not flush (`fsync` or `synchronous_commit` off, which `DATABASE_URL`
//! may name), the group is skipped.

use std::sync::Arc;

use platformkit_limit::{Limit, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::Server;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::measure::{Sample, Summary, measure};
use crate::operations::{Keys, Pool, defaults_limiter, limiter, shared_failed_op};
use crate::purge::drop_unless_owned;
use crate::report::{show_medians, show_ratio};
use crate::{Mode, WIDE};

/// How long each commit waits before its flush, in microseconds.
const COMMIT_DELAY_US: u32 = 2_000;

/// The limiters measured, in the order of a round.
const HOW: [&str; 3] = [
    "one statement per call",
    "defaults",
    "one write in flight fixed",
];

/// Each round's `failed` through each limiter, and the defaults' ops/s
/// over the others'.
#[derive(Serialize)]
pub(crate) struct SlowCommitsReport {
    pub(crate) commit_delay_us: u32,
    limiters: [Measured; 3],
    /// Per round: the defaults' ops/s over one statement per call's.
    pub(crate) defaults_over_one_statement: Vec<f64>,
    /// Per round: the defaults' ops/s over one write in flight's.
    pub(crate) defaults_over_one_in_flight: Vec<f64>,
}

#[derive(Serialize)]
struct Measured {
    how: &'static str,
    samples: Vec<Sample>,
}

/// Slows the commits of a database of its own, then in each round measures
/// `failed` through each of [`HOW`]; `None` when the server's commits do
/// not flush.
pub(crate) async fn run(server: &Server, mode: Mode) -> Option<SlowCommitsReport> {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    let flushes: bool = admin
        .query_one(
            "SELECT current_setting('fsync')::bool \
             AND current_setting('synchronous_commit') <> 'off'",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("reading fsync and synchronous_commit: {e}"))
        .get(0);
    if !flushes {
        eprintln!("slow commits: skipped (fsync or synchronous_commit off: commits do not flush)");
        drop(admin);
        drop_unless_owned(server, db.name()).await;
        return None;
    }
    let name = db.name();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" SET commit_delay = {COMMIT_DELAY_US};
             ALTER DATABASE \"{name}\" SET commit_siblings = 0"
        ))
        .await
        .unwrap_or_else(|e| panic!("slowing the commits: {e}"));
    // Opened after it: the settings apply to connections opened from now.
    let mut conns = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        conns.push(Arc::new(Mutex::new(db.connect().await)));
    }
    let pool = Pool::new(Arc::new(conns));
    let limit = Arc::new(
        Limit::new("slow-commits", Limit::MAX_ATTEMPTS, Limit::MAX_WINDOW).expect("a valid limit"),
    );

    let mut limiters = HOW.map(|how| Measured {
        how,
        samples: Vec::with_capacity(mode.rounds),
    });
    for _ in 0..mode.rounds {
        // Fresh limiters each round, as the defaults' rows have.
        let store = || Postgres::new(pool.clone());
        let fixed = Limiter::builder(store())
            .budget(Limiter::MAX_BUDGET)
            .writes_in_flight(1)
            .build()
            .expect("one place is within the bounds");
        for (measured, limiter) in
            limiters
                .iter_mut()
                .zip([limiter(store()), defaults_limiter(store()), fixed])
        {
            let op = shared_failed_op(Arc::new(limiter), Arc::clone(&limit));
            measured
                .samples
                .push(measure(&op, WIDE, Keys::Random, mode).await);
        }
    }
    drop((pool, admin));
    drop_unless_owned(server, db.name()).await;

    let [one, defaults, fixed] = &limiters;
    let over = |other: &Measured| {
        defaults
            .samples
            .iter()
            .zip(&other.samples)
            .map(|(d, o)| d.ops_per_sec / o.ops_per_sec)
            .collect()
    };
    Some(SlowCommitsReport {
        commit_delay_us: COMMIT_DELAY_US,
        defaults_over_one_statement: over(one),
        defaults_over_one_in_flight: over(fixed),
        limiters,
    })
}

pub(crate) fn print(slow: Option<&SlowCommitsReport>) {
    let Some(slow) = slow else {
        println!("slow commits: skipped (the server's commits do not flush)");
        return;
    };
    println!(
        "slow commits ({} ms commit_delay): failed, random keys, {WIDE} callers sharing one \
         limiter over {WIDE} connections, each right after the other",
        f64::from(slow.commit_delay_us) / 1000.0
    );
    println!("  {:<26} {:>9} {:>9} {:>9}", "", "ops/s", "p50", "p99");
    for Measured { how, samples } in &slow.limiters {
        println!("  {how:<26} {}", show_medians(samples));
    }
    println!(
        "  defaults ops/s over one statement per call {}, over one write in flight {}",
        show_ratio(&Summary::of(
            slow.defaults_over_one_statement.iter().copied()
        )),
        show_ratio(&Summary::of(
            slow.defaults_over_one_in_flight.iter().copied()
        ))
    );
}
