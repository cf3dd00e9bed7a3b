//! The attack: many callers at few keys, through one limiter shared by
//! [`WIDE`] tasks over [`WIDE`] connections (merging happens within one
//! limiter, and the refusal cache is one limiter's), with the defaults and
//! with both off, counting the statements sent.
//!
//! With the cache, a flooded key still costs one statement per TTL: the
//! refused keys are hammered for at least 2.5 TTLs, and their statements
//! compared with the bound the cache states.

use std::sync::Arc;
use std::time::{Duration, Instant};

use platformkit_limit::{Key, Limit, Limiter, Postgres};
use serde::Serialize;

use crate::measure::{Sample, Summary, measure, median};
use crate::operations::{
    Bench, Keys, Pool, REFUSED_KEYS, What, answered, defaults_limiter, limiter, refused_id,
    shared_failed_op,
};
use crate::report::{Results, show_ops, show_ratio, show_us};
use crate::{Mode, WIDE};

/// The attack's limit on the keys it finds refused: stored keys are
/// `bench-refused|id|refused-<n>`.
const REFUSED_LIMIT_NAME: &str = "bench-refused";

/// The max of [`REFUSED_LIMIT_NAME`]: each key is refused after this many
/// failures.
pub(crate) const REFUSED_MAX: u32 = 5;

/// The shortest flood at the refused keys with the refusal cache on: two
/// and a half TTLs, so that each key's refusal is refreshed (twice or
/// three times) while it is measured, in quick mode too.
const FLOOD: Duration = match Limiter::DEFAULT_REFUSAL_TTL
    .saturating_mul(5)
    .checked_div(2)
{
    Some(flood) => flood,
    None => unreachable!(),
};

pub(crate) struct Attack {
    pool: Pool,
    /// A limit nothing reaches: its hot key is still counting.
    counting: Arc<Limit>,
    /// A limit of [`REFUSED_MAX`], each of whose [`REFUSED_KEYS`] keys is
    /// refused before the attack starts.
    refused: Arc<Limit>,
}

impl Attack {
    /// The attack through `pool`: the hot key under `counting`, a limit
    /// nothing reaches.
    pub(crate) fn new(pool: Pool, counting: Limit) -> Attack {
        Attack {
            pool,
            counting: Arc::new(counting),
            refused: Arc::new(
                Limit::new(REFUSED_LIMIT_NAME, REFUSED_MAX, Limit::MAX_WINDOW)
                    .expect("a valid limit"),
            ),
        }
    }

    /// Refuses every key the attack hammers: [`REFUSED_MAX`] failures each,
    /// through a limiter of its own.
    pub(crate) async fn refuse_keys(&self) {
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

/// One line of the attack's table.
pub(crate) struct AttackRow {
    pub(crate) keys: Keys,
    /// The refusal cache and merging on (the defaults), or both off.
    pub(crate) defaults: bool,
    pub(crate) samples: Vec<Sample>,
    /// Every attempt made, the warm-ups' included.
    pub(crate) calls: u64,
    /// The statements those attempts sent.
    pub(crate) statements: u64,
    /// The time over which they were counted, in seconds, summed over the
    /// rounds.
    pub(crate) secs: f64,
    /// The rounds (a new limiter each).
    pub(crate) rounds: u64,
    /// Per round: these attempts per second over the lone upsert's at
    /// [`WIDE`] connections (random keys for the refused ones, the hot key
    /// for the hot one).
    pub(crate) ops_ratios: Vec<f64>,
}

impl AttackRow {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        median(self.samples.iter().map(|s| s.ops_per_sec))
    }

    pub(crate) fn ops_ratio(&self) -> Summary {
        Summary::of(self.ops_ratios.iter().copied())
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
    pub(crate) fn refusal_cache_bound(&self) -> f64 {
        REFUSED_KEYS as f64
            * (self.secs / Limiter::DEFAULT_REFUSAL_TTL.as_secs_f64() + self.rounds as f64)
    }

    /// The lone upsert this is compared to: its keys.
    pub(crate) fn floor_keys(&self) -> Keys {
        match self.keys {
            Keys::Refused | Keys::Random => Keys::Random,
            Keys::Hot => Keys::Hot,
        }
    }

    pub(crate) fn label(&self) -> String {
        match self.keys {
            Keys::Refused => format!("{REFUSED_KEYS} keys refused (max {REFUSED_MAX})"),
            Keys::Hot => "1 hot key, still counting".to_owned(),
            Keys::Random => unreachable!("the attack hammers few keys"),
        }
    }
}

pub(crate) struct AttackResults {
    pub(crate) rows: Vec<AttackRow>,
    /// The statements sent by the [`Limiter::FLOOD_REFUSALS`] refusals of each key
    /// that engage the refusal cache of a new limiter, how many refusals
    /// that was, and in how many rounds (a new limiter each).
    pub(crate) engaging_statements: u64,
    pub(crate) engaging_refusals: u64,
    pub(crate) rounds: u64,
}

impl AttackResults {
    pub(crate) fn new() -> AttackResults {
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

    /// The attack's section of the JSON.
    pub(crate) fn json(&self) -> AttackJson<'_> {
        AttackJson {
            tasks: WIDE,
            connections: WIDE,
            refused_keys: REFUSED_KEYS,
            refused_max: REFUSED_MAX,
            refusal_ttl_secs: Limiter::DEFAULT_REFUSAL_TTL.as_secs_f64(),
            engaging_statements: self.engaging_statements,
            engaging_refusals: self.engaging_refusals,
            rows: self
                .rows
                .iter()
                .map(|row| AttackRowJson {
                    keys: row.keys.name(),
                    refusal_cache_and_merging: row.defaults,
                    attempts_per_sec: row.ops_per_sec(),
                    p50_us: median(row.samples.iter().map(|s| s.p50_us)),
                    p99_us: median(row.samples.iter().map(|s| s.p99_us)),
                    attempts: row.calls,
                    statements: row.statements,
                    statements_per_attempt: row.statements_per_attempt(),
                    secs: row.secs,
                    statements_per_key_per_sec: row.statements_per_key_per_sec(),
                    refusal_cache_bound: (row.keys == Keys::Refused && row.defaults)
                        .then(|| row.refusal_cache_bound()),
                    floor: What::Upsert.json_name(),
                    floor_keys: row.floor_keys().name(),
                    ops_ratio: row.ops_ratio(),
                    attempts_per_server_core_sec: Summary::of(
                        row.samples.iter().map(Sample::calls_per_server_core_sec),
                    ),
                    samples: &row.samples,
                })
                .collect(),
        }
    }

    pub(crate) fn row(&self, keys: Keys, defaults: bool) -> &AttackRow {
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

#[derive(Serialize)]
pub(crate) struct AttackJson<'a> {
    tasks: usize,
    connections: usize,
    refused_keys: u64,
    refused_max: u32,
    refusal_ttl_secs: f64,
    engaging_statements: u64,
    engaging_refusals: u64,
    rows: Vec<AttackRowJson<'a>>,
}

#[derive(Serialize)]
struct AttackRowJson<'a> {
    keys: &'static str,
    refusal_cache_and_merging: bool,
    attempts_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    attempts: u64,
    statements: u64,
    statements_per_attempt: f64,
    secs: f64,
    statements_per_key_per_sec: f64,
    refusal_cache_bound: Option<f64>,
    floor: &'static str,
    floor_keys: &'static str,
    ops_ratio: Summary,
    attempts_per_server_core_sec: Summary,
    samples: &'a [Sample],
}

/// One round of the attack: for the refused keys, then the hot key, the
/// lone upsert at [`WIDE`] connections, then the attack with the defaults
/// and with both off, each through a new limiter.
pub(crate) async fn round(
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
        let floor = bench.measure(What::Upsert, WIDE, floor_keys).await;
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
                // The store refuses each key Limiter::FLOOD_REFUSALS times in a row,
                // which engages the cache for it; the cache answers the
                // attempts after them, but for one refresh per key per TTL.
                let before = attack.pool.lent();
                for n in 0..REFUSED_KEYS {
                    let key = Key::opaque(&refused_id(n));
                    for _ in 0..Limiter::FLOOD_REFUSALS {
                        let verdict = answered("failed", limiter.failed(&limit, &key).await);
                        assert!(verdict.is_refused(), "the key was refused first");
                    }
                }
                attack_results.engaging_statements += attack.pool.lent() - before;
                attack_results.engaging_refusals += REFUSED_KEYS * Limiter::FLOOD_REFUSALS as u64;
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

pub(crate) fn print(results: &Results, attack: &AttackResults) {
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
            show_us(median(row.samples.iter().map(|s| s.p50_us))),
            show_us(median(row.samples.iter().map(|s| s.p99_us))),
            row.statements_per_attempt(),
            show_ratio(&row.ops_ratio()),
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
         engage it ({} × {REFUSED_KEYS} keys × {} round{}), then {} for the {} \
         attempts after them over {:.2} s: {:.2} per key per second (TTL {} s; the stated bound \
         allows {:.0})",
        attack.engaging_statements,
        Limiter::FLOOD_REFUSALS,
        attack.rounds,
        if attack.rounds == 1 { "" } else { "s" },
        cached.statements,
        cached.calls,
        cached.secs,
        cached.statements_per_key_per_sec(),
        Limiter::DEFAULT_REFUSAL_TTL.as_secs_f64(),
        cached.refusal_cache_bound(),
    );
}
