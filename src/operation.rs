//! [`Operation`]: what a call does, in one vocabulary for the metrics, the
//! errors and the events.

use std::fmt;

/// What a call does. Its [`label`](Operation::label) is the `operation`
/// label of every metric, the first word of every error message and the
/// `operation` field of every event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Operation {
    /// Reads the count before an attempt.
    Check,
    /// Counts a failed attempt.
    Failed,
    /// Counts an ask and decides it.
    Hit,
    /// Counts an attempt before the work, for a permit.
    Reserve,
    /// Clears a key.
    Reset,
    /// Takes a reserved attempt back.
    TakeBack,
    /// Deletes windows that closed long ago.
    Purge,
    /// Lists the keys a limit refuses, for an operator.
    RefusedKeys,
    /// Applies the schema: a start-up step, in errors only (no metric, no
    /// event).
    Migrate,
}

impl Operation {
    /// Every operation the metrics label, in the order the docs list them
    /// (all but [`Operation::Migrate`]).
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

    /// The label, as the metrics, errors and events carry it.
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

    /// The metric docs name every operation's label, so a new operation
    /// cannot be missing from them.
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
