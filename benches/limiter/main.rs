//! What a limiter call costs, next to the floors it cannot beat.
//!
//! Starts a throwaway PostgreSQL with its crash-safety defaults (`fsync` and
//! `synchronous_commit` on), or uses the server `DATABASE_URL` names (which
//! must be a superuser), creates a database with [`SCHEMA`], and measures on
//! the same held connections:
//!
//! - the floors: a bare `SELECT 1` round trip, and the upsert the limiter's
//!   procedure runs, sent alone in autocommit (one round trip and one WAL
//!   flush), prepared once per connection as the procedure's plans are;
//! - the read of `check` alone in the same way, to split `check` into the
//!   statement and the procedure around it;
//! - `check`, `failed`, `hit` and `reset` through [`Limiter`] over
//!   [`Postgres`], at 1 and at 16 connections (a task and a held connection
//!   each), over random keys drawn from a million and over one hot key;
//! - `check_all` and `failed_all` over two limits at once (per account and
//!   per address), next to `check` and `failed` over one;
//! - `failed` with [`Postgres::with_relaxed_durability`], next to the
//!   durable default;
//! - `failed` connecting for each call, and `failed` on [`Memory`];
//! - an attack: 16 tasks sharing one limiter over 16 connections, hammering
//!   100 keys already refused and one hot key still counting, with the
//!   refusal cache and merging (the defaults) and without, counting the
//!   statements sent (with the cache, a flooded key still costs one
//!   statement per TTL: the refused keys are hammered for at least 2.5 TTLs,
//!   and their statements compared with the bound the cache states);
//! - [`purge`] at scale, in a database of its own: a million closed windows
//!   purged while 16 writers count on the open ones, against the same
//!   writers alone.
//!
//! The limiters of the operations above measure the store path: they have
//! neither the refusal cache nor merging (a limit nothing reaches is never
//! refused anyway, and the tasks of a row do not share a limiter). Only the
//! attack uses the defaults, and compares them with both off.
//!
//! Each floor is measured right before the operation it is compared to, in
//! rounds. The table shows the median over rounds; each ratio is the median
//! of the per-round ratios. The figures are also written as JSON to
//! `target/bench/limiter.json`.
//!
//! ```text
//! cargo bench --bench limiter                  # several minutes
//! BENCH_QUICK=1 cargo bench --bench limiter    # a few seconds, for CI
//! ```
//!
//! It is a measurement, not a test: targets that do not hold are reported,
//! and the process still succeeds. The exceptions are the checks of what the
//! purge left (every closed window gone, every count of the open ones
//! intact): a wrong answer there is a bug, and fails the process once the
//! report is written.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Deref;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use platformkit_limit::{
    DEFAULT_REFUSAL_TTL, FLOOD_REFUSALS, Key, Limit, LimitConn, Limiter, MAX_BUDGET, MAX_WINDOW,
    Memory, PURGE_BATCH_ROWS, Postgres, SCHEMA, Store, Verdict, purge,
};
use platformkit_limit_testdb::{Options, Server};
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

/// The upsert of `platformkit.platformkit_limit_add` (`schema.sql`) for a fixed window
/// (the default), as one statement that works out the window itself: the
/// write of every `failed` and `hit`, without the procedure and its
/// transaction around it. Keep the two in step.
const UPSERT: &str = "\
WITH clock AS (
    SELECT COALESCE($4::timestamptz, pg_catalog.statement_timestamp()) AS now
), win AS (
    SELECT now,
           pg_catalog.date_bin($3::int8 * interval '1 second', now,
                               timestamptz '1970-01-01 00:00:00+00') AS start
    FROM clock
)
INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
SELECT $1::text, win.start, win.start + $3::int8 * interval '1 second', $2::int8
FROM win
ON CONFLICT (key, window_start) DO UPDATE
    SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
RETURNING l.count, l.window_end, (SELECT now FROM clock)";

/// The read of `platformkit.platformkit_limit_read` (`schema.sql`) as one statement: what
/// `check` reads, without the procedure and its transaction around it.
const READ: &str = "\
WITH clock AS (
    SELECT COALESCE($3::timestamptz, pg_catalog.statement_timestamp()) AS now
), win AS (
    SELECT now,
           pg_catalog.date_bin($2::int8 * interval '1 second', now,
                               timestamptz '1970-01-01 00:00:00+00') AS start
    FROM clock
)
SELECT COALESCE((SELECT l.count FROM platformkit.platformkit_limits AS l
                 WHERE l.key = $1::text AND l.window_start = win.start), 0::int8),
       win.start + $2::int8 * interval '1 second',
       win.now
FROM win";

/// Random keys are `0..KEY_SPACE`.
const KEY_SPACE: u64 = 1_000_000;

/// Every `PREFILL_EVERY`th random key has a row in the current window before
/// the run, so that `check` finds a row for some keys and not for others.
const PREFILL_EVERY: u64 = 10;

/// The limit's name: stored keys are `bench|id|<id>`.
const LIMIT_NAME: &str = "bench";

/// The id of the hot key.
const HOT_ID: &str = "hot";

/// The second limit of the several-limits calls, per address: stored keys
/// are `bench-address|ip|<address>`.
const ADDRESS_LIMIT_NAME: &str = "bench-address";

/// The attack's limit on the keys it finds refused: stored keys are
/// `bench-refused|id|refused-<n>`.
const REFUSED_LIMIT_NAME: &str = "bench-refused";

/// How many keys the attack finds refused.
const REFUSED_KEYS: u64 = 100;

/// The max of [`REFUSED_LIMIT_NAME`]: each key is refused after this many
/// failures.
const REFUSED_MAX: u32 = 5;

/// The limit the purge's writers count under: stored keys are
/// `bench-open|id|<n>`, in the current window (open) and in closed ones.
const OPEN_LIMIT_NAME: &str = "bench-open";

/// The window of [`OPEN_LIMIT_NAME`]: a day, so that a key's windows that
/// ended two days ago and more are the purge's to take (closed more than a
/// day and more than a window ago), and a run rarely sees the open window
/// close.
const OPEN_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// A limit nothing reaches, so that every verdict is the same and only the
/// cost is measured.
const MAX_ATTEMPTS: u32 = 1_000_000_000;

/// The wide concurrency: tasks, each with a held connection of its own.
const WIDE: usize = 16;

/// The shortest flood at the refused keys with the refusal cache on: two
/// and a half TTLs, so that each key's refusal is refreshed (twice or
/// three times) while it is measured, in quick mode too.
const FLOOD: Duration = match DEFAULT_REFUSAL_TTL.saturating_mul(5).checked_div(2) {
    Some(flood) => flood,
    None => unreachable!(),
};

/// How long PostgreSQL 15 and newer keep a backend's table counters before
/// flushing them to the shared statistics (at most once a second), plus a
/// margin.
const STATS_FLUSH_WAIT: Duration = Duration::from_millis(1100);

type Held = Arc<Mutex<Client>>;
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
/// One call: given the worker's index and the key's id.
type Op = Arc<dyn Fn(usize, String) -> BoxFuture + Send + Sync>;

// ---------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Mode {
    quick: bool,
    rounds: usize,
    warmup: Duration,
    measure: Duration,
    /// Closed windows written before the purge.
    purge_closed: u64,
    /// Open windows written before the purge, and the keys its writers
    /// count on.
    purge_open: u64,
}

impl Mode {
    /// `BENCH_QUICK=1` or `--quick`: one short round. Other arguments (cargo
    /// passes `--bench`) are ignored.
    fn from_env_and_args() -> Mode {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().skip(1).any(|arg| arg == "--quick");
        if quick {
            Mode {
                quick,
                rounds: 1,
                warmup: Duration::from_millis(20),
                measure: Duration::from_millis(120),
                purge_closed: 20_000,
                purge_open: 5_000,
            }
        } else {
            Mode {
                quick,
                rounds: 5,
                warmup: Duration::from_millis(100),
                measure: Duration::from_millis(600),
                purge_closed: 1_000_000,
                purge_open: 100_000,
            }
        }
    }

    fn name(self) -> &'static str {
        if self.quick { "quick" } else { "full" }
    }
}

// ---------------------------------------------------------------------------
// What is measured
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keys {
    /// Drawn uniformly from `0..KEY_SPACE` for each call.
    Random,
    /// The same key for every call.
    Hot,
    /// Drawn uniformly from the [`REFUSED_KEYS`] keys the attack finds
    /// refused.
    Refused,
}

impl Keys {
    fn name(self) -> &'static str {
        match self {
            Keys::Random => "random",
            Keys::Hot => "hot",
            Keys::Refused => "refused",
        }
    }

    fn draw(self, rng: &mut XorShift) -> String {
        match self {
            Keys::Random => (rng.next() % KEY_SPACE).to_string(),
            Keys::Hot => HOT_ID.to_owned(),
            Keys::Refused => refused_id(rng.next() % REFUSED_KEYS),
        }
    }
}

/// The id of the `n`th key the attack finds refused.
fn refused_id(n: u64) -> String {
    format!("refused-{n}")
}

/// The address that goes with a random key's account in the several-limits
/// calls: a different address for each account, spread over the whole IPv4
/// space.
fn address_of(id: &str) -> IpAddr {
    let n: u64 = id.parse().expect("random keys are numbers");
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    IpAddr::V4(Ipv4Addr::from(
        u32::try_from(mixed).expect("the top half of a u64 fits in a u32"),
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    /// Floor: a bare round trip.
    Select1,
    /// Floor: the limiter's upsert alone, in autocommit.
    Upsert,
    /// The limiter's read alone, in autocommit: the floor of no target,
    /// shown to split `check` into the statement and the procedure.
    Read,
    Check,
    Failed,
    Hit,
    Reset,
    /// `check_all` over two (limit, key) pairs: per account and per address.
    CheckAll,
    /// `failed_all` over the same two pairs.
    FailedAll,
    /// `failed` with relaxed durability.
    RelaxedFailed,
    /// `failed`, connecting for each call.
    ConnectPerCall,
    /// `failed` on the in-process fake.
    Memory,
}

impl What {
    fn label(self) -> &'static str {
        match self {
            What::Select1 => "SELECT 1 (floor)",
            What::Upsert => "upsert alone (floor)",
            What::Read => "read alone",
            What::Check => "check",
            What::Failed => "failed",
            What::Hit => "hit",
            What::Reset => "reset",
            What::CheckAll => "check_all, 2 limits",
            What::FailedAll => "failed_all, 2 limits",
            What::RelaxedFailed => "failed, relaxed durability",
            What::ConnectPerCall => "failed, connect per call",
            What::Memory => "failed, Memory",
        }
    }

    fn json_name(self) -> &'static str {
        match self {
            What::Select1 => "select_1",
            What::Upsert => "upsert_alone",
            What::Read => "read_alone",
            What::Check => "check",
            What::Failed => "failed",
            What::Hit => "hit",
            What::Reset => "reset",
            What::CheckAll => "check_all_2_limits",
            What::FailedAll => "failed_all_2_limits",
            What::RelaxedFailed => "failed_relaxed_durability",
            What::ConnectPerCall => "failed_connect_per_call",
            What::Memory => "failed_memory",
        }
    }

    /// What this is compared to.
    fn floor(self) -> Option<What> {
        match self {
            What::Check => Some(What::Select1),
            What::Failed | What::Hit | What::Reset => Some(What::Upsert),
            What::CheckAll => Some(What::Check),
            What::FailedAll | What::RelaxedFailed | What::ConnectPerCall => Some(What::Failed),
            What::Select1 | What::Upsert | What::Read | What::Memory => None,
        }
    }

    /// What is measured right after this, over random keys, at the same
    /// concurrency, and compared to it.
    fn followed_by(self) -> &'static [What] {
        match self {
            What::Check => &[What::CheckAll],
            What::Failed => &[What::FailedAll, What::RelaxedFailed],
            _ => &[],
        }
    }
}

/// The figures of one measurement.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Every call made, the warm-up's included.
    calls: u64,
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

/// xorshift64: plenty for picking keys.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Every worker of every measurement draws its own sequence of keys.
fn next_seed() -> u64 {
    static SEED: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);
    SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
}

/// Runs `op` on `workers` concurrent tasks, each calling it back to back:
/// first for the warm-up, whose calls are not recorded, then for the
/// measurement. Each call's latency is recorded; the throughput is the calls
/// started in the measurement over the time until the last of them ended.
async fn measure(op: &Op, workers: usize, keys: Keys, mode: Mode) -> Sample {
    let start = Instant::now() + mode.warmup;
    let end = start + mode.measure;
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let op = Arc::clone(op);
            let mut rng = XorShift::new(next_seed());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut last = start;
                let mut calls = 0;
                loop {
                    let id = keys.draw(&mut rng);
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    op(worker, id).await;
                    let done = Instant::now();
                    calls += 1;
                    if began >= start {
                        latencies.push(done - began);
                        last = done;
                    }
                    // A call answered in memory never waits: let the other
                    // tasks run now and then.
                    tokio::task::coop::consume_budget().await;
                }
                (latencies, last, calls)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut last = start;
    let mut calls = 0;
    for task in tasks {
        match task.await {
            Ok((mine, my_last, my_calls)) => {
                latencies.extend(mine);
                last = last.max(my_last);
                calls += my_calls;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    sample(latencies, last - start, calls)
}

/// The figures of the latencies recorded over `took`, the time from the
/// start of the measurement until its last call ended.
fn sample(mut latencies: Vec<Duration>, took: Duration, calls: u64) -> Sample {
    latencies.sort_unstable();
    let secs = took.as_secs_f64();
    Sample {
        ops_per_sec: if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        },
        p50_us: percentile_us(&latencies, 0.50),
        p99_us: percentile_us(&latencies, 0.99),
        calls,
    }
}

/// The nearest-rank percentile of sorted latencies, in microseconds.
fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e6
}

/// The median, ignoring values that are not finite; NaN when none is.
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

// ---------------------------------------------------------------------------
// The calls
// ---------------------------------------------------------------------------

/// Lends one held connection to one call at a time.
fn lend(held: Held) -> impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> {
    move || {
        let held = Arc::clone(&held);
        async move { Ok::<_, Infallible>(held.lock_owned().await) }
    }
}

/// Lends any idle one of several held connections, one call at a time
/// each, and counts the connections it lends. The store borrows one
/// connection for each statement it sends, so the count is the statements
/// sent, exactly.
#[derive(Clone)]
struct Pool {
    conns: Arc<Vec<Held>>,
    idle: Arc<std::sync::Mutex<Vec<usize>>>,
    permits: Arc<Semaphore>,
    lent: Arc<AtomicU64>,
}

impl Pool {
    fn new(conns: Arc<Vec<Held>>) -> Pool {
        Pool {
            idle: Arc::new(std::sync::Mutex::new((0..conns.len()).collect())),
            permits: Arc::new(Semaphore::new(conns.len())),
            lent: Arc::new(AtomicU64::new(0)),
            conns,
        }
    }

    /// The connections lent so far: the statements sent through the pool.
    fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }
}

/// A connection lent by a [`Pool`]: idle again when dropped.
struct Lent {
    client: Option<OwnedMutexGuard<Client>>,
    index: usize,
    idle: Arc<std::sync::Mutex<Vec<usize>>>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for Lent {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client.as_deref().expect("lent until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // The connection first, then its index, then (as the fields drop)
        // the permit: whoever gets the permit finds the connection free.
        drop(self.client.take());
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
    }
}

impl LimitConn for Pool {
    type Conn = Lent;
    type Error = Infallible;

    async fn conn(&self) -> Result<Lent, Infallible> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let index = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .expect("a permit means an idle connection");
        let client = Arc::clone(&self.conns[index]).lock_owned().await;
        self.lent.fetch_add(1, Ordering::Relaxed);
        Ok(Lent {
            client: Some(client),
            index,
            idle: Arc::clone(&self.idle),
            _permit: permit,
        })
    }
}

/// A limiter that measures the store path: every call sends its statement.
/// Neither the refusal cache nor merging (both on by default) is on. The
/// limits measured through it are never reached, so there would be no
/// refusal to cache anyway, but a call must not be answered from memory nor
/// ride on another call's statement.
///
/// Its budget is long: a stall on a busy machine should show in the p99, not
/// turn into a fail-open verdict that returns early.
fn limiter<S: Store>(store: S) -> Limiter<S> {
    defaults_limiter(store)
        .without_refusal_cache()
        .without_merging()
}

/// A limiter with the defaults (the refusal cache and merging on) and the
/// long budget.
fn defaults_limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::new(store)
        .with_budget(MAX_BUDGET)
        .expect("the longest budget is a valid budget")
}

/// Panics unless the store answered.
fn answered(what: &str, verdict: Result<Verdict, platformkit_limit::Error>) -> Verdict {
    match verdict {
        Ok(verdict) if verdict.is_unreachable() => panic!(
            "{what}: the store was unreachable: {:?}",
            verdict.unreachable()
        ),
        Ok(verdict) => verdict,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// `what` through the limiter of each worker (`limiters[worker]`).
fn limiter_op<S: Store + 'static>(limiters: Arc<Vec<Limiter<S>>>, limit: Limit, what: What) -> Op {
    Arc::new(move |worker, id| {
        let limiters = Arc::clone(&limiters);
        let limit = limit.clone();
        Box::pin(async move {
            let limiter = &limiters[worker];
            let key = Key::opaque(&id);
            let verdict = match what {
                What::Check => limiter.check(&limit, &key).await,
                What::Failed | What::RelaxedFailed | What::ConnectPerCall | What::Memory => {
                    limiter.failed(&limit, &key).await
                }
                What::Hit => limiter.hit(&limit, &key).await,
                What::Reset => {
                    if let Err(e) = limiter.reset(&limit, &key).await {
                        panic!("reset: {e}");
                    }
                    return;
                }
                What::CheckAll | What::FailedAll => {
                    unreachable!("several limits have an operation of their own")
                }
                What::Select1 | What::Upsert | What::Read => {
                    unreachable!("the statements alone do not go through the limiter")
                }
            };
            answered(what.label(), verdict);
        })
    })
}

/// `check_all` or `failed_all` through the limiter of each worker, over two
/// pairs: the key under `account`, and the address that goes with it under
/// `address`.
fn several_op<S: Store + 'static>(
    limiters: Arc<Vec<Limiter<S>>>,
    account: Limit,
    address: Limit,
    what: What,
) -> Op {
    let limits = Arc::new((account, address));
    Arc::new(move |worker, id| {
        let limiters = Arc::clone(&limiters);
        let limits = Arc::clone(&limits);
        Box::pin(async move {
            let limiter = &limiters[worker];
            let (account, address) = &*limits;
            let account_key = Key::opaque(&id);
            let address_key = Key::ip(address_of(&id));
            let pairs = [(account, &account_key), (address, &address_key)];
            let verdicts = match what {
                What::CheckAll => limiter.check_all(&pairs).await,
                What::FailedAll => limiter.failed_all(&pairs).await,
                _ => unreachable!("only check_all and failed_all take several limits"),
            };
            match verdicts {
                Ok(verdicts) if verdicts.is_unreachable() => {
                    panic!("{}: the store was unreachable", what.label())
                }
                Ok(verdicts) => assert_eq!(verdicts.iter().count(), 2, "a verdict per pair"),
                Err(e) => panic!("{}: {e}", what.label()),
            }
        })
    })
}

/// The bare round trip, on the worker's held connection.
fn select1_op(conns: Arc<Vec<Held>>) -> Op {
    Arc::new(move |worker, _id| {
        let held = Arc::clone(&conns[worker]);
        Box::pin(async move {
            let client = held.lock_owned().await;
            if let Err(e) = client.simple_query("SELECT 1").await {
                panic!("SELECT 1: {e}");
            }
        })
    })
}

/// The statements run alone, prepared on one held connection: the
/// procedures' plans are cached per connection too, so neither side parses
/// and plans on every call.
#[derive(Clone)]
struct Prepared {
    upsert: Statement,
    read: Statement,
}

impl Prepared {
    async fn on(client: &Client) -> Prepared {
        let upsert = client
            .prepare_typed(
                UPSERT,
                &[Type::TEXT, Type::INT8, Type::INT8, Type::TIMESTAMPTZ],
            )
            .await
            .unwrap_or_else(|e| panic!("preparing the upsert: {e}"));
        let read = client
            .prepare_typed(READ, &[Type::TEXT, Type::INT8, Type::TIMESTAMPTZ])
            .await
            .unwrap_or_else(|e| panic!("preparing the read: {e}"));
        Prepared { upsert, read }
    }
}

/// The upsert alone, in autocommit, on the worker's held connection, with
/// the parameters the limiter sends.
fn upsert_op(conns: Arc<Vec<Held>>, prepared: Arc<Vec<Prepared>>, window_secs: i64) -> Op {
    Arc::new(move |worker, id| {
        let held = Arc::clone(&conns[worker]);
        let statement = prepared[worker].upsert.clone();
        Box::pin(async move {
            let client = held.lock_owned().await;
            let key = format!("{LIMIT_NAME}|id|{id}");
            let one = 1_i64;
            let pinned: Option<SystemTime> = None;
            let result = client
                .query_one(&statement, &[&key, &one, &window_secs, &pinned])
                .await;
            if let Err(e) = result {
                panic!("upsert alone: {e}");
            }
        })
    })
}

/// The read alone, in autocommit, on the worker's held connection, with the
/// parameters the limiter sends.
fn read_op(conns: Arc<Vec<Held>>, prepared: Arc<Vec<Prepared>>, window_secs: i64) -> Op {
    Arc::new(move |worker, id| {
        let held = Arc::clone(&conns[worker]);
        let statement = prepared[worker].read.clone();
        Box::pin(async move {
            let client = held.lock_owned().await;
            let key = format!("{LIMIT_NAME}|id|{id}");
            let pinned: Option<SystemTime> = None;
            let result = client
                .query_one(&statement, &[&key, &window_secs, &pinned])
                .await;
            if let Err(e) = result {
                panic!("read alone: {e}");
            }
        })
    })
}

/// Everything a round needs.
struct Bench {
    mode: Mode,
    limit: Limit,
    conns: Arc<Vec<Held>>,
    select1: Op,
    upsert: Op,
    read: Op,
    check: Op,
    failed: Op,
    hit: Op,
    reset: Op,
    check_all: Op,
    failed_all: Op,
    relaxed_failed: Op,
    connect_per_call: Op,
}

impl Bench {
    fn op(&self, what: What) -> Op {
        let op = match what {
            What::Select1 => &self.select1,
            What::Upsert => &self.upsert,
            What::Read => &self.read,
            What::Check => &self.check,
            What::Failed => &self.failed,
            What::Hit => &self.hit,
            What::Reset => &self.reset,
            What::CheckAll => &self.check_all,
            What::FailedAll => &self.failed_all,
            What::RelaxedFailed => &self.relaxed_failed,
            What::ConnectPerCall => &self.connect_per_call,
            // A fresh one each time: the fake never forgets a key.
            What::Memory => {
                let limiters = Arc::new(vec![limiter(Memory::new())]);
                return limiter_op(limiters, self.limit.clone(), What::Memory);
            }
        };
        Arc::clone(op)
    }
}

// ---------------------------------------------------------------------------
// The attack
// ---------------------------------------------------------------------------

/// Many callers at few keys, through one limiter shared by [`WIDE`] tasks
/// over [`WIDE`] connections: merging happens within one limiter, and the
/// refusal cache is one limiter's.
struct Attack {
    pool: Pool,
    /// A limit nothing reaches: its hot key is still counting.
    counting: Arc<Limit>,
    /// A limit of [`REFUSED_MAX`], each of whose [`REFUSED_KEYS`] keys is
    /// refused before the attack starts.
    refused: Arc<Limit>,
}

impl Attack {
    /// Refuses every key the attack hammers: [`REFUSED_MAX`] failures each,
    /// through a limiter of its own.
    async fn refuse_keys(&self) {
        let limiter = limiter(Postgres::new(self.pool.clone()));
        for n in 0..REFUSED_KEYS {
            let key = Key::opaque(&refused_id(n));
            let mut last = None;
            for _ in 0..REFUSED_MAX {
                last = Some(answered(
                    "failed",
                    limiter.failed(&self.refused, &key).await,
                ));
            }
            assert!(
                last.is_some_and(|v| v.is_refused()),
                "{REFUSED_MAX} failures refuse a key of a limit of {REFUSED_MAX}"
            );
        }
    }

    /// The limit `keys` are hammered under.
    fn limit(&self, keys: Keys) -> Arc<Limit> {
        match keys {
            Keys::Refused => Arc::clone(&self.refused),
            Keys::Hot => Arc::clone(&self.counting),
            Keys::Random => unreachable!("the attack hammers few keys"),
        }
    }
}

/// `failed` through one limiter shared by every worker.
fn shared_failed_op(limiter: Arc<Limiter<Postgres<Pool>>>, limit: Arc<Limit>) -> Op {
    Arc::new(move |_worker, id| {
        let limiter = Arc::clone(&limiter);
        let limit = Arc::clone(&limit);
        Box::pin(async move {
            answered("failed", limiter.failed(&limit, &Key::opaque(&id)).await);
        })
    })
}

/// One line of the attack's table.
struct AttackRow {
    keys: Keys,
    /// The refusal cache and merging on (the defaults), or both off.
    defaults: bool,
    samples: Vec<Sample>,
    /// Every attempt made, the warm-ups' included.
    calls: u64,
    /// The statements those attempts sent.
    statements: u64,
    /// The time over which they were counted, in seconds, summed over the
    /// rounds.
    secs: f64,
    /// The rounds (a new limiter each).
    rounds: u64,
    /// Per round: these attempts per second over the lone upsert's at
    /// [`WIDE`] connections (random keys for the refused ones, the hot key
    /// for the hot one).
    ops_ratios: Vec<f64>,
}

impl AttackRow {
    fn ops_per_sec(&self) -> f64 {
        median(self.samples.iter().map(|s| s.ops_per_sec))
    }

    fn p50_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p50_us))
    }

    fn p99_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p99_us))
    }

    fn statements_per_attempt(&self) -> f64 {
        if self.calls > 0 {
            self.statements as f64 / self.calls as f64
        } else {
            f64::NAN
        }
    }

    /// The statements per key hammered per second.
    fn statements_per_key_per_sec(&self) -> f64 {
        let keys = match self.keys {
            Keys::Refused => REFUSED_KEYS as f64,
            _ => 1.0,
        };
        self.statements as f64 / keys / self.secs
    }

    /// The most statements the refusal cache lets [`REFUSED_KEYS`] flooded
    /// keys send once engaged, as `Limiter::with_refusal_cache` states it:
    /// refreshes of one key start at least a TTL apart, so a flood of `T`
    /// seconds costs each key at most `T / TTL + 1`.
    fn refusal_cache_bound(&self) -> f64 {
        REFUSED_KEYS as f64 * (self.secs / DEFAULT_REFUSAL_TTL.as_secs_f64() + self.rounds as f64)
    }

    /// The lone upsert this is compared to: its keys.
    fn floor_keys(&self) -> Keys {
        match self.keys {
            Keys::Refused | Keys::Random => Keys::Random,
            Keys::Hot => Keys::Hot,
        }
    }

    fn label(&self) -> String {
        match self.keys {
            Keys::Refused => format!("{REFUSED_KEYS} keys refused (max {REFUSED_MAX})"),
            Keys::Hot => "1 hot key, still counting".to_owned(),
            Keys::Random => unreachable!("the attack hammers few keys"),
        }
    }
}

struct AttackResults {
    rows: Vec<AttackRow>,
    /// The statements sent by the [`FLOOD_REFUSALS`] refusals of each key
    /// that engage the refusal cache of a new limiter, how many refusals
    /// that was, and in how many rounds (a new limiter each).
    engaging_statements: u64,
    engaging_refusals: u64,
    rounds: u64,
}

impl AttackResults {
    fn new() -> AttackResults {
        let mut rows = Vec::new();
        for keys in [Keys::Refused, Keys::Hot] {
            for defaults in [true, false] {
                rows.push(AttackRow {
                    keys,
                    defaults,
                    samples: Vec::new(),
                    calls: 0,
                    statements: 0,
                    secs: 0.0,
                    rounds: 0,
                    ops_ratios: Vec::new(),
                });
            }
        }
        AttackResults {
            rows,
            engaging_statements: 0,
            engaging_refusals: 0,
            rounds: 0,
        }
    }

    fn row(&self, keys: Keys, defaults: bool) -> &AttackRow {
        self.rows
            .iter()
            .find(|r| r.keys == keys && r.defaults == defaults)
            .expect("every attack row is laid out")
    }

    fn record(
        &mut self,
        keys: Keys,
        defaults: bool,
        sample: Sample,
        statements: u64,
        took: Duration,
        floor: Sample,
    ) {
        let row = self
            .rows
            .iter_mut()
            .find(|r| r.keys == keys && r.defaults == defaults)
            .expect("every attack row is laid out");
        row.samples.push(sample);
        row.calls += sample.calls;
        row.statements += statements;
        row.secs += took.as_secs_f64();
        row.rounds += 1;
        row.ops_ratios.push(sample.ops_per_sec / floor.ops_per_sec);
    }
}

/// One round of the attack: for the refused keys, then the hot key, the
/// lone upsert at [`WIDE`] connections, then the attack with the defaults
/// and with both off, each through a new limiter.
async fn attack_round(
    bench: &Bench,
    attack: &Attack,
    results: &mut Results,
    attack_results: &mut AttackResults,
) {
    for keys in [Keys::Refused, Keys::Hot] {
        let floor_keys = if keys == Keys::Hot {
            Keys::Hot
        } else {
            Keys::Random
        };
        let floor = measure(&bench.op(What::Upsert), WIDE, floor_keys, bench.mode).await;
        results.record(What::Upsert, Some(floor_keys), WIDE, floor, None);
        for defaults in [true, false] {
            let store = Postgres::new(attack.pool.clone());
            let limiter = Arc::new(if defaults {
                defaults_limiter(store)
            } else {
                limiter(store)
            });
            let limit = attack.limit(keys);
            if defaults && keys == Keys::Refused {
                // The store refuses each key FLOOD_REFUSALS times in a row,
                // which engages the cache for it; the cache answers the
                // attempts after them, but for one refresh per key per TTL.
                let before = attack.pool.lent();
                for n in 0..REFUSED_KEYS {
                    let key = Key::opaque(&refused_id(n));
                    for _ in 0..FLOOD_REFUSALS {
                        let verdict = answered("failed", limiter.failed(&limit, &key).await);
                        assert!(verdict.is_refused(), "the key was refused first");
                    }
                }
                attack_results.engaging_statements += attack.pool.lent() - before;
                attack_results.engaging_refusals += REFUSED_KEYS * FLOOD_REFUSALS as u64;
                attack_results.rounds += 1;
            }
            let op = shared_failed_op(limiter, limit);
            let mode = if defaults && keys == Keys::Refused {
                Mode {
                    measure: bench.mode.measure.max(FLOOD),
                    ..bench.mode
                }
            } else {
                bench.mode
            };
            let before = attack.pool.lent();
            let began = Instant::now();
            let sample = measure(&op, WIDE, keys, mode).await;
            let took = began.elapsed();
            let statements = attack.pool.lent() - before;
            attack_results.record(keys, defaults, sample, statements, took, floor);
        }
    }
}

// ---------------------------------------------------------------------------
// Purge at scale
// ---------------------------------------------------------------------------

/// What the purge at scale found.
struct PurgeReport {
    closed: u64,
    open: u64,
    /// Rows `purge` said it deleted.
    deleted: u64,
    /// Statements it sent: one per batch.
    statements: u64,
    took: Duration,
    /// The writers while the purge ran, over its whole length.
    during: Sample,
    /// The same writers alone, over the same length, after the purge.
    alone: Sample,
    /// Every count the writers added, in both phases.
    writes: u64,
    /// The sum of the open windows' counts before the writers.
    open_sum_before: i64,
    /// The rows and the sum of the counts of the open windows (and of any
    /// window opened since) at the end.
    open_rows_after: i64,
    open_sum_after: i64,
    /// Rows of closed windows left at the end.
    closed_left: i64,
}

impl PurgeReport {
    fn rows_per_sec(&self) -> f64 {
        self.deleted as f64 / self.took.as_secs_f64()
    }

    fn p99_ratio(&self) -> f64 {
        self.during.p99_us / self.alone.p99_us
    }

    fn intact(&self) -> bool {
        i64::try_from(self.writes).is_ok_and(|w| self.open_sum_before + w == self.open_sum_after)
    }
}

/// Runs `op` on `workers` tasks back to back, each over keys drawn from
/// `0..among`, while `phase` runs after a warm-up. Returns what `phase`
/// returned, and the writers' figures over the calls begun while it ran;
/// the sample's `calls` counts every call, the warm-up's included.
async fn while_writing<T>(
    op: &Op,
    workers: usize,
    among: u64,
    warmup: Duration,
    phase: impl Future<Output = T>,
) -> (T, Sample) {
    let stop = Arc::new(AtomicBool::new(false));
    let from: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let op = Arc::clone(op);
            let stop = Arc::clone(&stop);
            let from = Arc::clone(&from);
            let mut rng = XorShift::new(next_seed());
            tokio::spawn(async move {
                let mut timed = Vec::new();
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = (rng.next() % among).to_string();
                    let began = Instant::now();
                    op(worker, id).await;
                    calls += 1;
                    if from.get().is_some_and(|from| began >= *from) {
                        timed.push((began, Instant::now()));
                    }
                }
                (timed, calls)
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    let start = Instant::now();
    from.set(start).expect("the phase starts once");
    let out = phase.await;
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut last = start;
    let mut calls = 0;
    for task in tasks {
        match task.await {
            Ok((timed, my_calls)) => {
                for (began, done) in timed.into_iter().filter(|(began, _)| *began < end) {
                    latencies.push(done - began);
                    last = last.max(done);
                }
                calls += my_calls;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    (out, sample(latencies, last - start, calls))
}

/// Writes `mode.purge_closed` closed windows and `mode.purge_open` open ones
/// into a database of their own, then runs [`purge`] while [`WIDE`] writers
/// run `failed` on the open keys, then the writers alone for as long.
///
/// The closed windows belong to the same keys as the open ones, a day each,
/// ended two days ago and more, so that the purge deletes next to the rows
/// the writers update. Autovacuum is off for the table, and it is vacuumed
/// and checkpointed before each phase, so that both phases start from a
/// settled table and neither meets background work the other does not.
async fn purge_at_scale(server: &Server, mode: Mode) -> PurgeReport {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    let open_limit = Limit::new(OPEN_LIMIT_NAME, MAX_ATTEMPTS, OPEN_WINDOW).expect("a valid limit");
    let window_secs = i64::try_from(OPEN_WINDOW.as_secs()).expect("a day fits in i64");
    let closed = i64::try_from(mode.purge_closed).expect("fits in i64");
    let open = i64::try_from(mode.purge_open).expect("fits in i64");
    let prefix = format!("{OPEN_LIMIT_NAME}|id|");

    // The superuser is not subject to row-level security.
    admin
        .batch_execute("ALTER TABLE platformkit.platformkit_limits SET (autovacuum_enabled = off)")
        .await
        .unwrap_or_else(|e| panic!("turning autovacuum off: {e}"));
    let open_start: SystemTime = admin
        .query_one(
            "SELECT pg_catalog.date_bin($1::int8 * interval '1 second',
                                        pg_catalog.statement_timestamp(),
                                        timestamptz '1970-01-01 00:00:00+00')",
            &[&window_secs],
        )
        .await
        .unwrap_or_else(|e| panic!("reading the current window: {e}"))
        .get(0);
    let written_began = Instant::now();
    // Closed window k of key n: [open start - (k + 3) days, open start - (k + 2) days).
    let written_closed = admin
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT $1::text || (g % $2::int8), w.start, w.start + $3::int8 * interval '1 second',
                    1 + g % 5
             FROM pg_catalog.generate_series(0, $4::int8 - 1) AS g,
                  LATERAL (SELECT $5::timestamptz
                                  - (3 + g / $2::int8) * $3::int8 * interval '1 second'
                                  AS start) AS w",
            &[&prefix, &open, &window_secs, &closed, &open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("writing the closed windows: {e}"));
    let written_open = admin
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT $1::text || g, $2::timestamptz, $2::timestamptz + $3::int8 * interval '1 second', 1
             FROM pg_catalog.generate_series(0, $4::int8 - 1) AS g",
            &[&prefix, &open_start, &window_secs, &open],
        )
        .await
        .unwrap_or_else(|e| panic!("writing the open windows: {e}"));
    assert_eq!(
        (written_closed, written_open),
        (mode.purge_closed, mode.purge_open)
    );
    settle(&admin, "VACUUM (ANALYZE) platformkit.platformkit_limits").await;
    eprintln!(
        "purge: {written_closed} closed and {written_open} open windows written and settled in {:.1}s",
        written_began.elapsed().as_secs_f64()
    );
    let open_sum_before = open_windows(&admin, open_start).await.1;

    let mut conns = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        conns.push(Arc::new(Mutex::new(db.connect().await)));
    }
    let limiters = Arc::new(
        conns
            .iter()
            .map(|held| limiter(Postgres::new(lend(Arc::clone(held)))))
            .collect::<Vec<_>>(),
    );
    let writers = limiter_op(limiters, open_limit, What::Failed);
    let source = Pool::new(Arc::new(vec![Arc::new(Mutex::new(db.connect().await))]));

    let ((deleted, took), during) =
        while_writing(&writers, WIDE, mode.purge_open, mode.warmup, async {
            let began = Instant::now();
            let deleted = purge(&source)
                .await
                .unwrap_or_else(|e| panic!("purge: {e}"));
            (deleted, began.elapsed())
        })
        .await;
    eprintln!(
        "purge: {deleted} rows in {:.1}s; the writers alone for as long ...",
        took.as_secs_f64()
    );
    settle(&admin, "VACUUM platformkit.platformkit_limits").await;
    let ((), alone) = while_writing(
        &writers,
        WIDE,
        mode.purge_open,
        mode.warmup,
        tokio::time::sleep(took),
    )
    .await;

    let statements = source.lent();
    let (open_rows_after, open_sum_after) = open_windows(&admin, open_start).await;
    let closed_left: i64 = admin
        .query_one(
            "SELECT count(*) FROM platformkit.platformkit_limits WHERE window_start < $1",
            &[&open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("counting the closed windows left: {e}"))
        .get(0);

    if !server.is_owned() {
        // A server of one's own goes with its databases; leave no copy of a
        // million rows on someone else's.
        drop((writers, source, conns, admin));
        let server_admin = platformkit_limit_testdb::connect(&server.admin_config()).await;
        let drop_database = format!("DROP DATABASE \"{}\" WITH (FORCE)", db.name());
        if let Err(e) = server_admin.batch_execute(&drop_database).await {
            eprintln!("could not drop database {}: {e}", db.name());
        }
    }

    PurgeReport {
        closed: mode.purge_closed,
        open: mode.purge_open,
        deleted,
        statements,
        took,
        during,
        alone,
        writes: during.calls + alone.calls,
        open_sum_before,
        open_rows_after,
        open_sum_after,
        closed_left,
    }
}

/// Runs `vacuum`, then a checkpoint, so that the next phase starts with no
/// dead rows and no dirty pages left over from the one before.
async fn settle(admin: &Client, vacuum: &str) {
    admin
        .batch_execute(vacuum)
        .await
        .unwrap_or_else(|e| panic!("{vacuum}: {e}"));
    admin
        .batch_execute("CHECKPOINT")
        .await
        .unwrap_or_else(|e| panic!("CHECKPOINT: {e}"));
}

/// The rows of the windows that opened at `open_start` or later, and the sum
/// of their counts.
async fn open_windows(admin: &Client, open_start: SystemTime) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*), COALESCE(sum(count), 0)::int8 FROM platformkit.platformkit_limits
             WHERE window_start >= $1",
            &[&open_start],
        )
        .await
        .unwrap_or_else(|e| panic!("summing the open windows: {e}"));
    (row.get(0), row.get(1))
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// One line of the table: every measurement of one thing.
struct Row {
    what: What,
    keys: Option<Keys>,
    conns: usize,
    samples: Vec<Sample>,
    /// Per round: this p50 over its floor's p50.
    p50_ratios: Vec<f64>,
    /// Per round: these operations per second over its floor's.
    ops_ratios: Vec<f64>,
}

impl Row {
    fn ops_per_sec(&self) -> f64 {
        median(self.samples.iter().map(|s| s.ops_per_sec))
    }

    fn p50_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p50_us))
    }

    fn p99_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p99_us))
    }

    /// At one connection the latency is what a caller feels; at many, the
    /// throughput is what the server sustains.
    fn headline_is_latency(&self) -> bool {
        self.conns == 1
    }
}

struct Results {
    rows: Vec<Row>,
}

impl Results {
    /// Every row, in the order of the table.
    fn new() -> Results {
        let mut rows = Vec::new();
        let mut add = |what, keys, conns| {
            rows.push(Row {
                what,
                keys,
                conns,
                samples: Vec::new(),
                p50_ratios: Vec::new(),
                ops_ratios: Vec::new(),
            });
        };
        for conns in [1, WIDE] {
            add(What::Select1, None, conns);
            add(What::Upsert, Some(Keys::Random), conns);
            add(What::Upsert, Some(Keys::Hot), conns);
            add(What::Read, Some(Keys::Random), conns);
            add(What::Read, Some(Keys::Hot), conns);
            for what in [What::Check, What::Failed, What::Hit, What::Reset] {
                for keys in [Keys::Random, Keys::Hot] {
                    add(what, Some(keys), conns);
                }
            }
            for what in [What::CheckAll, What::FailedAll, What::RelaxedFailed] {
                add(what, Some(Keys::Random), conns);
            }
            if conns == 1 {
                add(What::ConnectPerCall, Some(Keys::Random), 1);
                add(What::Memory, Some(Keys::Random), 1);
            }
        }
        Results { rows }
    }

    fn row(&self, what: What, keys: Option<Keys>, conns: usize) -> &Row {
        self.rows
            .iter()
            .find(|r| r.what == what && r.keys == keys && r.conns == conns)
            .expect("every measured row is laid out")
    }

    fn record(
        &mut self,
        what: What,
        keys: Option<Keys>,
        conns: usize,
        sample: Sample,
        floor: Option<Sample>,
    ) {
        let row = self
            .rows
            .iter_mut()
            .find(|r| r.what == what && r.keys == keys && r.conns == conns)
            .expect("every measured row is laid out");
        row.samples.push(sample);
        if let Some(floor) = floor {
            row.p50_ratios.push(sample.p50_us / floor.p50_us);
            row.ops_ratios.push(sample.ops_per_sec / floor.ops_per_sec);
        }
    }
}

/// Updates of the table, and how many of them were heap-only (HOT).
#[derive(Clone, Copy, Debug, Default)]
struct Updates {
    all: i64,
    hot: i64,
}

impl Updates {
    fn since(self, before: Updates) -> Updates {
        Updates {
            all: self.all - before.all,
            hot: self.hot - before.hot,
        }
    }

    fn add(&mut self, other: Updates) {
        self.all += other.all;
        self.hot += other.hot;
    }

    fn ratio(self) -> f64 {
        if self.all > 0 {
            self.hot as f64 / self.all as f64
        } else {
            f64::NAN
        }
    }
}

/// The table's update counters, fresh: each backend flushes its counters at
/// the end of a transaction at most once a second, so wait that long, then
/// have every held connection end a transaction.
async fn updates(conns: &[Held], reader: &Client) -> Updates {
    tokio::time::sleep(STATS_FLUSH_WAIT).await;
    for held in conns {
        let client = held.lock().await;
        if let Err(e) = client.simple_query("SELECT 1").await {
            panic!("flushing the statistics: {e}");
        }
    }
    let row = reader
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables \
             WHERE relid = 'platformkit.platformkit_limits'::regclass",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("reading pg_stat_user_tables: {e}"));
    Updates {
        all: row.get(0),
        hot: row.get(1),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    AtMost,
    AtLeast,
    Exactly,
}

impl Comparison {
    fn symbol(self) -> &'static str {
        match self {
            Comparison::AtMost => "≤",
            Comparison::AtLeast => "≥",
            Comparison::Exactly => "=",
        }
    }

    fn json_name(self) -> &'static str {
        match self {
            Comparison::AtMost => "at_most",
            Comparison::AtLeast => "at_least",
            Comparison::Exactly => "exactly",
        }
    }
}

struct Target {
    name: String,
    value: f64,
    bound: f64,
    comparison: Comparison,
    /// A check of correctness, not of speed: a miss fails the run.
    check: bool,
}

impl Target {
    fn at_most(name: impl Into<String>, value: f64, bound: f64) -> Target {
        Target::new(name, value, bound, Comparison::AtMost)
    }

    fn at_least(name: impl Into<String>, value: f64, bound: f64) -> Target {
        Target::new(name, value, bound, Comparison::AtLeast)
    }

    fn exactly(name: impl Into<String>, value: f64, bound: f64) -> Target {
        Target::new(name, value, bound, Comparison::Exactly)
    }

    fn new(name: impl Into<String>, value: f64, bound: f64, comparison: Comparison) -> Target {
        Target {
            name: name.into(),
            value,
            bound,
            comparison,
            check: false,
        }
    }

    /// Marks this a check of correctness.
    fn check(mut self) -> Target {
        self.check = true;
        self
    }

    fn holds(&self) -> bool {
        match self.comparison {
            Comparison::AtMost => self.value <= self.bound,
            Comparison::AtLeast => self.value >= self.bound,
            Comparison::Exactly => self.value == self.bound,
        }
    }
}

fn targets(results: &Results, attack: &AttackResults, purge: &PurgeReport) -> Vec<Target> {
    let random1 = |what| results.row(what, Some(Keys::Random), 1);
    let random_wide = |what| results.row(what, Some(Keys::Random), WIDE);
    let p50_ratio = |row: &Row| median(row.p50_ratios.iter().copied());
    let ops_ratio = |row: &Row| median(row.ops_ratios.iter().copied());
    // Two limits in one statement cost one round trip, not two: half-way
    // between the two is the line.
    let one_not_two = 1.5;
    let attack_ratio = |keys| median(attack.row(keys, true).ops_ratios.iter().copied());
    vec![
        Target::at_most(
            "check p50 / SELECT 1 p50 (random keys, 1 connection)",
            p50_ratio(random1(What::Check)),
            1.30,
        ),
        Target::at_most(
            "failed p50 / upsert alone p50 (random keys, 1 connection)",
            p50_ratio(random1(What::Failed)),
            1.10,
        ),
        Target::at_most(
            "hit p50 / upsert alone p50 (random keys, 1 connection)",
            p50_ratio(random1(What::Hit)),
            1.10,
        ),
        Target::at_least(
            format!("failed ops/s / upsert alone ops/s (random keys, {WIDE} connections)"),
            ops_ratio(random_wide(What::Failed)),
            0.90,
        ),
        Target::at_most(
            "check_all p50 / check p50 (2 limits, random keys, 1 connection)",
            p50_ratio(random1(What::CheckAll)),
            one_not_two,
        ),
        Target::at_most(
            "failed_all p50 / failed p50 (2 limits, random keys, 1 connection)",
            p50_ratio(random1(What::FailedAll)),
            one_not_two,
        ),
        Target::at_least(
            format!("check_all ops/s / check ops/s (2 limits, random keys, {WIDE} connections)"),
            ops_ratio(random_wide(What::CheckAll)),
            1.0 / one_not_two,
        ),
        Target::at_least(
            format!("failed_all ops/s / failed ops/s (2 limits, random keys, {WIDE} connections)"),
            ops_ratio(random_wide(What::FailedAll)),
            1.0 / one_not_two,
        ),
        Target::at_most(
            format!(
                "statements at {REFUSED_KEYS} flooded keys once the cache engaged / its stated \
                 bound, {REFUSED_KEYS} × (T / TTL + 1) per round (refusal cache on, {WIDE} tasks)"
            ),
            {
                let row = attack.row(Keys::Refused, true);
                row.statements as f64 / row.refusal_cache_bound()
            },
            1.0,
        ),
        Target::at_least(
            format!(
                "attempts/s at {REFUSED_KEYS} keys already refused (defaults) / upsert alone \
                 ops/s (random keys, {WIDE} connections)"
            ),
            attack_ratio(Keys::Refused),
            10.0,
        ),
        Target::at_least(
            format!(
                "attempts/s at 1 hot key still counting ({WIDE} callers, merging) / upsert alone \
                 ops/s (hot key, {WIDE} connections)"
            ),
            attack_ratio(Keys::Hot),
            5.0,
        ),
        Target::at_most(
            format!("writers' p99 during purge / writers' p99 alone ({WIDE} writers, failed)"),
            purge.p99_ratio(),
            2.0,
        ),
        Target::exactly(
            "rows purge deleted (the closed windows written)",
            purge.deleted as f64,
            purge.closed as f64,
        )
        .check(),
        Target::exactly(
            "closed windows left after the purge",
            purge.closed_left as f64,
            0.0,
        )
        .check(),
        Target::exactly(
            "sum of the open windows' counts (before the writers + their writes)",
            purge.open_sum_after as f64,
            purge.open_sum_before as f64 + purge.writes as f64,
        )
        .check(),
    ]
}

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

fn show_us(us: f64) -> String {
    if !us.is_finite() {
        "-".to_owned()
    } else if us < 1.0 {
        format!("{:.0}ns", us * 1000.0)
    } else if us < 1000.0 {
        format!("{us:.1}µs")
    } else {
        format!("{:.2}ms", us / 1000.0)
    }
}

fn show_ops(ops: f64) -> String {
    if ops.is_finite() {
        format!("{ops:.0}")
    } else {
        "-".to_owned()
    }
}

fn show_ratio(ratios: &[f64]) -> String {
    let finite: Vec<f64> = ratios.iter().copied().filter(|r| r.is_finite()).collect();
    if finite.is_empty() {
        return "-".to_owned();
    }
    let mid = median(finite.iter().copied());
    if finite.len() == 1 {
        return format!("×{mid:.2}");
    }
    let low = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let high = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("×{mid:.2} [{low:.2}–{high:.2}]")
}

fn print_table(results: &Results) {
    println!(
        "{:<26} {:<6} {:>5} {:>9} {:>9} {:>9}  vs floor (median [range] of per-round ratios)",
        "operation", "keys", "conns", "ops/s", "p50", "p99"
    );
    let mut conns_seen = 0;
    for row in &results.rows {
        if row.conns != conns_seen {
            conns_seen = row.conns;
            println!();
        }
        let versus = match row.what.floor() {
            Some(floor) if row.headline_is_latency() => {
                format!("p50 {} of {}", show_ratio(&row.p50_ratios), floor.label())
            }
            Some(floor) => format!("ops/s {} of {}", show_ratio(&row.ops_ratios), floor.label()),
            None => String::new(),
        };
        let conns = if row.what == What::Memory {
            "1 task".to_owned()
        } else {
            row.conns.to_string()
        };
        println!(
            "{:<26} {:<6} {:>5} {:>9} {:>9} {:>9}  {}",
            row.what.label(),
            row.keys.map_or("-", Keys::name),
            conns,
            show_ops(row.ops_per_sec()),
            show_us(row.p50_us()),
            show_us(row.p99_us()),
            versus
        );
    }
}

fn print_several(results: &Results) {
    println!(
        "several limits in one call (per account + per address, random keys), against one limit \
         at the same concurrency:"
    );
    println!(
        "  {:>5}  {:>22}  {:>22}  {:>22}  {:>22}",
        "conns",
        "check_all/check p50",
        "check_all/check ops/s",
        "failed_all/failed p50",
        "failed_all/failed ops/s"
    );
    for conns in [1, WIDE] {
        let row = |what| results.row(what, Some(Keys::Random), conns);
        let check_all = row(What::CheckAll);
        let failed_all = row(What::FailedAll);
        println!(
            "  {:>5}  {:>22}  {:>22}  {:>22}  {:>22}",
            conns,
            show_ratio(&check_all.p50_ratios),
            show_ratio(&check_all.ops_ratios),
            show_ratio(&failed_all.p50_ratios),
            show_ratio(&failed_all.ops_ratios),
        );
    }
}

fn print_relaxed(results: &Results) {
    println!(
        "relaxed durability (failed, random keys): Postgres::with_relaxed_durability() against \
         the durable default"
    );
    println!(
        "  {:>5}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}",
        "conns", "ops/s", "relaxed", "gain", "p50", "relaxed", "gain", "p99", "relaxed", "gain"
    );
    for conns in [1, WIDE] {
        let durable = results.row(What::Failed, Some(Keys::Random), conns);
        let relaxed = results.row(What::RelaxedFailed, Some(Keys::Random), conns);
        // Per round: the durable p50 over the relaxed one.
        let p50_gains: Vec<f64> = relaxed.p50_ratios.iter().map(|r| 1.0 / r).collect();
        println!(
            "  {:>5}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}",
            conns,
            show_ops(durable.ops_per_sec()),
            show_ops(relaxed.ops_per_sec()),
            show_gain(median(relaxed.ops_ratios.iter().copied())),
            show_us(durable.p50_us()),
            show_us(relaxed.p50_us()),
            show_gain(median(p50_gains)),
            show_us(durable.p99_us()),
            show_us(relaxed.p99_us()),
            show_gain(durable.p99_us() / relaxed.p99_us()),
        );
    }
    println!(
        "  (gain: relaxed ops/s over durable, durable latency over relaxed; medians of per-round \
         ratios, the p99's of the medians)"
    );
}

fn print_attack(results: &Results, attack: &AttackResults) {
    println!(
        "attack: {WIDE} tasks sharing one limiter over {WIDE} connections, each calling failed \
         back to back; defaults = refusal cache and merging on"
    );
    println!(
        "  {:<28} {:<9} {:>10} {:>9} {:>9}  {:>13}  vs upsert alone, {WIDE} connections",
        "keys", "limiter", "attempts/s", "p50", "p99", "stmts/attempt"
    );
    for row in &attack.rows {
        let floor = results.row(What::Upsert, Some(row.floor_keys()), WIDE);
        println!(
            "  {:<28} {:<9} {:>10} {:>9} {:>9}  {:>13.4}  ops/s {} of {} ({}/s)",
            row.label(),
            if row.defaults { "defaults" } else { "both off" },
            show_ops(row.ops_per_sec()),
            show_us(row.p50_us()),
            show_us(row.p99_us()),
            row.statements_per_attempt(),
            show_ratio(&row.ops_ratios),
            match row.floor_keys() {
                Keys::Hot => "the hot key",
                _ => "random keys",
            },
            show_ops(floor.ops_per_sec()),
        );
    }
    let cached = attack.row(Keys::Refused, true);
    println!(
        "  through a new limiter with the cache each round: {} statements for the refusals that \
         engage it ({FLOOD_REFUSALS} × {REFUSED_KEYS} keys × {} round{}), then {} for the {} \
         attempts after them over {:.2} s: {:.2} per key per second (TTL {} s; the stated bound \
         allows {:.0})",
        attack.engaging_statements,
        attack.rounds,
        if attack.rounds == 1 { "" } else { "s" },
        cached.statements,
        cached.calls,
        cached.secs,
        cached.statements_per_key_per_sec(),
        DEFAULT_REFUSAL_TTL.as_secs_f64(),
        cached.refusal_cache_bound(),
    );
}

fn print_purge(purge: &PurgeReport) {
    println!(
        "purge at scale: {} closed windows and {} open ones; purge() while {WIDE} writers run \
         failed on the open keys",
        purge.closed, purge.open
    );
    println!(
        "  purge: {} rows deleted in {:.2}s = {:.0} rows/s, in {} statements (batches of {})",
        purge.deleted,
        purge.took.as_secs_f64(),
        purge.rows_per_sec(),
        purge.statements,
        PURGE_BATCH_ROWS
    );
    println!(
        "  {:<22} {:>7} {:>9} {:>9} {:>9}",
        "writers", "secs", "ops/s", "p50", "p99"
    );
    for (name, sample) in [
        ("during the purge", purge.during),
        ("alone, after it", purge.alone),
    ] {
        println!(
            "  {:<22} {:>7.2} {:>9} {:>9} {:>9}",
            name,
            purge.took.as_secs_f64(),
            show_ops(sample.ops_per_sec),
            show_us(sample.p50_us),
            show_us(sample.p99_us)
        );
    }
    println!(
        "  writers' p99 during the purge / alone: {}",
        show_gain(purge.p99_ratio())
    );
    println!(
        "  open windows: {} rows; counts {} before + {} writes = {}, found {} ({})",
        purge.open_rows_after,
        purge.open_sum_before,
        purge.writes,
        purge.open_sum_before + i64::try_from(purge.writes).unwrap_or(i64::MAX),
        purge.open_sum_after,
        if purge.intact() {
            "intact"
        } else {
            "NOT INTACT"
        }
    );
    println!("  closed windows left: {}", purge.closed_left);
}

fn show_gain(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("×{ratio:.2}")
    } else {
        "-".to_owned()
    }
}

fn show_value(x: f64) -> String {
    if !x.is_finite() {
        "-".to_owned()
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else if x.abs() < 0.01 {
        format!("{x:.6}")
    } else {
        format!("{x:.2}")
    }
}

fn print_targets(targets: &[Target]) {
    println!("targets:");
    for target in targets {
        println!(
            "  {:<4} {} = {} ({} {}){}",
            if target.holds() { "HOLD" } else { "MISS" },
            target.name,
            show_value(target.value),
            target.comparison.symbol(),
            show_value(target.bound),
            if target.check { " [check]" } else { "" }
        );
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".to_owned()
    }
}

fn json_nums(xs: &[f64]) -> String {
    let items: Vec<String> = xs.iter().map(|&x| json_num(x)).collect();
    format!("[{}]", items.join(", "))
}

struct Machine {
    nproc: usize,
    cpu: String,
    postgres: String,
    fsync: String,
    synchronous_commit: String,
    server: &'static str,
}

/// Everything the JSON holds.
struct Report<'a> {
    mode: Mode,
    machine: &'a Machine,
    results: &'a Results,
    random_updates: Updates,
    hot_updates: Updates,
    attack: &'a AttackResults,
    purge: &'a PurgeReport,
    targets: &'a [Target],
}

fn to_json(report: &Report<'_>) -> String {
    let Report {
        mode,
        machine,
        results,
        random_updates,
        hot_updates,
        attack,
        purge,
        targets,
    } = *report;
    let mut out = String::new();
    let _ = writeln!(out, "{{");
    let _ = writeln!(out, "  \"mode\": {},", json_str(mode.name()));
    let _ = writeln!(out, "  \"rounds\": {},", mode.rounds);
    let _ = writeln!(out, "  \"warmup_ms\": {},", mode.warmup.as_millis());
    let _ = writeln!(out, "  \"measure_ms\": {},", mode.measure.as_millis());
    let _ = writeln!(out, "  \"key_space\": {KEY_SPACE},");
    let _ = writeln!(out, "  \"machine\": {{");
    let _ = writeln!(out, "    \"nproc\": {},", machine.nproc);
    let _ = writeln!(out, "    \"cpu\": {},", json_str(&machine.cpu));
    let _ = writeln!(out, "    \"postgres\": {},", json_str(&machine.postgres));
    let _ = writeln!(out, "    \"fsync\": {},", json_str(&machine.fsync));
    let _ = writeln!(
        out,
        "    \"synchronous_commit\": {},",
        json_str(&machine.synchronous_commit)
    );
    let _ = writeln!(out, "    \"server\": {}", json_str(machine.server));
    let _ = writeln!(out, "  }},");
    let _ = writeln!(out, "  \"rows\": [");
    for (i, row) in results.rows.iter().enumerate() {
        let floor = row
            .what
            .floor()
            .map_or("null".to_owned(), |f| json_str(f.json_name()));
        let _ = write!(
            out,
            "    {{\"operation\": {}, \"keys\": {}, \"connections\": {}, \
             \"ops_per_sec\": {}, \"p50_us\": {}, \"p99_us\": {}, \"floor\": {}, \
             \"p50_ratio\": {}, \"ops_ratio\": {}, \"p50_ratios\": {}, \"ops_ratios\": {}, \
             \"ops_per_sec_each\": {}, \"p50_us_each\": {}, \"p99_us_each\": {}}}",
            json_str(row.what.json_name()),
            row.keys.map_or("null".to_owned(), |k| json_str(k.name())),
            row.conns,
            json_num(row.ops_per_sec()),
            json_num(row.p50_us()),
            json_num(row.p99_us()),
            floor,
            json_num(median(row.p50_ratios.iter().copied())),
            json_num(median(row.ops_ratios.iter().copied())),
            json_nums(&row.p50_ratios),
            json_nums(&row.ops_ratios),
            json_nums(
                &row.samples
                    .iter()
                    .map(|s| s.ops_per_sec)
                    .collect::<Vec<_>>()
            ),
            json_nums(&row.samples.iter().map(|s| s.p50_us).collect::<Vec<_>>()),
            json_nums(&row.samples.iter().map(|s| s.p99_us).collect::<Vec<_>>()),
        );
        let _ = writeln!(out, "{}", if i + 1 < results.rows.len() { "," } else { "" });
    }
    let _ = writeln!(out, "  ],");
    let _ = writeln!(out, "  \"hot_updates\": {{");
    for (name, updates, last) in [
        ("hot_key", hot_updates, false),
        ("random_keys", random_updates, true),
    ] {
        let _ = writeln!(
            out,
            "    \"{name}\": {{\"n_tup_upd\": {}, \"n_tup_hot_upd\": {}, \"ratio\": {}}}{}",
            updates.all,
            updates.hot,
            json_num(updates.ratio()),
            if last { "" } else { "," }
        );
    }
    let _ = writeln!(out, "  }},");
    let _ = writeln!(out, "  \"attack\": {{");
    let _ = writeln!(out, "    \"tasks\": {WIDE},");
    let _ = writeln!(out, "    \"connections\": {WIDE},");
    let _ = writeln!(out, "    \"refused_keys\": {REFUSED_KEYS},");
    let _ = writeln!(out, "    \"refused_max\": {REFUSED_MAX},");
    let _ = writeln!(
        out,
        "    \"refusal_ttl_secs\": {},",
        json_num(DEFAULT_REFUSAL_TTL.as_secs_f64())
    );
    let _ = writeln!(
        out,
        "    \"engaging_statements\": {},",
        attack.engaging_statements
    );
    let _ = writeln!(
        out,
        "    \"engaging_refusals\": {},",
        attack.engaging_refusals
    );
    let _ = writeln!(out, "    \"rows\": [");
    for (i, row) in attack.rows.iter().enumerate() {
        let _ = write!(
            out,
            "      {{\"keys\": {}, \"refusal_cache_and_merging\": {}, \
             \"attempts_per_sec\": {}, \"p50_us\": {}, \"p99_us\": {}, \
             \"attempts\": {}, \"statements\": {}, \"statements_per_attempt\": {}, \
             \"secs\": {}, \"statements_per_key_per_sec\": {}, \
             \"floor\": \"upsert_alone\", \"floor_keys\": {}, \"ops_ratio\": {}, \
             \"ops_ratios\": {}, \"attempts_per_sec_each\": {}, \"p99_us_each\": {}}}",
            json_str(row.keys.name()),
            row.defaults,
            json_num(row.ops_per_sec()),
            json_num(row.p50_us()),
            json_num(row.p99_us()),
            row.calls,
            row.statements,
            json_num(row.statements_per_attempt()),
            json_num(row.secs),
            json_num(row.statements_per_key_per_sec()),
            json_str(row.floor_keys().name()),
            json_num(median(row.ops_ratios.iter().copied())),
            json_nums(&row.ops_ratios),
            json_nums(
                &row.samples
                    .iter()
                    .map(|s| s.ops_per_sec)
                    .collect::<Vec<_>>()
            ),
            json_nums(&row.samples.iter().map(|s| s.p99_us).collect::<Vec<_>>()),
        );
        let _ = writeln!(out, "{}", if i + 1 < attack.rows.len() { "," } else { "" });
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "  }},");
    let _ = writeln!(out, "  \"purge\": {{");
    let _ = writeln!(out, "    \"closed_windows\": {},", purge.closed);
    let _ = writeln!(out, "    \"open_windows\": {},", purge.open);
    let _ = writeln!(out, "    \"deleted\": {},", purge.deleted);
    let _ = writeln!(out, "    \"statements\": {},", purge.statements);
    let _ = writeln!(out, "    \"secs\": {},", json_num(purge.took.as_secs_f64()));
    let _ = writeln!(
        out,
        "    \"rows_per_sec\": {},",
        json_num(purge.rows_per_sec())
    );
    for (name, sample) in [
        ("writers_during", purge.during),
        ("writers_alone", purge.alone),
    ] {
        let _ = writeln!(
            out,
            "    \"{name}\": {{\"tasks\": {WIDE}, \"ops_per_sec\": {}, \"p50_us\": {}, \
             \"p99_us\": {}}},",
            json_num(sample.ops_per_sec),
            json_num(sample.p50_us),
            json_num(sample.p99_us)
        );
    }
    let _ = writeln!(
        out,
        "    \"writers_p99_ratio\": {},",
        json_num(purge.p99_ratio())
    );
    let _ = writeln!(out, "    \"writes\": {},", purge.writes);
    let _ = writeln!(out, "    \"open_sum_before\": {},", purge.open_sum_before);
    let _ = writeln!(out, "    \"open_sum_after\": {},", purge.open_sum_after);
    let _ = writeln!(out, "    \"open_rows_after\": {},", purge.open_rows_after);
    let _ = writeln!(out, "    \"closed_left\": {},", purge.closed_left);
    let _ = writeln!(out, "    \"intact\": {}", purge.intact());
    let _ = writeln!(out, "  }},");
    let _ = writeln!(out, "  \"targets\": [");
    for (i, target) in targets.iter().enumerate() {
        let _ = writeln!(
            out,
            "    {{\"name\": {}, \"value\": {}, \"bound\": {}, \"comparison\": {}, \
             \"at_most\": {}, \"check\": {}, \"holds\": {}}}{}",
            json_str(&target.name),
            json_num(target.value),
            json_num(target.bound),
            json_str(target.comparison.json_name()),
            target.comparison == Comparison::AtMost,
            target.check,
            target.holds(),
            if i + 1 < targets.len() { "," } else { "" }
        );
    }
    let _ = writeln!(out, "  ]");
    let _ = writeln!(out, "}}");
    out
}

fn json_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            PathBuf::from,
        );
    target.join("bench").join("limiter.json")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

async fn show(client: &Client, setting: &str) -> String {
    let row = client
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .unwrap_or_else(|e| panic!("SHOW {setting}: {e}"));
    row.get(0)
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

fn main() {
    let mode = Mode::from_env_and_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the Tokio runtime");
    let checks_hold = runtime.block_on(run(mode));
    drop(runtime);
    if !checks_hold {
        eprintln!("a check of correctness failed: see the targets marked [check]");
        std::process::exit(1);
    }
}

/// Runs everything and prints the report; returns whether every check of
/// correctness held.
async fn run(mode: Mode) -> bool {
    let began = Instant::now();
    eprintln!("starting a durable throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = Server::from_env_or_start(Options { durable: true });
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;

    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu: cpu_model(),
        postgres: show(&admin, "server_version").await,
        fsync: show(&admin, "fsync").await,
        synchronous_commit: show(&admin, "synchronous_commit").await,
        server: if server.is_owned() {
            "throwaway"
        } else {
            "DATABASE_URL"
        },
    };
    println!(
        "machine: {} CPUs, {}; PostgreSQL {} ({} server, fsync {}, synchronous_commit {})",
        machine.nproc,
        machine.cpu,
        machine.postgres,
        machine.server,
        machine.fsync,
        machine.synchronous_commit
    );
    println!(
        "mode: {} ({} round{}, {} ms warm-up and {} ms per measurement)",
        mode.name(),
        mode.rounds,
        if mode.rounds == 1 { "" } else { "s" },
        mode.warmup.as_millis(),
        mode.measure.as_millis()
    );

    // The longest window, so that no run crosses into a new window midway
    // and the rows written before it stay current.
    let limit = Limit::new(LIMIT_NAME, MAX_ATTEMPTS, MAX_WINDOW).expect("a valid limit");
    let window_secs = i64::try_from(limit.window().as_secs()).expect("a window fits in i64");

    // Rows for every PREFILL_EVERYth random key, in the current window.
    // The superuser is not subject to row-level security.
    let prefilled = admin
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT $1::text || g, w.start, w.start + $2::int8 * interval '1 second', 1
             FROM pg_catalog.generate_series(0, $3::int8 - 1, $4::int8) AS g,
                  (SELECT pg_catalog.date_bin($2::int8 * interval '1 second',
                                              pg_catalog.statement_timestamp(),
                                              timestamptz '1970-01-01 00:00:00+00') AS start) AS w
             ON CONFLICT DO NOTHING",
            &[
                &format!("{LIMIT_NAME}|id|"),
                &window_secs,
                &i64::try_from(KEY_SPACE).expect("the key space fits in i64"),
                &i64::try_from(PREFILL_EVERY).expect("fits in i64"),
            ],
        )
        .await
        .unwrap_or_else(|e| panic!("writing the first rows: {e}"));
    admin
        .batch_execute("VACUUM (ANALYZE) platformkit.platformkit_limits")
        .await
        .unwrap_or_else(|e| panic!("VACUUM: {e}"));
    eprintln!("database {}: {prefilled} rows written first", db.name());

    // One held connection per worker, as the table's owner: subject to
    // row-level security, as an application is. The session-wide switch
    // lets the lone upsert through; the limiter sets it for its own
    // transaction anyway, so the limiter's calls see no difference.
    let mut conns = Vec::with_capacity(WIDE);
    let mut prepared = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        let client = db.connect().await;
        client
            .batch_execute("SET platformkit.system = 'on'")
            .await
            .unwrap_or_else(|e| panic!("SET platformkit.system: {e}"));
        prepared.push(Prepared::on(&client).await);
        conns.push(Arc::new(Mutex::new(client)));
    }
    let conns = Arc::new(conns);
    let prepared = Arc::new(prepared);
    let limiters = Arc::new(
        conns
            .iter()
            .map(|held| limiter(Postgres::new(lend(Arc::clone(held)))))
            .collect::<Vec<_>>(),
    );
    let relaxed = Arc::new(
        conns
            .iter()
            .map(|held| limiter(Postgres::new(lend(Arc::clone(held))).with_relaxed_durability()))
            .collect::<Vec<_>>(),
    );
    let address = Limit::new(ADDRESS_LIMIT_NAME, MAX_ATTEMPTS, MAX_WINDOW).expect("a valid limit");
    let connecting = Arc::new(vec![limiter(Postgres::new(db.config()))]);
    let bench = Bench {
        mode,
        limit: limit.clone(),
        conns: Arc::clone(&conns),
        select1: select1_op(Arc::clone(&conns)),
        upsert: upsert_op(Arc::clone(&conns), Arc::clone(&prepared), window_secs),
        read: read_op(Arc::clone(&conns), Arc::clone(&prepared), window_secs),
        check: limiter_op(Arc::clone(&limiters), limit.clone(), What::Check),
        failed: limiter_op(Arc::clone(&limiters), limit.clone(), What::Failed),
        hit: limiter_op(Arc::clone(&limiters), limit.clone(), What::Hit),
        reset: limiter_op(Arc::clone(&limiters), limit.clone(), What::Reset),
        check_all: several_op(
            Arc::clone(&limiters),
            limit.clone(),
            address.clone(),
            What::CheckAll,
        ),
        failed_all: several_op(
            Arc::clone(&limiters),
            limit.clone(),
            address.clone(),
            What::FailedAll,
        ),
        relaxed_failed: limiter_op(relaxed, limit.clone(), What::RelaxedFailed),
        connect_per_call: limiter_op(connecting, limit.clone(), What::ConnectPerCall),
    };

    let attack = Attack {
        pool: Pool::new(Arc::clone(&conns)),
        counting: Arc::new(limit.clone()),
        refused: Arc::new(
            Limit::new(REFUSED_LIMIT_NAME, REFUSED_MAX, MAX_WINDOW).expect("a valid limit"),
        ),
    };
    attack.refuse_keys().await;

    let mut results = Results::new();
    let mut attack_results = AttackResults::new();
    // The table is new: it has had inserts only (the refused keys' updates
    // are left out below with the attack's).
    let mut counters = Updates::default();
    let mut random_updates = Updates::default();
    let mut hot_updates = Updates::default();
    for round in 0..mode.rounds {
        let round_began = Instant::now();
        for keys in [Keys::Random, Keys::Hot] {
            let held_failed = run_block(&bench, &mut results, keys).await;
            if keys == Keys::Random {
                let op = bench.op(What::ConnectPerCall);
                let sample = measure(&op, 1, keys, bench.mode).await;
                results.record(
                    What::ConnectPerCall,
                    Some(keys),
                    1,
                    sample,
                    Some(held_failed),
                );
                let op = bench.op(What::Memory);
                let sample = measure(&op, 1, keys, bench.mode).await;
                results.record(What::Memory, Some(keys), 1, sample, None);
            }
            let now = updates(&bench.conns, &admin).await;
            match keys {
                Keys::Random => random_updates.add(now.since(counters)),
                Keys::Hot => hot_updates.add(now.since(counters)),
                Keys::Refused => unreachable!("the blocks use random keys and the hot key"),
            }
            counters = now;
        }
        attack_round(&bench, &attack, &mut results, &mut attack_results).await;
        // The attack's updates are neither block's.
        counters = updates(&bench.conns, &admin).await;
        eprintln!(
            "round {}/{} done in {:.1}s",
            round + 1,
            mode.rounds,
            round_began.elapsed().as_secs_f64()
        );
    }

    eprintln!("purge at scale ...");
    let purge_began = Instant::now();
    let purge = purge_at_scale(&server, mode).await;
    eprintln!(
        "purge at scale done in {:.1}s",
        purge_began.elapsed().as_secs_f64()
    );

    println!();
    print_table(&results);
    println!();
    print_several(&results);
    println!();
    print_relaxed(&results);
    println!();
    print_attack(&results, &attack_results);
    println!();
    print_purge(&purge);

    println!();
    println!(
        "heap-only (HOT) updates of platformkit.platformkit_limits, from pg_stat_user_tables:"
    );
    for (name, updates) in [("hot key", hot_updates), ("random keys", random_updates)] {
        println!(
            "  {name:<12} {:>6.1}% of {} updates",
            updates.ratio() * 100.0,
            updates.all
        );
    }

    println!();
    println!("where the time goes (1 connection, random keys, differences of the medians above):");
    let p50 = |what, keys| results.row(what, keys, 1).p50_us();
    let random = Some(Keys::Random);
    let round_trip = p50(What::Select1, None);
    for (name, us) in [
        ("bare round trip (SELECT 1)", round_trip),
        (
            "read alone over the round trip (the statement)",
            p50(What::Read, random) - round_trip,
        ),
        (
            "check over the read alone (the CALL and its transaction)",
            p50(What::Check, random) - p50(What::Read, random),
        ),
        (
            "upsert alone over the round trip (statement + WAL flush)",
            p50(What::Upsert, random) - round_trip,
        ),
        (
            "failed over the upsert alone (the CALL and its transaction)",
            p50(What::Failed, random) - p50(What::Upsert, random),
        ),
        (
            "connect per call over a held connection",
            p50(What::ConnectPerCall, random) - p50(What::Failed, random),
        ),
    ] {
        println!("  {name:<58} {:>9}", show_signed_us(us));
    }

    let targets = targets(&results, &attack_results, &purge);
    println!();
    print_targets(&targets);

    let path = json_path();
    let json = to_json(&Report {
        mode,
        machine: &machine,
        results: &results,
        random_updates,
        hot_updates,
        attack: &attack_results,
        purge: &purge,
        targets: &targets,
    });
    match path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, json))
    {
        Ok(()) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
    }
    eprintln!("done in {:.1}s", began.elapsed().as_secs_f64());
    targets.iter().filter(|t| t.check).all(Target::holds)
}

fn show_signed_us(us: f64) -> String {
    if us.is_finite() && us < 0.0 {
        format!("-{}", show_us(-us))
    } else {
        show_us(us)
    }
}

/// One block of a round: at 1 and at [`WIDE`] connections, each operation
/// right after its floor, then (over random keys) what is compared to the
/// operation right after it, and the read alone right after `check`. Returns
/// this round's held `failed` at 1 connection, which connecting per call is
/// compared to.
async fn run_block(bench: &Bench, results: &mut Results, keys: Keys) -> Sample {
    let mut held_failed = None;
    for conns in [1, WIDE] {
        for what in [What::Check, What::Failed, What::Hit, What::Reset] {
            let floor = what.floor().expect("operations have a floor");
            let floor_keys = (floor != What::Select1).then_some(keys);
            let floor_sample = measure(&bench.op(floor), conns, keys, bench.mode).await;
            results.record(floor, floor_keys, conns, floor_sample, None);
            let sample = measure(&bench.op(what), conns, keys, bench.mode).await;
            results.record(what, Some(keys), conns, sample, Some(floor_sample));
            if keys == Keys::Random {
                for &next in what.followed_by() {
                    let next_sample = measure(&bench.op(next), conns, keys, bench.mode).await;
                    results.record(next, Some(keys), conns, next_sample, Some(sample));
                }
            }
            if what == What::Failed && conns == 1 {
                held_failed = Some(sample);
            }
            if what == What::Check {
                let read = measure(&bench.op(What::Read), conns, keys, bench.mode).await;
                results.record(What::Read, Some(keys), conns, read, None);
            }
        }
    }
    held_failed.expect("failed runs at 1 connection")
}
