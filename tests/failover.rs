//! Failover against real PostgreSQL: a primary, a hot standby streaming from
//! it, and the standby promoted once the primary is gone.
//!
//! A limiter pointed at a standby cannot count there: the standby is
//! unreachable as a store, so the limit's choice for an unreachable store
//! applies and says so, never a silent allow. A connection source that names
//! both servers and asks for a read-write session follows the promotion with
//! no restart, and finds the counts from before the failover there. With a
//! synchronous standby, no count the limiter acknowledged is lost, not even
//! one whose wait for the standby the budget's cancel request ended.
//!
//! Every wait is bounded and panics with what it waited for; no assertion is
//! about how long anything took.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::metrics::calls_recorded;
use common::{LONG_WINDOW, PATIENT, PROBE, assert_counted, assert_shed};
use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA, Verdict,
    WhenUnreachable,
};
use platformkit_limit_testdb::{Options, Server, TestDb};
use tokio::task::block_in_place;
use tokio::time::{Instant, sleep};
use tokio_postgres::Config;
use tokio_postgres::config::TargetSessionAttrs;

/// A clock pinned in the middle of a [`LONG_WINDOW`] window, shared by every
/// limiter of a test, so that no test straddles two windows whatever the
/// servers' clocks say.
fn pinned_clock() -> ManualClock {
    let window = LONG_WINDOW.as_secs();
    let start = 1_800_000_000 / window * window;
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(start + window / 2))
}

/// A limit over [`LONG_WINDOW`] that the tests never reach.
fn limit(name: &str) -> Limit {
    common::limit(name, 1_000_000)
}

/// A limiter over `conns` reading the pinned `clock`, with the patient
/// budget: the calls that must be counted connect to a server that may have
/// just been promoted, and calls during the outage end at once anyway (the
/// primary refuses connections and the standby is not read-write). The
/// refusal cache is off: every verdict comes from the server.
fn limiter<C: LimitConn>(conns: C, clock: &ManualClock) -> Limiter<Postgres<C>> {
    Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
        .budget(PATIENT)
        .no_refusal_cache()
        .build()
        .expect("a valid budget")
}

/// A primary started with `options`, a database with the schema on it, and a
/// hot standby of it (which has the database: it is created before the base
/// backup).
fn primary_and_standby(options: Options) -> (Server, TestDb, Server) {
    block_in_place(|| {
        let primary = Server::start(options);
        let db = tokio::runtime::Handle::current().block_on(primary.database(SCHEMA));
        let standby = primary.standby(Options::default());
        (primary, db, standby)
    })
}

/// The database's owner connecting to the primary, then to the standby, and
/// keeping the first server that accepts writes: a service's configuration
/// that follows a failover.
fn read_write_of_both(db: &TestDb, standby: &Server) -> Config {
    let mut config = db.config();
    config
        .host(standby.host())
        .port(standby.port())
        .target_session_attrs(TargetSessionAttrs::ReadWrite);
    config
}

/// Asserts that the verdict says the store was unreachable, with a cause of
/// kind `Connect` (the primary is not there), no count, and the given
/// decision.
#[track_caller]
fn assert_unreachable(verdict: &Verdict, allowed: bool, what: &str) {
    assert!(
        verdict.is_unreachable(),
        "{what}: expected unreachable, got {verdict:?}"
    );
    assert_eq!(verdict.is_allowed(), allowed, "{what}: {verdict:?}");
    let cause = verdict
        .unreachable()
        .expect("an unreachable verdict has a cause");
    assert_eq!(cause.kind(), ErrorKind::Connect, "{what}: {cause:?}");
    assert_eq!(verdict.count(), None, "{what}: nothing was counted");
    assert_eq!(verdict.retry_after(), None, "{what}: no count to wait out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_pointed_at_a_standby_is_unreachable_never_silently_allowed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let (primary, db, standby) = primary_and_standby(Options::default());
    let clock = pinned_clock();
    let allow = limit("allow");
    let refuse = Limit::builder("refuse", 1_000_000, LONG_WINDOW)
        .when_unreachable(WhenUnreachable::Refuse)
        .build()
        .expect("a valid limit");
    let key = Key::opaque("account-42");

    // Counts on the primary, replayed by the standby: there is a row there
    // that a read could find.
    let on_primary = limiter(db.config(), &clock);
    for (n, limit) in [(1, &allow), (2, &allow), (1, &refuse)] {
        let verdict = on_primary.failed(limit, &key).await.expect("a verdict");
        assert_counted(&verdict, "a failure on the primary");
        assert_eq!(verdict.count(), Some(n));
    }
    primary.wait_for_standby(&standby).await;

    let on_standby = limiter(db.on(&standby).config(), &clock);

    // The default choice allows, the other refuses; both say why, and the
    // metrics count the call as unreachable, which is what the alert watches.
    // The first call is answered by the standby, and a probe finds it a
    // hot standby; the calls after it are answered at once while that
    // answer stands.
    let mut first = true;
    for (limit, allowed) in [(&allow, true), (&refuse, false)] {
        for operation in ["check", "failed", "hit"] {
            let what = format!("{operation} of {} on the standby", limit.name());
            let verdict = match operation {
                "check" => on_standby.check(limit, &key).await,
                "failed" => on_standby.failed(limit, &key).await,
                _ => on_standby.hit(limit, &key).await,
            }
            .unwrap_or_else(|e| panic!("{what}: an error, not a verdict: {e:?}"));
            assert_unreachable(&verdict, allowed, &what);
            // The standby answered (refusing to write), rather than not
            // answering at all.
            let cause = verdict.unreachable().expect("a cause");
            assert_eq!(cause.code().is_some(), first, "{what}: {cause:?}");
            first = false;
            assert_eq!(
                calls_recorded(&snapshotter, limit.name(), operation, "unreachable"),
                1,
                "{what} is counted as an unreachable outcome"
            );
        }
    }
    for operation in ["check", "failed", "hit"] {
        assert_eq!(
            calls_recorded(&snapshotter, "allow", operation, "allowed"),
            u64::from(operation == "failed") * 2,
            "{operation}: only the primary's calls were allowed by a count"
        );
    }

    // Nothing was written anywhere: the primary has the counts it had.
    for (limit, count) in [(&allow, 2), (&refuse, 1)] {
        let verdict = on_primary.check(limit, &key).await.expect("a verdict");
        assert_counted(&verdict, "check on the primary afterwards");
        assert_eq!(verdict.count(), Some(count), "{}", limit.name());
    }

    drop((on_primary, on_standby));
    block_in_place(|| drop((standby, primary)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_follows_the_promoted_standby_counts_on_without_a_restart() {
    const BEFORE: u64 = 3;

    let (primary, db, standby) = primary_and_standby(Options::default());
    let clock = pinned_clock();
    let login = limit("login");
    let alice = Key::email("alice@example.com");
    // One limiter for the whole test, as a service that is never restarted.
    let service = limiter(read_write_of_both(&db, &standby), &clock);

    for n in 1..=BEFORE {
        let verdict = service.failed(&login, &alice).await.expect("a verdict");
        assert_counted(&verdict, "a failure before the failover");
        assert_eq!(verdict.count(), Some(n));
    }
    // The counts are on the standby before the primary goes.
    primary.wait_for_standby(&standby).await;
    block_in_place(|| primary.pg_ctl(&["stop", "-m", "immediate"]));

    // No primary: the standby is there but not read-write, so the source
    // has nothing to give, and the limit's choice applies, said.
    for operation in ["check", "failed"] {
        let verdict = match operation {
            "check" => service.check(&login, &alice).await,
            _ => service.failed(&login, &alice).await,
        }
        .expect("a verdict");
        assert_unreachable(
            &verdict,
            true,
            &format!("{operation} between stop and promotion"),
        );
    }

    block_in_place(|| standby.promote());
    // The latest probe found no primary; calls resume within one probe
    // interval of the promotion.
    tokio::time::sleep(PROBE).await;

    // The same limiter counts on, from where the primary left off.
    let verdict = service.check(&login, &alice).await.expect("a verdict");
    assert_counted(&verdict, "the first check after the promotion");
    assert_eq!(
        verdict.count(),
        Some(BEFORE),
        "the counts from before the failover are there, and nothing was counted during it"
    );
    let verdict = service.failed(&login, &alice).await.expect("a verdict");
    assert_counted(&verdict, "the first failure after the promotion");
    assert_eq!(verdict.count(), Some(BEFORE + 1));

    drop(service);
    block_in_place(|| drop((standby, primary)));
}

/// Waits, for at most a minute, until a backend of the primary waits for the
/// synchronous standby to acknowledge its commit.
async fn until_a_commit_waits_for_the_standby(primary: &Server) {
    let admin = platformkit_limit_testdb::connect(&primary.admin_config()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waits: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .await
            .expect("reading pg_stat_activity")
            .get(0);
        if waits > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no commit waited for the synchronous standby within a minute"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_loses_no_acknowledged_count_across_a_failover() {
    /// Failures called at once, every one acknowledged.
    const CONCURRENT: u64 = 64;

    let (primary, db, standby) = primary_and_standby(Options { durable: true });
    primary.make_synchronous(&standby).await;
    let clock = pinned_clock();
    let login = limit("login");
    let alice = Key::email("alice@example.com");
    // The longest budget, so that the last call below is still waiting for
    // the standby, not cancelled by its budget, when the primary stops.
    let service = Arc::new(
        Limiter::builder(
            Postgres::new(read_write_of_both(&db, &standby)).with_clock(clock.clone()),
        )
        .budget(Limiter::MAX_BUDGET)
        .no_refusal_cache()
        .build()
        .expect("a valid budget"),
    );
    let failed = |service: &Arc<Limiter<_>>| {
        let (service, login, alice) = (Arc::clone(service), login.clone(), alice.clone());
        tokio::spawn(async move { service.failed(&login, &alice).await })
    };

    let calls: Vec<_> = (0..CONCURRENT).map(|_| failed(&service)).collect();
    let mut counts = Vec::new();
    for call in calls {
        let verdict = call.await.expect("a call panicked").expect("a verdict");
        assert_counted(&verdict, "a concurrent failure");
        counts.push(verdict.count().expect("counted"));
    }
    assert_eq!(counts.iter().max(), Some(&CONCURRENT));

    // Cut off, the standby cannot have one more failure; the primary has
    // committed it but waits for the standby, and does not acknowledge it
    // before it stops.
    standby.stop_streaming().await;
    let last = failed(&service);
    until_a_commit_waits_for_the_standby(&primary).await;
    block_in_place(|| primary.pg_ctl(&["stop", "-m", "immediate"]));
    let verdict = last.await.expect("the call panicked").expect("a verdict");
    assert_unreachable(&verdict, true, "the failure the standby never had");

    block_in_place(|| standby.promote());
    tokio::time::sleep(PROBE).await;

    let verdict = service.check(&login, &alice).await.expect("a verdict");
    assert_counted(&verdict, "the check through the promoted standby");
    let count = verdict.count().expect("counted");
    assert!(
        count >= CONCURRENT,
        "{CONCURRENT} failures were acknowledged but the promoted standby counts {count}: \
         acknowledged counts were lost"
    );
    assert!(
        count <= CONCURRENT + 1,
        "the promoted standby counts {count}, more than the {} failures called",
        CONCURRENT + 1
    );

    drop(service);
    block_in_place(|| drop((standby, primary)));
}

/// A call whose commit waits for a synchronous standby that does not answer
/// is never acknowledged. The limiter sends a cancel request shortly before
/// the budget runs out; PostgreSQL answers a cancel during a
/// synchronous-replication wait with only a WARNING ("canceling wait for
/// synchronous replication due to user request": committed locally, maybe
/// not replicated) and completes the `CALL`. Before the fix the limiter took
/// that answer as counted, and the count was lost when the standby took
/// over; now an answer that comes after this call's own cancel request is
/// the budget running out on a server that answered (shed), never an
/// acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_the_synchronous_standby_never_had_is_never_acknowledged() {
    const BEFORE: u64 = 5;

    let (primary, db, standby) = primary_and_standby(Options { durable: true });
    primary.make_synchronous(&standby).await;
    let clock = pinned_clock();
    let login = limit("login");
    let alice = Key::email("alice@example.com");
    let service = Limiter::builder(
        Postgres::new(read_write_of_both(&db, &standby)).with_clock(clock.clone()),
    )
    .budget(Duration::from_secs(1))
    .no_refusal_cache()
    .build()
    .expect("a valid budget");
    for n in 1..=BEFORE {
        let verdict = service.failed(&login, &alice).await.expect("a verdict");
        assert_counted(&verdict, "a failure before the standby is cut off");
        assert_eq!(verdict.count(), Some(n));
    }

    standby.stop_streaming().await;
    // The commit waits for the standby until the budget runs out: the
    // server answered the cancel, so the call is shed, never acknowledged.
    let verdict = service.failed(&login, &alice).await.expect("a verdict");
    assert_shed(&verdict, "the failure the standby never had");
    let acknowledged = BEFORE + u64::from(verdict.count().is_some());

    block_in_place(|| {
        primary.pg_ctl(&["stop", "-m", "immediate"]);
        standby.promote();
    });
    let verdict = service.check(&login, &alice).await.expect("a verdict");
    assert_counted(&verdict, "the check through the promoted standby");
    let count = verdict.count().expect("counted");
    assert!(
        count >= acknowledged,
        "{acknowledged} failures were acknowledged but the promoted standby counts {count}: \
         an acknowledged count was lost"
    );

    drop(service);
    block_in_place(|| drop((standby, primary)));
}
