//! Floods and hang-ups: nothing an ordinary client can do by flooding a
//! limiter or by hanging up on it turns into "allowed" while the database
//! is up. A caller dropped at any point (queued, its statement in flight)
//! changes no other caller's answer; a call whose pair is refused from the
//! refusal cache sends no statement, whatever other pairs it carries; and
//! waiting that load causes is shed, never allowed.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::common;
use common::db::{Pool, counts_by_key, lock_row, lock_waits, stored};
use common::{SLACK, assert_shed};
use futures::future::join_all;
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, Reservation, SCHEMA, Verdict,
};
use platformkit_limit_testdb::{Server, TestDb};
use proptest::prelude::*;
use tokio::time::{Instant, sleep};

/// A connection source that counts the connections it lends: one per
/// statement the limiter sends.
struct Counting {
    pool: Pool,
    lent: Arc<AtomicUsize>,
}

impl LimitConn for Counting {
    type Conn = <Pool as LimitConn>::Conn;
    type Error = <Pool as LimitConn>::Error;

    async fn conn(&self) -> Result<Self::Conn, Self::Error> {
        self.lent.fetch_add(1, Ordering::SeqCst);
        self.pool.conn().await
    }
}

async fn counting(db: &TestDb, size: usize) -> (Counting, Arc<AtomicUsize>) {
    let lent = Arc::new(AtomicUsize::new(0));
    let pool = Pool::open(&db.config(), size).await;
    (
        Counting {
            pool,
            lent: lent.clone(),
        },
        lent,
    )
}

fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, Duration::from_secs(3600)).expect("a limit")
}

/// Waits until `n` backends of the database wait on a lock.
async fn until_lock_waits(db: &TestDb, n: i64) {
    let admin = db.connect_admin().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock_waits(&admin).await < n {
        assert!(Instant::now() < deadline, "no call waited on the lock");
        sleep(Duration::from_millis(5)).await;
    }
}

/// The reproduction of a dropped request letting others through: the one
/// place for a write in flight is held by a write waiting on a locked row;
/// the victim's account, already at its max, gets a queue of reservations;
/// the first two callers in it hang up (a client reset, a timeout layer).
/// Every other caller is still refused by the account's real count: none is
/// answered unreachable, none allowed, and each was counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_hang_up_change_no_other_callers_answer() {
    const QUEUED: usize = 10;
    let db = Server::shared().database(SCHEMA).await;
    let (conns, _) = counting(&db, 4).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(conns))
            .no_refusal_cache()
            .budget(Duration::from_secs(5))
            .build()
            .expect("a limiter"),
    );
    let login = limit("login", 3);
    let victim = Key::email("victim@example.com");
    for _ in 0..3 {
        limiter.failed(&login, &victim).await.expect("a verdict");
    }
    let blocker = limit("blk", 1_000);
    let x = Key::opaque("x");
    limiter.hit(&blocker, &x).await.expect("a verdict");

    // The one place is taken by a write waiting on a locked row.
    let locker = lock_row(&db, &stored(&blocker, &x)).await;
    let held = {
        let (limiter, blocker, x) = (limiter.clone(), blocker.clone(), x.clone());
        tokio::spawn(async move { limiter.hit(&blocker, &x).await })
    };
    until_lock_waits(&db, 1).await;

    let reserve = || {
        let (limiter, login, victim) = (limiter.clone(), login.clone(), victim.clone());
        tokio::spawn(async move {
            match limiter.reserve(&login, &victim).await? {
                Reservation::Granted(permit) => {
                    Ok::<_, platformkit_limit::Error>(permit.verdict().clone())
                }
                Reservation::Refused(verdict) => Ok(verdict),
            }
        })
    };
    let first = reserve();
    sleep(Duration::from_millis(20)).await;
    let queued: Vec<_> = (0..QUEUED).map(|_| reserve()).collect();
    sleep(Duration::from_millis(50)).await;
    // The first caller, and the first queued behind it, hang up.
    first.abort();
    queued[0].abort();
    sleep(Duration::from_millis(20)).await;
    drop(locker);

    let mut answers = Vec::new();
    for task in queued.into_iter().skip(1) {
        let verdict: Verdict = task
            .await
            .expect("a task")
            .expect("a verdict, not an error");
        answers.push(verdict);
    }
    held.await.expect("a task").expect("the held write");
    for verdict in &answers {
        assert!(
            !verdict.is_unreachable() && !verdict.is_shed(),
            "a caller was answered for a neighbour's hang-up: {verdict:?}"
        );
        assert!(
            verdict.is_refused(),
            "an account at its max let one through"
        );
        assert!(verdict.count().is_some_and(|c| c > 3), "{verdict:?}");
    }
    let counts = counts_by_key(&db.connect_admin().await).await;
    let counted = counts[&stored(&login, &victim)];
    let survivors = (QUEUED - 1) as i64;
    assert!(
        (3 + survivors..=3 + survivors + 2).contains(&counted),
        "{counted}: every surviving reservation counted, at most the dropped ones besides"
    );
}

/// A call over several pairs, one of which the refusal cache refuses (an
/// address flooding a login, each request with a fresh account), is refused
/// at once without a statement: the flood neither reaches the database nor
/// counts against the accounts it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_address_is_answered_from_the_cache_whatever_else_the_call_carries() {
    const FLOOD: usize = 200;
    let db = Server::shared().database(SCHEMA).await;
    let (conns, lent) = counting(&db, 4).await;
    let limiter = Limiter::new(Postgres::new(conns));
    let per_account = limit("login-account", 3);
    let per_address = limit("login-address", 5);
    let address = Key::ip("192.0.2.7".parse::<std::net::IpAddr>().expect("an address"));

    // The address is refused, repeatedly: it is flooded.
    let mut refused = 0;
    for i in 0.. {
        let account = Key::email(&format!("warmup{i}@example.com"));
        let pairs = [(&per_account, &account), (&per_address, &address)];
        let reserved = limiter.reserve_all(&pairs).await.expect("verdicts");
        if reserved.verdicts().is_refused() {
            refused += 1;
        }
        if refused == Limiter::FLOOD_REFUSALS {
            break;
        }
    }

    let before = lent.load(Ordering::SeqCst);
    for i in 0..FLOOD {
        let account = Key::email(&format!("victim{i}@example.com"));
        let pairs = [(&per_account, &account), (&per_address, &address)];
        let reserved = limiter.reserve_all(&pairs).await.expect("verdicts");
        let verdicts = reserved.verdicts();
        assert!(verdicts.is_refused(), "a refused address let one through");
        assert_eq!(
            verdicts.refused_by().map(Verdict::limit),
            Some("login-address")
        );
        let hit = limiter.hit_all(&pairs).await.expect("verdicts");
        assert!(hit.is_refused());
    }
    assert_eq!(
        lent.load(Ordering::SeqCst) - before,
        0,
        "the flood reached the database"
    );
    let counts = counts_by_key(&db.connect_admin().await).await;
    assert!(
        counts.keys().all(|key| !key.contains("victim")),
        "the flood counted against the accounts it named: {counts:?}"
    );
}

/// A pool of one held by the service (its own query): a call that waits
/// out its budget for a connection is shed (refused), never allowed, on a
/// limiter that was never answered as on one that was: the server answers
/// the probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_is_load_and_shed_never_allowed() {
    let db = Server::shared().database(SCHEMA).await;
    let held = common::db::hold(&db.config()).await;
    let budget = Duration::from_millis(300);
    let store = Postgres::new(common::db::lend(held.clone())).with_probe(db.config());
    let limiter = Limiter::builder(store).budget(budget).build().unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    let never_answered = {
        let taken = held.lock().await;
        let verdict = limiter.failed(&login, &alice).await.expect("a verdict");
        drop(taken);
        verdict
    };
    assert_shed(
        &never_answered,
        "never answered: the server answers a probe",
    );

    let counted = limiter.failed(&login, &alice).await.expect("a verdict");
    assert_eq!(counted.count(), Some(1));

    let taken = held.lock().await;
    let started = Instant::now();
    let verdict = limiter.failed(&login, &alice).await.expect("a verdict");
    assert!(started.elapsed() < budget + SLACK);
    drop(taken);
    assert_shed(&verdict, "a call that waited for the service's connection");
    assert!(
        verdict
            .shed()
            .is_some_and(|e| e.kind() == ErrorKind::Overloaded)
    );
    assert_eq!(
        limiter
            .check(&login, &alice)
            .await
            .expect("a verdict")
            .count(),
        Some(1),
        "the shed call counted nothing"
    );
}

/// What one played caller does: which key, and whether it hangs up, and
/// when.
#[derive(Clone, Debug)]
struct Caller {
    key: usize,
    hit: bool,
    /// Hangs up after this long (in 0.1 ms), or waits for its answer.
    hangs_up_after: Option<u16>,
}

fn callers() -> impl Strategy<Value = Vec<Caller>> {
    prop::collection::vec(
        (
            0..4usize,
            any::<bool>(),
            prop::option::weighted(0.4, 0..40u16),
        )
            .prop_map(|(key, hit, hangs_up_after)| Caller {
                key,
                hit,
                hangs_up_after,
            }),
        1..32,
    )
}

/// Concurrent writes over a few keys through one place, some callers
/// hanging up at random moments (queued, or their statement in flight):
/// with the server up, every caller that waits gets its own key's count,
/// never unreachable, never shed; each stored count is the surviving
/// callers' plus at most the ones that hung up.
fn play(db: &TestDb, callers: &[Caller]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let pool = Pool::open(&db.config(), 3).await;
        let clock = ManualClock::new(SystemTime::now());
        let limiter = Arc::new(
            Limiter::builder(Postgres::new(pool).with_clock(clock))
                .no_refusal_cache()
                .budget(Duration::from_secs(10))
                .build()
                .expect("a limiter"),
        );
        let name = format!("drop{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let limit = Limit::new(&name, 1_000_000, Duration::from_secs(3600)).expect("a limit");
        let keys: Vec<Key> = (0..4).map(|k| Key::opaque(&format!("k{k}"))).collect();
        let calls = callers.iter().map(|caller| {
            let (limiter, limit, key) = (limiter.clone(), limit.clone(), keys[caller.key].clone());
            let caller = caller.clone();
            async move {
                let call = async {
                    if caller.hit {
                        limiter.hit(&limit, &key).await
                    } else {
                        limiter.failed(&limit, &key).await
                    }
                };
                match caller.hangs_up_after {
                    None => Some(call.await),
                    Some(tenths) => {
                        let after = Duration::from_micros(u64::from(tenths) * 100);
                        tokio::time::timeout(after, call).await.ok()
                    }
                }
            }
        });
        let answers = join_all(calls.map(tokio::spawn)).await;
        let mut survived: BTreeMap<usize, i64> = BTreeMap::new();
        let mut dropped: BTreeMap<usize, i64> = BTreeMap::new();
        for (caller, answer) in callers.iter().zip(answers) {
            match answer.expect("a task") {
                Some(verdict) => {
                    let verdict = verdict.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    prop_assert!(
                        !verdict.is_unreachable() && !verdict.is_shed(),
                        "a waiting caller was answered for another's hang-up: {verdict:?}"
                    );
                    prop_assert!(verdict.is_allowed() && verdict.count().is_some());
                    *survived.entry(caller.key).or_default() += 1;
                }
                None => *dropped.entry(caller.key).or_default() += 1,
            }
        }
        // Statements of callers that hung up may still be in flight.
        sleep(Duration::from_millis(200)).await;
        let counts = counts_by_key(&db.connect_admin().await).await;
        for (k, key) in keys.iter().enumerate() {
            let stored = counts.get(&stored(&limit, key)).copied().unwrap_or(0);
            let survived = survived.get(&k).copied().unwrap_or(0);
            let dropped = dropped.get(&k).copied().unwrap_or(0);
            prop_assert!(
                (survived..=survived + dropped).contains(&stored),
                "key {k}: {stored} stored for {survived} surviving and {dropped} dropped callers"
            );
        }
        Ok(())
    })
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn cases() -> u32 {
    crate::common::cases(24)
}

#[test]
fn callers_hanging_up_at_random_never_change_a_waiting_callers_answer() {
    let server = Server::shared();
    let db = tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(server.database(SCHEMA));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&callers(), |callers| play(&db, &callers))
        .expect("no surviving caller answered for another's hang-up");
}

/// The login of the README over a pool of 8 on a durable server whose
/// commits take a millisecond, as a hosted disk's do: per account and per
/// address, failures counted, successes given back.
struct Login {
    app: axum::Router,
    /// How often the password was checked: the handler ran.
    checked: Arc<AtomicUsize>,
    /// Requests the handler saw with a verdict that was unreachable.
    unreachable: Arc<AtomicUsize>,
    limiter: Arc<Limiter<Postgres<deadpool_postgres::Pool>>>,
    per_account: Limit,
    per_address: Limit,
}

const FLOOD_BUDGET: Duration = Duration::from_secs(2);

async fn login(db: &TestDb) -> Login {
    use axum::extract::Extension;
    use axum::http::StatusCode;
    use platformkit_limit::Verdicts;
    use platformkit_limit_tower::LimitLayer;

    let manager = deadpool_postgres::Manager::new(db.config(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(8)
        .build()
        .expect("a pool");
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(pool))
            .budget(FLOOD_BUDGET)
            .build()
            .expect("a limiter"),
    );
    let per_account = Limit::new("login-account", 3, Duration::from_secs(900)).expect("a limit");
    let per_address = Limit::new("login-address", 50, Duration::from_secs(900)).expect("a limit");
    let checked = Arc::new(AtomicUsize::new(0));
    let unreachable = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (checked, unreachable) = (checked.clone(), unreachable.clone());
        move |Extension(verdicts): Extension<Verdicts>| {
            let (checked, unreachable) = (checked.clone(), unreachable.clone());
            async move {
                checked.fetch_add(1, Ordering::SeqCst);
                if verdicts.is_unreachable() {
                    unreachable.fetch_add(1, Ordering::SeqCst);
                }
                // A wrong password.
                StatusCode::UNAUTHORIZED
            }
        }
    };
    let layer = LimitLayer::attempt(limiter.clone(), |r: &axum::http::response::Parts| {
        r.status.is_success()
    })
    .limit(&per_account, |head: &axum::http::request::Parts| {
        let account = head.headers.get("x-account")?.to_str().ok()?;
        Some(Key::email(account))
    })
    .limit_per_client_ip(&per_address);
    let app = axum::Router::new()
        .route("/login", axum::routing::post(handler))
        .layer(layer);
    Login {
        app,
        checked,
        unreachable,
        limiter,
        per_account,
        per_address,
    }
}

/// One login attempt from `address` for `account`: its status and how long
/// it took.
async fn attempt(app: axum::Router, address: std::net::IpAddr, account: String) -> (u16, Duration) {
    use tower::ServiceExt as _;
    let request = axum::http::Request::post("/login")
        .header("x-account", account)
        .extension(axum::extract::ConnectInfo(std::net::SocketAddr::new(
            address, 50_000,
        )))
        .body(axum::body::Body::empty())
        .expect("a request");
    let started = Instant::now();
    let response = app.oneshot(request).await.expect("a response");
    (response.status().as_u16(), started.elapsed())
}

/// A durable server whose commits each take about a millisecond.
fn slow_commits() -> Server {
    Server::start(platformkit_limit_testdb::Options { durable: true })
}

async fn with_slow_commits(server: &Server) -> TestDb {
    let db = server.database(SCHEMA).await;
    crate::common::db::slow_commits(&db, 1_000).await;
    db
}

/// 3,000 concurrent logins from one address already at its limit, each
/// with a fresh account, through the layer over a pool of 8: not one is
/// allowed (the password is never checked), every one is answered within
/// the budget, and an ordinary user from another address, meanwhile, is
/// served and counted within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_a_refused_address_is_never_allowed_and_others_are_served() {
    const FLOOD: usize = 3_000;
    let server = slow_commits();
    let db = with_slow_commits(&server).await;
    let login = login(&db).await;
    let flooder: std::net::IpAddr = "192.0.2.7".parse().expect("an address");
    let address = Key::ip(flooder);
    for _ in 0..login.per_address.max() {
        login
            .limiter
            .hit(&login.per_address, &address)
            .await
            .expect("a verdict");
    }

    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let app = login.app.clone();
            tokio::spawn(attempt(app, flooder, format!("victim{i}@example.com")))
        })
        .collect();
    sleep(Duration::from_millis(100)).await;
    let ordinary = attempt(
        login.app.clone(),
        "198.51.100.1".parse().expect("an address"),
        "alice@example.com".to_owned(),
    )
    .await;
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    for task in flood {
        let (status, took) = task.await.expect("a task");
        *statuses.entry(status).or_default() += 1;
        slowest = slowest.max(took);
    }
    assert_eq!(ordinary.0, 401, "the ordinary user's password was checked");
    assert!(ordinary.1 < FLOOD_BUDGET + SLACK, "{:?}", ordinary.1);
    assert_eq!(
        login.checked.load(Ordering::SeqCst),
        1,
        "the flood was let through: {statuses:?}"
    );
    assert!(
        statuses.keys().all(|status| [429, 503].contains(status)),
        "{statuses:?}"
    );
    assert!(
        slowest < FLOOD_BUDGET + SLACK,
        "a flood request took {slowest:?}"
    );
    let alice = Key::email("alice@example.com");
    let counted = login
        .limiter
        .check(&login.per_account, &alice)
        .await
        .expect("a verdict");
    assert_eq!(
        counted.count(),
        Some(1),
        "the ordinary user's failure counted"
    );
    drop(login);
    tokio::task::block_in_place(|| drop((db, server)));
}

/// 3,000 concurrent logins from 3,000 addresses (a botnet), each with a
/// fresh account, through the same layer: none is answered unreachable (the
/// server is up, however many wait), and at most the sum of the limits is
/// let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_botnet_of_fresh_addresses_is_counted_never_read_as_an_outage() {
    const FLOOD: usize = 3_000;
    let server = slow_commits();
    let db = with_slow_commits(&server).await;
    let login = login(&db).await;
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let app = login.app.clone();
            let address = std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                10,
                (i / 65_536) as u8,
                (i / 256 % 256) as u8,
                (i % 256) as u8,
            ));
            tokio::spawn(attempt(app, address, format!("user{i}@example.com")))
        })
        .collect();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    for task in flood {
        let (status, took) = task.await.expect("a task");
        *statuses.entry(status).or_default() += 1;
        slowest = slowest.max(took);
    }
    assert_eq!(
        login.unreachable.load(Ordering::SeqCst),
        0,
        "a flood was read as an outage: {statuses:?}"
    );
    let let_through = login.checked.load(Ordering::SeqCst);
    let limits = FLOOD * login.per_address.max().min(login.per_account.max()) as usize;
    assert!(let_through <= limits, "{let_through} let through");
    assert!(
        statuses.keys().all(|status| [401, 503].contains(status)),
        "{statuses:?}"
    );
    assert!(slowest < FLOOD_BUDGET + SLACK, "a request took {slowest:?}");
    drop(login);
    tokio::task::block_in_place(|| drop((db, server)));
}

/// A deadpool pool that tracks how many of its connections are lent at
/// once, and the most ever.
struct Tracked {
    pool: deadpool_postgres::Pool,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

/// A connection of [`Tracked`], given back (and uncounted) when dropped.
struct TrackedConn {
    conn: <deadpool_postgres::Pool as LimitConn>::Conn,
    now: Arc<AtomicUsize>,
}

impl std::ops::Deref for TrackedConn {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self.conn
    }
}

impl Drop for TrackedConn {
    fn drop(&mut self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LimitConn for Tracked {
    type Conn = TrackedConn;
    type Error = deadpool_postgres::PoolError;

    async fn conn(&self) -> Result<TrackedConn, Self::Error> {
        let conn = self.pool.conn().await?;
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Ok(TrackedConn {
            conn,
            now: self.now.clone(),
        })
    }
}

/// 3,000 concurrent all-or-nothing calls (an API's quota, two limits) on
/// fresh keys through a pool of 8, on a server with slow commits: they are
/// never merged, so each waits for one of the writes' places in the
/// limiter, and the burst never holds more of the pool than the writes
/// may (one statement in flight, the default); an ordinary user's `hit`
/// meanwhile is served and counted, and no call is read as an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_all_or_nothing_calls_waits_in_the_limiter_and_an_ordinary_user_is_served() {
    const BURST: usize = 3_000;
    let server = slow_commits();
    let db = with_slow_commits(&server).await;
    let manager = deadpool_postgres::Manager::new(db.config(), tokio_postgres::NoTls);
    let most = Arc::new(AtomicUsize::new(0));
    let source = Tracked {
        pool: deadpool_postgres::Pool::builder(manager)
            .max_size(8)
            .build()
            .expect("a pool"),
        now: Arc::new(AtomicUsize::new(0)),
        most: most.clone(),
    };
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(source))
            .budget(FLOOD_BUDGET)
            .build()
            .expect("a limiter"),
    );
    let per_second = limit("api-second", 20);
    let per_day = limit("api-day", 10_000);
    let burst: Vec<_> = (0..BURST)
        .map(|n| {
            let (limiter, per_second, per_day) =
                (limiter.clone(), per_second.clone(), per_day.clone());
            tokio::spawn(async move {
                let client = Key::opaque(&format!("client-{n}"));
                let pairs = [(&per_second, &client), (&per_day, &client)];
                limiter.hit_all_or_nothing(&pairs).await.expect("verdicts")
            })
        })
        .collect();
    sleep(Duration::from_millis(50)).await;
    let user = limiter
        .hit(&limit("search", 100), &Key::opaque("an ordinary user"))
        .await
        .expect("a verdict");
    assert!(
        !user.is_shed() && !user.is_unreachable() && user.count() == Some(1),
        "the ordinary user during the burst: {user:?}"
    );
    for (n, task) in burst.into_iter().enumerate() {
        let verdicts = task.await.expect("a task");
        assert!(
            !verdicts.is_unreachable(),
            "burst call {n} read as an outage: {verdicts:?}"
        );
    }
    // The burst's one place, and the ordinary user's statement.
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 2, "{most} connections of the pool lent at once");
    drop(limiter);
    tokio::task::block_in_place(|| drop((db, server)));
}

/// A database whose connection slots are all taken (here its connection
/// limit, as a flood of logins, with or without grants, takes them: both
/// are `53300`, too many connections) is up and out of a resource: a
/// limiter that connects for each call sheds its calls, never lets them
/// through as unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_slots_all_taken_are_load_and_shed_never_allowed() {
    let (db, taken) = every_slot_taken().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = common::limit("login", 5);
    for attempt in 0..3 {
        let verdict = limiter
            .failed(&login, &Key::email("alice@example.com"))
            .await
            .expect("a verdict");
        assert_shed(
            &verdict,
            &format!("attempt {attempt} with every slot taken"),
        );
    }
    drop(taken);
}

/// An API's quota calls under the same flood: asks of a cost, over two
/// limits, counted under every limit or all or nothing, on fresh keys all
/// at once, are shed, every one, never allowed. Through sqlx's pool of two,
/// as below: a connection for each of 500 calls at once would take the
/// whole server's slots, not the database's, from every other test.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_calls_with_every_slot_taken_are_shed_never_allowed() {
    let (db, taken) = every_slot_taken().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy(&db.url())
        .expect("a lazy pool");
    let limiter = Limiter::new(Postgres::new(pool));
    let per_second = common::limit("api-second", 20);
    let per_day = common::limit("api-day", 1_000);
    let cost = NonZeroU32::new(3).expect("a cost");
    let flood = (0..500).map(|n| {
        let (limiter, per_second, per_day) = (&limiter, &per_second, &per_day);
        async move {
            let client = Key::opaque(&format!("client-{n}"));
            let pairs = [(per_second, &client), (per_day, &client)];
            if n % 2 == 0 {
                limiter.hit_all_or_nothing(&pairs).cost(cost).await
            } else {
                limiter.hit_all(&pairs).cost(cost).await
            }
        }
    });
    for (n, verdicts) in join_all(flood).await.into_iter().enumerate() {
        let verdicts = verdicts.expect("verdicts");
        assert!(
            verdicts.is_shed() && verdicts.is_refused() && !verdicts.is_unreachable(),
            "quota call {n} with every slot taken: {verdicts:?}"
        );
    }
    drop(taken);
}

/// The same through sqlx's pool, which retries such a connection in
/// silence until its acquire timeout: a connection it cannot make because
/// every slot is taken is load, and a flood of calls on fresh keys is shed,
/// every one.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_slots_all_taken_are_shed_through_an_sqlx_pool_too() {
    let (db, taken) = every_slot_taken().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy(&db.url())
        .expect("a lazy pool");
    let limiter = Limiter::new(Postgres::new(pool));
    let login = common::limit("login", 5);
    for attempt in 0..3 {
        let verdict = limiter
            .failed(&login, &Key::email("alice@example.com"))
            .await
            .expect("a verdict");
        assert_shed(
            &verdict,
            &format!("attempt {attempt} through sqlx with every slot taken"),
        );
    }
    // The flood itself: fresh keys, all at once.
    let flood = (0..500).map(|n| {
        let limiter = &limiter;
        let login = &login;
        async move {
            limiter
                .failed(login, &Key::email(&format!("user{n}@example.com")))
                .await
        }
    });
    for (n, verdict) in join_all(flood).await.into_iter().enumerate() {
        assert_shed(
            &verdict.expect("a verdict"),
            &format!("flood call {n} through sqlx with every slot taken"),
        );
    }
    drop(taken);
}

/// A fresh database with a connection limit of two, both taken (the admin's
/// session and a flood's connection, held until the second value drops):
/// every further connection is refused with `53300`. Both connect before
/// the limit is set: a backend of the database's set-up still exiting
/// once took the flood's slot, and the set-up itself failed with 53300.
async fn every_slot_taken() -> (TestDb, (tokio_postgres::Client, tokio_postgres::Client)) {
    let db = Server::shared().database(platformkit_limit::SCHEMA).await;
    let admin = db.connect_admin().await;
    let flood = db.connect().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" CONNECTION LIMIT 2",
            db.name()
        ))
        .await
        .expect("a connection limit");
    (db, (admin, flood))
}
