//! The targets: each a ratio of a measurement to its floor, measured in the
//! same run on the same server and connections, with a bound; each line
//! names its floor, and is marked HOLD or MISS on the median over rounds
//! (the range is shown beside it). A few are checks of correctness, not
//! speed: a miss there fails the run.

use platformkit_limit::Limiter;
use serde::Serialize;

use crate::WIDE;
use crate::attack::{AttackResults, REFUSED_MAX};
use crate::distinct::DistinctReport;
use crate::flood::{FLOODERS, FloodResults};
use crate::listing::ListingReport;
use crate::measure::Summary;
use crate::measure::Updates;
use crate::operations::{Keys, REFUSED_KEYS, What};
use crate::purge::PurgeReport;
use crate::report::Results;
use crate::slow_commits::SlowCommitsReport;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Comparison {
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
}

#[derive(Serialize)]
pub(crate) struct Target {
    /// What is measured.
    pub(crate) name: String,
    /// What it is compared to.
    pub(crate) floor: String,
    /// The median over rounds, its range and each round's value (one value
    /// for what is measured once over the whole run).
    pub(crate) value: Summary,
    pub(crate) bound: f64,
    pub(crate) comparison: Comparison,
    /// A check of correctness, not of speed: a miss fails the run.
    pub(crate) check: bool,
    pub(crate) holds: bool,
}

impl Target {
    fn new(
        name: impl Into<String>,
        floor: impl Into<String>,
        values: impl IntoIterator<Item = f64>,
        comparison: Comparison,
        bound: f64,
    ) -> Target {
        let value = Summary::of(values);
        let holds = match comparison {
            Comparison::AtMost => value.median <= bound,
            Comparison::AtLeast => value.median >= bound,
            Comparison::Exactly => value.median == bound,
        };
        Target {
            name: name.into(),
            floor: floor.into(),
            value,
            bound,
            comparison,
            check: false,
            holds,
        }
    }

    /// Marks this a check of correctness.
    fn check(mut self) -> Target {
        self.check = true;
        self
    }

    pub(crate) fn holds(&self) -> bool {
        self.holds
    }
}

/// The outage's targets, for each driver: a call answered at once once a
/// probe found the server down (p99 at most 50 ms), at most a probe a
/// second, every call unreachable (a check), and counting again within a
/// probe interval (and a call) of the server's return.
pub(crate) fn outage(outages: &[crate::outage::Outage]) -> Vec<Target> {
    use Comparison::{AtMost, Exactly};
    let mut targets = Vec::new();
    for o in outages {
        let driver = o.driver;
        targets.push(Target::new(
            format!("outage: a call's p99 (ms) once a probe found it down, {driver}"),
            "the budget (2,000 ms) a call waited before",
            [o.p99_ms],
            AtMost,
            50.0,
        ));
        targets.push(Target::new(
            format!("outage: probes a second while down, {driver}"),
            "one probe per store per second",
            [o.probes as f64 / o.down_secs],
            AtMost,
            1.0,
        ));
        targets.push(
            Target::new(
                format!("outage: calls not answered unreachable while down, {driver}"),
                "none",
                [o.not_unreachable as f64],
                Exactly,
                0.0,
            )
            .check(),
        );
        targets.push(Target::new(
            format!("outage: from the server's return to a counted call (ms), {driver}"),
            "one probe interval (1,000 ms) and a call",
            [o.back_ms],
            AtMost,
            1_100.0,
        ));
    }
    targets
}

/// The listing's targets: its p50 over a flood of keys below their max
/// within twice its p50 with the refused keys alone (its cost follows the
/// refused keys, not the table), and the refused keys listed over both (a
/// check).
pub(crate) fn listing(listing: &ListingReport) -> Vec<Target> {
    use Comparison::{AtMost, Exactly};
    let (keys, refused, at_most) = (listing.keys, listing.refused, listing.at_most);
    vec![
        Target::new(
            format!(
                "refused_keys(&limit, {at_most}) p50 over {keys} keys below the max and \
                 {refused} refused (1 connection)"
            ),
            format!("the same listing over the {refused} refused keys alone, right before it"),
            listing.p50_ratios.iter().copied(),
            AtMost,
            2.0,
        ),
        Target::new(
            format!("keys refused_keys listed over {keys} keys below the max"),
            format!("the {refused} keys refused through the limiter"),
            [listing.listed_flooded as f64],
            Exactly,
            refused as f64,
        )
        .check(),
        Target::new(
            "keys refused_keys listed over the refused keys alone",
            format!("the {refused} keys refused through the limiter"),
            [listing.listed_alone as f64],
            Exactly,
            refused as f64,
        )
        .check(),
    ]
}

/// The slow commits' targets: the defaults' `failed` ops/s at least 0.9 of
/// one statement per call's and of one write in flight's. Each of the
/// [`WIDE`] callers waits a commit per call, so no choice of places carries
/// more than [`WIDE`] callers a commit: the places the defaults choose may
/// cost little against the best fixed choice, and cannot gain much.
pub(crate) fn slow_commits(slow: &SlowCommitsReport) -> Vec<Target> {
    let ms = f64::from(slow.commit_delay_us) / 1000.0;
    vec![
        Target::new(
            format!(
                "failed ops/s with the defaults, {WIDE} callers, slow commits ({ms} ms \
                 commit_delay)"
            ),
            "one statement per call, the same server and rounds",
            slow.defaults_over_one_statement.iter().copied(),
            Comparison::AtLeast,
            0.9,
        ),
        Target::new(
            "the same",
            "one write in flight fixed",
            slow.defaults_over_one_in_flight.iter().copied(),
            Comparison::AtLeast,
            0.9,
        ),
    ]
}

/// The floor of `failed` and `hit`.
const UPSERT_FLOOR: &str = "upsert alone: platformkit_limit_add's statement, prepared";
/// The floor of `check`.
const READ_FLOOR: &str = "read alone: platformkit_limit_read's statement, prepared";

pub(crate) fn all(
    results: &Results,
    attack: &AttackResults,
    flood: &FloodResults,
    (purge, distinct): (&PurgeReport, &DistinctReport),
    random_updates: Updates,
    hot_updates: Updates,
) -> Vec<Target> {
    use Comparison::{AtLeast, AtMost, Exactly};
    let random = |what, conns| results.row(what, Some(Keys::Random), conns);
    let p50 = |what| random(what, 1).p50_ratios.clone();
    let ops = |what| random(what, WIDE).ops_ratios.clone();
    let at_1 = "random keys, 1 connection";
    let at_wide = format!("random keys, {WIDE} connections");
    // Two limits in one statement cost one round trip, not two: half-way
    // between the two is the line.
    let one_not_two = 1.5;
    let attack_ratios = |keys| attack.row(keys, true).ops_ratios.clone();
    let mut targets = vec![
        Target::new(
            format!("check p50 ({at_1})"),
            READ_FLOOR,
            p50(What::Check),
            AtMost,
            1.15,
        ),
        Target::new(
            format!("check ops/s ({at_wide})"),
            READ_FLOOR,
            ops(What::Check),
            AtLeast,
            0.8,
        ),
    ];
    for what in [What::Failed, What::Hit] {
        let name = what.label();
        targets.push(Target::new(
            format!("{name} p50, one statement per call ({at_1})"),
            UPSERT_FLOOR,
            p50(what),
            AtMost,
            1.10,
        ));
        targets.push(Target::new(
            format!("{name} ops/s, one statement per call ({at_wide})"),
            UPSERT_FLOOR,
            ops(what),
            AtLeast,
            0.9,
        ));
    }
    // Where the server's CPU time can be read (a server on this machine):
    // what the database pays per attempt, which is what sizes it.
    let per_core = random(What::DefaultsFailed, WIDE).per_core_ratios.clone();
    let per_core_target = (!per_core.is_empty()).then(|| {
        Target::new(
            format!(
                "failed attempts per second of the server's CPU with the defaults, {WIDE} \
                 callers sharing one limiter ({at_wide})"
            ),
            "the upsert alone's, prepared, measured right before it",
            per_core,
            AtLeast,
            1.5,
        )
    });
    if crate::prepared::measured(results) {
        // Through `Prepared`, over the read alone: its ratio to `check`,
        // measured right after it, times `check`'s to the read, per round.
        let through = |ratios: fn(&crate::report::Row) -> &Vec<f64>, conns| {
            let prepared = ratios(random(What::PreparedCheck, conns));
            let check = ratios(random(What::Check, conns));
            prepared
                .iter()
                .zip(check)
                .map(|(p, c)| p * c)
                .collect::<Vec<_>>()
        };
        targets.push(Target::new(
            format!("check through Prepared p50 ({at_1})"),
            READ_FLOOR,
            through(|row| &row.p50_ratios, 1),
            AtMost,
            1.15,
        ));
        targets.push(Target::new(
            format!("check through Prepared ops/s ({at_wide})"),
            READ_FLOOR,
            through(|row| &row.ops_ratios, WIDE),
            AtLeast,
            0.8,
        ));
    }
    if crate::sqlx::measured(results) {
        let name = What::SqlxFailed.label();
        targets.push(Target::new(
            format!("{name} p50, one statement per call ({at_1})"),
            UPSERT_FLOOR,
            p50(What::SqlxFailed),
            AtMost,
            1.10,
        ));
        targets.push(Target::new(
            format!("{name} ops/s, one statement per call ({at_wide})"),
            UPSERT_FLOOR,
            ops(What::SqlxFailed),
            AtLeast,
            0.9,
        ));
        // The README's path. A lone caller: the defaults cost no more over
        // sqlx than sqlx's one statement per call, as over tokio-postgres
        // (why not against tokio-postgres: docs/PERFORMANCE.md, targets).
        let lone = |ratios: fn(&crate::report::Row) -> &Vec<f64>| {
            let defaults = ratios(random(What::SqlxDefaults, 1));
            let one = ratios(random(What::SqlxFailed, 1));
            defaults
                .iter()
                .zip(one)
                .map(|(d, o)| d / o)
                .collect::<Vec<_>>()
        };
        let over = "failed over sqlx, one statement per call (each over the upsert alone \
                    measured right before it)";
        targets.push(Target::new(
            format!("failed p50 with the defaults over sqlx PgPool, a lone caller ({at_1})"),
            over,
            lone(|row| &row.p50_ratios),
            AtMost,
            1.10,
        ));
        targets.push(Target::new(
            format!("failed ops/s with the defaults over sqlx PgPool, a lone caller ({at_1})"),
            over,
            lone(|row| &row.ops_ratios),
            AtLeast,
            1.0 / 1.10,
        ));
        // Many callers: within 1.1 of the same over tokio-postgres.
        let (p50, ops) = crate::sqlx::defaults_over_tokio_postgres(results, WIDE);
        for (what, ratios, comparison, bound) in [
            ("p50", p50, AtMost, 1.10),
            ("ops/s", ops, AtLeast, 1.0 / 1.10),
        ] {
            targets.push(Target::new(
                format!("failed {what} with the defaults over sqlx PgPool ({at_wide})"),
                "the same over tokio-postgres, measured right before it",
                ratios.each,
                comparison,
                bound,
            ));
        }
    }
    targets.extend([
        Target::new(
            format!("failed p50 with the defaults, a lone caller ({at_1})"),
            "failed p50, one statement per call (each over the upsert alone measured right \
             before it)",
            p50(What::DefaultsFailed)
                .iter()
                .zip(p50(What::Failed))
                .map(|(defaults, one)| defaults / one),
            AtMost,
            1.10,
        ),
        Target::new(
            format!(
                "failed ops/s with the defaults, {WIDE} callers sharing one limiter over {WIDE} \
                 connections ({at_wide})"
            ),
            UPSERT_FLOOR,
            ops(What::DefaultsFailed),
            AtLeast,
            1.5,
        ),
        Target::new(
            format!("check_all p50, 2 limits ({at_1})"),
            "check p50, 1 limit",
            p50(What::CheckAll),
            AtMost,
            one_not_two,
        ),
        Target::new(
            format!("failed_all p50, 2 limits ({at_1})"),
            "failed p50, 1 limit",
            p50(What::FailedAll),
            AtMost,
            one_not_two,
        ),
        Target::new(
            format!("check_all ops/s, 2 limits ({at_wide})"),
            "check ops/s, 1 limit",
            ops(What::CheckAll),
            AtLeast,
            1.0 / one_not_two,
        ),
        Target::new(
            format!("failed_all ops/s, 2 limits ({at_wide})"),
            "failed ops/s, 1 limit",
            ops(What::FailedAll),
            AtLeast,
            1.0 / one_not_two,
        ),
        Target::new(
            format!(
                "statements at {REFUSED_KEYS} flooded keys once the refusal cache engaged \
                 ({WIDE} tasks, over the run)"
            ),
            format!("the cache's stated bound, {REFUSED_KEYS} × (T / TTL + 1) per round"),
            [{
                let row = attack.row(Keys::Refused, true);
                row.statements as f64 / row.refusal_cache_bound()
            }],
            AtMost,
            1.0,
        ),
        Target::new(
            format!(
                "attempts/s at {REFUSED_KEYS} keys already refused (max {REFUSED_MAX}), defaults, \
                 {WIDE} tasks"
            ),
            format!("{UPSERT_FLOOR}, {at_wide}"),
            attack_ratios(Keys::Refused),
            AtLeast,
            10.0,
        ),
        Target::new(
            format!("attempts/s at 1 hot key still counting, defaults (merging), {WIDE} tasks"),
            format!("{UPSERT_FLOOR}, the hot key, {WIDE} connections"),
            attack_ratios(Keys::Hot),
            AtLeast,
            5.0,
        ),
        Target::new(
            format!("writers' p99 during the purge ({WIDE} writers, failed)"),
            "the same writers' p99 alone, as long, after it",
            [purge.p99_ratio()],
            AtMost,
            2.0,
        ),
        Target::new(
            "heap-only (HOT) updates of the count, the hot key (over the run)",
            "every update of the hot key",
            [hot_updates.ratio()],
            AtLeast,
            0.9,
        ),
        Target::new(
            "heap-only (HOT) updates of the count, random keys (over the run)",
            "every update of the random keys",
            [random_updates.ratio()],
            AtLeast,
            0.9,
        ),
        Target::new(
            "rows purge deleted",
            "the closed windows written",
            [purge.deleted as f64],
            Exactly,
            purge.closed as f64,
        )
        .check(),
        Target::new(
            "closed windows left after the purge",
            "none",
            [purge.closed_left as f64],
            Exactly,
            0.0,
        )
        .check(),
        Target::new(
            "sum of the open windows' counts after the purge",
            "their sum before the writers + the writers' writes",
            [purge.open_sum_after as f64],
            Exactly,
            purge.open_sum_before as f64 + purge.writes as f64,
        )
        .check(),
        Target::new(
            format!(
                "purge's rows/s after a flood of {} distinct keys",
                distinct.keys
            ),
            "the flood's rows/s written, defaults",
            [distinct.keeps_up()],
            AtLeast,
            10.0,
        ),
        Target::new(
            format!("writers' p99 during the flood's purge ({WIDE} writers, failed)"),
            "the same writers' p99 alone, as long, after it",
            [distinct.p99_ratio()],
            AtMost,
            1.2,
        ),
        Target::new(
            "rows of the flood of distinct keys left after the purge",
            "none",
            [distinct.left as f64],
            Exactly,
            0.0,
        )
        .check(),
    ]);
    targets.extend([
        Target::new(
            format!(
                "attempts let through by a flood of {FLOODERS} tasks from an address at its \
                 limit, fresh accounts"
            ),
            "none",
            flood.allowed.iter().copied(),
            Exactly,
            0.0,
        )
        .check(),
        Target::new(
            "an ordinary user's login p99 under that flood",
            format!(
                "the limiter's budget ({} s): served, never shed",
                Limiter::DEFAULT_BUDGET.as_secs_f64()
            ),
            flood
                .p99_flood_us
                .iter()
                .map(|us| us / 1e6 / Limiter::DEFAULT_BUDGET.as_secs_f64()),
            AtMost,
            FLOOD_P99_OF_BUDGET,
        ),
        Target::new(
            "an ordinary user's logins shed under that flood",
            "none",
            flood.ordinary_shed.iter().copied(),
            Exactly,
            0.0,
        ),
    ]);
    targets.extend(per_core_target);
    targets
}

/// The most of the budget an ordinary user's p99 may take under a flood of
/// a refused address: the flood is answered in process, without a
/// statement, so what it costs the user is the CPU its tasks take (the
/// bench's flooders call back to back; the ratio to the user's p99 alone is
/// in the flood's line of the report), never a wait for the database.
const FLOOD_P99_OF_BUDGET: f64 = 0.5;

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

pub(crate) fn print(targets: &[Target]) {
    println!(
        "targets (value = measured / floor, median of the per-round ratios [range over rounds]):"
    );
    for target in targets {
        let value = &target.value;
        let range = if value.count() > 1 {
            format!(" [{}–{}]", show_value(value.low), show_value(value.high))
        } else {
            String::new()
        };
        println!(
            "  {:<4} {} / {} = {}{} ({} {}){}",
            if target.holds { "HOLD" } else { "MISS" },
            target.name,
            target.floor,
            show_value(value.median),
            range,
            target.comparison.symbol(),
            show_value(target.bound),
            if target.check { " [check]" } else { "" }
        );
    }
}
