//! An unreachable store gives "allowed, unreachable" within the budget, says
//! why, and is counted as such: nothing listening, a listener that never
//! answers, a terminated or killed connection, a connection source that
//! errors or never yields (an exhausted pool), a stopped or restarted
//! server. Once the store is back, the counts from before are there and the
//! calls it missed were not counted.
//!
//! Every fault is caused by the test itself: it stops the server, terminates
//! a backend, holds a row lock from another session or hands the limiter a
//! source that fails. The time bounds are correctness bounds (a call that
//! ignored its budget would wait for as long as the fault lasts), not speed
//! targets, so they leave room for a busy machine.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::db::{counts_by_key, fresh_db, hold, lend, nothing_listens, stored};
use common::metrics::Recorded;
use common::{BUDGET, PROBE, SLACK, assert_counted, assert_shed, limit, timed};
use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA, Store, Verdict,
    WhenUnreachable,
};
use platformkit_limit_testdb::{Options, Server};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tokio_postgres::{Client, Config, NoTls};

/// A source that keeps one connection and replaces it when it finds it
/// closed, as a pool does with a broken connection; and how many connections
/// it has made.
fn reconnecting(
    config: Config,
) -> (
    impl LimitConn<Conn = OwnedMappedMutexGuard<Option<Client>, Client>, Error = tokio_postgres::Error>,
    Arc<AtomicUsize>,
) {
    let slot: Arc<Mutex<Option<Client>>> = Arc::new(Mutex::new(None));
    let connects = Arc::new(AtomicUsize::new(0));
    let made = Arc::clone(&connects);
    let source = move || {
        let slot = Arc::clone(&slot);
        let config = config.clone();
        let made = Arc::clone(&made);
        async move {
            let mut guard = slot.lock_owned().await;
            if guard.as_ref().is_none_or(Client::is_closed) {
                *guard = None;
                let (client, connection) = config.connect(NoTls).await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                *guard = Some(client);
                made.fetch_add(1, Ordering::Relaxed);
            }
            Ok(OwnedMutexGuard::map(guard, |client| {
                client.as_mut().expect("connected just above")
            }))
        }
    };
    (source, connects)
}

/// The limiter's operation `op` ("check", "failed" or "hit") on `key`.
async fn operate<S: Store>(
    limiter: &Limiter<S>,
    op: &str,
    limit: &Limit,
    key: &Key,
) -> Result<Verdict, platformkit_limit::Error> {
    match op {
        "check" => limiter.check(limit, key).await,
        "failed" => limiter.failed(limit, key).await,
        "hit" => limiter.hit(limit, key).await,
        other => panic!("no operation {other}"),
    }
}

/// Asserts that the verdict is allowed because the store was unreachable,
/// for the reason `kind`.
#[track_caller]
fn assert_unreachable(verdict: &Verdict, kind: ErrorKind, what: &str) {
    assert!(
        verdict.is_allowed() && verdict.is_unreachable(),
        "{what}: expected allowed because unreachable, got {verdict:?}"
    );
    let cause = verdict
        .unreachable()
        .expect("an unreachable verdict has a cause");
    assert_eq!(cause.kind(), kind, "{what}: {cause:?}");
    assert_eq!(verdict.count(), None, "{what}");
}

// ---------------------------------------------------------------------------
// The server is not there
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_server_that_never_answers_is_unreachable_within_the_budget() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    // Accepts connections and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket);
        }
    });
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("limit_owner")
        .dbname("silent");

    let limiter = Limiter::builder(Postgres::new(config))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    // The first call waits its budget, then for the probe: no answer
    // within the probe's bound either, so down.
    let what = "a server that never answers";
    let (verdict, took) = timed(BUDGET + PROBE + SLACK, what, limiter.check(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Timeout, what);
    assert!(
        took >= BUDGET + PROBE - Duration::from_millis(50),
        "took {took:?}"
    );
    // While that answer stands, calls are answered at once: none waits its
    // budget (the breaker).
    let what = "a call after the probe found it down";
    let (verdict, took) = timed(BUDGET, what, limiter.check(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Connect, what);
    assert!(took < BUDGET, "waited {took:?}");
    silent.abort();

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "check", "unreachable"), 2);
    assert_eq!(recorded.probes("down"), 1, "one probe for both calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unreachable_and_the_counts_are_there_when_it_is_back() {
    let server = tokio::task::block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let limiter = Limiter::builder(Postgres::new(db.config()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let held = hold(&db.config()).await;
    // A held connection cannot open one of its own: the store is given a
    // probe (without it, a call on it that got no answer is shed).
    let held_limiter = Limiter::builder(Postgres::new(lend(held.clone())).with_probe(db.config()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    tokio::task::block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));
    let what = "a stopped server";
    let (verdict, _) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Connect, what);
    // A connection held across the stop is lost too.
    let what = "a connection held across the stop";
    let (verdict, _) = timed(BUDGET + SLACK, what, held_limiter.failed(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Connect, what);

    tokio::task::block_in_place(|| server.pg_ctl(&["start", "-w"]));
    // The server is back: calls count again within one probe interval.
    tokio::time::sleep(PROBE).await;
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert!(!verdict.is_unreachable(), "{:?}", verdict.unreachable());
    assert_eq!(
        verdict.count(),
        Some(2),
        "the count outlived the restart; the unreachable failures were not recorded"
    );
    drop(held_limiter);
    drop(held);
    tokio::task::block_in_place(|| drop(server));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_run_fails_open_then_recovers() {
    // Longer than the other fault tests' budget: the calls before and after
    // the outage connect to a server that has just started, on a busy
    // machine, and must be counted.
    const RESTART_BUDGET: Duration = Duration::from_secs(1);
    const WRITES_BEFORE: u64 = 5;

    let server = tokio::task::block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let per_call = Limiter::builder(Postgres::new(db.config()))
        .budget(RESTART_BUDGET)
        .build()
        .unwrap();
    let (source, connects) = reconnecting(db.config());
    let pooled = Limiter::builder(Postgres::new(source))
        .budget(RESTART_BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 1_000);
    let alice = Key::email("alice@example.com");

    let mut expected = 0;
    for _ in 0..WRITES_BEFORE {
        for (name, verdict) in [
            ("per call", per_call.failed(&login, &alice).await.unwrap()),
            ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
        ] {
            expected += 1;
            assert_counted(&verdict, name);
            assert_eq!(verdict.count(), Some(expected), "{name}");
        }
    }
    assert_eq!(connects.load(Ordering::Relaxed), 1);

    tokio::task::block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));

    // Every call during the outage is allowed, says why, and ends in time.
    for round in 0..2 {
        for (name, limiter_call) in [("per call", 0), ("reconnecting", 1)] {
            for op in ["check", "failed", "hit"] {
                let what = format!("{name} {op} during the outage, round {round}");
                let call = async {
                    match (limiter_call, op) {
                        (0, "check") => per_call.check(&login, &alice).await,
                        (0, "failed") => per_call.failed(&login, &alice).await,
                        (0, _) => per_call.hit(&login, &alice).await,
                        (_, "check") => pooled.check(&login, &alice).await,
                        (_, "failed") => pooled.failed(&login, &alice).await,
                        (_, _) => pooled.hit(&login, &alice).await,
                    }
                };
                let (verdict, _) = timed(RESTART_BUDGET + SLACK, &what, call).await;
                assert_unreachable(&verdict.unwrap(), ErrorKind::Connect, &what);
            }
        }
    }

    tokio::task::block_in_place(|| server.pg_ctl(&["start", "-w"]));

    // The first call after the start works, with nothing done by the caller.
    for (name, verdict) in [
        ("per call", per_call.failed(&login, &alice).await.unwrap()),
        ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
    ] {
        expected += 1;
        assert_counted(&verdict, &format!("{name}, first call after the start"));
        assert_eq!(
            verdict.count(),
            Some(expected),
            "{name}: the counts from before the outage are there, and nothing \
             was counted while it lasted"
        );
    }
    assert_eq!(connects.load(Ordering::Relaxed), 2, "one reconnection");

    // A restart between two calls, with no call during it, is no different.
    tokio::task::block_in_place(|| server.pg_ctl(&["restart", "-m", "fast", "-w"]));
    for (name, verdict) in [
        ("per call", per_call.failed(&login, &alice).await.unwrap()),
        ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
    ] {
        expected += 1;
        assert_counted(&verdict, &format!("{name}, first call after the restart"));
        assert_eq!(verdict.count(), Some(expected), "{name}");
    }
    assert_eq!(connects.load(Ordering::Relaxed), 3, "one more reconnection");

    let admin = db.connect_admin().await;
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), expected as i64)])
    );

    drop((per_call, pooled, admin));
    tokio::task::block_in_place(|| drop(server));
}

// ---------------------------------------------------------------------------
// The connection source fails
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_source_that_errors_is_unreachable() {
    let failing = || async {
        Err::<Box<Client>, _>(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the pool is closed",
        ))
    };
    let limiter = Limiter::builder(Postgres::new(failing))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    for op in ["check", "failed", "hit"] {
        let call = operate(&limiter, op, &login, &alice);
        let (verdict, _) = timed(BUDGET + SLACK, op, call).await;
        let verdict = verdict.unwrap();
        assert_unreachable(&verdict, ErrorKind::Connect, op);

        // The source's own error is the cause.
        let cause = verdict.unreachable().unwrap();
        let mut source = std::error::Error::source(cause);
        let mut found = false;
        while let Some(e) = source {
            found |= e
                .downcast_ref::<io::Error>()
                .is_some_and(|e| e.to_string() == "the pool is closed");
            source = e.source();
        }
        assert!(
            found,
            "{op}: the source's error is not the cause: {cause:?}"
        );
    }

    // A reset has nothing to fail open to: the same failure is an error.
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    let err = reset.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect);
    assert!(err.is_unreachable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_source_that_never_yields_is_shed_unless_a_probe_finds_the_server_down() {
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    // A source that never hands over a connection, and cannot probe: no
    // evidence of an outage, so shed within the budget, never allowed.
    let never = || std::future::pending::<Result<Box<Client>, Infallible>>();
    let limiter = Limiter::builder(Postgres::new(never))
        .budget(BUDGET)
        .build()
        .unwrap();
    for op in ["check", "failed", "hit"] {
        let call = operate(&limiter, op, &login, &alice);
        let (verdict, took) = timed(BUDGET + SLACK, op, call).await;
        assert_shed(&verdict.unwrap(), op);
        assert!(took >= BUDGET, "{op} gave up early, after {took:?}");
    }
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    assert_eq!(reset.unwrap_err().kind(), ErrorKind::Overloaded);

    // The same source given a probe of an address nothing listens at: down.
    let limiter = Limiter::builder(Postgres::new(never).with_probe(nothing_listens()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let (verdict, _) = timed(BUDGET + SLACK, "probed", limiter.hit(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Timeout, "probed");

    // An exhausted pool: its one connection is taken by someone else, and
    // the server answers a probe: load, shed.
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::builder(Postgres::new(lend(held.clone())).with_probe(db.config()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let taken = held.lock().await;
    let what = "an exhausted pool";
    let (verdict, _) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_shed(&verdict.unwrap(), what);
    drop(taken);

    // Once the connection is back, calls are counted again; the one that
    // timed out waiting was not.
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert_counted(&verdict, "after the pool recovered");
    assert_eq!(verdict.count(), Some(1));
}

/// The local count of `CountLocally` limits holds at most its bound of keys,
/// however many distinct keys come while the store is unreachable. A key it
/// has no room for is refused (as `WhenUnreachable::Refuse` answers), never
/// allowed uncounted, for a read as for a write; a key it counts keeps its
/// count and its lockout. Once every window of a key has closed (and its
/// lockout ended), the key is dropped and its room goes to a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_count_holds_a_bounded_number_of_keys_and_refuses_a_key_it_cannot_count() {
    const ROOM: usize = 100;
    let window = Duration::from_secs(60);
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60));
    let limiter = Limiter::builder(Postgres::new(nothing_listens()).with_clock(clock.clone()))
        .no_refusal_cache()
        .local_keys(ROOM)
        .build()
        .unwrap();
    assert_eq!(limiter.local_keys(), ROOM);
    let login = Limit::builder("login", 3, window)
        .lockout(Duration::from_secs(600))
        .when_unreachable(WhenUnreachable::CountLocally)
        .build()
        .unwrap();

    // A key counted to its max, then locked out.
    let victim = Key::email("victim@example.com");
    for _ in 0..3 {
        limiter.failed(&login, &victim).await.unwrap();
    }
    assert!(limiter.check(&login, &victim).await.unwrap().is_refused());

    for i in 0..10 * ROOM {
        let key = Key::email(&format!("{i:0>120}@example.com"));
        let verdict = limiter.failed(&login, &key).await.unwrap();
        assert!(verdict.is_unreachable(), "{i}: {verdict:?}");
        if i + 1 < ROOM {
            assert_eq!(verdict.count(), Some(1), "{i}: counted locally");
            assert!(verdict.is_allowed(), "{i}");
        } else {
            assert!(
                verdict.is_refused(),
                "{i}: a key the local count has no room for was not refused: {verdict:?}"
            );
            assert_eq!(verdict.count(), None, "{i}: nothing counted");
            for read in [
                limiter.check(&login, &key).await.unwrap(),
                limiter.hit(&login, &key).await.unwrap(),
            ] {
                assert!(read.is_refused() && read.is_unreachable(), "{i}: {read:?}");
            }
        }
        assert!(
            limiter.local_keys_held() <= ROOM,
            "{i}: {}",
            limiter.local_keys_held()
        );
    }
    let victim_now = limiter.check(&login, &victim).await.unwrap();
    assert!(victim_now.is_refused(), "{victim_now:?}");
    assert_eq!(victim_now.count(), Some(3), "the victim's count was kept");

    // Two windows on (a sliding window reads the one before), every key
    // but the locked-out victim has nothing left that a verdict reads: it is
    // dropped, and a new key is counted.
    clock.advance(2 * window + Duration::from_secs(1));
    let late = limiter
        .failed(&login, &Key::email("late@example.com"))
        .await
        .unwrap();
    assert!(late.is_allowed() && late.is_unreachable(), "{late:?}");
    assert_eq!(late.count(), Some(1));
    assert_eq!(limiter.local_keys_held(), 2, "the victim and the late key");
    assert!(
        limiter.check(&login, &victim).await.unwrap().is_refused(),
        "the victim's lockout was kept"
    );
}

/// An ask of a cost fails open as one of 1 does, as each limit's
/// `WhenUnreachable` says: allowed uncounted, refused, or counted locally
/// with its whole cost (and a permit takes the whole cost back from the
/// local count); a cost above max is refused without trying the store, so
/// it is never read as unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_of_a_cost_fails_open_as_its_limit_says_and_one_above_max_is_refused_at_once() {
    let window = Duration::from_secs(60);
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60));
    let limiter = Limiter::builder(Postgres::new(nothing_listens()).with_clock(clock))
        .budget(BUDGET)
        .build()
        .unwrap();
    let cost = |n| NonZeroU32::new(n).expect("a cost");
    let limit = |name: &str, unreachable| {
        Limit::builder(name, 10, window)
            .when_unreachable(unreachable)
            .build()
            .unwrap()
    };
    let open = limit("open", WhenUnreachable::Allow);
    let closed = limit("closed", WhenUnreachable::Refuse);
    let local = limit("local", WhenUnreachable::CountLocally);
    let key = Key::opaque("client");

    let (verdict, _) = timed(
        BUDGET + SLACK,
        "hit of a cost",
        limiter.hit(&open, &key).cost(cost(4)),
    )
    .await;
    let verdict = verdict.unwrap();
    assert!(
        verdict.is_allowed() && verdict.is_unreachable(),
        "{verdict:?}"
    );
    assert_eq!(verdict.count(), None);
    let verdict = limiter.hit(&closed, &key).cost(cost(4)).await.unwrap();
    assert!(
        verdict.is_refused() && verdict.is_unreachable(),
        "{verdict:?}"
    );

    let mut counts = Vec::new();
    for n in [6, 4, 1] {
        let verdict = limiter.hit(&local, &key).cost(cost(n)).await.unwrap();
        assert!(verdict.is_unreachable(), "{verdict:?}");
        counts.push((verdict.count(), verdict.is_allowed()));
    }
    assert_eq!(
        counts,
        [(Some(6), true), (Some(10), true), (Some(11), false)],
        "counted locally, whole"
    );
    let reopened = Key::opaque("reserving");
    match limiter
        .reserve(&local, &reopened)
        .cost(cost(7))
        .await
        .unwrap()
    {
        platformkit_limit::Reservation::Granted(permit) => {
            assert_eq!(permit.verdict().count(), Some(7));
            // The store is down: the take-back is of the local count.
            permit.succeeded().await.unwrap();
        }
        platformkit_limit::Reservation::Refused(verdict) => panic!("{verdict:?}"),
    }
    let after = limiter.hit(&local, &reopened).cost(cost(10)).await.unwrap();
    assert_eq!(after.count(), Some(10), "the 7 were taken back");
    assert!(after.is_allowed());

    for limit in [&open, &closed, &local] {
        let (over, _) = timed(
            SLACK,
            "a cost above max",
            limiter.hit(limit, &key).cost(cost(11)),
        )
        .await;
        let over = over.unwrap();
        assert!(over.is_refused() && over.exceeds_max(), "{over:?}");
        assert!(!over.is_unreachable(), "the store was not tried");
    }
}

/// All or nothing while the database is unreachable: each limit decides as
/// its `WhenUnreachable` says, and one that counts locally counts the ask
/// under itself whatever the others say (the local count over-counts: the
/// safe side); a limit that refuses refuses the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_or_nothing_call_fails_open_limit_by_limit_and_a_local_count_counts_its_own() {
    let window = Duration::from_secs(60);
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60));
    let limiter = Limiter::builder(Postgres::new(nothing_listens()).with_clock(clock))
        .budget(BUDGET)
        .build()
        .unwrap();
    let limit = |name: &str, unreachable| {
        Limit::builder(name, 3, window)
            .when_unreachable(unreachable)
            .build()
            .unwrap()
    };
    let open = limit("open", WhenUnreachable::Allow);
    let closed = limit("closed", WhenUnreachable::Refuse);
    let local = limit("local", WhenUnreachable::CountLocally);
    let key = Key::opaque("client");
    let one = NonZeroU32::MIN;

    let (both, _) = timed(
        BUDGET + SLACK,
        "hit_all_or_nothing",
        limiter
            .hit_all_or_nothing(&[(&open, &key), (&local, &key)])
            .cost(one),
    )
    .await;
    let both = both.unwrap();
    assert!(both.is_allowed() && both.is_unreachable(), "{both:?}");
    let counts: Vec<_> = both.iter().map(Verdict::count).collect();
    assert_eq!(counts, [None, Some(1)]);
    let refused = limiter
        .hit_all_or_nothing(&[(&closed, &key), (&local, &key)])
        .cost(one)
        .await
        .unwrap();
    assert_eq!(refused.refused_by().map(Verdict::limit), Some("closed"));
    assert!(refused.is_unreachable());
    // The local count counted it all the same.
    let local_now = limiter.hit(&local, &key).cost(one).await.unwrap();
    assert_eq!(
        local_now.count(),
        Some(3),
        "counted locally, whatever closed said"
    );
}
