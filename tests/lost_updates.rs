//! No count is lost under concurrency: concurrent `hit`s on one key let
//! exactly `max` through; 2 replicas × 16 tasks × 200 `failed` calls, on one
//! hot key or spread over thousands, see every count exactly once and leave
//! the sum in the table; and `hit` from every replica at once never lets
//! more than the limit through.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common;
use common::db::{Pool, counts_by_key, fresh_db, one_i64, stored, stored_rows};
use common::{PATIENT, assert_counted, limit};
use platformkit_limit::{Key, Limit, Limiter, ManualClock, Postgres};
use platformkit_limit_testdb::TestDb;
use tokio_postgres::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_let_exactly_max_through() {
    let db = fresh_db().await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let forgot = limit("forgot-password", 10);
    let key = Key::opaque("account-7");

    let calls: Vec<_> = (0..24)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let (forgot, key) = (forgot.clone(), key.clone());
            tokio::spawn(async move { limiter.hit(&forgot, &key).await })
        })
        .collect();
    let mut counts = Vec::new();
    let mut allowed = 0;
    for call in calls {
        let verdict = call.await.unwrap().unwrap();
        assert!(!verdict.is_unreachable(), "{:?}", verdict.unreachable());
        allowed += usize::from(verdict.is_allowed());
        counts.push(verdict.count().unwrap());
    }
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=24).collect::<Vec<u64>>(),
        "every hit counted once"
    );
    assert_eq!(allowed, 10, "exactly max hits go ahead");
    assert_eq!(stored_rows(&db).await, [(stored(&forgot, &key), 24)]);
}

// ---------------------------------------------------------------------------
// From every replica at once
// ---------------------------------------------------------------------------

/// Replicas of the service in the load tests, each with its own connections.
const REPLICAS: usize = 2;
/// Tasks per replica in the load tests.
const TASKS: usize = 16;
/// Calls per task in the lost-update tests.
const CALLS: usize = 200;
/// Calls in each lost-update test.
const TOTAL_CALLS: usize = REPLICAS * TASKS * CALLS;

/// The sum of every count in the table, read as the superuser.
async fn total_count(admin: &Client) -> i64 {
    one_i64(
        admin,
        "SELECT COALESCE(sum(count), 0)::int8 FROM platformkit.platformkit_limits",
        &[],
    )
    .await
}

/// One replica of the service: a limiter over a pool of its own.
async fn replica(db: &TestDb, clock: Option<&ManualClock>) -> Arc<Limiter<Postgres<Pool>>> {
    let mut store = Postgres::new(Pool::open(&db.config(), TASKS).await);
    if let Some(clock) = clock {
        store = store.with_clock(clock.clone());
    }
    // The refusal cache is off: these tests are about what the database
    // counts, and a cached refusal is answered without asking it.
    Arc::new(
        Limiter::builder(store)
            .budget(PATIENT)
            .no_refusal_cache()
            .build()
            .unwrap(),
    )
}

/// Calls `failed` [`CALLS`] times from each of [`TASKS`] tasks on each of
/// [`REPLICAS`] replicas, the `i`-th call overall on the key `key_of(i)`.
/// Returns, for each call, the stored key and the count its verdict reported.
async fn failed_from_every_replica(
    db: &TestDb,
    login: &Limit,
    key_of: fn(usize) -> Key,
) -> Vec<(String, u64)> {
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(replica(db, None).await);
    }
    let mut tasks = Vec::new();
    for (r, limiter) in replicas.iter().enumerate() {
        for t in 0..TASKS {
            let limiter = Arc::clone(limiter);
            let login = login.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::with_capacity(CALLS);
                for c in 0..CALLS {
                    let i = (r * TASKS + t) * CALLS + c;
                    let key = key_of(i);
                    let verdict = limiter
                        .failed(&login, &key)
                        .await
                        .unwrap_or_else(|e| panic!("call {i}: {e:?}"));
                    assert_counted(&verdict, &format!("call {i}"));
                    seen.push((stored(&login, &key), verdict.count().expect("counted")));
                }
                seen
            }));
        }
    }
    let mut seen = Vec::with_capacity(TOTAL_CALLS);
    for task in tasks {
        seen.extend(task.await.expect("a writer task panicked"));
    }
    seen
}

/// The counts each key's calls reported, sorted.
fn reported_by_key(seen: &[(String, u64)]) -> BTreeMap<String, Vec<u64>> {
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, count) in seen {
        by_key.entry(key.clone()).or_default().push(*count);
    }
    for counts in by_key.values_mut() {
        counts.sort_unstable();
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_updates_on_one_hot_key() {
    let db = fresh_db().await;
    let login = limit("login", 1_000_000);
    let hot = Key::opaque("hot");

    let seen = failed_from_every_replica(&db, &login, |_| Key::opaque("hot")).await;
    assert_eq!(seen.len(), TOTAL_CALLS);

    // Each call added one and saw the count after its own addition: with no
    // lost update, the calls saw every count from 1 to the total exactly once.
    let reported = reported_by_key(&seen);
    let expected: Vec<u64> = (1..=TOTAL_CALLS as u64).collect();
    assert_eq!(reported.len(), 1);
    assert!(
        reported[&stored(&login, &hot)] == expected,
        "the calls did not see every count from 1 to {TOTAL_CALLS} exactly once"
    );

    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, TOTAL_CALLS as i64);
    let rows = admin
        .query(
            "SELECT count FROM platformkit.platformkit_limits WHERE key = $1",
            &[&stored(&login, &hot)],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one row for the hot key's one window");
    assert_eq!(rows[0].get::<_, i64>(0), TOTAL_CALLS as i64);
}

/// Spreads calls over this many keys in `no_lost_updates_over_many_keys`.
const MANY_KEYS: u64 = 10_000;

/// Keys each step of the many-keys test picks from.
const KEYS_PER_STEP: u64 = MANY_KEYS / CALLS as u64;

/// The key of the `i`-th call. Call `c` of every task picks one of the
/// [`KEYS_PER_STEP`] keys of step `c`, pseudo-randomly (splitmix64) but
/// always the same: over the test the calls range over all [`MANY_KEYS`]
/// keys, and tasks at the same step meet on one key often enough that
/// concurrent upserts of one row happen here too (about 1,300 keys get more
/// than one call).
fn spread_key(i: usize) -> Key {
    let step = (i % CALLS) as u64;
    let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    Key::opaque(&format!("k{}", step * KEYS_PER_STEP + z % KEYS_PER_STEP))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_updates_over_many_keys() {
    let db = fresh_db().await;
    let login = limit("login", 1_000_000);

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..TOTAL_CALLS {
        *expected.entry(stored(&login, &spread_key(i))).or_default() += 1;
    }
    assert!(
        expected.len() > 4_000 && expected.values().filter(|&&n| n > 1).count() > 1_000,
        "the calls spread over thousands of keys, and meet on many"
    );

    let seen = failed_from_every_replica(&db, &login, spread_key).await;
    assert_eq!(seen.len(), TOTAL_CALLS);

    // Per key, the calls saw every count from 1 to the key's total once.
    for (key, counts) in reported_by_key(&seen) {
        let want: Vec<u64> = (1..=expected[&key] as u64).collect();
        assert_eq!(counts, want, "counts reported for {key}");
    }

    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, TOTAL_CALLS as i64);
    let stored_counts = counts_by_key(&admin).await;
    assert_eq!(stored_counts.len(), expected.len(), "keys stored");
    assert!(
        stored_counts == expected,
        "some key's stored count differs from the calls made on it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_never_allows_more_than_the_limit() {
    const MAX: u32 = 50;
    const HITS: usize = 10;
    const ASKS: usize = REPLICAS * TASKS * HITS;

    let db = fresh_db().await;
    // One pinned clock shared by both replicas: the window cannot roll over
    // in the middle of the test and let a second batch of 50 through.
    let clock = ManualClock::new(SystemTime::now());
    let forgot = Limit::new("password-forgot", MAX, Duration::from_secs(3600)).unwrap();
    let victim = Key::email("victim@example.com");

    let mut tasks = Vec::new();
    for _ in 0..REPLICAS {
        let limiter = replica(&db, Some(&clock)).await;
        for _ in 0..TASKS {
            let limiter = Arc::clone(&limiter);
            let forgot = forgot.clone();
            let victim = victim.clone();
            tasks.push(tokio::spawn(async move {
                let mut verdicts = Vec::with_capacity(HITS);
                for _ in 0..HITS {
                    let verdict = limiter.hit(&forgot, &victim).await.expect("hit");
                    assert_counted(&verdict, "hit");
                    verdicts.push((verdict.is_allowed(), verdict.count().expect("counted")));
                }
                verdicts
            }));
        }
    }
    let mut allowed = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        for (is_allowed, count) in task.await.expect("a task panicked") {
            if is_allowed {
                allowed.push(count);
            } else {
                refused.push(count);
            }
        }
    }
    allowed.sort_unstable();
    refused.sort_unstable();

    assert_eq!(allowed.len(), MAX as usize, "asks let through");
    assert_eq!(allowed, (1..=u64::from(MAX)).collect::<Vec<_>>());
    assert_eq!(refused.len(), ASKS - MAX as usize, "asks refused");
    assert_eq!(
        refused,
        (u64::from(MAX) + 1..=ASKS as u64).collect::<Vec<_>>()
    );

    // Refused asks are counted too.
    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, ASKS as i64);
}
