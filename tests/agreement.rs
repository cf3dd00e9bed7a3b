//! `Memory` is the fake callers test against; it is only worth having if it
//! behaves exactly like `Postgres`. These tests play the same calls, at the
//! same pinned times, against both, and require the same verdicts, call for
//! call; the property also checks both against a plain model of fixed and
//! sliding windows, written independently of the crate's arithmetic (the
//! model, in `agreement/model.rs`, finds a sliding window's reopening by
//! search, the crate by a closed form). The calls: check, failed, hit, reset,
//! reserve (with or without success reported), and the several-limits calls,
//! the asks among them each of a cost of 1 or, in the cases with costs, of
//! a cost drawn up to past the limits' max (`Ask::cost`), and in the cases with tiers, each asking its limit under a
//! max of its own (`Limit::with_max`, one count under every tier), and in
//! the cases with all-or-nothing calls, with costs and tiers,
//! `hit_all_or_nothing` half the time; after
//! each, the operator's reads (`status`, `refused_keys`) agree too.
//! While the database is gone, a limit that counts locally gives `Memory`'s
//! verdicts, marked unreachable.

#[path = "agreement/model.rs"]
mod model;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use model::{
    Call, Case, Model, Seen, case, case_with_all_or_nothing, case_with_costs, case_with_tiers,
    micros,
};
use platformkit_limit::{
    Key, Limit, LimitConn, Limiter, ManualClock, Memory, Postgres, Reservation, SCHEMA, Store,
    Verdict, WhenUnreachable,
};
use platformkit_limit_testdb::{Server, TestDb};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio::runtime::Runtime;
use tokio::sync::Mutex;
use tokio_postgres::Client;

/// One database and one held connection for every test in this file; each
/// case namespaces its keys with limit names of its own.
struct Fixture {
    runtime: Runtime,
    _db: TestDb,
    client: Arc<Mutex<Client>>,
    next_case: AtomicU64,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("building a Tokio runtime");
        let server = Server::shared();
        let (db, client) = runtime.block_on(async {
            let db = server.database(SCHEMA).await;
            let client = db.connect().await;
            (db, client)
        });
        Fixture {
            runtime,
            _db: db,
            client: Arc::new(Mutex::new(client)),
            next_case: AtomicU64::new(0),
        }
    })
}

impl Fixture {
    /// A prefix for limit names no other case uses.
    fn case_prefix(&self, test: &str) -> String {
        format!("{test}.{}", self.next_case.fetch_add(1, Ordering::Relaxed))
    }

    /// Lends the held connection to one call at a time.
    fn held(&self) -> impl LimitConn + use<> {
        let client = self.client.clone();
        move || {
            let client = client.clone();
            async move { Ok::<_, Infallible>(client.lock_owned().await) }
        }
    }

    /// A `Postgres` limiter and a `Memory` one, both reading `clock`. The
    /// budget is the longest allowed, so that a slow machine cannot turn a
    /// verdict into a fail-open one.
    fn limiters(
        &self,
        clock: &ManualClock,
    ) -> (Limiter<Postgres<impl LimitConn + use<>>>, Limiter<Memory>) {
        let pg = Limiter::builder(Postgres::new(self.held()).with_clock(clock.clone()))
            .budget(Limiter::MAX_BUDGET)
            .build()
            .unwrap();
        let mem = Limiter::builder(Memory::new().with_clock(clock.clone()))
            .budget(Limiter::MAX_BUDGET)
            .build()
            .unwrap();
        (pg, mem)
    }
}

// ---------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------

fn cases() -> u32 {
    crate::common::cases(64)
}

fn play(case: &Case) -> Result<(), TestCaseError> {
    let fx = fixture();
    let own = case.limits(&fx.case_prefix("agree"), WhenUnreachable::Allow);
    let keys = case.keys();
    let clock = case.clock();
    let (pg, mem) = fx.limiters(&clock);
    let mut model = Model::default();
    let tiered = case.ops.iter().any(|op| op.tier > 0);

    fx.runtime.block_on(async {
        for (i, op) in case.ops.iter().enumerate() {
            case.advance(&clock, op);
            let now = clock.now();
            let (limits, specs) = case.tiered(&own, op, true);
            let (limit, key) = (&limits[op.limit], &keys[op.key]);
            let all: Vec<(&Limit, &Key)> = limits.iter().map(|l| (l, key)).collect();
            let fail = |who: &str, e: platformkit_limit::Error| {
                TestCaseError::fail(format!("op {i} {op:?}: {who}: {e:?}"))
            };
            let cost = NonZeroU32::new(op.cost()).expect("a cost of at least 1");
            // (verdicts from Postgres, from Memory, the limits they are for)
            let (p, m, which): (Vec<Verdict>, Vec<Verdict>, Vec<usize>) = match op.call {
                Call::Check => (
                    vec![
                        pg.check(limit, key)
                            .await
                            .map_err(|e| fail("Postgres", e))?,
                    ],
                    vec![mem.check(limit, key).await.map_err(|e| fail("Memory", e))?],
                    vec![op.limit],
                ),
                Call::Failed => (
                    vec![
                        pg.failed(limit, key)
                            .await
                            .map_err(|e| fail("Postgres", e))?,
                    ],
                    vec![
                        mem.failed(limit, key)
                            .await
                            .map_err(|e| fail("Memory", e))?,
                    ],
                    vec![op.limit],
                ),
                Call::Hit => (
                    vec![
                        hit(&pg, limit, key, cost)
                            .await
                            .map_err(|e| fail("Postgres", e))?,
                    ],
                    vec![
                        hit(&mem, limit, key, cost)
                            .await
                            .map_err(|e| fail("Memory", e))?,
                    ],
                    vec![op.limit],
                ),
                Call::Reserve { succeed } => {
                    let p = reserve(&pg, limit, key, cost)
                        .await
                        .map_err(|e| fail("Postgres", e))?;
                    let m = reserve(&mem, limit, key, cost)
                        .await
                        .map_err(|e| fail("Memory", e))?;
                    let (pv, mv) = (p.verdict().clone(), m.verdict().clone());
                    if succeed {
                        if let Reservation::Granted(permit) = p {
                            permit.succeeded().await.map_err(|e| fail("Postgres", e))?;
                        }
                        if let Reservation::Granted(permit) = m {
                            permit.succeeded().await.map_err(|e| fail("Memory", e))?;
                        }
                    }
                    (vec![pv], vec![mv], vec![op.limit])
                }
                Call::CheckAll | Call::FailedAll | Call::HitAll | Call::HitAllOrNothing => {
                    let (p, m) = match op.call {
                        Call::CheckAll => (pg.check_all(&all).await, mem.check_all(&all).await),
                        Call::FailedAll => (pg.failed_all(&all).await, mem.failed_all(&all).await),
                        Call::HitAllOrNothing => (
                            pg.hit_all_or_nothing(&all).cost(cost).await,
                            mem.hit_all_or_nothing(&all).cost(cost).await,
                        ),
                        _ => (
                            hit_all(&pg, &all, cost).await,
                            hit_all(&mem, &all, cost).await,
                        ),
                    };
                    (
                        p.map_err(|e| fail("Postgres", e))?.into_vec(),
                        m.map_err(|e| fail("Memory", e))?.into_vec(),
                        (0..limits.len()).collect(),
                    )
                }
                Call::Reset => {
                    let (p, m) = (pg.reset(limit, key).await, mem.reset(limit, key).await);
                    prop_assert!(p.is_ok(), "op {i} {op:?}: Postgres reset: {p:?}");
                    prop_assert!(m.is_ok(), "op {i} {op:?}: Memory reset: {m:?}");
                    model.reset(op.limit, op.key);
                    same_status(&pg, &mem, (limit, tiered), key, i).await?;
                    continue;
                }
            };
            let expected = model.verdicts(&op.call, op.cost(), &which, op.key, &specs, micros(now));
            for (((p, m), &l), expected) in p.iter().zip(&m).zip(&which).zip(expected) {
                let (p, m) = (Seen::from(p), Seen::from(m));
                prop_assert_eq!(
                    &p,
                    &m,
                    "op {} {:?} at {:?}, limit {}: Postgres, then Memory",
                    i,
                    op,
                    now,
                    l
                );
                prop_assert_eq!(
                    &m,
                    &expected,
                    "op {} {:?} at {:?}, limit {}: the stores, then the model",
                    i,
                    op,
                    now,
                    l
                );
                if let Call::Reserve { succeed: true } = op.call {
                    if m.allowed {
                        model.take_back(l, op.key, op.cost(), case.limits[l].1, micros(now));
                    }
                }
            }
            same_status(&pg, &mem, (limit, tiered), key, i).await?;
        }
        Ok(())
    })
}

/// `hit`, of a cost of 1 (the call most callers make) or more.
async fn hit<S: Store>(
    limiter: &Limiter<S>,
    limit: &Limit,
    key: &Key,
    cost: NonZeroU32,
) -> Result<Verdict, platformkit_limit::Error> {
    if cost == NonZeroU32::MIN {
        limiter.hit(limit, key).await
    } else {
        limiter.hit(limit, key).cost(cost).await
    }
}

/// `reserve`, of a cost of 1 or more.
async fn reserve<'a, S: Store>(
    limiter: &'a Limiter<S>,
    limit: &Limit,
    key: &Key,
    cost: NonZeroU32,
) -> Result<Reservation<'a, S>, platformkit_limit::Error> {
    if cost == NonZeroU32::MIN {
        limiter.reserve(limit, key).await
    } else {
        limiter.reserve(limit, key).cost(cost).await
    }
}

/// `hit_all`, of a cost of 1 or more.
async fn hit_all<S: Store>(
    limiter: &Limiter<S>,
    all: &[(&Limit, &Key)],
    cost: NonZeroU32,
) -> Result<platformkit_limit::Verdicts, platformkit_limit::Error> {
    if cost == NonZeroU32::MIN {
        limiter.hit_all(all).await
    } else {
        limiter.hit_all(all).cost(cost).await
    }
}

/// The operator's reads agree too: the key's status, and the keys the limit
/// refuses (in order), on both stores; a status is refused exactly when the
/// key is listed, but with tiers: a key is listed when a write left it at
/// the max of the tier it was counted under, so a listed key is refused,
/// and a key refused under a smaller max than its writes' is not listed.
async fn same_status<P: Store>(
    pg: &Limiter<P>,
    mem: &Limiter<Memory>,
    (limit, tiered): (&Limit, bool),
    key: &Key,
    i: usize,
) -> Result<(), TestCaseError> {
    let fail = |who: &str, e: platformkit_limit::Error| {
        TestCaseError::fail(format!("op {i}: {who}: {e:?}"))
    };
    let p = pg
        .status(limit, key)
        .await
        .map_err(|e| fail("Postgres status", e))?;
    let m = mem
        .status(limit, key)
        .await
        .map_err(|e| fail("Memory status", e))?;
    prop_assert_eq!(&p, &m, "op {}: status, Postgres then Memory", i);
    let at_most = Limiter::MAX_REFUSED_KEYS;
    let pl = pg
        .refused_keys(limit, at_most)
        .await
        .map_err(|e| fail("Postgres refused_keys", e))?;
    let ml = mem
        .refused_keys(limit, at_most)
        .await
        .map_err(|e| fail("Memory refused_keys", e))?;
    prop_assert_eq!(&pl, &ml, "op {}: refused_keys, Postgres then Memory", i);
    prop_assert!(
        if tiered {
            !pl.contains(&p) || p.is_refused()
        } else {
            p.is_refused() == pl.contains(&p)
        },
        "op {}: a refused status is listed, and only then (tiers: {})",
        i,
        tiered
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn both_limiters_agree(case in case()) {
        play(&case)?;
    }

    #[test]
    fn both_limiters_agree_with_costs(case in case_with_costs()) {
        play(&case)?;
    }

    #[test]
    fn both_limiters_agree_with_tiers(case in case_with_tiers()) {
        play(&case)?;
    }

    #[test]
    fn both_limiters_agree_with_all_or_nothing(case in case_with_all_or_nothing()) {
        play(&case)?;
    }
}

// ---------------------------------------------------------------------------
// The local count while the database is gone
// ---------------------------------------------------------------------------

/// Runs one call of `cost` on a limiter; `None` for a reset (whose result
/// the caller checks).
async fn act<S: Store>(
    limiter: &Limiter<S>,
    (call, cost): (&Call, NonZeroU32),
    limit: &Limit,
    key: &Key,
    all: &[(&Limit, &Key)],
) -> Result<Option<Vec<Verdict>>, platformkit_limit::Error> {
    Ok(Some(match call {
        Call::Check => vec![limiter.check(limit, key).await?],
        Call::Failed => vec![limiter.failed(limit, key).await?],
        Call::Hit => vec![hit(limiter, limit, key, cost).await?],
        Call::Reserve { succeed } => {
            let reservation = reserve(limiter, limit, key, cost).await?;
            let verdict = reservation.verdict().clone();
            if let (true, Reservation::Granted(permit)) = (*succeed, reservation) {
                permit.succeeded().await?;
            }
            vec![verdict]
        }
        Call::CheckAll => limiter.check_all(all).await?.into_vec(),
        Call::FailedAll => limiter.failed_all(all).await?.into_vec(),
        Call::HitAll => hit_all(limiter, all, cost).await?.into_vec(),
        // Not drawn by the cases played here (see `case_with_all_or_nothing`).
        Call::HitAllOrNothing => limiter.hit_all_or_nothing(all).cost(cost).await?.into_vec(),
        Call::Reset => return Ok(None),
    }))
}

/// A limiter whose database is never there, for limits that count locally:
/// its verdicts must be `Memory`'s, marked unreachable.
fn play_local(case: &Case) -> Result<(), TestCaseError> {
    let fx = fixture();
    let own = case.limits(&fx.case_prefix("local"), WhenUnreachable::CountLocally);
    let keys = case.keys();
    let clock = case.clock();
    // Nothing listens at the database's address: down, with no probe.
    let gone = || async {
        Err::<Box<Client>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    };
    let down = Limiter::builder(Postgres::new(gone).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let mem = Limiter::builder(Memory::new().with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    fx.runtime.block_on(async {
        for (i, op) in case.ops.iter().enumerate() {
            case.advance(&clock, op);
            // Tiers of limits without a lockout only: the local count is
            // bounded, and keeps the earlier window a lockout reads by the
            // max of the call that counted (the latest that reached it),
            // so a call under a smaller tier's max may not find a lockout
            // that an earlier window under it would give.
            let (limits, _) = case.tiered(&own, op, false);
            let (limit, key) = (&limits[op.limit], &keys[op.key]);
            let all: Vec<(&Limit, &Key)> = limits.iter().map(|l| (l, key)).collect();
            let cost = NonZeroU32::new(op.cost()).expect("a cost of at least 1");
            let d = act(&down, (&op.call, cost), limit, key, &all).await;
            let m = act(&mem, (&op.call, cost), limit, key, &all).await;
            let m = m.map_err(|e| TestCaseError::fail(format!("op {i} {op:?}: Memory: {e:?}")))?;
            let Some(m) = m else {
                let d = down.reset(limit, key).await;
                prop_assert!(
                    d.is_err_and(|e| e.is_unreachable()),
                    "op {i}: reset says unreachable"
                );
                mem.reset(limit, key).await.unwrap();
                continue;
            };
            let d = d
                .map_err(|e| TestCaseError::fail(format!("op {i} {op:?}: local: {e:?}")))?
                .expect("not a reset");
            // A cost above a limit's max asks no store, so neither limiter
            // is unreachable: the verdicts are the same.
            let asked = !m.iter().any(Verdict::exceeds_max);
            for (d, m) in d.iter().zip(&m) {
                prop_assert_eq!(
                    d.is_unreachable(),
                    asked,
                    "op {} {:?}: the local verdict says unreachable, if asked",
                    i,
                    op
                );
                let (d, m) = (Seen::from(d), Seen::from(m));
                prop_assert_eq!(
                    Seen {
                        unreachable: false,
                        ..d
                    },
                    m,
                    "op {} {:?}: the local count, then Memory",
                    i,
                    op
                );
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: (cases() / 2).max(1),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_local_count_agrees_with_memory(case in case()) {
        play_local(&case)?;
    }

    #[test]
    fn the_local_count_agrees_with_memory_with_costs(case in case_with_costs()) {
        play_local(&case)?;
    }

    #[test]
    fn the_local_count_agrees_with_memory_with_tiers(case in case_with_tiers()) {
        play_local(&case)?;
    }
}

// ---------------------------------------------------------------------------
// A window edge, spelled out
// ---------------------------------------------------------------------------

#[test]
fn agreement_at_a_window_edge() {
    let fx = fixture();
    let limit = Limit::new(
        &format!("{}.login", fx.case_prefix("edge")),
        3,
        Duration::from_secs(60),
    )
    .unwrap();
    let key = Key::new(["email", "a|b\0~"]).unwrap();
    // A whole number of minutes since the epoch: a window edge.
    let edge = UNIX_EPOCH + Duration::from_secs(1_700_000_040);
    let before = edge - Duration::from_micros(1);
    let clock = ManualClock::new(before);
    let (pg, mem) = fx.limiters(&clock);

    fx.runtime.block_on(async {
        for n in 1..=3u64 {
            let p = Seen::from(&pg.failed(&limit, &key).await.unwrap());
            let m = Seen::from(&mem.failed(&limit, &key).await.unwrap());
            assert_eq!(p, m, "failure {n}: Postgres, then Memory");
            assert_eq!(p.count, Some(n));
            assert_eq!(p.allowed, n < 3, "failure {n}");
        }

        // Just before the edge, the window is used up.
        let p = Seen::from(&pg.check(&limit, &key).await.unwrap());
        let m = Seen::from(&mem.check(&limit, &key).await.unwrap());
        assert_eq!(p, m, "1µs before the edge: Postgres, then Memory");
        assert_eq!(
            p,
            Seen {
                allowed: false,
                refused: true,
                unreachable: false,
                count: Some(3),
                remaining: Some(0),
                reopens_at: Some(edge),
                retry_after: Some(Duration::from_micros(1)),
                exceeds_max: false,
            }
        );

        // At the edge exactly, a new window opens: nothing counted yet.
        clock.advance(Duration::from_micros(1));
        assert_eq!(clock.now(), edge);
        let p = Seen::from(&pg.check(&limit, &key).await.unwrap());
        let m = Seen::from(&mem.check(&limit, &key).await.unwrap());
        assert_eq!(p, m, "at the edge: Postgres, then Memory");
        assert_eq!(
            p,
            Seen {
                allowed: true,
                refused: false,
                unreachable: false,
                count: Some(0),
                remaining: Some(3),
                reopens_at: Some(edge + Duration::from_secs(60)),
                retry_after: None,
                exceeds_max: false,
            }
        );
    });
}
