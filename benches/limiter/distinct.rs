//! A flood of distinct keys, in a database of its own: `failed` on that
//! many fresh keys with the defaults (one limiter shared by [`WIDE`]
//! callers over [`WIDE`] connections), as fast as they go, as a credential
//! stuffing run over fresh accounts writes them; then what a row costs the
//! table (heap and indexes); then `purge` of them all while [`WIDE`]
//! writers count on other keys, against the same writers alone, as
//! [`purge`](mod@crate::purge) measures it.
//!
//! The flood is written on a clock pinned three days back, so that its
//! windows are the purge's to take at once (closed more than a day ago);
//! the writers during the purge count on the present.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use platformkit_limit::{Key, Limit, ManualClock, Postgres, SCHEMA};
use platformkit_limit_testdb::Server;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::measure::Sample;
use crate::operations::{Pool, answered, defaults_limiter};
use crate::purge::{Beside, beside_writers, drop_unless_owned, settle};
use crate::report::{show_gain, show_ops, show_us};
use crate::{Mode, WIDE};

/// The flood's limit: stored keys are `flood-account|id|<n>`, a login's
/// per-account limit of 5 in 15 minutes.
const FLOOD_LIMIT_NAME: &str = "flood-account";

/// The limit the purge's writers count under, on keys of their own.
const WRITERS_LIMIT_NAME: &str = "flood-writers";

/// The keys the writers during the purge count on.
const WRITERS_KEYS: u64 = 100_000;

/// What the flood of distinct keys found.
#[derive(Clone, Copy, Serialize)]
pub(crate) struct DistinctReport {
    /// Distinct keys written, one row each.
    pub(crate) keys: u64,
    /// How long writing them took, and the rate.
    written_secs: f64,
    pub(crate) written_rows_per_sec: f64,
    /// The table's size (heap, indexes, TOAST) over its rows, once settled.
    pub(crate) bytes_per_row: f64,
    /// Rows `purge` said it deleted, and how long it took.
    pub(crate) deleted: u64,
    purge_secs: f64,
    pub(crate) purge_rows_per_sec: f64,
    /// The writers while the purge ran, and alone for as long after it.
    #[serde(rename = "writers_during")]
    during: Sample,
    #[serde(rename = "writers_alone")]
    alone: Sample,
    /// Rows of the flood left at the end.
    pub(crate) left: i64,
}

impl DistinctReport {
    pub(crate) fn p99_ratio(&self) -> f64 {
        self.during.p99_us / self.alone.p99_us
    }

    /// Purge's rate over the flood's.
    pub(crate) fn keeps_up(&self) -> f64 {
        self.purge_rows_per_sec / self.written_rows_per_sec
    }

    /// Bytes a day for each thousand distinct-key attempts a second.
    fn bytes_per_day_per_thousand(&self) -> f64 {
        1_000.0 * 86_400.0 * self.bytes_per_row
    }
}

/// Writes `mode.distinct_keys` distinct keys with the defaults, sizes the
/// table, then purges them while [`WIDE`] writers run `failed`, and runs
/// the writers alone for as long.
pub(crate) async fn run(server: &Server, mode: Mode) -> DistinctReport {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    let mut conns = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        conns.push(Arc::new(Mutex::new(db.connect().await)));
    }
    let conns = Arc::new(conns);

    // The flood: three days back, as fast as the defaults go.
    let back = SystemTime::now() - Duration::from_secs(3 * 86_400);
    let flooding = Arc::new(defaults_limiter(
        Postgres::new(Pool::new(Arc::clone(&conns))).with_clock(ManualClock::new(back)),
    ));
    let account =
        Arc::new(Limit::new(FLOOD_LIMIT_NAME, 5, Duration::from_secs(900)).expect("a valid limit"));
    let next = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let tasks: Vec<_> = (0..WIDE)
        .map(|_| {
            let (limiter, account, next) = (
                Arc::clone(&flooding),
                Arc::clone(&account),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= mode.distinct_keys {
                        break;
                    }
                    let key = Key::opaque(&n.to_string());
                    answered("failed", limiter.failed(&account, &key).await);
                }
            })
        })
        .collect();
    for task in tasks {
        if let Err(e) = task.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let written_secs = began.elapsed().as_secs_f64();
    drop(flooding);
    settle(&admin, "VACUUM (ANALYZE) platformkit.platformkit_limits").await;
    let row = admin
        .query_one(
            "SELECT pg_catalog.pg_total_relation_size('platformkit.platformkit_limits')::int8,
                    count(*) FROM platformkit.platformkit_limits",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("sizing the table: {e}"));
    let (bytes, rows): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        u64::try_from(rows).ok(),
        Some(mode.distinct_keys),
        "one row per distinct key"
    );
    eprintln!(
        "distinct keys: {rows} written in {written_secs:.1}s, {bytes} bytes; purging them ..."
    );

    let writers = Limit::new(
        WRITERS_LIMIT_NAME,
        Limit::MAX_ATTEMPTS,
        Duration::from_secs(86_400),
    )
    .expect("a valid limit");
    let Beside {
        deleted,
        took,
        during,
        alone,
        ..
    } = beside_writers(&db, &admin, writers, WRITERS_KEYS, mode.warmup).await;
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM platformkit.platformkit_limits WHERE key LIKE $1",
            &[&format!("{FLOOD_LIMIT_NAME}|%")],
        )
        .await
        .unwrap_or_else(|e| panic!("counting the flood's rows left: {e}"))
        .get(0);

    drop((conns, admin));
    drop_unless_owned(server, db.name()).await;

    DistinctReport {
        keys: mode.distinct_keys,
        written_secs,
        written_rows_per_sec: mode.distinct_keys as f64 / written_secs,
        bytes_per_row: bytes as f64 / rows as f64,
        deleted,
        purge_secs: took.as_secs_f64(),
        purge_rows_per_sec: deleted as f64 / took.as_secs_f64(),
        during,
        alone,
        left,
    }
}

pub(crate) fn print(distinct: &DistinctReport) {
    println!(
        "a flood of {} distinct keys: failed with the defaults, one limiter shared by {WIDE} \
         callers over {WIDE} connections; then purge() while {WIDE} writers run failed",
        distinct.keys
    );
    println!(
        "  written: {:.1}s = {} rows/s; {:.0} bytes a row (heap and indexes) = {:.1} GB a day \
         per 1,000 distinct-key attempts/s",
        distinct.written_secs,
        show_ops(distinct.written_rows_per_sec),
        distinct.bytes_per_row,
        distinct.bytes_per_day_per_thousand() / 1e9
    );
    println!(
        "  purge: {} rows in {:.2}s = {} rows/s ({} the flood's rate); {} of the flood left",
        distinct.deleted,
        distinct.purge_secs,
        show_ops(distinct.purge_rows_per_sec),
        show_gain(distinct.keeps_up()),
        distinct.left
    );
    println!(
        "  {:<22} {:>9} {:>9} {:>9}",
        "writers", "ops/s", "p50", "p99"
    );
    for (name, sample) in [
        ("during the purge", distinct.during),
        ("alone, after it", distinct.alone),
    ] {
        println!(
            "  {:<22} {:>9} {:>9} {:>9}",
            name,
            show_ops(sample.ops_per_sec),
            show_us(sample.p50_us),
            show_us(sample.p99_us)
        );
    }
    println!(
        "  writers' p99 during the purge / alone: {}",
        show_gain(distinct.p99_ratio())
    );
}
