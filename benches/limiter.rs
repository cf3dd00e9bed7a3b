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
//! - `failed` connecting for each call, and `failed` on [`Memory`].
//!
//! Each floor is measured right before the operation it is compared to, in
//! rounds. The table shows the median over rounds; each ratio is the median
//! of the per-round ratios. The figures are also written as JSON to
//! `target/bench/limiter.json`.
//!
//! ```text
//! cargo bench --bench limiter                  # a few minutes
//! BENCH_QUICK=1 cargo bench --bench limiter    # a few seconds, for CI
//! ```
//!
//! It is a measurement, not a test: targets that do not hold are reported,
//! and the process still succeeds.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use platformkit_limit::{
    Key, Limit, LimitConn, Limiter, MAX_BUDGET, MAX_WINDOW, Memory, Postgres, SCHEMA, Store,
};
use platformkit_limit_testdb::{Options, Server};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

/// The upsert of `platformkit_limit_add` (`schema.sql`) for a fixed window
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
INSERT INTO platformkit_limits AS l (key, window_start, window_end, count)
SELECT $1::text, win.start, win.start + $3::int8 * interval '1 second', $2::int8
FROM win
ON CONFLICT (key, window_start) DO UPDATE
    SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
RETURNING l.count, l.window_end, (SELECT now FROM clock)";

/// The read of `platformkit_limit_read` (`schema.sql`) as one statement: what
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
SELECT COALESCE((SELECT l.count FROM platformkit_limits AS l
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

/// A limit nothing reaches, so that every verdict is the same and only the
/// cost is measured.
const MAX_ATTEMPTS: u32 = 1_000_000_000;

/// The wide concurrency: tasks, each with a held connection of its own.
const WIDE: usize = 16;

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
            }
        } else {
            Mode {
                quick,
                rounds: 5,
                warmup: Duration::from_millis(100),
                measure: Duration::from_millis(600),
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
}

impl Keys {
    fn name(self) -> &'static str {
        match self {
            Keys::Random => "random",
            Keys::Hot => "hot",
        }
    }

    fn draw(self, rng: &mut XorShift) -> String {
        match self {
            Keys::Random => (rng.next() % KEY_SPACE).to_string(),
            Keys::Hot => HOT_ID.to_owned(),
        }
    }
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
            What::ConnectPerCall => "failed_connect_per_call",
            What::Memory => "failed_memory",
        }
    }

    /// What this is compared to.
    fn floor(self) -> Option<What> {
        match self {
            What::Check => Some(What::Select1),
            What::Failed | What::Hit | What::Reset => Some(What::Upsert),
            What::ConnectPerCall => Some(What::Failed),
            What::Select1 | What::Upsert | What::Read | What::Memory => None,
        }
    }
}

/// The figures of one measurement.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
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
                loop {
                    let id = keys.draw(&mut rng);
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    op(worker, id).await;
                    let done = Instant::now();
                    if began >= start {
                        latencies.push(done - began);
                        last = done;
                    }
                }
                (latencies, last)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut last = start;
    for task in tasks {
        match task.await {
            Ok((mine, my_last)) => {
                latencies.extend(mine);
                last = last.max(my_last);
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    latencies.sort_unstable();
    let secs = (last - start).as_secs_f64();
    Sample {
        ops_per_sec: if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        },
        p50_us: percentile_us(&latencies, 0.50),
        p99_us: percentile_us(&latencies, 0.99),
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

/// A limiter whose budget is long: a stall on a busy machine should show in
/// the p99, not turn into a fail-open verdict that returns early.
fn limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::new(store)
        .with_budget(MAX_BUDGET)
        .expect("the longest budget is a valid budget")
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
                What::Failed | What::ConnectPerCall | What::Memory => {
                    limiter.failed(&limit, &key).await
                }
                What::Hit => limiter.hit(&limit, &key).await,
                What::Reset => {
                    if let Err(e) = limiter.reset(&limit, &key).await {
                        panic!("reset: {e}");
                    }
                    return;
                }
                What::Select1 | What::Upsert | What::Read => {
                    unreachable!("the statements alone do not go through the limiter")
                }
            };
            match verdict {
                Ok(verdict) if verdict.is_unreachable() => panic!(
                    "{}: the store was unreachable: {:?}",
                    what.label(),
                    verdict.unreachable()
                ),
                Ok(_) => {}
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
             WHERE relid = 'platformkit_limits'::regclass",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("reading pg_stat_user_tables: {e}"));
    Updates {
        all: row.get(0),
        hot: row.get(1),
    }
}

struct Target {
    name: String,
    value: f64,
    bound: f64,
    at_most: bool,
}

impl Target {
    fn holds(&self) -> bool {
        if self.at_most {
            self.value <= self.bound
        } else {
            self.value >= self.bound
        }
    }
}

fn targets(results: &Results) -> Vec<Target> {
    let random1 = |what| results.row(what, Some(Keys::Random), 1);
    vec![
        Target {
            name: "check p50 / SELECT 1 p50 (random keys, 1 connection)".to_owned(),
            value: median(random1(What::Check).p50_ratios.iter().copied()),
            bound: 1.30,
            at_most: true,
        },
        Target {
            name: "failed p50 / upsert alone p50 (random keys, 1 connection)".to_owned(),
            value: median(random1(What::Failed).p50_ratios.iter().copied()),
            bound: 1.10,
            at_most: true,
        },
        Target {
            name: "hit p50 / upsert alone p50 (random keys, 1 connection)".to_owned(),
            value: median(random1(What::Hit).p50_ratios.iter().copied()),
            bound: 1.10,
            at_most: true,
        },
        Target {
            name: format!("failed ops/s / upsert alone ops/s (random keys, {WIDE} connections)"),
            value: median(
                results
                    .row(What::Failed, Some(Keys::Random), WIDE)
                    .ops_ratios
                    .iter()
                    .copied(),
            ),
            bound: 0.90,
            at_most: false,
        },
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

fn to_json(
    mode: Mode,
    machine: &Machine,
    results: &Results,
    random_updates: Updates,
    hot_updates: Updates,
    targets: &[Target],
) -> String {
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
    let _ = writeln!(out, "  \"targets\": [");
    for (i, target) in targets.iter().enumerate() {
        let _ = writeln!(
            out,
            "    {{\"name\": {}, \"value\": {}, \"bound\": {}, \"at_most\": {}, \"holds\": {}}}{}",
            json_str(&target.name),
            json_num(target.value),
            json_num(target.bound),
            target.at_most,
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
    runtime.block_on(run(mode));
}

async fn run(mode: Mode) {
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
            "INSERT INTO platformkit_limits (key, window_start, window_end, count)
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
        .batch_execute("VACUUM (ANALYZE) platformkit_limits")
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
        connect_per_call: limiter_op(connecting, limit.clone(), What::ConnectPerCall),
    };

    let mut results = Results::new();
    // The table is new: it has had inserts only.
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
            }
            counters = now;
        }
        eprintln!(
            "round {}/{} done in {:.1}s",
            round + 1,
            mode.rounds,
            round_began.elapsed().as_secs_f64()
        );
    }

    println!();
    print_table(&results);

    println!();
    println!("heap-only (HOT) updates of platformkit_limits, from pg_stat_user_tables:");
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

    let targets = targets(&results);
    println!();
    println!("targets:");
    for target in &targets {
        println!(
            "  {:<4} {} = {} ({} {:.2})",
            if target.holds() { "ok" } else { "MISS" },
            target.name,
            if target.value.is_finite() {
                format!("{:.2}", target.value)
            } else {
                "-".to_owned()
            },
            if target.at_most { "≤" } else { "≥" },
            target.bound
        );
    }

    let path = json_path();
    let json = to_json(
        mode,
        &machine,
        &results,
        random_updates,
        hot_updates,
        &targets,
    );
    match path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, json))
    {
        Ok(()) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
    }
    eprintln!("done in {:.1}s", began.elapsed().as_secs_f64());
}

fn show_signed_us(us: f64) -> String {
    if us.is_finite() && us < 0.0 {
        format!("-{}", show_us(-us))
    } else {
        show_us(us)
    }
}

/// One block of a round: at 1 and at [`WIDE`] connections, each operation
/// right after its floor, and the read alone right after `check`. Returns
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
