//! What a limiter call costs, next to the floors it cannot beat.
//!
//! Starts a throwaway PostgreSQL with its crash-safety defaults (`fsync` and
//! `synchronous_commit` on), or uses the server `DATABASE_URL` names (which
//! must be a superuser), creates a database with [`SCHEMA`], and measures on
//! the same held connections:
//!
//! - the floors ([`floors`]): the statement of the procedure each operation
//!   calls, run alone in autocommit, prepared once per connection as a
//!   driver would; the statement is cut out of [`SCHEMA`] at run time, so
//!   the floor cannot drift from the procedure. The upsert of
//!   `platformkit_limit_add` is the floor of `failed` and `hit`, the read of
//!   `platformkit_limit_read` the floor of `check`. A bare `SELECT 1` round
//!   trip is shown too, the floor of nothing;
//! - `check`, `failed`, `hit` and `reset` through a `Limiter` over
//!   `Postgres`, at 1 and at 16 connections (a task and a held connection
//!   each), over random keys drawn from a million and over one hot key;
//! - `check_all` and `failed_all` over two limits at once (per account and
//!   per address), next to `check` and `failed` over one;
//! - `hit` with a cost of 5 (an API call that counts five units), and
//!   `hit_all` and `hit_all_or_nothing` over two limits, each right after
//!   `hit` and compared to it;
//! - `failed` with `Postgres::with_relaxed_durability`, next to the
//!   durable default;
//! - `failed` connecting for each call, and `failed` on `Memory`;
//! - `failed` with the defaults (the refusal cache and merging on) through
//!   one limiter shared by 16 callers over 16 connections, random keys, and
//!   by a lone caller over one; at 16, also with 2, 4, 8 and 16 writes in
//!   flight, fixed, in place of the default's (one, more while
//!   commits wait on slow flushes);
//! - with the feature `sqlx`, `failed` over an sqlx `PgPool` of 1 and of 16
//!   connections, next to `failed` over tokio-postgres ([`sqlx`](mod@sqlx));
//! - with the feature `deadpool`, `check` and `failed` through `Prepared`,
//!   each statement prepared once per connection, next to the same calls
//!   sent as one unnamed statement ([`prepared`]);
//! - an attack ([`attack`]): 16 tasks sharing one limiter over 16
//!   connections, hammering 100 keys already refused and one hot key still
//!   counting, with the defaults and with both off, counting the statements
//!   sent;
//! - `purge` at scale ([`purge`](mod@purge)), in a database of its own: a
//!   million closed windows purged while 16 writers count on the open ones,
//!   against the same writers alone;
//! - a flood of distinct keys ([`distinct`]), in a database of its own: a
//!   million fresh keys (`BENCH_DISTINCT_KEYS`) written with the defaults
//!   as fast as they go, the table's bytes per row, then their purge while
//!   16 writers count, against the same writers alone;
//! - the operator's listing at millions of keys ([`listing`]), in two
//!   databases of their own: `refused_keys(&limit, 100)` over two million
//!   distinct keys of one limit below its max (`BENCH_LISTING_KEYS`; a
//!   hundred thousand in quick mode) and ten keys refused through the
//!   limiter, against the same listing over the ten refused keys alone,
//!   measured right before it;
//! - slow commits ([`slow_commits`]), in a database of its own whose
//!   commits wait 2 ms before their flush (`commit_delay`): `failed` on
//!   random keys through one limiter shared by 16 callers over 16
//!   connections, one statement per call, the defaults, and one write in
//!   flight fixed, each right after the other (skipped on a server whose
//!   commits do not flush);
//! - a real outage ([`outage`]), on a server of its own, stopped and
//!   started again, on each driver built in.
//!
//! The limiters of the operations measure the store path: they have neither
//! the refusal cache nor merging, so every call sends one statement. Only
//! the attack and the one shared limiter use the defaults.
//!
//! Each floor is measured right before the operation it is compared to, in
//! rounds. Tables show the median over rounds; each ratio is the median of
//! the per-round ratios, with their range. Every measurement also reads the
//! CPU time of the server's processes (from `/proc`, when the server runs on
//! this machine), which gives the capacity table: login attempts per second
//! one PostgreSQL core sustains. The report ends with the targets, each
//! naming its floor and marked HOLD or MISS ([`targets`]); everything is also
//! written as JSON to `target/bench/limiter.json` ([`report`]).
//!
//! ```text
//! cargo bench --bench limiter --features sqlx  # 5 rounds, with sqlx
//! cargo bench --bench limiter --features deadpool  # with Prepared
//! cargo bench --bench limiter                  # 5 rounds, several minutes
//! BENCH_ROUNDS=3 cargo bench --bench limiter   # fewer rounds
//! BENCH_QUICK=1 cargo bench --bench limiter    # one short round, for CI
//! BENCH_DISTINCT_KEYS=10000000 cargo bench --bench limiter  # a flood of 10 million keys
//! BENCH_LISTING_KEYS=5000000 cargo bench --bench limiter   # the listing over 5 million keys
//! BENCH_ONLY=listing cargo bench --bench limiter           # the listing alone
//! ```
//!
//! `BENCH_ONLY=listing` runs the listing's group alone (in quick mode too),
//! prints its lines and its target, and writes no JSON, so that a whole
//! run's stays as it was.
//!
//! It is a measurement, not a test: targets that do not hold are reported,
//! and the process still succeeds. The exceptions are the checks of what the
//! purge left (every closed window gone, every count of the open ones
//! intact, none of the flood's keys left) and of what the listing found
//! (the refused keys, no more, no fewer): a wrong answer there is a bug,
//! and fails the process once the report is written. A floor statement
//! that cannot be cut out of the schema stops the run before anything is
//! measured.

mod attack;
mod distinct;
mod flood;
mod floors;
mod listing;
mod measure;
mod operations;
mod outage;
mod prepared;
mod purge;
mod report;
mod slow_commits;
mod sqlx;
mod targets;

use std::sync::Arc;
use std::time::{Duration, Instant};

use platformkit_limit::{Limit, Postgres, SCHEMA};
use platformkit_limit_testdb::{Options, Server};
use tokio::sync::Mutex;

use crate::attack::{Attack, AttackResults};
use crate::floors::{Floors, Prepared};
use crate::measure::{Machine, ServerCpu, Updates, updates};
use crate::operations::{Bench, Keys, Pool, What, lend, limiter, run_block};
use crate::report::Results;

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

/// The wide concurrency: tasks, each with a held connection of its own.
const WIDE: usize = 16;

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
    /// The distinct keys of the flood purged after it (`BENCH_DISTINCT_KEYS`
    /// in a full run).
    distinct_keys: u64,
    /// The distinct keys the listing is measured over
    /// (`BENCH_LISTING_KEYS` in a full run).
    listing_keys: u64,
    /// `BENCH_ONLY=listing`: the listing's group alone.
    only_listing: bool,
}

impl Mode {
    /// `BENCH_QUICK=1` or `--quick`: one short round. `BENCH_ROUNDS=n` sets
    /// the rounds of a full run (5 by default). `BENCH_ONLY=listing` runs
    /// the listing's group alone. Other arguments (cargo passes `--bench`)
    /// are ignored.
    fn from_env_and_args() -> Mode {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().skip(1).any(|arg| arg == "--quick");
        let only_listing = match std::env::var("BENCH_ONLY").as_deref() {
            Err(_) | Ok("") => false,
            Ok("listing") => true,
            Ok(other) => panic!("BENCH_ONLY={other}: the one group that runs alone is `listing`"),
        };
        if quick {
            Mode {
                quick,
                rounds: 1,
                warmup: Duration::from_millis(20),
                measure: Duration::from_millis(120),
                purge_closed: 20_000,
                purge_open: 5_000,
                distinct_keys: 20_000,
                listing_keys: 100_000,
                only_listing,
            }
        } else {
            let rounds = std::env::var("BENCH_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .unwrap_or(5);
            Mode {
                quick,
                rounds,
                warmup: Duration::from_millis(100),
                measure: Duration::from_millis(600),
                purge_closed: 1_000_000,
                purge_open: 100_000,
                distinct_keys: std::env::var("BENCH_DISTINCT_KEYS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or(1_000_000),
                listing_keys: std::env::var("BENCH_LISTING_KEYS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or(2_000_000),
                only_listing,
            }
        }
    }

    fn name(self) -> &'static str {
        if self.quick { "quick" } else { "full" }
    }
}

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
    // Before the server: a floor that cannot be cut out of the schema stops
    // the run here.
    let floors = Floors::from_schema(SCHEMA);
    eprintln!("starting a durable throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = Server::from_env_or_start(Options { durable: true });
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    ServerCpu::install(&admin).await;

    let machine = Machine::read(&admin, server.is_owned()).await;
    println!("{machine}");
    println!(
        "mode: {} ({} round{}, {} ms warm-up and {} ms per measurement)",
        mode.name(),
        mode.rounds,
        if mode.rounds == 1 { "" } else { "s" },
        mode.warmup.as_millis(),
        mode.measure.as_millis()
    );
    println!("{floors}");

    if mode.only_listing {
        return listing_alone(&server, mode).await;
    }

    // The longest window, so that no run crosses into a new window midway
    // and the rows written before it stay current.
    let limit =
        Limit::new(LIMIT_NAME, Limit::MAX_ATTEMPTS, Limit::MAX_WINDOW).expect("a valid limit");
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
    // lets the floors through; the limiter sets it for its own transaction
    // anyway, so the limiter's calls see no difference.
    let mut conns = Vec::with_capacity(WIDE);
    let mut prepared = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        let client = db.connect().await;
        client
            .batch_execute("SET platformkit.system = 'on'")
            .await
            .unwrap_or_else(|e| panic!("SET platformkit.system: {e}"));
        prepared.push(Prepared::on(&client, &floors).await);
        conns.push(Arc::new(Mutex::new(client)));
    }
    let conns = Arc::new(conns);
    let limiters = Arc::new(
        conns
            .iter()
            .map(|held| limiter(Postgres::new(lend(Arc::clone(held)))))
            .collect::<Vec<_>>(),
    );
    let address = Limit::new(ADDRESS_LIMIT_NAME, Limit::MAX_ATTEMPTS, Limit::MAX_WINDOW)
        .expect("a valid limit");
    let bench = Bench::new(
        mode,
        limit.clone(),
        address,
        Arc::clone(&conns),
        Arc::new(prepared),
        limiters,
        db.config(),
    );
    #[cfg(feature = "sqlx")]
    let bench = bench.with_sqlx(sqlx::ops(&db.url(), &limit).await);
    #[cfg(feature = "deadpool")]
    let bench = bench.with_prepared(prepared::ops(&db.config(), &limit).await);

    let attack = Attack::new(Pool::new(Arc::clone(&conns)), limit.clone());
    attack.refuse_keys().await;

    let mut results = Results::new();
    let mut attack_results = AttackResults::new();
    let mut flood_results = flood::FloodResults::default();
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
                let sample = bench.measure(What::ConnectPerCall, 1, keys).await;
                results.record(
                    What::ConnectPerCall,
                    Some(keys),
                    1,
                    sample,
                    Some(held_failed),
                );
                let sample = bench.measure(What::Memory, 1, keys).await;
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
        attack::round(&bench, &attack, &mut results, &mut attack_results).await;
        flood::round(&conns, round, &mut flood_results).await;
        // The attack's updates are neither block's.
        counters = updates(&bench.conns, &admin).await;
        eprintln!(
            "round {}/{} done in {:.1}s",
            round + 1,
            mode.rounds,
            round_began.elapsed().as_secs_f64()
        );
    }

    let purge = timed("purge at scale", purge::at_scale(&server, mode)).await;

    let distinct = timed(
        "a flood of distinct keys, then its purge",
        distinct::run(&server, mode),
    )
    .await;

    let listing = timed(
        "the listing at millions of keys",
        listing::run(&server, mode),
    )
    .await;

    let slow_commits = timed("slow commits", slow_commits::run(&server, mode)).await;

    let outages = timed("a real outage on each driver", outage::run(mode)).await;

    let mut targets = targets::all(
        &results,
        &attack_results,
        &flood_results,
        (&purge, &distinct),
        random_updates,
        hot_updates,
    );
    targets.extend(targets::listing(&listing));
    targets.extend(slow_commits.iter().flat_map(targets::slow_commits));
    targets.extend(targets::outage(&outages));
    let report = report::Report {
        mode,
        machine: &machine,
        floors: &floors,
        results: &results,
        random_updates,
        hot_updates,
        attack: &attack_results,
        flood: &flood_results,
        purge: &purge,
        distinct: &distinct,
        listing: &listing,
        slow_commits: slow_commits.as_ref(),
        targets: &targets,
    };
    report.print();
    outage::print(&outages);
    report.write_json();
    eprintln!("done in {:.1}s", began.elapsed().as_secs_f64());
    targets
        .iter()
        .filter(|t| t.check)
        .all(targets::Target::holds)
}

/// Runs one group between a line that says it starts and one that says how
/// long it took.
async fn timed<T>(group: &str, run: impl std::future::Future<Output = T>) -> T {
    eprintln!("{group} ...");
    let began = Instant::now();
    let out = run.await;
    eprintln!("{group} done in {:.1}s", began.elapsed().as_secs_f64());
    out
}

/// `BENCH_ONLY=listing`: the listing's group, its lines and its target;
/// returns whether every check of correctness held.
async fn listing_alone(server: &Server, mode: Mode) -> bool {
    let began = Instant::now();
    eprintln!("the listing at millions of keys, alone ...");
    let listing = listing::run(server, mode).await;
    println!();
    listing::print(&listing);
    let targets = targets::listing(&listing);
    println!();
    targets::print(&targets);
    eprintln!("done in {:.1}s", began.elapsed().as_secs_f64());
    targets
        .iter()
        .filter(|t| t.check)
        .all(targets::Target::holds)
}
