//! What a `DebuggingRecorder` saw, for tests that set one as the local
//! recorder of their thread.

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, Snapshotter};
use platformkit_limit::metric::{
    CALL_DURATION_SECONDS, CALLS_TOTAL, LABEL_FOUND, LABEL_LIMIT, LABEL_OPERATION, LABEL_OUTCOME,
    LABEL_SOURCE, PROBES_TOTAL,
};

/// What a [`DebuggingRecorder`](metrics_util::debugging::DebuggingRecorder)
/// saw, keyed by label values.
#[derive(Debug, Default)]
pub struct Recorded {
    /// `platformkit_limit_calls_total` by `(limit, operation, outcome)`.
    pub calls: BTreeMap<(String, String, String), u64>,
    /// Samples of `platformkit_limit_call_duration_seconds` by
    /// `(limit, operation)`.
    pub durations: BTreeMap<(String, String), usize>,
    /// `platformkit_limit_probes_total` by what the probes found.
    pub probes: BTreeMap<String, u64>,
    /// Every label of every series, as `(name, value)`.
    pub labels: Vec<(String, String)>,
}

impl Recorded {
    pub fn take(snapshotter: &Snapshotter) -> Recorded {
        let mut recorded = Recorded::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: BTreeMap<String, String> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            recorded
                .labels
                .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
            match (key.name(), value) {
                (CALLS_TOTAL, DebugValue::Counter(n)) => {
                    assert_eq!(labels.len(), 4, "labels of {CALLS_TOTAL}: {labels:?}");
                    // Every call here reaches the store: the refusal cache is
                    // covered by tests/refusal_cache.rs.
                    assert_eq!(label(LABEL_SOURCE), "store", "{labels:?}");
                    recorded.calls.insert(
                        (
                            label(LABEL_LIMIT),
                            label(LABEL_OPERATION),
                            label(LABEL_OUTCOME),
                        ),
                        n,
                    );
                }
                (CALL_DURATION_SECONDS, DebugValue::Histogram(samples)) => {
                    assert_eq!(
                        labels.len(),
                        2,
                        "labels of {CALL_DURATION_SECONDS}: {labels:?}"
                    );
                    *recorded
                        .durations
                        .entry((label(LABEL_LIMIT), label(LABEL_OPERATION)))
                        .or_default() += samples.len();
                }
                (PROBES_TOTAL, DebugValue::Counter(n)) => {
                    recorded.probes.insert(label(LABEL_FOUND), n);
                }
                _ => {}
            }
        }
        recorded
    }

    /// How many probes found the server `found` (`up` or `down`).
    pub fn probes(&self, found: &str) -> u64 {
        self.probes.get(found).copied().unwrap_or(0)
    }

    pub fn calls(&self, limit: &str, operation: &str, outcome: &str) -> u64 {
        self.calls
            .get(&(limit.to_owned(), operation.to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

/// `platformkit_limit_calls_total` for one limit, operation and outcome.
pub fn calls_recorded(
    snapshotter: &Snapshotter,
    limit: &str,
    operation: &str,
    outcome: &str,
) -> u64 {
    Recorded::take(snapshotter).calls(limit, operation, outcome)
}

/// The expected `platformkit_limit_calls_total`, as [`Recorded::calls`] has
/// it, from `(limit, operation, outcome, count)`.
pub fn series(entries: &[(&str, &str, &str, u64)]) -> BTreeMap<(String, String, String), u64> {
    entries
        .iter()
        .map(|&(l, op, out, n)| ((l.to_owned(), op.to_owned(), out.to_owned()), n))
        .collect()
}
