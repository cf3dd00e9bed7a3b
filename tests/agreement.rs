//! `Memory` is the fake callers test against; it is only worth having if it
//! behaves exactly like `Postgres`. These tests play the same calls, at the
//! same pinned times, against both, and require the same verdicts, call for
//! call; the property also checks both against a plain model of fixed and
//! sliding windows, written independently of the crate's arithmetic (the
//! model finds a sliding window's reopening by search, the crate by a closed
//! form). The calls: check, failed, hit, reset, reserve (with or without
//! success reported), and the several-limits calls.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use platformkit_limit::{
    DEFAULT_REFUSAL_TTL, FLOOD_REFUSALS, FLOOD_SPAN, Key, Limit, LimitConn, Limiter, MAX_BUDGET,
    ManualClock, Memory, Postgres, Reservation, SCHEMA, Store, Verdict, WhenUnreachable,
};
use platformkit_limit_testdb::{Server, TestDb};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio::runtime::Runtime;
use tokio::sync::Mutex;
use tokio_postgres::Client;

const MICROS_PER_SEC: u64 = 1_000_000;

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
        let pg = Limiter::new(Postgres::new(self.held()).with_clock(clock.clone()))
            .with_budget(MAX_BUDGET)
            .unwrap();
        let mem = Limiter::new(Memory::new().with_clock(clock.clone()))
            .with_budget(MAX_BUDGET)
            .unwrap();
        (pg, mem)
    }
}

/// Everything a verdict tells a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    allowed: bool,
    refused: bool,
    unreachable: bool,
    count: Option<u64>,
    remaining: Option<u64>,
    reopens_at: Option<SystemTime>,
    retry_after: Option<Duration>,
}

impl From<&Verdict> for Seen {
    fn from(v: &Verdict) -> Self {
        Seen {
            allowed: v.is_allowed(),
            refused: v.is_refused(),
            unreachable: v.is_unreachable(),
            count: v.count(),
            remaining: v.remaining(),
            reopens_at: v.reopens_at(),
            retry_after: v.retry_after(),
        }
    }
}

fn micros(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

fn at_micros(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

// ---------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------

/// 240 bytes: any key with it is digested.
const LONG: &str = concat!(
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "012345678901234567890123",
);

/// Keys chosen to break a sloppy encoding or a sloppy comparison: a
/// separator and the two parts it could fake, empty, NUL, the digest marker,
/// an escape, two spellings of "é" and two cases of one letter (distinct
/// keys, byte for byte), and two long keys that differ only past the cut.
const KEY_POOL: &[&[&str]] = &[
    &["a|b"],
    &["a", "b"],
    &[""],
    &["\0"],
    &["~"],
    &["\\"],
    &["\u{e9}"],
    &["e\u{301}"],
    &["A"],
    &["a"],
    &[LONG, "1"],
    &[LONG, "2"],
];

/// Windows of the limits, in seconds.
const WINDOWS: &[u64] = &[1, 7, 60];

#[derive(Clone, Debug)]
enum Call {
    Check,
    Failed,
    Hit,
    Reset,
    /// Reserve, then report success (taking the attempt back) or not.
    Reserve {
        succeed: bool,
    },
    /// The several-limits calls, over every limit of the case with one key.
    CheckAll,
    FailedAll,
    HitAll,
}

/// How the clock moves before a call.
#[derive(Clone, Debug)]
enum Advance {
    Stay,
    By(Duration),
    /// To the next edge of limit `limit`'s windows, plus `offset_micros`
    /// (never backwards).
    ToEdge {
        limit: usize,
        offset_micros: i64,
    },
}

#[derive(Clone, Debug)]
struct Op {
    advance: Advance,
    call: Call,
    limit: usize,
    key: usize,
}

#[derive(Clone, Debug)]
struct Case {
    /// Seconds and microseconds since the Unix epoch.
    start: (u64, u32),
    /// `(max, window in seconds, sliding, lockout in seconds or 0)` of each
    /// limit.
    limits: Vec<(u32, u64, bool, u64)>,
    keys: Vec<&'static [&'static str]>,
    ops: Vec<Op>,
}

fn advance(limits: usize) -> impl Strategy<Value = Advance> {
    let by = |d: Duration| Just(Advance::By(d));
    prop_oneof![
        4 => Just(Advance::Stay),
        1 => by(Duration::from_micros(1)),
        2 => (1..5u64).prop_map(|ms| Advance::By(Duration::from_millis(ms))),
        1 => by(Duration::from_micros(999_999)),
        1 => by(Duration::from_secs(1)),
        1 => by(Duration::from_micros(6_999_999)),
        1 => by(Duration::from_secs(7)),
        1 => by(Duration::from_micros(7_000_001)),
        1 => by(Duration::from_secs(59)),
        1 => by(Duration::from_secs(61)),
        2 => (2..10u64).prop_map(|s| Advance::By(Duration::from_secs(s))),
        3 => (0..limits, -1..=1i64).prop_map(|(limit, offset_micros)| Advance::ToEdge {
            limit,
            offset_micros,
        }),
    ]
}

fn op(limits: usize, keys: usize) -> impl Strategy<Value = Op> {
    let call = prop_oneof![
        3 => Just(Call::Check),
        3 => Just(Call::Failed),
        3 => Just(Call::Hit),
        1 => Just(Call::Reset),
        2 => any::<bool>().prop_map(|succeed| Call::Reserve { succeed }),
        1 => Just(Call::CheckAll),
        1 => Just(Call::FailedAll),
        1 => Just(Call::HitAll),
    ];
    (advance(limits), call, 0..limits, 0..keys).prop_map(|(advance, call, limit, key)| Op {
        advance,
        call,
        limit,
        key,
    })
}

fn start() -> impl Strategy<Value = (u64, u32)> {
    prop_oneof![
        // Anywhere after 2001.
        (1_000_000_000..=2_000_000_000u64, 0..1_000_000u32),
        // A moment before an edge of every window length (420 s = 7 × 60).
        (2_380_953..=4_761_904u64, 1..=3u32)
            .prop_map(|(n, before)| (n * 420 - 1, 1_000_000 - before)),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let lockouts =
        prop_oneof![3 => Just(0u64), 1 => Just(1u64), 1 => Just(30u64), 1 => Just(90u64)];
    let limits = prop::collection::vec(
        (
            1..=4u32,
            prop::sample::select(WINDOWS),
            any::<bool>(),
            lockouts,
        ),
        1..=3,
    );
    let keys = prop::sample::subsequence(KEY_POOL.to_vec(), 1..=4);
    (start(), limits, keys).prop_flat_map(|(start, limits, keys)| {
        let ops = prop::collection::vec(op(limits.len(), keys.len()), 1..=40);
        (Just(start), Just(limits), Just(keys), ops).prop_map(|(start, limits, keys, ops)| Case {
            start,
            limits,
            keys,
            ops,
        })
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64)
}

/// Counts per (limit, key, window start in microseconds), windows from the
/// Unix epoch as the crate documents them. For a sliding window the estimate
/// is the current count plus the previous window's weighted by how much of
/// it still overlaps the last window's length; an attempt may go ahead while
/// the estimate (before its own ask, for `hit`) is below max.
///
/// Both limiters keep their refusal cache on (the default), so the model
/// keeps one too: once a single-limit call's key has been refused
/// `FLOOD_REFUSALS` times within `FLOOD_SPAN` (answers from the cache
/// included), the refusal is answered again, with nothing counted, for the
/// TTL or until it reopens, whichever is sooner; then the next call asks
/// again. An allow, a reset or a success forgets the key; the several-limits
/// calls neither read nor fill it.
#[derive(Default)]
struct Model {
    counts: HashMap<(usize, usize, u64), u64>,
    /// (limit, key) → what the refusal cache knows of it.
    refusals: HashMap<(usize, usize), Cached>,
}

/// The refusal cache's entry for one (limit, key).
#[derive(Default)]
struct Cached {
    /// The latest refusals answered, in µs, oldest first.
    times: VecDeque<u64>,
    /// The refusal answered again, when it reopens and when its TTL ends,
    /// in µs.
    held: Option<(Seen, u64, u64)>,
}

impl Cached {
    fn refused_at(&mut self, now: u64) {
        self.times.push_back(now);
        if self.times.len() > FLOOD_REFUSALS {
            self.times.pop_front();
        }
    }

    fn flooded(&self, now: u64) -> bool {
        let span = u64::try_from(FLOOD_SPAN.as_micros()).unwrap();
        self.times.len() == FLOOD_REFUSALS && now - self.times[0] < span
    }
}

impl Model {
    fn count(&self, limit: usize, key: usize, start: u64) -> u64 {
        self.counts.get(&(limit, key, start)).copied().unwrap_or(0)
    }

    /// The estimate times the window width, at `now`.
    fn weighted(&self, limit: usize, key: usize, width: u64, sliding: bool, now: u64) -> u128 {
        let start = now / width * width;
        let elapsed = now - start;
        let previous = if sliding && start >= width {
            self.count(limit, key, start - width)
        } else {
            0
        };
        u128::from(previous) * u128::from(width - elapsed)
            + u128::from(self.count(limit, key, start)) * u128::from(width)
    }

    fn verdict(
        &mut self,
        call: &Call,
        limit: usize,
        key: usize,
        spec: (u32, u64, bool, u64),
        now: u64,
    ) -> Seen {
        let (max, window, sliding, lockout) = spec;
        let single = !matches!(call, Call::CheckAll | Call::FailedAll | Call::HitAll);
        if single {
            let cached = self.refusals.entry((limit, key)).or_default();
            if let Some((seen, reopens, fresh_until)) = &cached.held {
                if now < *fresh_until {
                    let seen = Seen {
                        retry_after: Some(Duration::from_micros(reopens - now)),
                        ..seen.clone()
                    };
                    cached.refused_at(now);
                    return seen;
                }
            }
        }
        let width = window * MICROS_PER_SEC;
        let start = now / width * width;
        if matches!(
            call,
            Call::Failed | Call::Hit | Call::Reserve { .. } | Call::FailedAll | Call::HitAll
        ) {
            *self.counts.entry((limit, key, start)).or_insert(0) += 1;
        }
        let weighted = self.weighted(limit, key, width, sliding, now);
        let own = if matches!(call, Call::Hit | Call::Reserve { .. } | Call::HitAll) {
            u128::from(width)
        } else {
            0
        };
        let max_w = u128::from(max) * u128::from(width);
        // A lockout runs from the end of any window whose own count reached
        // max (the current one counted before this call's own ask).
        let own_asks = u64::from(own > 0);
        let locked_until = (lockout > 0)
            .then(|| {
                self.counts
                    .iter()
                    .filter(|&(&(l, k, s), &c)| {
                        (l, k) == (limit, key)
                            && s <= start
                            && (if s == start { c - own_asks } else { c }) >= u64::from(max)
                    })
                    .map(|(&(_, _, s), _)| s + width + lockout * MICROS_PER_SEC)
                    .filter(|&until| until > now)
                    .max()
            })
            .flatten();
        let allowed = weighted - own < max_w && locked_until.is_none();
        let count = u64::try_from(weighted.div_ceil(u128::from(width))).unwrap();
        let reopens = if allowed {
            start + width
        } else {
            // The first microsecond, from now or the lockout's end, at which
            // the estimate is below max again: it only falls while nothing
            // is counted, so search for it.
            let from = locked_until.map_or(now, |until| until.max(now));
            let (mut lo, mut hi) = (from, from.max(start) + 2 * width + 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.weighted(limit, key, width, sliding, mid) < max_w {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        };
        let seen = Seen {
            allowed,
            refused: !allowed,
            unreachable: false,
            count: Some(count),
            remaining: Some(u64::from(max).saturating_sub(count)),
            reopens_at: Some(at_micros(reopens)),
            retry_after: (!allowed).then(|| Duration::from_micros(reopens - now)),
        };
        if single && allowed {
            self.refusals.remove(&(limit, key));
        } else if single {
            let cached = self.refusals.entry((limit, key)).or_default();
            cached.refused_at(now);
            let ttl = u64::try_from(DEFAULT_REFUSAL_TTL.as_micros()).unwrap();
            cached.held = cached
                .flooded(now)
                .then(|| (seen.clone(), reopens, reopens.min(now + ttl)));
        }
        seen
    }

    /// A reserved attempt that succeeded is taken back from its window.
    fn take_back(&mut self, limit: usize, key: usize, window: u64, now: u64) {
        self.refusals.remove(&(limit, key));
        let width = window * MICROS_PER_SEC;
        let start = now / width * width;
        if let Some(count) = self.counts.get_mut(&(limit, key, start)) {
            *count = count.saturating_sub(1);
        }
    }

    fn reset(&mut self, limit: usize, key: usize) {
        self.refusals.remove(&(limit, key));
        self.counts.retain(|&(l, k, _), _| (l, k) != (limit, key));
    }
}

impl Case {
    /// The case's limits, named under `prefix`, each deciding `unreachable`
    /// as given when the store cannot be reached.
    fn limits(&self, prefix: &str, unreachable: WhenUnreachable) -> Vec<Limit> {
        self.limits
            .iter()
            .enumerate()
            .map(|(i, &(max, window, sliding, lockout))| {
                let limit = Limit::new(&format!("{prefix}.l{i}"), max, Duration::from_secs(window))
                    .unwrap()
                    .when_unreachable(unreachable);
                let limit = if sliding { limit.sliding() } else { limit };
                if lockout > 0 {
                    limit.lockout(Duration::from_secs(lockout)).unwrap()
                } else {
                    limit
                }
            })
            .collect()
    }

    fn keys(&self) -> Vec<Key> {
        self.keys.iter().map(|p| Key::new(*p).unwrap()).collect()
    }

    /// A clock at the case's start.
    fn clock(&self) -> ManualClock {
        ManualClock::new(
            UNIX_EPOCH
                + Duration::new(self.start.0, 0)
                + Duration::from_micros(self.start.1.into()),
        )
    }

    /// Moves `clock` as `op` says.
    fn advance(&self, clock: &ManualClock, op: &Op) {
        match op.advance {
            Advance::Stay => {}
            Advance::By(by) => clock.advance(by),
            Advance::ToEdge {
                limit,
                offset_micros,
            } => {
                let now = micros(clock.now());
                let width = self.limits[limit].1 * MICROS_PER_SEC;
                let edge = (now / width + 1) * width;
                let target = edge.saturating_add_signed(offset_micros);
                if target > now {
                    clock.set(at_micros(target));
                }
            }
        }
    }
}

fn play(case: &Case) -> Result<(), TestCaseError> {
    let fx = fixture();
    let limits = case.limits(&fx.case_prefix("agree"), WhenUnreachable::Allow);
    let keys = case.keys();
    let clock = case.clock();
    let (pg, mem) = fx.limiters(&clock);
    let mut model = Model::default();

    fx.runtime.block_on(async {
        for (i, op) in case.ops.iter().enumerate() {
            case.advance(&clock, op);
            let now = clock.now();
            let (limit, key) = (&limits[op.limit], &keys[op.key]);
            let all: Vec<(&Limit, &Key)> = limits.iter().map(|l| (l, key)).collect();
            let fail = |who: &str, e: platformkit_limit::Error| {
                TestCaseError::fail(format!("op {i} {op:?}: {who}: {e:?}"))
            };
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
                    vec![pg.hit(limit, key).await.map_err(|e| fail("Postgres", e))?],
                    vec![mem.hit(limit, key).await.map_err(|e| fail("Memory", e))?],
                    vec![op.limit],
                ),
                Call::Reserve { succeed } => {
                    let p = pg
                        .reserve(limit, key)
                        .await
                        .map_err(|e| fail("Postgres", e))?;
                    let m = mem
                        .reserve(limit, key)
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
                Call::CheckAll | Call::FailedAll | Call::HitAll => {
                    let (p, m) = match op.call {
                        Call::CheckAll => (pg.check_all(&all).await, mem.check_all(&all).await),
                        Call::FailedAll => (pg.failed_all(&all).await, mem.failed_all(&all).await),
                        _ => (pg.hit_all(&all).await, mem.hit_all(&all).await),
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
                    continue;
                }
            };
            for ((p, m), &l) in p.iter().zip(&m).zip(&which) {
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
                let expected = model.verdict(&op.call, l, op.key, case.limits[l], micros(now));
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
                        model.take_back(l, op.key, case.limits[l].1, micros(now));
                    }
                }
            }
        }
        Ok(())
    })
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
}

// ---------------------------------------------------------------------------
// The local count while the database is gone
// ---------------------------------------------------------------------------

/// Runs one call on a limiter; `None` for a reset (whose result the caller
/// checks).
async fn act<S: Store>(
    limiter: &Limiter<S>,
    call: &Call,
    limit: &Limit,
    key: &Key,
    all: &[(&Limit, &Key)],
) -> Result<Option<Vec<Verdict>>, platformkit_limit::Error> {
    Ok(Some(match call {
        Call::Check => vec![limiter.check(limit, key).await?],
        Call::Failed => vec![limiter.failed(limit, key).await?],
        Call::Hit => vec![limiter.hit(limit, key).await?],
        Call::Reserve { succeed } => {
            let reservation = limiter.reserve(limit, key).await?;
            let verdict = reservation.verdict().clone();
            if let (true, Reservation::Granted(permit)) = (*succeed, reservation) {
                permit.succeeded().await?;
            }
            vec![verdict]
        }
        Call::CheckAll => limiter.check_all(all).await?.into_vec(),
        Call::FailedAll => limiter.failed_all(all).await?.into_vec(),
        Call::HitAll => limiter.hit_all(all).await?.into_vec(),
        Call::Reset => return Ok(None),
    }))
}

/// A limiter whose database is never there, for limits that count locally:
/// its verdicts must be `Memory`'s, marked unreachable.
fn play_local(case: &Case) -> Result<(), TestCaseError> {
    let fx = fixture();
    let limits = case.limits(&fx.case_prefix("local"), WhenUnreachable::CountLocally);
    let keys = case.keys();
    let clock = case.clock();
    let gone = || async { Err::<Box<Client>, _>(std::io::Error::other("the database is gone")) };
    let down = Limiter::new(Postgres::new(gone).with_clock(clock.clone())).without_refusal_cache();
    let mem = Limiter::new(Memory::new().with_clock(clock.clone())).without_refusal_cache();
    fx.runtime.block_on(async {
        for (i, op) in case.ops.iter().enumerate() {
            case.advance(&clock, op);
            let (limit, key) = (&limits[op.limit], &keys[op.key]);
            let all: Vec<(&Limit, &Key)> = limits.iter().map(|l| (l, key)).collect();
            let d = act(&down, &op.call, limit, key, &all).await;
            let m = act(&mem, &op.call, limit, key, &all).await;
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
            for (d, m) in d.iter().zip(&m) {
                prop_assert!(
                    d.is_unreachable(),
                    "op {i} {op:?}: the local verdict says unreachable"
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
        cases: cases() / 2,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_local_count_agrees_with_memory(case in case()) {
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
            }
        );
    });
}
