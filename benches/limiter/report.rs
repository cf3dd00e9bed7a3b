//! The report: every measurement's row, the tables printed from them, the
//! capacity table, and the JSON written with serde to
//! `target/bench/limiter.json`.

use std::path::PathBuf;

use serde::Serialize;

use crate::attack::{AttackJson, AttackResults};
use crate::floors::Floors;
use crate::measure::{Machine, Sample, Summary, Updates, median};
use crate::operations::{Keys, What};
use crate::purge::PurgeReport;
use crate::targets::Target;
use crate::{KEY_SPACE, Mode, WIDE};

/// One line of the table: every measurement of one thing.
pub(crate) struct Row {
    pub(crate) what: What,
    pub(crate) keys: Option<Keys>,
    pub(crate) conns: usize,
    pub(crate) samples: Vec<Sample>,
    /// Per round: this p50 over its floor's p50.
    pub(crate) p50_ratios: Vec<f64>,
    /// Per round: these operations per second over its floor's.
    pub(crate) ops_ratios: Vec<f64>,
    /// Per round: calls per second of the server's CPU time over its
    /// floor's (empty where the server's CPU time cannot be read).
    pub(crate) per_core_ratios: Vec<f64>,
}

impl Row {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        median(self.samples.iter().map(|s| s.ops_per_sec))
    }

    pub(crate) fn p50_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p50_us))
    }

    fn p99_us(&self) -> f64 {
        median(self.samples.iter().map(|s| s.p99_us))
    }

    pub(crate) fn p50_ratio(&self) -> Summary {
        Summary::of(self.p50_ratios.iter().copied())
    }

    pub(crate) fn ops_ratio(&self) -> Summary {
        Summary::of(self.ops_ratios.iter().copied())
    }

    /// Calls per second of the server's CPU, per round.
    fn per_server_core(&self) -> Summary {
        Summary::of(self.samples.iter().map(Sample::calls_per_server_core_sec))
    }

    /// At one connection the latency is what a caller feels; at many, the
    /// throughput is what the server sustains.
    fn headline_is_latency(&self) -> bool {
        self.conns == 1
    }
}

pub(crate) struct Results {
    rows: Vec<Row>,
}

impl Results {
    /// Every row, in the order of the table.
    pub(crate) fn new() -> Results {
        let mut rows = Vec::new();
        let mut add = |what, keys, conns| {
            rows.push(Row {
                what,
                keys,
                conns,
                samples: Vec::new(),
                p50_ratios: Vec::new(),
                ops_ratios: Vec::new(),
                per_core_ratios: Vec::new(),
            });
        };
        for conns in [1, WIDE] {
            add(What::Select1, None, conns);
            for what in [What::Read, What::Upsert] {
                for keys in [Keys::Random, Keys::Hot] {
                    add(what, Some(keys), conns);
                }
            }
            for what in [What::Check, What::Failed, What::Hit, What::Reset] {
                for keys in [Keys::Random, Keys::Hot] {
                    add(what, Some(keys), conns);
                }
            }
            for what in [
                What::CheckAll,
                What::FailedAll,
                What::RelaxedFailed,
                What::HitN,
                What::HitAll,
                What::HitAllOrNothing,
            ] {
                add(what, Some(Keys::Random), conns);
            }
            // Measured with the feature `sqlx` only: left out when empty.
            add(What::SqlxFailed, Some(Keys::Random), conns);
            // Measured with the feature `deadpool` only: left out when empty.
            add(What::PreparedCheck, Some(Keys::Random), conns);
            add(What::PreparedFailed, Some(Keys::Random), conns);
            add(What::DefaultsFailed, Some(Keys::Random), conns);
            // Measured with the feature `sqlx` only.
            add(What::SqlxDefaults, Some(Keys::Random), conns);
            if conns == 1 {
                add(What::ConnectPerCall, Some(Keys::Random), 1);
                add(What::Memory, Some(Keys::Random), 1);
            } else {
                for places in crate::operations::SWEPT_PLACES {
                    add(What::DefaultsPlaces(places), Some(Keys::Random), conns);
                }
            }
        }
        Results { rows }
    }

    pub(crate) fn row(&self, what: What, keys: Option<Keys>, conns: usize) -> &Row {
        self.rows
            .iter()
            .find(|r| r.what == what && r.keys == keys && r.conns == conns)
            .expect("every measured row is laid out")
    }

    pub(crate) fn record(
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
            let per_core = sample.calls_per_server_core_sec() / floor.calls_per_server_core_sec();
            if per_core.is_finite() {
                row.per_core_ratios.push(per_core);
            }
        }
    }
}

/// One line of the capacity table: login attempts (`failed`) per second
/// that one core of the server sustains.
#[derive(Serialize)]
struct Capacity {
    name: String,
    /// The row it comes from: its operation, keys and connections.
    operation: &'static str,
    keys: &'static str,
    connections: usize,
    attempts_per_sec: f64,
    /// How many cores the server kept busy, per round.
    server_cores_busy: Summary,
    /// Attempts per second of the server's CPU time, per round.
    attempts_per_server_core_sec: Summary,
}

fn capacity(results: &Results, attack: &AttackResults) -> Vec<Capacity> {
    let at = |name: &str, what: What, connections: usize| {
        let row = results.row(what, Some(Keys::Random), connections);
        Capacity {
            name: name.to_owned(),
            operation: what.json_name(),
            keys: Keys::Random.name(),
            connections,
            attempts_per_sec: row.ops_per_sec(),
            server_cores_busy: Summary::of(row.samples.iter().map(Sample::server_cores_busy)),
            attempts_per_server_core_sec: row.per_server_core(),
        }
    };
    let attacked = |name: String, keys: Keys| {
        let row = attack.row(keys, true);
        Capacity {
            name,
            operation: "failed_attack_defaults",
            keys: keys.name(),
            connections: WIDE,
            attempts_per_sec: row.ops_per_sec(),
            server_cores_busy: Summary::of(row.samples.iter().map(Sample::server_cores_busy)),
            attempts_per_server_core_sec: Summary::of(
                row.samples.iter().map(Sample::calls_per_server_core_sec),
            ),
        }
    };
    let wide = |name: &str, what: What| at(name, what, WIDE);
    vec![
        at("the upsert alone, durable (floor)", What::Upsert, 1),
        at(
            "durable commits, defaults, a lone caller",
            What::DefaultsFailed,
            1,
        ),
        wide("the upsert alone, durable (floor)", What::Upsert),
        wide("durable commits (failed, store path)", What::Failed),
        wide(
            "durable commits, defaults, 1 shared limiter",
            What::DefaultsFailed,
        ),
        wide("relaxed durability (failed)", What::RelaxedFailed),
        attacked(
            format!(
                "under attack, defaults: {} refused keys",
                crate::operations::REFUSED_KEYS
            ),
            Keys::Refused,
        ),
        attacked(
            "under attack, defaults: 1 hot key counting".to_owned(),
            Keys::Hot,
        ),
    ]
}

pub(crate) fn show_us(us: f64) -> String {
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

/// The medians of `samples`' ops/s, p50 and p99, in three columns.
pub(crate) fn show_medians(samples: &[crate::measure::Sample]) -> String {
    let median =
        |f: fn(&crate::measure::Sample) -> f64| crate::measure::median(samples.iter().map(f));
    format!(
        "{:>9} {:>9} {:>9}",
        show_ops(median(|s| s.ops_per_sec)),
        show_us(median(|s| s.p50_us)),
        show_us(median(|s| s.p99_us))
    )
}

pub(crate) fn show_ops(ops: f64) -> String {
    if ops.is_finite() {
        format!("{ops:.0}")
    } else {
        "-".to_owned()
    }
}

/// `×median [low–high]`, or `×value` for one round.
pub(crate) fn show_ratio(summary: &Summary) -> String {
    if !summary.median.is_finite() {
        "-".to_owned()
    } else if summary.count() == 1 {
        format!("×{:.2}", summary.median)
    } else {
        format!(
            "×{:.2} [{:.2}–{:.2}]",
            summary.median, summary.low, summary.high
        )
    }
}

pub(crate) fn show_gain(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("×{ratio:.2}")
    } else {
        "-".to_owned()
    }
}

fn show_signed_us(us: f64) -> String {
    if us.is_finite() && us < 0.0 {
        format!("-{}", show_us(-us))
    } else {
        show_us(us)
    }
}

/// Everything the report holds.
pub(crate) struct Report<'a> {
    pub(crate) mode: Mode,
    pub(crate) machine: &'a Machine,
    pub(crate) floors: &'a Floors,
    pub(crate) results: &'a Results,
    pub(crate) random_updates: Updates,
    pub(crate) hot_updates: Updates,
    pub(crate) attack: &'a AttackResults,
    pub(crate) flood: &'a crate::flood::FloodResults,
    pub(crate) purge: &'a PurgeReport,
    pub(crate) distinct: &'a crate::distinct::DistinctReport,
    pub(crate) listing: &'a crate::listing::ListingReport,
    pub(crate) slow_commits: Option<&'a crate::slow_commits::SlowCommitsReport>,
    pub(crate) targets: &'a [Target],
}

impl Report<'_> {
    pub(crate) fn print(&self) {
        println!();
        self.print_table();
        println!();
        self.print_several();
        println!();
        self.print_relaxed();
        println!();
        crate::sqlx::print(self.results);
        println!();
        crate::prepared::print(self.results);
        println!();
        crate::attack::print(self.results, self.attack);
        println!();
        crate::flood::print(self.flood);
        println!();
        crate::purge::print(self.purge);
        println!();
        crate::distinct::print(self.distinct);
        println!();
        crate::listing::print(self.listing);
        println!();
        crate::slow_commits::print(self.slow_commits);
        println!();
        println!(
            "heap-only (HOT) updates of platformkit.platformkit_limits, from pg_stat_user_tables:"
        );
        for (name, updates) in [
            ("hot key", self.hot_updates),
            ("random keys", self.random_updates),
        ] {
            println!(
                "  {name:<12} {:>6.1}% of {} updates",
                updates.ratio() * 100.0,
                updates.all
            );
        }
        println!();
        self.print_time();
        println!();
        self.print_capacity();
        println!();
        crate::targets::print(self.targets);
    }

    fn print_table(&self) {
        println!(
            "{:<28} {:<6} {:>5} {:>9} {:>9} {:>9}  vs floor (median [range] of per-round ratios)",
            "operation", "keys", "conns", "ops/s", "p50", "p99"
        );
        let mut conns_seen = 0;
        for row in self.results.rows.iter().filter(|r| !r.samples.is_empty()) {
            if row.conns != conns_seen {
                conns_seen = row.conns;
                println!();
            }
            let versus = match row.what.floor() {
                Some(floor) if row.headline_is_latency() => {
                    format!("p50 {} of {}", show_ratio(&row.p50_ratio()), floor.label())
                }
                Some(floor) => format!(
                    "ops/s {} of {}",
                    show_ratio(&row.ops_ratio()),
                    floor.label()
                ),
                None => String::new(),
            };
            let conns = match row.what {
                What::Memory => "1 task".to_owned(),
                _ => row.conns.to_string(),
            };
            println!(
                "{:<28} {:<6} {:>5} {:>9} {:>9} {:>9}  {}",
                row.what.label(),
                row.keys.map_or("-", Keys::name),
                conns,
                show_ops(row.ops_per_sec()),
                show_us(row.p50_us()),
                show_us(row.p99_us()),
                versus
            );
        }
        println!(
            "  (failed, defaults, 1 limiter: {WIDE} callers sharing one limiter with the refusal \
             cache and merging over {WIDE} connections, writes in flight as the commits say; \
             \"the same\" below it: that many writes in flight, fixed)"
        );
    }

    fn print_several(&self) {
        println!(
            "several limits in one call (per account + per address, random keys), against one \
             limit at the same concurrency:"
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
            let row = |what| self.results.row(what, Some(Keys::Random), conns);
            let check_all = row(What::CheckAll);
            let failed_all = row(What::FailedAll);
            println!(
                "  {:>5}  {:>22}  {:>22}  {:>22}  {:>22}",
                conns,
                show_ratio(&check_all.p50_ratio()),
                show_ratio(&check_all.ops_ratio()),
                show_ratio(&failed_all.p50_ratio()),
                show_ratio(&failed_all.ops_ratio()),
            );
        }
    }

    fn print_relaxed(&self) {
        println!(
            "relaxed durability (failed, random keys): Postgres::with_relaxed_durability() \
             against the durable default"
        );
        println!(
            "  {:>5}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}",
            "conns", "ops/s", "relaxed", "gain", "p50", "relaxed", "gain", "p99", "relaxed", "gain"
        );
        for conns in [1, WIDE] {
            let durable = self.results.row(What::Failed, Some(Keys::Random), conns);
            let relaxed = self
                .results
                .row(What::RelaxedFailed, Some(Keys::Random), conns);
            // Per round: the durable p50 over the relaxed one.
            let p50_gains = relaxed.p50_ratios.iter().map(|r| 1.0 / r);
            println!(
                "  {:>5}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8}",
                conns,
                show_ops(durable.ops_per_sec()),
                show_ops(relaxed.ops_per_sec()),
                show_gain(relaxed.ops_ratio().median),
                show_us(durable.p50_us()),
                show_us(relaxed.p50_us()),
                show_gain(median(p50_gains)),
                show_us(durable.p99_us()),
                show_us(relaxed.p99_us()),
                show_gain(durable.p99_us() / relaxed.p99_us()),
            );
        }
        println!(
            "  (gain: relaxed ops/s over durable, durable latency over relaxed; medians of \
             per-round ratios, the p99's of the medians)"
        );
    }

    fn print_time(&self) {
        println!(
            "where the time goes (1 connection, random keys, differences of the medians above):"
        );
        let p50 = |what, keys| self.results.row(what, keys, 1).p50_us();
        let random = Some(Keys::Random);
        let round_trip = p50(What::Select1, None);
        for (name, us) in [
            ("bare round trip (SELECT 1)", round_trip),
            (
                "read alone over the round trip (the statement)",
                p50(What::Read, random) - round_trip,
            ),
            (
                "check over the read alone (the function call around it)",
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
            println!("  {name:<60} {:>9}", show_signed_us(us));
        }
    }

    fn print_capacity(&self) {
        println!(
            "capacity: login attempts (failed) per second one PostgreSQL core sustains, = attempts \
             / CPU seconds of the server's processes over the same time (/proc/<pid>/stat of the \
             postmaster and its children); median [range] over rounds"
        );
        println!(
            "  {:<46} {:>5} {:>10} {:>20} {:>30}",
            "", "conns", "attempts/s", "server cores busy", "attempts/s per server core"
        );
        if self.mode.quick {
            println!(
                "  (quick mode: measurements of {} ms against clock ticks of 10 ms, so these are \
                 coarse)",
                self.mode.measure.as_millis()
            );
        }
        for line in capacity(self.results, self.attack) {
            let cores = &line.server_cores_busy;
            let busy = if cores.median.is_finite() {
                format!("{:.2} [{:.2}–{:.2}]", cores.median, cores.low, cores.high)
            } else {
                "-".to_owned()
            };
            let per = &line.attempts_per_server_core_sec;
            let per_core = if per.median.is_finite() {
                format!(
                    "{} [{}–{}]",
                    show_ops(per.median),
                    show_ops(per.low),
                    show_ops(per.high)
                )
            } else {
                "- (no server CPU measured)".to_owned()
            };
            println!(
                "  {:<46} {:>5} {:>10} {:>20} {:>30}",
                line.name,
                line.connections,
                show_ops(line.attempts_per_sec),
                busy,
                per_core
            );
        }
    }

    /// Writes the JSON to `target/bench/limiter.json` (under
    /// `CARGO_TARGET_DIR` if set).
    pub(crate) fn write_json(&self) {
        let path = std::env::var_os("CARGO_TARGET_DIR")
            .filter(|dir| !dir.is_empty())
            .map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
                PathBuf::from,
            )
            .join("bench")
            .join("limiter.json");
        let json = serde_json::to_string_pretty(&self.json()).expect("the report serializes");
        match path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, json + "\n"))
        {
            Ok(()) => println!("\nwrote {}", path.display()),
            Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
        }
    }

    fn json(&self) -> Json<'_> {
        Json {
            mode: self.mode.name(),
            rounds: self.mode.rounds,
            warmup_ms: self.mode.warmup.as_millis(),
            measure_ms: self.mode.measure.as_millis(),
            key_space: KEY_SPACE,
            machine: self.machine,
            floors: self.floors,
            rows: self
                .results
                .rows
                .iter()
                .filter(|row| !row.samples.is_empty())
                .map(|row| RowJson {
                    operation: row.what.json_name(),
                    keys: row.keys.map(Keys::name),
                    connections: row.conns,
                    ops_per_sec: row.ops_per_sec(),
                    p50_us: row.p50_us(),
                    p99_us: row.p99_us(),
                    floor: row.what.floor().map(What::json_name),
                    p50_ratio: row.p50_ratio(),
                    ops_ratio: row.ops_ratio(),
                    calls_per_server_core_sec: row.per_server_core(),
                    samples: &row.samples,
                })
                .collect(),
            hot_updates: HotJson {
                hot_key: UpdatesJson {
                    updates: self.hot_updates,
                    ratio: self.hot_updates.ratio(),
                },
                random_keys: UpdatesJson {
                    updates: self.random_updates,
                    ratio: self.random_updates.ratio(),
                },
            },
            attack: self.attack.json(),
            flood: self.flood,
            purge: self.purge,
            distinct: self.distinct,
            listing: self.listing,
            slow_commits: self.slow_commits,
            capacity: capacity(self.results, self.attack),
            targets: self.targets,
        }
    }
}

#[derive(Serialize)]
struct Json<'a> {
    mode: &'static str,
    rounds: usize,
    warmup_ms: u128,
    measure_ms: u128,
    key_space: u64,
    machine: &'a Machine,
    floors: &'a Floors,
    rows: Vec<RowJson<'a>>,
    hot_updates: HotJson,
    attack: AttackJson<'a>,
    flood: &'a crate::flood::FloodResults,
    purge: &'a PurgeReport,
    distinct: &'a crate::distinct::DistinctReport,
    listing: &'a crate::listing::ListingReport,
    slow_commits: Option<&'a crate::slow_commits::SlowCommitsReport>,
    capacity: Vec<Capacity>,
    targets: &'a [Target],
}

#[derive(Serialize)]
struct RowJson<'a> {
    operation: &'static str,
    keys: Option<&'static str>,
    connections: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    floor: Option<&'static str>,
    p50_ratio: Summary,
    ops_ratio: Summary,
    calls_per_server_core_sec: Summary,
    samples: &'a [Sample],
}

#[derive(Serialize)]
struct HotJson {
    hot_key: UpdatesJson,
    random_keys: UpdatesJson,
}

#[derive(Serialize)]
struct UpdatesJson {
    #[serde(flatten)]
    updates: Updates,
    ratio: f64,
}
