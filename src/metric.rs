//! The metrics the limiter emits, through the [`metrics`] facade. Install a
//! recorder in your service (the crate never does) and give the duration
//! histogram buckets (`examples/axum_sqlx.rs` does); `contrib/` has alerts
//! and a dashboard. Label values are bounded, and never a key.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `platformkit_limit_calls_total` | counter | `limit`, `operation`, `outcome`, `source` |
//! | `platformkit_limit_statements_total` | counter | `operation` |
//! | `platformkit_limit_call_duration_seconds` | histogram | `limit`, `operation` |
//! | `platformkit_limit_purged_rows_total` | counter | — |
//! | `platformkit_limit_purge_failures_total` | counter | — |
//! | `platformkit_limit_probes_total` | counter | `found` |
//!
//! `operation` ([`LABEL_OPERATION`]) is one vocabulary in every metric,
//! error and event. In `calls_total` and `call_duration_seconds` it is the
//! call, a several-limits call counted once per pair; in `statements_total`
//! the call that sent the statement ([merging](crate::guide#merging) shares
//! them; an operator's [`status`](crate::Limiter::status) is a `check`'s
//! statement and no call).
//!
//! `calls_total` counts calls, never cost units ([API quotas](crate::guide#api-quotas)).
//!
//! `outcome`: `allowed`, `refused`, `unreachable`
//! ([fail-open](crate::guide#fail-open)), `shed`
//! ([down or overloaded](crate::guide#down-or-overloaded)), `error` (a hard
//! error returned) or `cleared` (a `reset` or `take_back` done). `source`:
//! `store`, `cache` (the [refusal cache](crate::guide#the-refusal-cache)
//! answered) or `cost` ([`Verdict::exceeds_max`](crate::Verdict::exceeds_max)).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};

/// Counter of calls, by limit, operation and outcome.
pub const CALLS_TOTAL: &str = "platformkit_limit_calls_total";
/// Histogram of call durations in seconds, by limit and operation, the wait
/// for a connection included.
pub const CALL_DURATION_SECONDS: &str = "platformkit_limit_call_duration_seconds";
/// Counter of rows deleted by [`purge`](crate::purge).
pub const PURGED_ROWS_TOTAL: &str = "platformkit_limit_purged_rows_total";

/// Counter of purge runs that failed.
pub const PURGE_FAILURES_TOTAL: &str = "platformkit_limit_purge_failures_total";

/// Counter of statements sent to PostgreSQL, by operation.
pub const STATEMENTS_TOTAL: &str = "platformkit_limit_statements_total";

/// Counter of probes of the server, by what they found.
pub const PROBES_TOTAL: &str = "platformkit_limit_probes_total";

/// The label of [`PROBES_TOTAL`]: `up` or `down`.
pub const LABEL_FOUND: &str = "found";

/// Label: the limit's name.
pub const LABEL_LIMIT: &str = "limit";
/// Label: the operation: `check`, `failed`, `hit`, `reserve`, `reset`,
/// `take_back` (a permit's success), `purge` or `refused_keys` (these two
/// in `statements_total` only).
pub const LABEL_OPERATION: &str = "operation";
/// Label: `allowed`, `refused`, `unreachable`, `shed`, `error` or `cleared`.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: `store`, `cache` or `cost` (see the module docs).
pub const LABEL_SOURCE: &str = "source";

/// How a call ended, as the `outcome` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Refused,
    Unreachable,
    Shed,
    Error,
    Cleared,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Refused => "refused",
            Outcome::Unreachable => "unreachable",
            Outcome::Shed => "shed",
            Outcome::Error => "error",
            Outcome::Cleared => "cleared",
        }
    }
}

/// Describes every metric to the installed recorder (name, unit, help).
/// [`Limiter::new`](crate::Limiter::new) calls it; call it yourself if you
/// install your recorder later.
pub fn describe() {
    describe_counter!(
        CALLS_TOTAL,
        Unit::Count,
        "Limiter calls by limit, operation and outcome (allowed, refused, unreachable, shed, error, cleared)."
    );
    describe_histogram!(
        CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of limiter calls, the wait for a connection included."
    );
    describe_counter!(
        PURGED_ROWS_TOTAL,
        Unit::Count,
        "Rows of closed windows deleted by purge."
    );
    describe_counter!(
        STATEMENTS_TOTAL,
        Unit::Count,
        "Statements sent to PostgreSQL by the limiter, by operation."
    );
    describe_counter!(
        PURGE_FAILURES_TOTAL,
        Unit::Count,
        "Purge runs that failed before finishing."
    );
    describe_counter!(
        PROBES_TOTAL,
        Unit::Count,
        "Probes of the server after a call got no answer, by what they found (up, down)."
    );
}

/// Who answered a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Store,
    Cache,
    /// A cost above the limit's max, refused before any lookup.
    Cost,
}

pub(crate) fn record_from(
    limit: &Arc<str>,
    operation: Operation,
    outcome: Outcome,
    source: Source,
    took: Duration,
) {
    let source = match source {
        Source::Store => "store",
        Source::Cache => "cache",
        Source::Cost => "cost",
    };
    counter!(
        CALLS_TOTAL,
        LABEL_LIMIT => limit.clone(),
        LABEL_OPERATION => operation.label(),
        LABEL_OUTCOME => outcome.label(),
        LABEL_SOURCE => source,
    )
    .increment(1);
    histogram!(
        CALL_DURATION_SECONDS,
        LABEL_LIMIT => limit.clone(),
        LABEL_OPERATION => operation.label(),
    )
    .record(took.as_secs_f64());
}

/// A purge begins: its counters exist at 0, so an alert sees the first
/// failure.
pub(crate) fn purge_started() {
    counter!(PURGED_ROWS_TOTAL).increment(0);
    counter!(PURGE_FAILURES_TOTAL).increment(0);
}

pub(crate) fn purged(rows: u64) {
    counter!(PURGED_ROWS_TOTAL).increment(rows);
}

pub(crate) fn purge_failed() {
    counter!(PURGE_FAILURES_TOTAL).increment(1);
}

pub(crate) fn probed(down: bool) {
    let found = if down { "down" } else { "up" };
    counter!(PROBES_TOTAL, LABEL_FOUND => found).increment(1);
}

pub(crate) fn statement_sent(operation: Operation) {
    counter!(STATEMENTS_TOTAL, LABEL_OPERATION => operation.label()).increment(1);
}

/// What a call does; its [`label`](Operation::label) names it in every
/// metric, error message and event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Operation {
    Check,
    Failed,
    Hit,
    Reserve,
    Reset,
    TakeBack,
    Purge,
    RefusedKeys,
    /// Applies the schema (in errors only).
    Migrate,
    /// An operator's call that counts nothing: a limit recorded or read,
    /// a block, the audit (in errors only).
    Operator,
}

impl Operation {
    /// Every operation the metrics label, in the order the docs list them
    /// (all but [`Operation::Migrate`] and [`Operation::Operator`]).
    #[cfg(test)]
    pub(crate) const ALL: [Operation; 8] = [
        Operation::Check,
        Operation::Failed,
        Operation::Hit,
        Operation::Reserve,
        Operation::Reset,
        Operation::TakeBack,
        Operation::Purge,
        Operation::RefusedKeys,
    ];

    /// Whether the operation adds to a count.
    pub(crate) const fn adds(self) -> bool {
        match self {
            Operation::Failed | Operation::Hit | Operation::Reserve => true,
            Operation::Check
            | Operation::Reset
            | Operation::TakeBack
            | Operation::Purge
            | Operation::RefusedKeys
            | Operation::Migrate
            | Operation::Operator => false,
        }
    }

    /// Whether the operation is an ask its own verdict decides, reading the
    /// count before the ask (a `failed` tells of the next attempt).
    pub(crate) const fn asks(self) -> bool {
        match self {
            Operation::Hit | Operation::Reserve => true,
            Operation::Check
            | Operation::Failed
            | Operation::Reset
            | Operation::TakeBack
            | Operation::Purge
            | Operation::RefusedKeys
            | Operation::Migrate
            | Operation::Operator => false,
        }
    }

    pub(crate) const fn label(self) -> &'static str {
        match self {
            Operation::Check => "check",
            Operation::Failed => "failed",
            Operation::Hit => "hit",
            Operation::Reserve => "reserve",
            Operation::Reset => "reset",
            Operation::TakeBack => "take_back",
            Operation::Purge => "purge",
            Operation::RefusedKeys => "refused_keys",
            Operation::Migrate => "migrate",
            Operation::Operator => "limits",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_docs_name_every_operation() {
        let docs = include_str!("metric.rs");
        let label_doc = docs
            .split("pub const LABEL_OPERATION")
            .next()
            .and_then(|before| before.rsplit("/// Label: the operation").next())
            .expect("the label's doc");
        for operation in Operation::ALL {
            let label = format!("`{}`", operation.label());
            assert!(label_doc.contains(&label), "{label} is missing");
        }
    }
}
