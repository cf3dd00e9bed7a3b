//! Purge at scale, in a database of its own: a million closed windows
//! purged while [`WIDE`] writers count on the open ones, against the same
//! writers alone; then what the purge left is checked.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use platformkit_limit::{Limit, Postgres, PurgeTask, SCHEMA, purge};
use platformkit_limit_testdb::{Server, TestDb};
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::measure::{Sample, XorShift, next_seed, sample};
use crate::operations::{Op, Pool, What, lend, limiter, limiter_op};
use crate::report::{show_gain, show_ops, show_us};
use crate::{Mode, WIDE};

/// The limit the purge's writers count under: stored keys are
/// `bench-open|id|<n>`, in the current window (open) and in closed ones.
const OPEN_LIMIT_NAME: &str = "bench-open";

/// The window of [`OPEN_LIMIT_NAME`]: a day, so that a key's windows that
/// ended two days ago and more are the purge's to take (closed more than a
/// day and more than a window ago), and a run rarely sees the open window
/// close.
const OPEN_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// What the purge at scale found.
#[derive(Serialize)]
pub(crate) struct PurgeReport {
    #[serde(rename = "closed_windows")]
    pub(crate) closed: u64,
    #[serde(rename = "open_windows")]
    open: u64,
    /// Rows `purge` said it deleted.
    pub(crate) deleted: u64,
    /// Statements it sent: one per batch.
    statements: u64,
    #[serde(rename = "secs", serialize_with = "secs")]
    took: Duration,
    /// The writers while the purge ran, over its whole length.
    #[serde(rename = "writers_during")]
    during: Sample,
    /// The same writers alone, over the same length, after the purge.
    #[serde(rename = "writers_alone")]
    alone: Sample,
    /// Every count the writers added, in both phases.
    pub(crate) writes: u64,
    /// The sum of the open windows' counts before the writers.
    pub(crate) open_sum_before: i64,
    /// The rows and the sum of the counts of the open windows (and of any
    /// window opened since) at the end.
    open_rows_after: i64,
    pub(crate) open_sum_after: i64,
    /// Rows of closed windows left at the end.
    pub(crate) closed_left: i64,
    /// Derived, for the JSON.
    rows_per_sec: f64,
    writers_p99_ratio: f64,
    intact: bool,
}

fn secs<S: serde::Serializer>(took: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(took.as_secs_f64())
}

impl PurgeReport {
    fn rows_per_sec(&self) -> f64 {
        self.deleted as f64 / self.took.as_secs_f64()
    }

    pub(crate) fn p99_ratio(&self) -> f64 {
        self.during.p99_us / self.alone.p99_us
    }

    fn intact(&self) -> bool {
        i64::try_from(self.writes).is_ok_and(|w| self.open_sum_before + w == self.open_sum_after)
    }
}

/// Runs `op` on `workers` tasks back to back, each over keys drawn from
/// `0..among`, while `phase` runs after a warm-up. Returns what `phase`
/// returned, and the writers' figures over the calls begun while it ran;
/// the sample's `calls` counts every call, the warm-up's included.
pub(crate) async fn while_writing<T>(
    op: &Op,
    workers: usize,
    among: u64,
    warmup: Duration,
    phase: impl Future<Output = T>,
) -> (T, Sample) {
    let stop = Arc::new(AtomicBool::new(false));
    let from: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let op = Arc::clone(op);
            let stop = Arc::clone(&stop);
            let from = Arc::clone(&from);
            let mut rng = XorShift::new(next_seed());
            tokio::spawn(async move {
                let mut timed = Vec::new();
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = (rng.next() % among).to_string();
                    let began = Instant::now();
                    op(worker, id).await;
                    calls += 1;
                    if from.get().is_some_and(|from| began >= *from) {
                        timed.push((began, Instant::now()));
                    }
                }
                (timed, calls)
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    let start = Instant::now();
    from.set(start).expect("the phase starts once");
    let out = phase.await;
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut last = start;
    let mut calls = 0;
    for task in tasks {
        match task.await {
            Ok((timed, my_calls)) => {
                for (began, done) in timed.into_iter().filter(|(began, _)| *began < end) {
                    latencies.push(done - began);
                    last = last.max(done);
                }
                calls += my_calls;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    (out, sample(latencies, last - start, calls))
}

/// Writes `mode.purge_closed` closed windows and `mode.purge_open` open ones
/// into a database of their own, then runs [`purge`] while [`WIDE`] writers
/// run `failed` on the open keys, then the writers alone for as long.
///
/// The closed windows belong to the same keys as the open ones, a day each,
/// ended two days ago and more, so that the purge deletes next to the rows
/// the writers update. Autovacuum is off for the table, and it is vacuumed
/// and checkpointed before each phase, so that both phases start from a
/// settled table and neither meets background work the other does not.
pub(crate) async fn at_scale(server: &Server, mode: Mode) -> PurgeReport {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    let open_limit =
        Limit::new(OPEN_LIMIT_NAME, Limit::MAX_ATTEMPTS, OPEN_WINDOW).expect("a valid limit");
    let window_secs = i64::try_from(OPEN_WINDOW.as_secs()).expect("a day fits in i64");
    let closed = i64::try_from(mode.purge_closed).expect("fits in i64");
    let open = i64::try_from(mode.purge_open).expect("fits in i64");
    let prefix = format!("{OPEN_LIMIT_NAME}|id|");

    // The superuser is not subject to row-level security.
    admin
        .batch_execute("ALTER TABLE platformkit.platformkit_limits SET (autovacuum_enabled = off)")
        .await
        .unwrap_or_else(|e| panic!("turning autovacuum off: {e}"));
    let open_start: SystemTime = admin
        .query_one(
            "SELECT pg_catalog.date_bin($1::int8 * interval '1 second',
                                        pg_catalog.statement_timestamp(),
                                        timestamptz '1970-01-01 00:00:00+00')",
            &[&window_secs],
        )
        .await
        .unwrap_or_else(|e| panic!("reading the current window: {e}"))
        .get(0);
    let written_began = Instant::now();
    // Closed window k of key n: [open start - (k + 3) days, open start - (k + 2) days).
    let written_closed = admin
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT $1::text || (g % $2::int8), w.start, w.start + $3::int8 * interval '1 second',
                    1 + g % 5
             FROM pg_catalog.generate_series(0, $4::int8 - 1) AS g,
                  LATERAL (SELECT $5::timestamptz
                                  - (3 + g / $2::int8) * $3::int8 * interval '1 second'
                                  AS start) AS w",
            &[&prefix, &open, &window_secs, &closed, &open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("writing the closed windows: {e}"));
    let written_open = admin
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT $1::text || g, $2::timestamptz, $2::timestamptz + $3::int8 * interval '1 second', 1
             FROM pg_catalog.generate_series(0, $4::int8 - 1) AS g",
            &[&prefix, &open_start, &window_secs, &open],
        )
        .await
        .unwrap_or_else(|e| panic!("writing the open windows: {e}"));
    assert_eq!(
        (written_closed, written_open),
        (mode.purge_closed, mode.purge_open)
    );
    settle(&admin, "VACUUM (ANALYZE) platformkit.platformkit_limits").await;
    eprintln!(
        "purge: {written_closed} closed and {written_open} open windows written and settled in {:.1}s",
        written_began.elapsed().as_secs_f64()
    );
    let open_sum_before = open_windows(&admin, open_start).await.1;

    let Beside {
        deleted,
        took,
        during,
        alone,
        statements,
    } = beside_writers(&db, &admin, open_limit, mode.purge_open, mode.warmup).await;
    let (open_rows_after, open_sum_after) = open_windows(&admin, open_start).await;
    let closed_left: i64 = admin
        .query_one(
            "SELECT count(*) FROM platformkit.platformkit_limits WHERE window_start < $1",
            &[&open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("counting the closed windows left: {e}"))
        .get(0);

    drop(admin);
    drop_unless_owned(server, db.name()).await;

    let mut report = PurgeReport {
        closed: mode.purge_closed,
        open: mode.purge_open,
        deleted,
        statements,
        took,
        during,
        alone,
        writes: during.calls + alone.calls,
        open_sum_before,
        open_rows_after,
        open_sum_after,
        closed_left,
        rows_per_sec: 0.0,
        writers_p99_ratio: 0.0,
        intact: false,
    };
    report.rows_per_sec = report.rows_per_sec();
    report.writers_p99_ratio = report.p99_ratio();
    report.intact = report.intact();
    report
}

/// What [`beside_writers`] measured.
pub(crate) struct Beside {
    /// Rows `purge` said it deleted, and how long it took.
    pub(crate) deleted: u64,
    pub(crate) took: Duration,
    /// The writers while the purge ran, and alone for as long after it.
    pub(crate) during: Sample,
    pub(crate) alone: Sample,
    /// Statements the purge sent: one per batch.
    pub(crate) statements: u64,
}

/// Runs [`purge`] on a connection of its own while [`WIDE`] writers run
/// `failed` under `limit`, each on a held connection of its own, over keys
/// drawn from `0..among`; then, the table vacuumed and checkpointed, the
/// same writers alone for as long (a second at least).
pub(crate) async fn beside_writers(
    db: &TestDb,
    admin: &Client,
    limit: Limit,
    among: u64,
    warmup: Duration,
) -> Beside {
    let mut limiters = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        let held = Arc::new(Mutex::new(db.connect().await));
        limiters.push(limiter(Postgres::new(lend(held))));
    }
    let writers = limiter_op(Arc::new(limiters), limit, What::Failed);
    let source = Pool::new(Arc::new(vec![Arc::new(Mutex::new(db.connect().await))]));
    let ((deleted, took), during) = while_writing(&writers, WIDE, among, warmup, async {
        let began = Instant::now();
        let deleted = purge(&source)
            .await
            .unwrap_or_else(|e| panic!("purge: {e}"));
        (deleted, began.elapsed())
    })
    .await;
    eprintln!(
        "purge: {deleted} rows in {:.1}s; the writers alone for as long ...",
        took.as_secs_f64()
    );
    settle(admin, "VACUUM platformkit.platformkit_limits").await;
    let alone_for = tokio::time::sleep(took.max(Duration::from_secs(1)));
    let ((), alone) = while_writing(&writers, WIDE, among, warmup, alone_for).await;
    Beside {
        deleted,
        took,
        during,
        alone,
        statements: source.lent(),
    }
}

/// Drops the database `name` unless the server is the benchmark's own: a
/// server of one's own goes with its databases; leave no copy of a million
/// rows on someone else's. Its connections must be dropped first.
pub(crate) async fn drop_unless_owned(server: &Server, name: &str) {
    if server.is_owned() {
        return;
    }
    let server_admin = platformkit_limit_testdb::connect(&server.admin_config()).await;
    let drop_database = format!("DROP DATABASE \"{name}\" WITH (FORCE)");
    if let Err(e) = server_admin.batch_execute(&drop_database).await {
        eprintln!("could not drop database {name}: {e}");
    }
}

/// Runs `vacuum`, then a checkpoint, so that the next phase starts with no
/// dead rows and no dirty pages left over from the one before.
pub(crate) async fn settle(admin: &Client, vacuum: &str) {
    admin
        .batch_execute(vacuum)
        .await
        .unwrap_or_else(|e| panic!("{vacuum}: {e}"));
    admin
        .batch_execute("CHECKPOINT")
        .await
        .unwrap_or_else(|e| panic!("CHECKPOINT: {e}"));
}

/// The rows of the windows that opened at `open_start` or later, and the sum
/// of their counts.
async fn open_windows(admin: &Client, open_start: SystemTime) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*), COALESCE(sum(count), 0)::int8 FROM platformkit.platformkit_limits
             WHERE window_start >= $1",
            &[&open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("summing the open windows: {e}"));
    (row.get(0), row.get(1))
}

pub(crate) fn print(purge: &PurgeReport) {
    println!(
        "purge at scale: {} closed windows and {} open ones; purge() while {WIDE} writers run \
         failed on the open keys",
        purge.closed, purge.open
    );
    println!(
        "  purge: {} rows deleted in {:.2}s = {:.0} rows/s, in {} statements (batches of {})",
        purge.deleted,
        purge.took.as_secs_f64(),
        purge.rows_per_sec(),
        purge.statements,
        PurgeTask::BATCH_ROWS
    );
    println!(
        "  {:<22} {:>7} {:>9} {:>9} {:>9}",
        "writers", "secs", "ops/s", "p50", "p99"
    );
    for (name, sample) in [
        ("during the purge", purge.during),
        ("alone, after it", purge.alone),
    ] {
        println!(
            "  {:<22} {:>7.2} {:>9} {:>9} {:>9}",
            name,
            purge.took.as_secs_f64(),
            show_ops(sample.ops_per_sec),
            show_us(sample.p50_us),
            show_us(sample.p99_us)
        );
    }
    println!(
        "  writers' p99 during the purge / alone: {}",
        show_gain(purge.p99_ratio())
    );
    println!(
        "  open windows: {} rows; counts {} before + {} writes = {}, found {} ({})",
        purge.open_rows_after,
        purge.open_sum_before,
        purge.writes,
        purge.open_sum_before + i64::try_from(purge.writes).unwrap_or(i64::MAX),
        purge.open_sum_after,
        if purge.intact() {
            "intact"
        } else {
            "NOT INTACT"
        }
    );
    println!("  closed windows left: {}", purge.closed_left);
}
