//! The purge drops exactly the windows that closed more than a day ago,
//! works through more rows than one batch (and stops after exactly one),
//! skips a row a call holds instead of waiting for it, and, run in the
//! middle of writes, loses no count of an open window; each batch reads
//! only the rows it deletes, and a window ending far ahead goes at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common;
use common::db::{
    Pool, as_system, counts_by_key, explained, fresh_db, lend, lock_row, stored, stored_rows,
};
use common::{PATIENT, assert_counted, limit};
use platformkit_limit::{Key, Limiter, Postgres, PurgeTask, purge};
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_drops_windows_that_closed_long_ago() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    // Relative to the database's clock; purge keeps a day of closed windows.
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT key, window_end - interval '15 minutes', window_end, 1
         FROM (VALUES
             ('old|a', now() - interval '24 hours 1 minute'),
             ('old|b', now() - interval '3 days'),
             ('old|c', now() - interval '300 days'),
             ('old|a', now() - interval '30 days'),
             ('recent|a', now() - interval '23 hours 59 minutes'),
             ('recent|b', now() - interval '1 minute'),
             ('open|a', now() + interval '1 second'),
             ('open|b', now() + interval '30 days')
         ) AS rows (key, window_end)",
        &[],
    )
    .await;

    let purged = purge(&db.config()).await.unwrap();
    assert_eq!(purged, 4, "the windows that closed more than a day ago");
    let left: Vec<String> = stored_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["open|a", "open|b", "recent|a", "recent|b"]);

    assert_eq!(
        purge(&db.config()).await.unwrap(),
        0,
        "nothing more to purge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_works_through_more_rows_than_one_batch() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    let closed = 2 * i64::from(PurgeTask::BATCH_ROWS) + 2_000;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', g
         FROM generate_series(1, $1::int8) AS g",
        &[&closed],
    )
    .await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('open|a', now() - interval '1 minute', now() + interval '1 hour', 1)",
        &[],
    )
    .await;

    assert_eq!(purge(&db.config()).await.unwrap(), closed as u64);
    let left: Vec<String> = stored_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["open|a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_of_exactly_one_full_batch_stops() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', 1
         FROM generate_series(1, $1::int8) AS g",
        &[&i64::from(PurgeTask::BATCH_ROWS)],
    )
    .await;
    assert_eq!(
        purge(&db.config()).await.unwrap(),
        u64::from(PurgeTask::BATCH_ROWS)
    );
    assert_eq!(stored_rows(&db).await, []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_rows_it_would_wait_for() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('old|locked', now() - interval '3 days', now() - interval '2 days', 1),
                ('old|free', now() - interval '3 days', now() - interval '2 days', 1)",
        &[],
    )
    .await;

    let locker = lock_row(&db, "old|locked").await;

    let started = Instant::now();
    assert_eq!(purge(&db.config()).await.unwrap(), 1, "only the free row");
    assert!(
        started.elapsed() < PurgeTask::BATCH_BUDGET,
        "purge waited for the lock"
    );
    locker.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(purge(&db.config()).await.unwrap(), 1, "the row, once free");
    assert_eq!(stored_rows(&db).await, []);
}

// ---------------------------------------------------------------------------
// Under load
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_under_load_loses_no_open_counts() {
    const CLOSED_ROWS: i64 = 200_000;
    const RECENT_ROWS: i64 = 1_000;
    const WRITERS: usize = 16;
    const OPEN_KEYS: usize = 64;
    const MIN_CALLS: usize = 20;

    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    // Windows that closed between about 3 and 5 days ago, and windows that
    // closed an hour ago (which purge must keep).
    admin
        .batch_execute(&format!(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT 'closed|' || g, w.start, w.start + interval '1 hour', 1
             FROM generate_series(1, {CLOSED_ROWS}) AS g,
                  LATERAL (SELECT now() - interval '3 days' - g * interval '1 second' AS start) AS w;
             INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT 'recent|' || g, now() - interval '2 hours', now() - interval '1 hour', 2
             FROM generate_series(1, {RECENT_ROWS}) AS g;
             ANALYZE platformkit.platformkit_limits;"
        ))
        .await
        .expect("inserting closed windows");

    let login = limit("login", 1_000_000);
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(Pool::open(&db.config(), WRITERS).await))
            .budget(PATIENT)
            .build()
            .unwrap(),
    );
    let purged = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for t in 0..WRITERS {
        let limiter = Arc::clone(&limiter);
        let login = login.clone();
        let purged = Arc::clone(&purged);
        let calls = Arc::clone(&calls);
        writers.push(tokio::spawn(async move {
            // Writes until the purge is over, so that it runs under load.
            let mut made: BTreeMap<String, i64> = BTreeMap::new();
            let mut c = 0;
            while c < MIN_CALLS || !purged.load(Ordering::Acquire) {
                let key = Key::opaque(&format!("open{}", (t * 7 + c) % OPEN_KEYS));
                let verdict = limiter
                    .failed(&login, &key)
                    .await
                    .unwrap_or_else(|e| panic!("writer {t}, call {c}: {e:?}"));
                assert_counted(&verdict, &format!("writer {t}, call {c}"));
                *made.entry(stored(&login, &key)).or_default() += 1;
                calls.fetch_add(1, Ordering::Relaxed);
                c += 1;
            }
            made
        }));
    }

    // Let the writers get going, then purge in the middle of their writes.
    while calls.load(Ordering::Relaxed) < WRITERS {
        sleep(Duration::from_millis(5)).await;
    }
    let calls_before = calls.load(Ordering::Relaxed);
    let deleted = purge(&db.config()).await;
    let calls_during = calls.load(Ordering::Relaxed) - calls_before;
    purged.store(true, Ordering::Release);

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for writer in writers {
        for (key, n) in writer.await.expect("a writer panicked") {
            *expected.entry(key).or_default() += n;
        }
    }
    assert_eq!(deleted.expect("purge"), CLOSED_ROWS as u64, "rows purged");
    assert!(calls_during > 0, "no write happened while the purge ran");

    let stored_counts = counts_by_key(&admin).await;
    let closed_left = stored_counts
        .keys()
        .filter(|k| k.starts_with("closed|"))
        .count();
    assert_eq!(closed_left, 0, "closed windows left behind");
    let recent: Vec<i64> = stored_counts
        .iter()
        .filter(|(k, _)| k.starts_with("recent|"))
        .map(|(_, &n)| n)
        .collect();
    assert_eq!(
        recent.len(),
        RECENT_ROWS as usize,
        "recently closed windows kept"
    );
    assert!(recent.iter().all(|&n| n == 2));
    let open: BTreeMap<String, i64> = stored_counts
        .into_iter()
        .filter(|(k, _)| k.starts_with("login|"))
        .collect();
    assert_eq!(open.len(), OPEN_KEYS);
    assert!(
        open == expected,
        "an open window's count differs from the calls made on it: \
         stored {open:?}, made {expected:?}"
    );
}

/// The purge's scan of the table, from the plan of its DELETE: the line of
/// the node that reads `index`, with its actual rows.
fn scan_of(plan: &str, index: &str) -> String {
    plan.lines()
        .find(|line| line.contains(&format!("Index Scan using {index} on platformkit_limits")))
        .unwrap_or_else(|| panic!("the purge does not scan {index}:\n{plan}"))
        .to_owned()
}

/// Weekly windows closed more than a day ago but less than a week ago must
/// be kept (a sliding window still reads them); comparing in epoch seconds
/// made the planner read every closed window on every batch, 2 s a batch
/// with nothing to delete over 2 M of them, and past the batch's budget
/// purge would never finish. Now the purge reads a range of the index on
/// the moment each row may go: each batch reads the rows it deletes and no
/// other, whatever the table holds (shown by the plan's actual rows, as
/// the limiter's role runs it), and deletes each by its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_reads_only_the_rows_it_deletes_however_many_closed_windows_it_keeps() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'reset|' || g, e - interval '7 days', e, 1
         FROM (SELECT g, now() - interval '25 hours' - (g % 5000) * interval '1 minute' AS e
               FROM generate_series(1, 20000) AS g) AS weekly",
        &[],
    )
    .await;
    common::db::old_rows(&mut system, 30).await;
    system
        .batch_execute("ANALYZE platformkit.platformkit_limits")
        .await
        .unwrap();

    let (held, plans) = explained(&db).await;
    held.lock()
        .await
        .batch_execute("SET auto_explain.log_analyze = on")
        .await
        .unwrap();
    for expected in [30, 0] {
        plans.lock().unwrap().clear();
        assert_eq!(purge(&lend(Arc::clone(&held))).await.unwrap(), expected);
        let plans = plans.lock().unwrap();
        let delete = plans
            .iter()
            .find(|plan| plan.contains("Delete on platformkit_limits"))
            .expect("the plan of the purge's DELETE");
        assert!(
            !delete.contains("Seq Scan") && !delete.contains("Rows Removed by Filter"),
            "the purge read rows it did not delete:\n{delete}"
        );
        let due = scan_of(delete, "platformkit_limits_purge_order");
        assert!(
            due.contains(&format!(" rows={expected} loops=1)")),
            "the purge read other rows than the {expected} it deleted: {due}"
        );
        let ahead = scan_of(delete, "platformkit_limits_window_end");
        assert!(ahead.contains(" rows=0 loops=1)"), "{ahead}");
        // The rows found are deleted where the scan found them, by their
        // ctid: joined back to the table on the primary key, a second probe
        // of that index per row halved the purge's rate
        // (docs/PERFORMANCE.md, "Purge deletes by place").
        assert!(
            !delete.contains("platformkit_limits_pkey"),
            "the purge found its rows again through the primary key:\n{delete}"
        );
        let by_place = delete
            .lines()
            .find(|line| line.contains("Tid Scan on platformkit_limits l"))
            .unwrap_or_else(|| panic!("the purge did not delete by place:\n{delete}"));
        assert!(
            by_place.contains(&format!(" rows={expected} loops=1)")),
            "{by_place}"
        );
    }
    assert_eq!(stored_rows(&db).await.len(), 20_000);
}

/// The rows of one window all may go at the same moment, and the index
/// keeps the entries of deleted rows until a VACUUM: a batch that scanned
/// from the start of the index stepped over the entries of every row the
/// batches before it had deleted, and over ten million rows of one window
/// purge went at a third of the rate, slower with every batch. Each batch
/// now starts where the one before stopped: the last batch of a purge
/// reads as many pages as the first (its plan's buffers, as the limiter's
/// role runs it), however many rows went before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_purge_batch_starts_where_the_one_before_stopped() {
    const BATCHES: i64 = 5;
    let db = fresh_db().await;
    let mut system = db.connect().await;
    let batch = i64::from(PurgeTask::BATCH_ROWS);
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', 1
         FROM generate_series(1, $1::int8) AS g",
        &[&(BATCHES * batch)],
    )
    .await;
    system
        .batch_execute("ANALYZE platformkit.platformkit_limits")
        .await
        .unwrap();

    let (held, plans) = explained(&db).await;
    held.lock()
        .await
        .batch_execute("SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on")
        .await
        .unwrap();
    assert_eq!(
        purge(&lend(Arc::clone(&held))).await.unwrap(),
        (BATCHES * batch) as u64
    );
    let plans = plans.lock().unwrap();
    let pages: Vec<u64> = plans
        .iter()
        .filter(|plan| plan.contains("Delete on platformkit_limits"))
        .map(|delete| due_scan_pages(delete))
        .collect();
    // The full batches, then one that finds nothing.
    assert_eq!(pages.len(), BATCHES as usize + 1, "{pages:?}");
    let (first, last_full) = (pages[0], pages[BATCHES as usize - 1]);
    assert!(
        last_full <= first + first / 10,
        "the last full batch read {last_full} pages, the first {first}: it stepped over \
         what the batches before it deleted ({pages:?})"
    );
    let empty = pages[BATCHES as usize];
    assert!(
        empty <= first / 10,
        "the batch that found nothing read {empty} pages, the first {first} ({pages:?})"
    );
}

/// Rows may share a place in the purge's order: every row written before
/// schema version 2 has created_at -infinity, and every row of one window
/// one purge_after. A batch that stopped inside such a group starts the
/// next one at the same place, so the group's other rows go in the same
/// purge, not the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_takes_every_row_of_a_place_that_rows_share() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    let shared = 2 * i64::from(PurgeTask::BATCH_ROWS) + 10;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count, created_at)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', 1, '-infinity'
         FROM generate_series(1, $1::int8) AS g",
        &[&shared],
    )
    .await;
    assert_eq!(purge(&db.config()).await.unwrap(), shared as u64);
    assert!(stored_rows(&db).await.is_empty(), "rows left behind");
}

/// The pages the purge's scan of the rows due read (hit or read), from the
/// plan of its DELETE: the scan of alias `d` that is not of window_end.
fn due_scan_pages(plan: &str) -> u64 {
    let mut lines = plan.lines().skip_while(|line| {
        !(line.contains("Scan using")
            && line.contains("on platformkit_limits d")
            && !line.contains("platformkit_limits_window_end"))
    });
    let scan = lines
        .next()
        .unwrap_or_else(|| panic!("no scan of the rows due:\n{plan}"));
    let buffers = lines
        .take_while(|line| !line.contains("->"))
        .find(|line| line.trim_start().starts_with("Buffers:"))
        .unwrap_or_else(|| panic!("no buffers for {scan}:\n{plan}"));
    buffers
        .split_whitespace()
        .filter_map(|word| {
            word.strip_prefix("hit=")
                .or_else(|| word.strip_prefix("read="))
        })
        .map(|n| n.parse::<u64>().expect("a count of pages"))
        .sum()
}

/// A ctid names a row of one table. Had the table's owner made a table
/// inherit from the limiter's (nothing of the crate does), a purge by
/// ctid over the table and its children deleted, in the child, whatever
/// row sat at a ctid the batch took from the table, open windows
/// included. Purge reads and deletes the limiter's table only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_by_place_in_the_limiters_table_only() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    common::db::old_rows(&mut system, 5).await;
    let admin = db.connect_admin().await;
    admin
        .batch_execute(
            "CREATE TABLE platformkit.inheriting () INHERITS (platformkit.platformkit_limits);
             INSERT INTO platformkit.inheriting (key, window_start, window_end, count)
             SELECT 'open|' || g, now() - interval '1 minute', now() + interval '1 hour', 1
             FROM generate_series(1, 5) AS g;",
        )
        .await
        .expect("a table that inherits, with open windows at the same places");
    let places = |table: &'static str| {
        let admin = &admin;
        async move {
            let rows = admin
                .query(
                    &format!("SELECT ctid::text FROM ONLY {table} ORDER BY ctid"),
                    &[],
                )
                .await
                .unwrap();
            rows.iter().map(|row| row.get(0)).collect::<Vec<String>>()
        }
    };
    assert_eq!(
        places("platformkit.platformkit_limits").await,
        places("platformkit.inheriting").await,
        "the two tables' rows at the same places"
    );

    assert_eq!(
        purge(&db.config()).await.unwrap(),
        5,
        "the old windows only"
    );
    assert_eq!(
        places("platformkit.platformkit_limits").await,
        [] as [String; 0]
    );
    assert_eq!(
        places("platformkit.inheriting").await.len(),
        5,
        "the open windows kept"
    );
}

/// A window that ends far ahead, stored through the procedure with a clock
/// pinned in 2199 or 2150 (inside the bounds the Rust side allows) or by a
/// direct insert, was never deleted: purge also asked that it had closed.
/// Now a row that ends more than 367 days from now goes at the next purge,
/// and an open window stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_that_end_far_ahead_are_purged_at_once() {
    let db = fresh_db().await;
    let tenant = db.connect_tenant().await;
    for (key, at, window) in [
        ("far|2199", "2199-12-31 00:00:00+00", 31_622_400),
        ("far|2150", "2150-06-01 00:00:00+00", 60),
        ("open|now", "now", 3_600),
    ] {
        tenant
            .batch_execute(&format!(
                "CALL platformkit.platformkit_limit_add(p_key => '{key}', p_add => 1, \
                 p_window_secs => {window}, p_at => platformkit.platformkit_us('{at}'), p_budget_ms => 2000, \
                 p_relaxed => false, p_previous => false, p_max => 5, p_lockout_secs => 0)"
            ))
            .await
            .unwrap_or_else(|e| panic!("{key}: {e:?}"));
    }
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('far|insert', '2199-01-01 00:00:00+00', '2199-01-01 00:01:00+00', 1)",
        &[],
    )
    .await;

    assert_eq!(purge(&db.tenant_config()).await.unwrap(), 3);
    let left: Vec<String> = stored_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["open|now"]);
}
