//! Merged counts for one hot key: concurrent writes to one key in one process
//! share statements, every count is written, and `hit` still lets exactly the
//! limit through.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use platformkit_limit::{Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::Client;

/// `size` held connections lent round-robin, counting the statements sent
/// (one per connection lent).
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
    let (conns, sent) = pool(&db, 8).await;
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
    let statements = sent.load(Ordering::SeqCst);
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
    assert_eq!(sent.load(Ordering::SeqCst), 64);
    assert_eq!(stored_count(&db).await, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_failures_on_distinct_keys_never_wait_on_each_other() {
    let db = Server::shared().database(SCHEMA).await;
    let (conns, sent) = pool(&db, 8).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("login", 1_000, Duration::from_secs(3600)).expect("a limit");
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (limiter, limit) = (limiter.clone(), limit.clone());
            tokio::spawn(
                async move { limiter.failed(&limit, &Key::opaque(&format!("k{i}"))).await },
            )
        })
        .collect();
    for task in tasks {
        let verdict = task.await.expect("a task").expect("a verdict");
        assert_eq!(verdict.count(), Some(1));
    }
    assert_eq!(sent.load(Ordering::SeqCst), 64, "one statement per key");
}
