//! [`Operation`], what a call does; [`Counting`], what a store counts for.

use std::fmt;

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

/// An operation a store counts for and [`decide`](crate::decide::decide)
/// turns into a verdict: it cannot hold another, so a store is never asked
/// to count a reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    operation: Operation,
    all_or_nothing: bool,
}

impl Counting {
    pub(crate) const CHECK: Counting = Counting::each(Operation::Check);
    /// Adds a failure, then tells whether the next attempt may go ahead.
    pub(crate) const FAILED: Counting = Counting::each(Operation::Failed);
    /// Adds this ask (its cost), and tells whether it may go ahead.
    pub(crate) const HIT: Counting = Counting::each(Operation::Hit);
    /// As `HIT`, for a permit.
    pub(crate) const RESERVE: Counting = Counting::each(Operation::Reserve);
    /// As `HIT` over several pairs, adding under none of them unless every
    /// one allows: `hit_all_or_nothing`.
    pub(crate) const HIT_ALL_OR_NOTHING: Counting = Counting {
        operation: Operation::Hit,
        all_or_nothing: true,
    };

    const fn each(operation: Operation) -> Counting {
        Counting {
            operation,
            all_or_nothing: false,
        }
    }

    pub(crate) const fn operation(self) -> Operation {
        self.operation
    }

    pub(crate) const fn adds(self) -> bool {
        self.operation.adds()
    }

    pub(crate) const fn asks(self) -> bool {
        self.operation.asks()
    }

    /// Whether it adds only if every pair of the call allows
    /// (`HIT_ALL_OR_NOTHING`): one statement of its own, never merged.
    pub(crate) const fn all_or_nothing(self) -> bool {
        self.all_or_nothing
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

    /// Only counting operations add or ask, and an ask also adds: a store
    /// counts for exactly the operations a [`Counting`] can hold.
    #[test]
    fn only_counting_operations_add_or_ask() {
        let counting = [
            Counting::CHECK,
            Counting::FAILED,
            Counting::HIT,
            Counting::RESERVE,
        ];
        for operation in Operation::ALL {
            let held = counting.iter().any(|c| c.operation() == operation);
            assert!(
                held || !(operation.adds() || operation.asks()),
                "{operation}"
            );
        }
        let adds: Vec<_> = counting
            .iter()
            .filter(|c| c.adds())
            .map(|c| c.operation())
            .collect();
        assert_eq!(
            adds,
            [Operation::Failed, Operation::Hit, Operation::Reserve]
        );
        let asks: Vec<_> = counting
            .iter()
            .filter(|c| c.asks())
            .map(|c| c.operation())
            .collect();
        assert_eq!(asks, [Operation::Hit, Operation::Reserve]);
    }
}
