//! How the crate reads a SQLSTATE.

use tokio_postgres::error::SqlState;

/// The rows of the table in [`ErrorKind`](super::ErrorKind)'s docs, in
/// order (a test holds the two together).
pub(super) const SQLSTATES: &[(&str, &str, Class)] = &[
    ("08P01", "protocol_violation", Class::Refused),
    ("08", "connection_exception (the class)", Class::Gone),
    ("57P01", "admin_shutdown", Class::Gone),
    ("57P02", "crash_shutdown", Class::Gone),
    ("57P03", "cannot_connect_now", Class::Gone),
    (
        "53",
        "insufficient_resources (the class: connection slots, memory, the lock table)",
        Class::Exhausted,
    ),
    ("25006", "read_only_sql_transaction", Class::Gone),
    ("57014", "query_canceled", Class::Cancelled),
    ("55P03", "lock_not_available", Class::LockTimeout),
    (
        "2D000",
        "invalid_transaction_termination",
        Class::InTransaction,
    ),
    ("25P02", "in_failed_sql_transaction", Class::InTransaction),
    (
        "PK001",
        "a session setting the limiter refuses",
        Class::Misconfigured,
    ),
    ("22023", "invalid_parameter_value", Class::Refused),
];

/// What a SQLSTATE means to the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// The server is going away or is not the primary: unreachable.
    Gone,
    /// A cancel: overloaded when this call sent it, else a hard error.
    Cancelled,
    /// The server is out of a resource: up, and overloaded.
    Exhausted,
    /// A lock held past the budget.
    LockTimeout,
    /// The connection was inside a caller's transaction.
    InTransaction,
    /// The session's settings make every call fail.
    Misconfigured,
    /// Anything else: PostgreSQL refused the statement.
    Refused,
}

impl Class {
    pub(super) fn of(code: &SqlState) -> Class {
        let code = code.code();
        SQLSTATES
            .iter()
            .find(|(c, _, _)| *c == code)
            .or_else(|| {
                SQLSTATES
                    .iter()
                    .find(|(c, _, _)| c.len() == 2 && code.starts_with(c))
            })
            .map_or(Class::Refused, |(_, _, class)| *class)
    }

    /// The kind as the docs' table names it.
    #[cfg(test)]
    fn described(self) -> &'static str {
        match self {
            Class::Gone => "Connect",
            Class::Cancelled => "Overloaded if this call sent the cancel, else Cancelled",
            Class::Exhausted => "Overloaded",
            Class::LockTimeout => "LockTimeout",
            Class::InTransaction => "InTransaction",
            Class::Misconfigured => "Misconfigured",
            Class::Refused => "Query",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sqlstate_table_in_the_docs_is_the_one_the_code_reads() {
        let source = include_str!("mod.rs");
        let documented: Vec<&str> = source
            .lines()
            .map(str::trim)
            .filter_map(|line| line.strip_prefix("/// | `"))
            .collect();
        let read: Vec<String> = SQLSTATES
            .iter()
            .map(|(code, name, class)| format!("{code}` | {name} | {} |", class.described()))
            .collect();
        assert_eq!(documented, read);
    }

    #[test]
    fn a_code_is_read_exactly_first_then_by_its_class() {
        assert_eq!(Class::of(&SqlState::PROTOCOL_VIOLATION), Class::Refused);
        assert_eq!(Class::of(&SqlState::CONNECTION_FAILURE), Class::Gone);
        assert_eq!(Class::of(&SqlState::READ_ONLY_SQL_TRANSACTION), Class::Gone);
        assert_eq!(Class::of(&SqlState::LOCK_NOT_AVAILABLE), Class::LockTimeout);
        assert_eq!(Class::of(&SqlState::TOO_MANY_CONNECTIONS), Class::Exhausted);
        assert_eq!(Class::of(&SqlState::OUT_OF_MEMORY), Class::Exhausted);
        assert_eq!(
            Class::of(&SqlState::from_code("PK001")),
            Class::Misconfigured
        );
        assert_eq!(Class::of(&SqlState::UNDEFINED_TABLE), Class::Refused);
    }
}
