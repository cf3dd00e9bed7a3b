//! The operator's listing at millions of keys: `refused_keys(&limit, 100)`
//! over a table that holds `mode.listing_keys` distinct keys of the limit in
//! its current window, each below the limit's max, beside [`REFUSED`] keys
//! refused through the limiter; against the same listing over a table that
//! holds the refused keys alone (the floor: what the listing costs when no
//! flood is there), measured right before it in each round.
//!
//! The listing reads the rows a writer marked at its max (the partial index
//! `platformkit_limits_at_max`), so the flood should not show in its
//! latency: the target is the ratio of the two p50s.
//!
//! Each table is in a database of its own, both alive for the whole group,
//! so that each round measures the floor right before the flood. The flood
//! is written in one `INSERT … SELECT FROM generate_series`, as the system
//! (the table's owner with `SET LOCAL platformkit.system = 'on'`), each
//! row's window computed as the writers compute it.

use std::sync::Arc;
use std::time::Instant;

use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA, Store};
use platformkit_limit_testdb::{Server, TestDb};
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::Mode;
use crate::measure::{Sample, Summary, measure};
use crate::operations::{Keys, Op, answered, lend, limiter};
use crate::purge::{drop_unless_owned, settle};
use crate::report::{show_medians, show_ratio};

/// The listed limit: stored keys are `bench-listing|id|<id>`.
const LISTING_LIMIT_NAME: &str = "bench-listing";

/// The listed limit's max: the flood's counts are 1 to one below it.
const LISTING_MAX: u32 = 5;

/// The keys refused through the limiter, in both tables.
pub(crate) const REFUSED: u64 = 10;

/// What the listing asks for at most.
pub(crate) const AT_MOST: usize = 100;

/// What the listing found and cost, with the flood and without it.
#[derive(Serialize)]
pub(crate) struct ListingReport {
    /// The flood's distinct keys, below the max, one row each.
    pub(crate) keys: u64,
    /// The keys refused through the limiter, in each table.
    pub(crate) refused: u64,
    pub(crate) at_most: usize,
    /// How long writing the flooded table took: the flood, the refused
    /// keys, and settling it.
    written_secs: f64,
    /// The keys the listing returned before the measurement, over the
    /// flood and over the refused keys alone.
    pub(crate) listed_flooded: u64,
    pub(crate) listed_alone: u64,
    /// Each round's listing over the refused keys alone (the floor), then
    /// over the flood.
    #[serde(rename = "refused_keys_no_flood")]
    alone: Vec<Sample>,
    #[serde(rename = "refused_keys_flooded")]
    flooded: Vec<Sample>,
    /// Per round: the flood's p50 over the floor's, and the same of p99.
    pub(crate) p50_ratios: Vec<f64>,
    pub(crate) p99_ratios: Vec<f64>,
}

impl ListingReport {
    pub(crate) fn p50_ratio(&self) -> Summary {
        Summary::of(self.p50_ratios.iter().copied())
    }

    fn p99_ratio(&self) -> Summary {
        Summary::of(self.p99_ratios.iter().copied())
    }
}

/// One table: its database, and the limiter that lists over one held
/// connection of the table's owner.
struct Table {
    db: TestDb,
    admin: Client,
    op: Op,
    /// The keys the listing found once the table was ready.
    listed: u64,
}

/// The listing of `limit` through `limiter`, at most [`AT_MOST`] keys.
fn listing_op<S: Store + 'static>(limiter: Arc<Limiter<S>>, limit: Arc<Limit>) -> Op {
    Arc::new(move |_worker, _id| {
        let limiter = Arc::clone(&limiter);
        let limit = Arc::clone(&limit);
        Box::pin(async move {
            if let Err(e) = limiter.refused_keys(&limit, AT_MOST).await {
                panic!("refused_keys: {e}");
            }
        })
    })
}

/// A database with [`REFUSED`] keys of `limit` refused through the limiter
/// and, when `flood` is above zero, that many distinct keys of it below
/// its max; settled, and listed once.
async fn table(server: &Server, limit: &Arc<Limit>, flood: u64) -> Table {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    // The superuser is not subject to row-level security; autovacuum off,
    // so that no background work meets one table's measurement and not the
    // other's.
    admin
        .batch_execute("ALTER TABLE platformkit.platformkit_limits SET (autovacuum_enabled = off)")
        .await
        .unwrap_or_else(|e| panic!("turning autovacuum off: {e}"));

    if flood > 0 {
        let window_secs = i64::try_from(limit.window().as_secs()).expect("a window fits in i64");
        let mut owner = db.connect().await;
        let tx = owner
            .transaction()
            .await
            .unwrap_or_else(|e| panic!("BEGIN: {e}"));
        tx.batch_execute("SET LOCAL platformkit.system = 'on'")
            .await
            .unwrap_or_else(|e| panic!("SET LOCAL platformkit.system: {e}"));
        let written = tx
            .execute(
                "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
                 SELECT $1::text || g, w.start, w.start + pg_catalog.make_interval(secs => $2::int8),
                        1 + g % ($3::int8 - 1)
                 FROM pg_catalog.generate_series(0, $4::int8 - 1) AS g,
                      (SELECT pg_catalog.date_bin(pg_catalog.make_interval(secs => $2::int8),
                                                  pg_catalog.now(),
                                                  timestamptz '1970-01-01 00:00:00+00') AS start) AS w",
                &[
                    &format!("{}|id|flood-", limit.name()),
                    &window_secs,
                    &i64::from(limit.max()),
                    &i64::try_from(flood).expect("fits in i64"),
                ],
            )
            .await
            .unwrap_or_else(|e| panic!("writing the flood: {e}"));
        tx.commit().await.unwrap_or_else(|e| panic!("COMMIT: {e}"));
        assert_eq!(written, flood, "one row per distinct key");
    }

    // The refused keys, through the limiter: each write that leaves a key
    // at its max marks it, as a service's writes do.
    let held = Arc::new(Mutex::new(db.connect().await));
    let lister = Arc::new(limiter(Postgres::new(lend(held))));
    for n in 0..REFUSED {
        let key = Key::opaque(&format!("refused-{n}"));
        for _ in 0..limit.max() {
            answered("failed", lister.failed(limit, &key).await);
        }
    }
    settle(&admin, "VACUUM (ANALYZE) platformkit.platformkit_limits").await;

    let rows: i64 = admin
        .query_one(
            "SELECT count(*) FROM platformkit.platformkit_limits WHERE key LIKE $1",
            &[&format!("{}|%", limit.name())],
        )
        .await
        .unwrap_or_else(|e| panic!("counting the rows: {e}"))
        .get(0);
    assert_eq!(
        u64::try_from(rows).ok(),
        Some(flood + REFUSED),
        "one row per key"
    );
    let listed = lister
        .refused_keys(limit, AT_MOST)
        .await
        .unwrap_or_else(|e| panic!("refused_keys: {e}"))
        .len();
    Table {
        db,
        admin,
        op: listing_op(lister, Arc::clone(limit)),
        listed: u64::try_from(listed).expect("fits in u64"),
    }
}

/// Writes both tables, then in each round measures the listing over the
/// refused keys alone, then over the flood, at one connection (an
/// operator's page).
pub(crate) async fn run(server: &Server, mode: Mode) -> ListingReport {
    // The longest window, so that no run crosses into a new window midway
    // and the flood stays current.
    let limit = Arc::new(
        Limit::new(LISTING_LIMIT_NAME, LISTING_MAX, Limit::MAX_WINDOW).expect("a valid limit"),
    );
    let alone = table(server, &limit, 0).await;
    let began = Instant::now();
    let flooded = table(server, &limit, mode.listing_keys).await;
    let written_secs = began.elapsed().as_secs_f64();
    eprintln!(
        "listing: {} keys and {REFUSED} refused written and settled in {written_secs:.1}s",
        mode.listing_keys
    );

    let mut report = ListingReport {
        keys: mode.listing_keys,
        refused: REFUSED,
        at_most: AT_MOST,
        written_secs,
        listed_flooded: flooded.listed,
        listed_alone: alone.listed,
        alone: Vec::with_capacity(mode.rounds),
        flooded: Vec::with_capacity(mode.rounds),
        p50_ratios: Vec::with_capacity(mode.rounds),
        p99_ratios: Vec::with_capacity(mode.rounds),
    };
    for _ in 0..mode.rounds {
        // The key drawn is not used: the listing takes none.
        let floor = measure(&alone.op, 1, Keys::Hot, mode).await;
        let sample = measure(&flooded.op, 1, Keys::Hot, mode).await;
        report.p50_ratios.push(sample.p50_us / floor.p50_us);
        report.p99_ratios.push(sample.p99_us / floor.p99_us);
        report.alone.push(floor);
        report.flooded.push(sample);
    }

    for table in [alone, flooded] {
        let Table { db, admin, op, .. } = table;
        drop((admin, op));
        drop_unless_owned(server, db.name()).await;
    }
    report
}

pub(crate) fn print(listing: &ListingReport) {
    println!(
        "the operator's listing at {} keys: refused_keys(&limit, {}) at 1 connection over {} \
         distinct keys of the limit below its max and {} refused through the limiter, against \
         the same over the {} refused alone (measured right before it)",
        listing.keys, listing.at_most, listing.keys, listing.refused, listing.refused
    );
    println!(
        "  written: {:.1}s; listed {} over the flood, {} over the refused alone",
        listing.written_secs, listing.listed_flooded, listing.listed_alone
    );
    println!("  {:<34} {:>9} {:>9} {:>9}", "", "ops/s", "p50", "p99");
    for (name, samples) in [
        ("refused_keys, no flood (floor)", &listing.alone),
        ("refused_keys, flooded", &listing.flooded),
    ] {
        println!("  {name:<34} {}", show_medians(samples));
    }
    println!(
        "  flooded / no flood: p50 {}, p99 {}",
        show_ratio(&listing.p50_ratio()),
        show_ratio(&listing.p99_ratio())
    );
}
