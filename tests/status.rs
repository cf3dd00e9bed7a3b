//! An operator's reads, against a real server: `Limiter::status` (a key's
//! state, read from the database, never from the refusal cache) and
//! `Limiter::refused_keys` (who a limit refuses now: only that limit's
//! keys, newest first, bounded, whatever the keys hold; one index range,
//! never a scan of the table). The role without grants cannot list, and
//! PUBLIC cannot execute the listing.

use std::time::Duration;

use crate::common;
use common::db::{assert_index_plans, explained, fresh_db, lend, refused};
use common::hostile_keys::hostile_subjects;
use common::{LONG_WINDOW, PATIENT, limit, pinned_clock};
use platformkit_limit::{ErrorKind, Key, Limit, Limiter, Postgres, grants};
use tokio_postgres::error::SqlState;

/// A limiter over the database as the table's owner (subject to FORCE ROW
/// LEVEL SECURITY), with a patient budget.
fn limiter_on(config: tokio_postgres::Config) -> Limiter<Postgres<tokio_postgres::Config>> {
    Limiter::builder(Postgres::new(config))
        .budget(PATIENT)
        .build()
        .unwrap()
}

/// A limiter on `clock` that counts every call: no refusal cache answers a
/// refused key, so each failure reaches the table.
fn counting_every_call(
    config: tokio_postgres::Config,
    clock: &platformkit_limit::ManualClock,
) -> Limiter<Postgres<tokio_postgres::Config>> {
    Limiter::builder(Postgres::new(config).with_clock(clock.clone()))
        .budget(PATIENT)
        .no_refusal_cache()
        .build()
        .unwrap()
}

/// An untouched key, a counting one, a refused one, and the same key after
/// a reset through another limiter (another replica): each status is the
/// database's, and agrees with a check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_an_untouched_a_counting_and_a_refused_key_and_after_a_reset_elsewhere() {
    let db = fresh_db().await;
    let (here, elsewhere) = (limiter_on(db.config()), limiter_on(db.config()));
    let login = limit("login", 3);
    let alice = Key::email("Alice@Example.com");

    let untouched = here.status(&login, &alice).await.unwrap();
    assert_eq!(untouched.key(), "email|alice@example.com");
    assert_eq!((untouched.count(), untouched.max()), (0, 3));
    assert!(!untouched.is_refused());
    assert_eq!(untouched.retry_after(), None);
    assert_eq!(untouched.reopens_at(), None);
    assert_eq!(untouched.locked_until(), None);
    assert!(untouched.window_end() > untouched.read_at());

    for _ in 0..2 {
        here.failed(&login, &alice).await.unwrap();
    }
    let counting = here.status(&login, &alice).await.unwrap();
    assert_eq!(counting.count(), 2);
    assert!(!counting.is_refused());
    assert_eq!(counting.window_end(), untouched.window_end());

    // Refused, and flooded with checks so that the refusal cache may hold it.
    here.failed(&login, &alice).await.unwrap();
    for _ in 0..20 {
        assert!(here.check(&login, &alice).await.unwrap().is_refused());
    }
    let refused = here.status(&login, &alice).await.unwrap();
    assert_eq!(refused.count(), 3);
    assert!(refused.is_refused());
    assert_eq!(refused.reopens_at(), Some(refused.window_end()));
    let retry = refused.retry_after().expect("a refused key reopens");
    assert!(retry > Duration::ZERO && retry <= LONG_WINDOW, "{retry:?}");
    assert_eq!(refused.locked_until(), None);

    elsewhere.reset(&login, &alice).await.unwrap();
    let after = here.status(&login, &alice).await.unwrap();
    assert_eq!(after.count(), 0, "the database's state, not the cache's");
    assert!(!after.is_refused());
}

/// A lockout: a full window keeps the key refused after its window closed;
/// the status says until when, and the listing shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_lockout_is_a_refusal_with_its_end() {
    let db = fresh_db().await;
    let clock = pinned_clock();
    let limiter = Limiter::builder(Postgres::new(db.config()).with_clock(clock.clone()))
        .budget(PATIENT)
        .build()
        .unwrap();
    let login = Limit::builder("login", 2, Duration::from_secs(60))
        .lockout(Duration::from_secs(600))
        .build()
        .unwrap();
    let bob = Key::username("bob");
    for _ in 0..2 {
        limiter.failed(&login, &bob).await.unwrap();
    }
    let full = limiter.status(&login, &bob).await.unwrap();
    clock.advance(Duration::from_secs(120));
    let locked = limiter.status(&login, &bob).await.unwrap();
    assert_eq!(locked.count(), 0, "a new window");
    assert!(locked.is_refused());
    let until = full.window_end() + Duration::from_secs(600);
    assert_eq!(locked.locked_until(), Some(until));
    assert_eq!(locked.reopens_at(), Some(until));
    assert_eq!(
        limiter.check(&login, &bob).await.unwrap().reopens_at(),
        Some(until),
        "status and check agree"
    );
    let listed = limiter.refused_keys(&login, 10).await.unwrap();
    assert_eq!(listed, vec![locked]);
}

/// Only the limit's own refused keys, newest first (the latest window, then
/// the highest count), bounded by `at_most`; `login2`'s keys and `login`'s
/// counting keys are not listed; 0 and more than the bound are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_keys_lists_only_the_limits_refused_keys_newest_first_and_bounded() {
    let db = fresh_db().await;
    let clock = pinned_clock();
    // Every failure counted: no refusal cache to answer a flooded key.
    let limiter = counting_every_call(db.config(), &clock);
    let window = Duration::from_secs(60);
    let login = Limit::builder("login", 2, window)
        .lockout(Duration::from_secs(3600))
        .build()
        .unwrap();
    // Names that share a prefix with `login`, and their keys refused.
    let others = [
        Limit::new("login2", 1, window).unwrap(),
        Limit::new("logi", 1, window).unwrap(),
        Limit::new("login.x", 1, window).unwrap(),
    ];
    for other in &others {
        limiter.hit(other, &Key::opaque("x")).await.unwrap();
        limiter.hit(other, &Key::opaque("x")).await.unwrap();
    }
    let fail = |key: &'static str, n: usize| {
        let (limiter, login) = (&limiter, &login);
        async move {
            for _ in 0..n {
                limiter.failed(login, &Key::opaque(key)).await.unwrap();
            }
        }
    };
    // An earlier window: `old` locked out.
    fail("old", 2).await;
    clock.advance(window);
    // The current window: `many` over max, `two` at max, `one` counting.
    fail("two", 2).await;
    fail("many", 5).await;
    fail("one", 1).await;

    let listed = limiter.refused_keys(&login, 10).await.unwrap();
    let keys: Vec<(&str, u64)> = listed.iter().map(|s| (s.key(), s.count())).collect();
    assert_eq!(keys, [("id|many", 5), ("id|two", 2), ("id|old", 0)]);
    assert!(listed.iter().all(|s| s.is_refused()));
    assert!(listed[2].locked_until().is_some());
    for status in &listed {
        let key = Key::opaque(status.key().strip_prefix("id|").unwrap());
        assert_eq!(&limiter.status(&login, &key).await.unwrap(), status);
    }

    let first = limiter.refused_keys(&login, 1).await.unwrap();
    assert_eq!(first, listed[..1]);
    for at_most in [0, Limiter::MAX_REFUSED_KEYS + 1, usize::MAX] {
        let err = limiter.refused_keys(&login, at_most).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{at_most}: {err}");
    }
    assert!(
        limiter
            .refused_keys(&login, Limiter::MAX_REFUSED_KEYS)
            .await
            .is_ok()
    );

    // The procedure holds the same bounds as the library.
    let client = db.connect().await;
    for (prefix, at_most) in [("login|", 1001), ("login|", 0), ("login", 10), ("|", 10)] {
        let sql = format!(
            "SELECT * FROM platformkit.platformkit_limit_list(p_prefix => '{prefix}', \
             p_window_secs => 60, p_at => NULL, p_budget_ms => 2000, p_previous => false, \
             p_max => 2, p_lockout_secs => 0, p_at_most => {at_most})"
        );
        let (code, message) = refused(client.query(&sql, &[]).await, &sql);
        assert_eq!(code, SqlState::INVALID_PARAMETER_VALUE, "{sql}: {message}");
    }
}

/// A sliding limit: a key whose previous window still weighs it over max
/// is listed, and reopens when the estimate falls below max, as a check
/// says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_estimate_at_max_is_listed_with_its_reopening() {
    let db = fresh_db().await;
    let clock = pinned_clock();
    let limiter = counting_every_call(db.config(), &clock);
    let window = Duration::from_secs(3600);
    let sliding = Limit::builder("api", 4, window)
        .strategy(platformkit_limit::Strategy::Sliding)
        .build()
        .unwrap();
    let key = Key::opaque("k");
    for _ in 0..8 {
        limiter.failed(&sliding, &key).await.unwrap();
    }
    // 10:30 → 11:10: the previous window (8) weighs 50/60: 6.7 ≥ 4.
    clock.advance(Duration::from_secs(40 * 60));
    let status = limiter.status(&sliding, &key).await.unwrap();
    assert!(status.is_refused());
    let check = limiter.check(&sliding, &key).await.unwrap();
    assert_eq!(status.reopens_at(), check.reopens_at());
    assert_eq!(Some(status.count()), check.count());
    assert_eq!(
        limiter.refused_keys(&sliding, 5).await.unwrap(),
        vec![status]
    );
}

/// Any key the crate can encode (control characters, the separator, the
/// digest marker, SQL, a mebibyte that shows as its digest) is listed as
/// stored, and never breaks the listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_never_break_the_listing() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let hostile = limit("hostile", 1);
    let mut expected: Vec<String> = Vec::new();
    let subjects = hostile_subjects();
    assert!(
        subjects.iter().any(|s| s.spellings[0].is_digested()),
        "a key long enough to be digested is among them"
    );
    for subject in subjects {
        let key = &subject.spellings[0];
        limiter.failed(&hostile, key).await.unwrap();
        expected.push(key.as_str().to_owned());
    }
    expected.sort();
    expected.dedup();
    let mut listed: Vec<String> = limiter
        .refused_keys(&hostile, Limiter::MAX_REFUSED_KEYS)
        .await
        .unwrap()
        .iter()
        .map(|s| s.key().to_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "each key as stored, a long one as its digest form"
    );
}

/// The listing reaches the table by index ranges of the limit's keys, as
/// the limiter's role, never by a scan of the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_is_an_index_range_of_the_limits_keys() {
    let db = fresh_db().await;
    let (held, plans) = explained(&db).await;
    let limiter = Limiter::builder(Postgres::new(lend(held)))
        .budget(PATIENT)
        .build()
        .unwrap();
    let login = limit("login", 1);
    limiter.failed(&login, &Key::opaque("a")).await.unwrap();
    limiter
        .failed(&limit("login2", 1), &Key::opaque("b"))
        .await
        .unwrap();
    plans.lock().unwrap().clear();
    let listed = limiter.refused_keys(&login, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_index_plans(&plans, "the listing");
    let plans = plans.lock().unwrap();
    let range = plans
        .iter()
        .flat_map(|plan| plan.lines())
        .find(|line| line.contains("Index Cond") && line.contains(">="))
        .unwrap_or_else(|| panic!("no index range in the listing's plans: {plans:?}"));
    assert!(range.contains("key") && range.contains('<'), "{range}");
}

/// A flood of keys below their max costs the listing nothing: with 100,000
/// keys of the limit counted once and three refused, the listing finds the
/// three, and no step of its plan reads more than a few rows (it reads the
/// keys a writer left at their max, not the limit's every key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listings_cost_follows_the_refused_keys_not_the_flood() {
    let db = fresh_db().await;
    let login = limit("login", 3);
    let mut system = db.connect().await;
    common::db::as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'login|id|flood-' || g, w.start, w.start + make_interval(secs => $1), 1
         FROM generate_series(1, 100000) AS g,
              (SELECT date_bin(make_interval(secs => $1), now(),
                               timestamptz '1970-01-01 00:00:00+00') AS start) AS w",
        &[&f64::from(u32::try_from(LONG_WINDOW.as_secs()).unwrap())],
    )
    .await;
    let service = limiter_on(db.config());
    for who in ["a", "b", "c"] {
        for _ in 0..3 {
            service.failed(&login, &Key::opaque(who)).await.unwrap();
        }
    }

    let (held, plans) = explained(&db).await;
    held.lock()
        .await
        .batch_execute("SET auto_explain.log_analyze = on")
        .await
        .unwrap();
    let limiter = Limiter::builder(Postgres::new(lend(held)))
        .budget(PATIENT)
        .build()
        .unwrap();
    plans.lock().unwrap().clear();
    let listed = limiter.refused_keys(&login, 100).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|s| s.key()).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert_index_plans(&plans, "the listing");
    let plans = plans.lock().unwrap();
    let most = plans
        .iter()
        .flat_map(|plan| plan.lines())
        .filter_map(|line| {
            let rows = line.split("actual time=").nth(1)?.split("rows=").nth(1)?;
            rows.split(' ').next()?.parse::<u64>().ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no analysed plan: {plans:?}"));
    assert!(
        most <= 10,
        "a step of the listing read {most} rows: {plans:?}"
    );
}

/// A block holds across windows, on every path a call takes (one key,
/// several keys, all or nothing, a read), on another replica, until its
/// end, then the key is open; a limit's lockout does not lengthen it; the
/// listing shows it; the service's own reset keeps it, an unblock ends it
/// at once. Each action is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_holds_across_windows_on_every_path_until_its_end() {
    let db = fresh_db().await;
    let clock = pinned_clock();
    let (support, service) = (
        counting_every_call(db.config(), &clock),
        counting_every_call(db.config(), &clock),
    );
    let quarter = Duration::from_secs(15 * 60);
    let login = Limit::builder("login", 5, quarter)
        .lockout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let api = Limit::new("api", 100, Duration::from_secs(60)).unwrap();
    let mallory = Key::email("mallory@example.com");
    let until = support
        .block(
            &login,
            &mallory,
            Duration::from_secs(7200),
            "ann",
            "ticket 7",
        )
        .await
        .unwrap();
    let blocked_for = until.duration_since(clock.now()).unwrap();
    assert!(
        blocked_for >= Duration::from_secs(7200) && blocked_for <= Duration::from_secs(7202),
        "{blocked_for:?}"
    );

    for advance in [Duration::ZERO, quarter, 5 * quarter] {
        clock.advance(advance);
        let pairs = [(&login, &mallory), (&api, &mallory)];
        assert!(service.check(&login, &mallory).await.unwrap().is_refused());
        let failed = service.failed(&login, &mallory).await.unwrap();
        assert!(failed.is_refused());
        assert_eq!(failed.reopens_at(), Some(until), "{failed:?}");
        assert!(service.check_all(&pairs).await.unwrap().is_refused());
        assert!(service.hit_all(&pairs).await.unwrap().is_refused());
        assert!(
            service
                .hit_all_or_nothing(&pairs)
                .await
                .unwrap()
                .is_refused()
        );
        let status = support.status(&login, &mallory).await.unwrap();
        assert_eq!(status.locked_until(), Some(until));
        let listed = support.refused_keys(&login, 10).await.unwrap();
        assert_eq!(
            listed.iter().map(|s| s.key()).collect::<Vec<_>>(),
            ["email|mallory@example.com"]
        );
    }
    // Under a limit without a lockout too.
    assert!(service.check(&api, &mallory).await.unwrap().is_allowed());
    support
        .block(&api, &mallory, Duration::from_secs(60), "ann", "api abuse")
        .await
        .unwrap();
    assert!(service.check(&api, &mallory).await.unwrap().is_refused());
    assert!(service.hit(&api, &mallory).await.unwrap().is_refused());
    // Past its end, and with no full window of its own: open.
    clock.set(until);
    support.reset(&login, &mallory).await.unwrap();
    support
        .block(&login, &mallory, Duration::from_secs(60), "ann", "again")
        .await
        .unwrap();
    clock.advance(Duration::from_secs(62));
    assert!(service.check(&login, &mallory).await.unwrap().is_allowed());

    support
        .block(
            &login,
            &mallory,
            Duration::from_secs(600),
            "ann",
            "once more",
        )
        .await
        .unwrap();
    assert!(service.check(&login, &mallory).await.unwrap().is_refused());
    // The service's own reset (a success that forgives failures) keeps it.
    service.reset(&login, &mallory).await.unwrap();
    assert!(service.check(&login, &mallory).await.unwrap().is_refused());
    assert_eq!(
        support
            .unblock(&login, &mallory, "bob", "verified")
            .await
            .unwrap(),
        1
    );
    assert!(service.check(&login, &mallory).await.unwrap().is_allowed());
    let actions: Vec<_> = support
        .audit(Some(&login), 10)
        .await
        .unwrap()
        .iter()
        .map(|e| {
            (
                e.by().to_owned(),
                e.action().as_str(),
                e.reason().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("bob".to_owned(), "unblock", "verified".to_owned()),
            ("ann".to_owned(), "block", "once more".to_owned()),
            ("ann".to_owned(), "block", "again".to_owned()),
            ("ann".to_owned(), "block", "ticket 7".to_owned()),
        ]
    );
    let wrong = support
        .block(&login, &mallory, Duration::from_secs(60), "", "no one")
        .await
        .unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::InvalidOption);
}

/// A block is its own, whatever the limit reads it: made under a limit
/// with a lockout and a short window, it holds for its length, no longer,
/// under a next deploy's limit of the same name without a lockout, with a
/// longer window, or with a longer lockout; two blocks of one key at once
/// leave one, neither failing; a blocked key is listed on both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_is_its_own_whatever_the_limit_and_one_replaces_another() {
    let db = fresh_db().await;
    let clock = pinned_clock();
    let (support, other) = (
        counting_every_call(db.config(), &clock),
        counting_every_call(db.config(), &clock),
    );
    let memory = Limiter::builder(platformkit_limit::Memory::new().with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .unwrap();
    let made_under = Limit::builder("login", 5, Duration::from_secs(60))
        .lockout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let mallory = Key::email("mallory@example.com");
    let until = support
        .block(
            &made_under,
            &mallory,
            Duration::from_secs(1800),
            "ann",
            "t1",
        )
        .await
        .unwrap();
    memory
        .block(
            &made_under,
            &mallory,
            Duration::from_secs(1800),
            "ann",
            "t1",
        )
        .await
        .unwrap();
    clock.advance(Duration::from_secs(60));
    let next_deploys = [
        limit("login", 5),
        Limit::new("login", 5, Duration::from_secs(86_400)).unwrap(),
        Limit::builder("login", 5, Duration::from_secs(60))
            .lockout(Duration::from_secs(86_400))
            .build()
            .unwrap(),
    ];
    for read_under in &next_deploys {
        let verdict = other.check(read_under, &mallory).await.unwrap();
        assert!(verdict.is_refused(), "{read_under:?}: {verdict:?}");
        assert_eq!(verdict.reopens_at(), Some(until), "{read_under:?}");
        for store in [
            &support.refused_keys(read_under, 10).await.unwrap(),
            &memory.refused_keys(read_under, 10).await.unwrap(),
        ] {
            assert_eq!(store.len(), 1, "{read_under:?}: {store:?}");
        }
    }
    clock.set(until);
    for read_under in &next_deploys {
        assert!(
            other
                .check(read_under, &mallory)
                .await
                .unwrap()
                .is_allowed()
        );
    }

    let (short, long) = tokio::join!(
        support.block(
            &made_under,
            &mallory,
            Duration::from_secs(60),
            "ann",
            "short"
        ),
        other.block(
            &made_under,
            &mallory,
            Duration::from_secs(600),
            "bob",
            "long"
        ),
    );
    let (short, long) = (short.unwrap(), long.unwrap());
    let reopens = other
        .check(&made_under, &mallory)
        .await
        .unwrap()
        .reopens_at();
    assert!(
        reopens == Some(short) || reopens == Some(long),
        "{reopens:?}"
    );
    assert_eq!(
        support
            .unblock(&made_under, &mallory, "carol", "one block")
            .await
            .unwrap(),
        1
    );
    assert!(
        other
            .check(&made_under, &mallory)
            .await
            .unwrap()
            .is_allowed()
    );
}

/// A login granted nothing cannot list; PUBLIC may not execute the listing;
/// `grants` lets a role execute it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_without_grants_cannot_list() {
    let db = fresh_db().await;
    let stranger = limiter_on(db.stranger_config());
    let err = stranger
        .refused_keys(&limit("login", 1), 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Query, "{err}");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");
    let err = stranger
        .status(&limit("login", 1), &Key::opaque("a"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");

    let admin = db.connect_admin().await;
    // A role of this test's own: roles are the server's, shared by every test.
    let operator = format!("{}_operator", db.name());
    admin
        .batch_execute(&format!("CREATE ROLE \"{operator}\" NOLOGIN"))
        .await
        .unwrap();
    let can = |role: String| {
        let admin = &admin;
        async move {
            admin
                .query_one(
                    "SELECT pg_catalog.has_function_privilege($1, \
                     'platformkit.platformkit_limit_list(text, bigint, bigint, bigint, \
                      boolean, bigint, bigint, bigint)', 'EXECUTE')",
                    &[&role],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(
        !can("public".into()).await,
        "PUBLIC may execute the listing"
    );
    assert!(!can(operator.clone()).await);
    db.connect()
        .await
        .batch_execute(&grants(&operator).expect("a role"))
        .await
        .unwrap();
    assert!(can(operator.clone()).await, "grants() covers the listing");
    common::db::drop_role(&db.connect().await, &admin, &operator).await;
}

/// The key column compares byte for byte whatever the database's locale,
/// so one limit's keys are one range of the primary key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_column_is_compared_byte_for_byte() {
    let db = fresh_db().await;
    let collation: String = db
        .connect()
        .await
        .query_one(
            "SELECT c.collname::text FROM pg_catalog.pg_attribute AS a
             JOIN pg_catalog.pg_collation AS c ON c.oid = a.attcollation
             WHERE a.attrelid = 'platformkit.platformkit_limits'::regclass
               AND a.attname = 'key'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(collation, "C");
}

/// Each limit a service records is recorded as it was built, and any
/// replica reads it back: a tier records its limit, a new deploy's
/// definition replaces the old, and a name nobody recorded is an error
/// naming the ones that are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_is_recorded_as_built_and_any_replica_reads_it_back() {
    let db = fresh_db().await;
    let (service, operator) = (limiter_on(db.config()), limiter_on(db.config()));
    assert_eq!(operator.limits().await.unwrap(), []);

    let login = Limit::builder("login", 5, Duration::from_secs(900))
        .strategy(platformkit_limit::Strategy::Sliding)
        .lockout(Duration::from_secs(3600))
        .when_unreachable(platformkit_limit::WhenUnreachable::Refuse)
        .build()
        .unwrap();
    let api = limit("api", 100);
    // Only a tier of `api` is given: `api` itself is what is recorded.
    service
        .record([&login, &api.with_max(1000).unwrap()])
        .await
        .unwrap();

    let recorded = operator.limits().await.unwrap();
    let as_built = Limit::builder("login", 5, Duration::from_secs(900))
        .strategy(platformkit_limit::Strategy::Sliding)
        .lockout(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert_eq!(recorded, [api.clone(), as_built.clone()]);
    assert_eq!(operator.limit("login").await.unwrap(), as_built);

    let unknown = operator.limit("Login").await.unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::InvalidLimit);
    assert!(
        unknown
            .to_string()
            .contains("the limits recorded: api, login"),
        "{unknown}"
    );

    // The next deploy changes the limit: its definition replaces the old.
    let next_deploy = limiter_on(db.config());
    let stricter = limit("login", 3);
    next_deploy.record([&stricter]).await.unwrap();
    assert_eq!(operator.limit("login").await.unwrap(), stricter);
}

/// One account under every limit: the limits with a count for it, each
/// decided under its own definition (refused under one, open under
/// another), none for a limit it never touched; an unlock everywhere
/// clears them all, says which, and is in the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accounts_statuses_across_limits_and_its_unlock_everywhere() {
    let db = fresh_db().await;
    let service = limiter_on(db.config());
    let (login, api, export) = (limit("login", 2), limit("api", 100), limit("export", 1));
    service.record([&login, &api, &export]).await.unwrap();
    let alice = Key::email("alice@example.com");
    for _ in 0..2 {
        service.failed(&login, &alice).await.unwrap();
    }
    service.hit(&api, &alice).await.unwrap();
    service
        .hit(&export, &Key::email("bob@example.com"))
        .await
        .unwrap();

    let operator = limiter_on(db.config());
    let statuses = operator.statuses(&alice).await.unwrap();
    let seen: Vec<_> = statuses
        .iter()
        .map(|s| (s.limit(), s.key(), s.count(), s.max(), s.is_refused()))
        .collect();
    assert_eq!(
        seen,
        [
            ("api", "email|alice@example.com", 1, 100, false),
            ("login", "email|alice@example.com", 2, 2, true),
        ]
    );

    let cleared = operator
        .unlock_everywhere(&alice, "ann", "ticket 3")
        .await
        .unwrap();
    let cleared: Vec<_> = cleared.iter().map(|(l, n)| (l.name(), *n)).collect();
    assert_eq!(cleared, [("api", 1), ("login", 1)]);
    assert_eq!(operator.statuses(&alice).await.unwrap(), []);
    let audit = operator.audit(None, 10).await.unwrap();
    let audit: Vec<_> = audit
        .iter()
        .map(|e| {
            (
                e.by(),
                e.action().as_str(),
                e.limit(),
                e.windows(),
                e.reason(),
            )
        })
        .collect();
    assert_eq!(
        audit,
        [
            ("ann", "unlock", "login", Some(1), "ticket 3"),
            ("ann", "unlock", "export", Some(0), "ticket 3"),
            ("ann", "unlock", "api", Some(1), "ticket 3"),
        ]
    );
    assert!(service.check(&login, &alice).await.unwrap().is_allowed());
    // Bob's count under another limit is untouched.
    let bob = operator.statuses(&Key::email("bob@example.com")).await;
    assert_eq!(bob.unwrap().len(), 1);
}
