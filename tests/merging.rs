//! Merging: concurrent writes through one limiter share statements. For one
//! hot key, every count is written and `hit` still lets exactly the limit
//! through; for different keys, the first writes go at once and the rest
//! share the next statement, each key with its own count, as `Memory` counts
//! them one by one. Callers of different costs on one key share a statement
//! that adds each one's own cost, and each gets its own verdict. A caller
//! under another tier of a limit with a lockout goes in a statement of its
//! own, so that it reads the lockout under its own max.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::common;
use common::db::{lock_row, lock_waits, stored};
use futures::future::join_all;
use platformkit_limit::{
    Key, Limit, LimitConn, Limiter, ManualClock, Memory, Postgres, SCHEMA, Strategy,
};
use platformkit_limit_testdb::{Server, TestDb};
use proptest::prelude::*;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::Client;

/// `size` held connections lent round-robin, counting the connections
/// lent.
async fn pool(
    db: &TestDb,
    size: usize,
) -> (
    impl LimitConn<Conn = OwnedMutexGuard<Client>> + 'static,
    Arc<AtomicUsize>,
) {
    let mut clients = Vec::with_capacity(size);
    for _ in 0..size {
        clients.push(Arc::new(Mutex::new(db.connect().await)));
    }
    let clients = Arc::new(clients);
    let lent = Arc::new(AtomicUsize::new(0));
    let counter = lent.clone();
    let conns = move || {
        let at = counter.fetch_add(1, Ordering::SeqCst) % clients.len();
        let client = clients[at].clone();
        async move { Ok::<_, std::convert::Infallible>(client.lock_owned().await) }
    };
    (conns, lent)
}

/// Counts, on the server, each statement that writes counts: a
/// statement-level trigger on the table that moves a sequence (which no
/// rollback and no row lock touch). [`statements`] reads it.
async fn count_statements(db: &TestDb) {
    db.connect_admin()
        .await
        .batch_execute(
            "CREATE SEQUENCE public.statements;
             GRANT USAGE ON SEQUENCE public.statements TO PUBLIC;
             CREATE FUNCTION public.count_statement() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_catalog.nextval('public.statements'); RETURN NULL; END $$;
             CREATE TRIGGER count_statements AFTER INSERT ON platformkit.platformkit_limits
                 FOR EACH STATEMENT EXECUTE FUNCTION public.count_statement();",
        )
        .await
        .expect("a statement counter");
}

/// The statements that wrote counts so far ([`count_statements`]).
async fn statements(db: &TestDb) -> i64 {
    let row = db
        .connect_admin()
        .await
        .query_one("SELECT last_value, is_called FROM public.statements", &[])
        .await
        .expect("the statement counter");
    if row.get(1) { row.get(0) } else { 0 }
}

async fn stored_count(db: &TestDb) -> i64 {
    db.connect_admin()
        .await
        .query_one(
            "SELECT COALESCE(sum(count), 0)::int8 FROM platformkit.platformkit_limits",
            &[],
        )
        .await
        .expect("a system read")
        .get(0)
}

const CALLERS: usize = 200;
const MAX: u32 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_on_one_key_share_statements_and_let_exactly_max_through() {
    let db = Server::shared().database(SCHEMA).await;
    count_statements(&db).await;
    let (conns, _) = pool(&db, 8).await;
    // The window cannot roll over mid-test; the refusal cache is off so that
    // every ask reaches the store and is counted.
    let clock = ManualClock::new(SystemTime::now());
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns).with_clock(clock))
            .no_refusal_cache()
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    assert!(limiter.merging(), "on by default");
    let limit = Limit::new("password-forgot", MAX, Duration::from_secs(3600)).expect("a limit");
    let key = Key::email("victim@example.com");

    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { limiter.hit(&limit, &key).await })
        })
        .collect();
    let mut counts = Vec::new();
    let mut allowed = 0;
    for task in tasks {
        let verdict = task.await.expect("a task").expect("a verdict");
        assert!(!verdict.is_unreachable());
        allowed += usize::from(verdict.is_allowed());
        counts.push(verdict.count().expect("counted"));
    }
    counts.sort_unstable();
    let statements = statements(&db).await as usize;
    println!("{CALLERS} concurrent hits on one key: {statements} statements, {allowed} allowed");
    assert_eq!(allowed, MAX as usize, "exactly max let through");
    assert_eq!(
        counts,
        (1..=CALLERS as u64).collect::<Vec<_>>(),
        "each caller its own position"
    );
    assert_eq!(stored_count(&db).await, CALLERS as i64, "every ask counted");
    assert!(
        statements < CALLERS,
        "merged: {statements} statements for {CALLERS} calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_merging_every_call_sends_its_own_statement() {
    let db = Server::shared().database(SCHEMA).await;
    count_statements(&db).await;
    let (conns, sent) = pool(&db, 8).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .no_refusal_cache()
            .no_merging()
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("login", 1_000, Duration::from_secs(3600)).expect("a limit");
    let key = Key::opaque("hot");
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { limiter.failed(&limit, &key).await })
        })
        .collect();
    for task in tasks {
        assert!(task.await.expect("a task").expect("a verdict").is_allowed());
    }
    assert_eq!(statements(&db).await, 64);
    assert_eq!(sent.load(Ordering::SeqCst), 64, "a connection each");
    assert_eq!(stored_count(&db).await, 64);
}

/// The most writes of the limiter's seen on the server at once while 16
/// callers write fresh keys back to back for `for_`, through `pool(db, 16)`
/// and a limiter with the defaults: sampled from `pg_stat_activity`.
async fn most_writes_in_flight(db: &TestDb, for_: Duration) -> i64 {
    let (conns, _) = pool(db, 16).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .no_refusal_cache()
            .build()
            .expect("the defaults"),
    );
    let limit = Limit::new("login", 1_000_000, Duration::from_secs(3600)).expect("a limit");
    let until = tokio::time::Instant::now() + for_;
    let callers: Vec<_> = (0..16)
        .map(|caller| {
            let (limiter, limit) = (limiter.clone(), limit.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while tokio::time::Instant::now() < until {
                    let key = Key::opaque(&format!("{caller}-{n}"));
                    let verdict = limiter.failed(&limit, &key).await.expect("a verdict");
                    assert!(verdict.is_allowed(), "{verdict:?}");
                    n += 1;
                }
            })
        })
        .collect();
    let admin = db.connect_admin().await;
    let mut most = 0;
    while tokio::time::Instant::now() < until {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity
                 WHERE datname = current_database() AND state = 'active'
                   AND query LIKE 'CALL platformkit.platformkit_limit_add%'",
                &[],
            )
            .await
            .expect("the server's activity");
        most = most.max(row.get::<_, i64>(0));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for caller in callers {
        caller.await.expect("a caller");
    }
    most
}

/// The default writes in flight follow the commits: where each commit waits
/// on a slow flush (2 ms, as a hosted database's), the limiter sends
/// several statements at once, so callers do not wait on each flush in
/// turn. (That it keeps one where commits are quick is the rule's own
/// test, `the_places_follow_the_commits`: sampled from the server, two
/// statements one after the other can read as two at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_writes_in_flight_follow_the_commits() {
    let durable = Server::start(platformkit_limit_testdb::Options { durable: true });
    let slow = durable.database(SCHEMA).await;
    common::db::slow_commits(&slow, 2_000).await;
    let most = most_writes_in_flight(&slow, Duration::from_millis(1500)).await;
    assert!(
        most > 1,
        "commits that wait 2 ms on their flush: {most} in flight at most"
    );
}

/// A flight gives its connection back every few statements: a service
/// that lends the limiter its one connection and uses it too gets its turn
/// while writes keep coming (more writers than one statement takes, so
/// some always wait), not only once they stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_sharing_its_one_connection_gets_its_turn_while_writes_keep_coming() {
    const WRITERS: usize = 100;
    let db = Server::shared().database(SCHEMA).await;
    let held = Arc::new(Mutex::new(db.connect().await));
    let lent = held.clone();
    let conns = move || {
        let lent = lent.clone();
        async move { Ok::<_, std::convert::Infallible>(lent.lock_owned().await) }
    };
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .no_refusal_cache()
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("login", 1_000_000, Duration::from_secs(3600)).expect("a limit");
    let answered = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicUsize::new(0));
    // Bounded, so that the test ends if the service never gets its turn.
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (limiter, limit) = (limiter.clone(), limit.clone());
            let (answered, stopped) = (answered.clone(), stopped.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while tokio::time::Instant::now() < until && stopped.load(Ordering::SeqCst) == 0 {
                    let key = Key::opaque(&format!("{writer}-{n}"));
                    assert!(limiter.failed(&limit, &key).await.unwrap().is_allowed());
                    answered.fetch_add(1, Ordering::SeqCst);
                    n += 1;
                }
            })
        })
        .collect();
    while answered.load(Ordering::SeqCst) < 2 * WRITERS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let service = held.lock().await;
    let writing = tokio::time::Instant::now() < until;
    service
        .simple_query("SELECT 1")
        .await
        .expect("the service's own query");
    drop(service);
    stopped.store(1, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("a writer");
    }
    assert!(
        writing,
        "the service had its connection only once the writes stopped"
    );
}

/// Locks the rows of `keys` under `limit`, each from a session of its own,
/// until the returned sessions are dropped.
async fn lock_rows(db: &TestDb, limit: &Limit, keys: &[Key]) -> Vec<Client> {
    let mut lockers = Vec::with_capacity(keys.len());
    for key in keys {
        lockers.push(lock_row(db, &stored(limit, key)).await);
    }
    lockers
}

/// Starts a write to each of `held` (whose rows another session locks) and
/// returns once each is in flight, waiting on its row: every place for a
/// write in flight is taken.
async fn fill_the_places<C: LimitConn + 'static>(
    db: &TestDb,
    limiter: &Arc<Limiter<Postgres<C>>>,
    limit: &Limit,
    held: &[Key],
) -> Vec<tokio::task::JoinHandle<Result<platformkit_limit::Verdict, platformkit_limit::Error>>> {
    assert_eq!(Some(held.len()), limiter.writes_in_flight());
    let tasks = held
        .iter()
        .map(|key| {
            let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { limiter.failed(&limit, &key).await })
        })
        .collect();
    // Each sent at once: none queues behind another, so within seconds
    // every one waits on its row.
    let admin = db.connect_admin().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock_waits(&admin).await < held.len() as i64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first {} writes did not all go at once",
            held.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tasks
}

/// The first writes go at once, alone, one per place for a write in
/// flight; the writes for other keys that arrive while every place is taken
/// wait, then go together in the statements that take the places as they
/// free, each key with its own count. With one place, that is one
/// statement for every write queued. A flight keeps its connection for
/// the writes that wait: one connection a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_different_keys_behind_the_ones_in_flight_share_statements() {
    const QUEUED: usize = 20;
    for places in [1, 2] {
        let db = Server::shared().database(SCHEMA).await;
        count_statements(&db).await;
        let (conns, sent) = pool(&db, 8).await;
        let clock = ManualClock::new(SystemTime::now());
        let limiter = Arc::new(
            Limiter::builder(Postgres::new(conns).with_clock(clock))
                .no_refusal_cache()
                .writes_in_flight(places)
                .budget(Duration::from_secs(30))
                .build()
                .expect("a budget"),
        );
        let limit = Limit::new("login", 1_000, Duration::from_secs(3600)).expect("a limit");
        let held: Vec<Key> = (0..places)
            .map(|i| Key::opaque(&format!("held{i}")))
            .collect();
        for key in &held {
            assert_eq!(limiter.failed(&limit, key).await.unwrap().count(), Some(1));
        }

        let lockers = lock_rows(&db, &limit, &held).await;
        let (before, lent_before) = (statements(&db).await, sent.load(Ordering::SeqCst));
        let in_flight = fill_the_places(&db, &limiter, &limit, &held).await;

        // One poll puts every queued write in the queue.
        let keys: Vec<Key> = (0..QUEUED).map(|i| Key::opaque(&format!("k{i}"))).collect();
        let mut queued = Box::pin(join_all(keys.iter().map(|key| limiter.failed(&limit, key))));
        assert!(
            futures::poll!(&mut queued).is_pending(),
            "queued behind the held rows"
        );
        drop(lockers);

        for task in in_flight {
            assert_eq!(task.await.unwrap().unwrap().count(), Some(2));
        }
        for verdict in queued.await {
            assert_eq!(verdict.unwrap().count(), Some(1), "each key its own count");
        }
        // The held writes alone; the queued ones in the statements that took
        // the places of the held ones as each returned.
        let statements = (statements(&db).await - before) as usize;
        assert!(
            (places + 1..=2 * places).contains(&statements),
            "{statements} statements for {places} held and {QUEUED} queued writes"
        );
        assert_eq!(
            sent.load(Ordering::SeqCst) - lent_before,
            places,
            "the queued writes on the connections of the flights in flight"
        );
        assert_eq!(stored_count(&db).await, (2 * places + QUEUED) as i64);
    }
}

/// Callers of different costs queued on one hot key behind a write in
/// flight go in one statement, which adds each caller's own cost: each sees
/// the count after its own cost (the statement's less the costs of the
/// callers after it), and is allowed or refused by that count alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_callers_of_different_costs_each_add_and_are_decided_by_their_own() {
    let db = Server::shared().database(SCHEMA).await;
    count_statements(&db).await;
    let (conns, sent) = pool(&db, 8).await;
    let clock = ManualClock::new(SystemTime::now());
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns).with_clock(clock))
            .no_refusal_cache()
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("api", 20, Duration::from_secs(3600)).expect("a limit");
    let key = Key::opaque("hot");
    let cost = |n| NonZeroU32::new(n).expect("a cost");
    let first = limiter.hit(&limit, &key).cost(cost(2)).await.unwrap();
    assert_eq!(first.count(), Some(2));

    // A write of 3 in flight, waiting on the row another session locks.
    let locker = lock_row(&db, &stored(&limit, &key)).await;
    let (before, lent_before) = (statements(&db).await, sent.load(Ordering::SeqCst));
    let in_flight = {
        let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
        tokio::spawn(async move { limiter.hit(&limit, &key).cost(cost(3)).await })
    };
    let admin = db.connect_admin().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock_waits(&admin).await < 1 {
        assert!(tokio::time::Instant::now() < deadline, "not sent at once");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // One poll queues them all behind it, in this order.
    let costs = [5, 1, 7, 4, 1];
    let mut queued = Box::pin(join_all(
        costs.map(|n| limiter.hit(&limit, &key).cost(cost(n)).into_future()),
    ));
    assert!(futures::poll!(&mut queued).is_pending(), "queued");
    drop(locker);

    let held = in_flight.await.unwrap().unwrap();
    assert_eq!(held.count(), Some(5));
    let seen: Vec<(Option<u64>, bool)> = queued
        .await
        .into_iter()
        .map(|verdict| {
            let verdict = verdict.unwrap();
            assert!(!verdict.is_unreachable(), "{verdict:?}");
            (verdict.count(), verdict.is_allowed())
        })
        .collect();
    // 5 + 5, + 1, + 7 (18: within 20), + 4 (22: refused), + 1 (23: the
    // window is past max).
    assert_eq!(
        seen,
        [
            (Some(10), true),
            (Some(11), true),
            (Some(18), true),
            (Some(22), false),
            (Some(23), false),
        ]
    );
    assert_eq!(
        statements(&db).await - before,
        2,
        "the write in flight, then one statement for the five queued"
    );
    assert_eq!(
        sent.load(Ordering::SeqCst) - lent_before,
        1,
        "both on the flight's one connection"
    );
    assert_eq!(stored_count(&db).await, 23, "every cost counted once");
}

/// Tiers of a limit with a lockout read the lockout under their own max:
/// a caller under the paid tier queued on a hot key behind a free tier's
/// write in flight is not locked out by the free tier's max. The previous
/// window's 3 reached the free tier's 2 (a lockout), not the paid tier's 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_queued_behind_another_reads_the_lockout_under_its_own_max() {
    let db = Server::shared().database(SCHEMA).await;
    let (conns, _) = pool(&db, 8).await;
    let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
            .no_refusal_cache()
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let free = Limit::builder("api", 2, Duration::from_secs(60))
        .lockout(Duration::from_secs(600))
        .build()
        .expect("a limit");
    let paid = free.with_max(5).expect("a tier");
    let key = Key::opaque("hot");
    for _ in 0..3 {
        limiter.hit(&free, &key).await.unwrap();
    }
    clock.advance(Duration::from_secs(60));
    let first = limiter.hit(&paid, &key).await.unwrap();
    assert!(first.is_allowed(), "3 never reached 5: {first:?}");
    assert!(
        limiter.hit(&free, &key).await.unwrap().is_refused(),
        "locked out"
    );

    // The current window's row, locked by another session: the free
    // tier's write waits on it, in flight.
    let locker = db.connect().await;
    locker
        .batch_execute("BEGIN; SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    let locked = locker
        .query(
            "SELECT count FROM platformkit.platformkit_limits \
             WHERE key = $1 AND count = 2 FOR UPDATE",
            &[&stored(&free, &key)],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1, "the current window's row");
    let in_flight = {
        let (limiter, free, key) = (limiter.clone(), free.clone(), key.clone());
        tokio::spawn(async move { limiter.hit(&free, &key).await })
    };
    let admin = db.connect_admin().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock_waits(&admin).await < 1 {
        assert!(tokio::time::Instant::now() < deadline, "not sent at once");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut queued = limiter.hit(&paid, &key).into_future();
    assert!(futures::poll!(&mut queued).is_pending(), "queued");
    drop(locker);

    assert!(
        in_flight.await.unwrap().unwrap().is_refused(),
        "still locked out"
    );
    let upgraded = queued.await.unwrap();
    assert!(upgraded.is_allowed(), "under the paid max: {upgraded:?}");
    assert!(upgraded.count().is_some_and(|n| n <= 5), "{upgraded:?}");
    assert_eq!(stored_count(&db).await, 3 + 4, "every write counted once");
}

/// Queued writes whose callers went away (a client disconnecting drops its
/// request) just as their turn to send came pass the turn on: the places
/// for writes in flight are not lost, and the next write is counted, not
/// left waiting until its budget runs out and failing open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_dropped_as_their_turn_comes_pass_it_on() {
    const PLACES: usize = 2;
    let db = Server::shared().database(SCHEMA).await;
    let (conns, _) = pool(&db, 8).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .no_refusal_cache()
            .writes_in_flight(PLACES)
            .budget(Duration::from_secs(5))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("login", 1_000, Duration::from_secs(3600)).expect("a limit");
    let held: Vec<Key> = (0..PLACES)
        .map(|i| Key::opaque(&format!("held{i}")))
        .collect();
    for key in &held {
        limiter.failed(&limit, key).await.unwrap();
    }
    let lockers = lock_rows(&db, &limit, &held).await;
    let in_flight = fill_the_places(&db, &limiter, &limit, &held).await;

    let keys: Vec<Key> = (0..PLACES)
        .map(|i| Key::opaque(&format!("gone{i}")))
        .collect();
    let mut gone: Vec<_> = keys
        .iter()
        .map(|key| Box::pin(limiter.failed(&limit, key)))
        .collect();
    for call in &mut gone {
        assert!(futures::poll!(call).is_pending(), "queued");
    }
    drop(lockers);
    for task in in_flight {
        task.await.unwrap().unwrap();
    }
    // Each returning write handed its place to a queued one, which is
    // dropped before it reads that.
    drop(gone);

    let next = limiter.failed(&limit, &Key::opaque("next")).await.unwrap();
    assert!(!next.is_unreachable(), "{:?}", next.unreachable());
    assert_eq!(next.count(), Some(1));
}

/// Concurrent writes through one merging limiter, over a few keys and
/// limits, each end with the counts `Memory` reaches playing the same calls
/// one by one: no count lost, none moved to another key, and on each key the
/// callers see the counts 1 to n, each once.
#[test]
fn concurrent_merged_writes_count_as_memory_counts_them_one_by_one() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = runtime.block_on(Server::shared().database(SCHEMA));
    let (conns, _) = runtime.block_on(pool(&db, 4));
    let conns = Arc::new(conns);
    let case = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: crate::common::cases(16),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(calls in prop::collection::vec((0..3usize, 0..3usize, 0..5usize), 1..48))| {
        let case = case.fetch_add(1, Ordering::SeqCst);
        let clock = ManualClock::new(SystemTime::now());
        let limits = [
            Limit::new(&format!("a{case}"), 3, Duration::from_secs(60)).unwrap(),
            Limit::new(&format!("b{case}"), 5, Duration::from_secs(3600)).unwrap(),
            Limit::builder(&format!("c{case}"), 4, Duration::from_secs(60))
                .strategy(Strategy::Sliding)
                .build()
                .unwrap(),
        ];
        let keys: Vec<Key> = (0..5).map(|i| Key::opaque(&format!("u{i}"))).collect();
        let conns = conns.clone();
        let pg = Arc::new(
            Limiter::builder(Postgres::new(move || {
                let conns = conns.clone();
                async move { conns.conn().await }
            }).with_clock(clock.clone()))
            .no_refusal_cache()
            .budget(Duration::from_secs(30))
            .build()
            .unwrap(),
        );
        let memory = Limiter::builder(Memory::new().with_clock(clock))
            .no_refusal_cache()
            .no_merging()
            .build()
            .unwrap();
        runtime.block_on(async {
            let tasks: Vec<_> = calls
                .iter()
                .map(|&(op, limit, key)| {
                    let (pg, limit, key) = (pg.clone(), limits[limit].clone(), keys[key].clone());
                    tokio::spawn(async move {
                        match op {
                            0 => pg.failed(&limit, &key).await,
                            1 => pg.hit(&limit, &key).await,
                            _ => pg.reserve(&limit, &key).await.map(|r| r.verdict().clone()),
                        }
                    })
                })
                .collect();
            let mut seen: std::collections::BTreeMap<(usize, usize), Vec<u64>> = Default::default();
            for (task, &(_, limit, key)) in tasks.into_iter().zip(&calls) {
                let verdict = task.await.unwrap().unwrap();
                prop_assert!(!verdict.is_unreachable());
                seen.entry((limit, key)).or_default().push(verdict.count().unwrap());
            }
            for &(op, limit, key) in &calls {
                let (limit, key) = (&limits[limit], &keys[key]);
                match op {
                    0 => drop(memory.failed(limit, key).await.unwrap()),
                    1 => drop(memory.hit(limit, key).await.unwrap()),
                    _ => drop(memory.reserve(limit, key).await.unwrap()),
                }
            }
            for (&(limit, key), counts) in &mut seen {
                counts.sort_unstable();
                prop_assert_eq!(counts.clone(), (1..=counts.len() as u64).collect::<Vec<_>>());
                let (limit, key) = (&limits[limit], &keys[key]);
                let (p, m) = (
                    pg.check(limit, key).await.unwrap(),
                    memory.check(limit, key).await.unwrap(),
                );
                prop_assert_eq!(
                    (p.count(), p.is_allowed(), p.retry_after()),
                    (m.count(), m.is_allowed(), m.retry_after())
                );
            }
            Ok(())
        })?;
    });
}

/// A limiter that outlives the runtime its statements were sent on (one in
/// a `static`, shared by several runtimes): the flight torn down with its
/// runtime, mid-statement, answers its callers, gives its place back and
/// leaves no key queued with no flight to send it; the next runtime's calls
/// for the same key are sent and counted.
#[test]
fn a_flight_torn_down_with_its_runtime_leaves_no_key_and_no_place_behind() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let first = runtime();
    let limit = Limit::new("torn", 1_000, Duration::from_secs(3600)).expect("a limit");
    let key = Key::opaque("k");
    let (db, limiter) = first.block_on(async {
        let db = Server::shared().database(SCHEMA).await;
        // A connection for each call, on whichever runtime makes it.
        let limiter = Arc::new(
            Limiter::builder(Postgres::new(db.config()))
                .no_refusal_cache()
                .budget(Duration::from_secs(5))
                .build()
                .expect("a limiter"),
        );
        limiter.failed(&limit, &key).await.expect("a verdict");
        (db, limiter)
    });
    let locker = first.block_on(lock_row(&db, &stored(&limit, &key)));
    for _ in 0..2 {
        let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
        first.spawn(async move { limiter.failed(&limit, &key).await });
    }
    first.block_on(async {
        let admin = db.connect_admin().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lock_waits(&admin).await < 1 {
            assert!(tokio::time::Instant::now() < deadline, "no write waited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    // The runtime goes, and with it the flight, its statement and the lock.
    drop(locker);
    drop(first);

    let second = runtime();
    second.block_on(async {
        let verdict = tokio::time::timeout(Duration::from_secs(4), limiter.failed(&limit, &key))
            .await
            .expect("the key was left with no flight to send it")
            .expect("a verdict");
        assert!(
            !verdict.is_shed() && !verdict.is_unreachable(),
            "{verdict:?}"
        );
        assert!(verdict.count().is_some_and(|c| c >= 2), "{verdict:?}");
    });
    drop(second);
}
