//! The one error type of the crate.
//!
//! Being refused is not an error: it is a [`Verdict`](crate::Verdict). An
//! [`Error`] means the limiter could not give a verdict at all, or was built
//! with a configuration that makes no sense.
//!
//! The error is opaque; classify it with [`Error::kind`],
//! [`Error::is_unreachable`] and [`Error::code`]. Messages say what failed and
//! where, never a key: keys are personal data. The cause, when there is one,
//! is returned by [`std::error::Error::source`] and not repeated in `Display`.

use std::time::Duration;

use snafu::Snafu;
use tokio_postgres::error::SqlState;

/// A boxed error from a connection source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the limiter could not give a verdict, or refused a configuration.
///
/// ```
/// use platformkit_limit::{ErrorKind, Limit};
/// use std::time::Duration;
///
/// let err = Limit::new("login", 0, Duration::from_secs(60)).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidLimit);
/// assert!(!err.is_unreachable());
/// assert_eq!(err.to_string(), "invalid limit \"login\": max must be at least 1");
/// ```
#[derive(Debug, Snafu)]
pub struct Error(Inner);

/// The kinds of [`Error`] a caller can match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No connection could be had, or it was lost during the call: the
    /// connection source failed, the server refused or dropped the
    /// connection, or it is shutting down. The store is unreachable.
    Connect,
    /// The call's budget ran out, on the client (waiting for a connection or
    /// an answer) or on the server (the budget as `lock_timeout`, or the
    /// session's own `statement_timeout`).
    /// The store is unreachable.
    Timeout,
    /// PostgreSQL refused the limiter's statement: a misconfiguration such as
    /// a missing table, a missing privilege or a row-level security denial.
    Query,
    /// No connection could be had for a reason an outage does not explain:
    /// an invalid configuration, bad credentials, a database that does not
    /// exist. A misconfiguration, never a silent allow.
    Misconfigured,
    /// The connection source handed over a connection that was inside a
    /// transaction of the caller's. The limiter never commits a caller's
    /// work: that transaction was rolled back.
    InTransaction,
    /// A [`Limit`](crate::Limit) that makes no sense.
    InvalidLimit,
    /// A [`Key`](crate::Key) that cannot be built.
    InvalidKey,
    /// An option (a budget, a batch size) that makes no sense.
    InvalidOption,
}

#[derive(Debug, Snafu)]
#[snafu(visibility(pub(crate)))]
pub(crate) enum Inner {
    #[snafu(display("{operation}: the connection source could not provide a connection"))]
    Connect {
        operation: &'static str,
        source: BoxError,
    },

    #[snafu(display(
        "{operation}: the connection source failed for a reason an outage does not explain"
    ))]
    Misconfigured {
        operation: &'static str,
        source: BoxError,
    },

    #[snafu(display("{operation}: the connection to PostgreSQL failed or was lost"))]
    ConnectionLost {
        operation: &'static str,
        source: tokio_postgres::Error,
    },

    #[snafu(display("{operation}: no answer within the budget of {budget:?}"))]
    Timeout {
        operation: &'static str,
        budget: Duration,
    },

    #[snafu(display("{operation}: PostgreSQL stopped the statement (lock timeout or cancel)"))]
    ServerTimeout {
        operation: &'static str,
        source: tokio_postgres::Error,
    },

    #[snafu(display("{operation}: PostgreSQL refused the limiter's statement"))]
    Query {
        operation: &'static str,
        source: tokio_postgres::Error,
    },

    #[snafu(display(
        "{operation}: the connection was handed over inside a transaction; \
         the limiter needs an idle connection and rolled that transaction back"
    ))]
    InTransaction {
        operation: &'static str,
        source: tokio_postgres::Error,
    },

    #[snafu(display(
        "the call that carried this one's count (merged for a hot key) gave up at its budget"
    ))]
    Abandoned,

    #[snafu(display("{operation}: the merged statement for this key failed"))]
    Merged {
        operation: &'static str,
        source: std::sync::Arc<Error>,
    },

    #[snafu(display("{operation}: PostgreSQL answered unexpectedly: {what}"))]
    Unexpected {
        operation: &'static str,
        what: &'static str,
    },

    #[snafu(display("invalid limit {name:?}: {reason}"))]
    InvalidLimit { name: String, reason: String },

    #[snafu(display("invalid key: {reason}"))]
    InvalidKey { reason: &'static str },

    #[snafu(display("invalid option {option}: {reason}"))]
    InvalidOption {
        option: &'static str,
        reason: String,
    },
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match &self.0 {
            Inner::Connect { .. } | Inner::ConnectionLost { .. } => ErrorKind::Connect,
            Inner::Timeout { .. } | Inner::ServerTimeout { .. } | Inner::Abandoned => {
                ErrorKind::Timeout
            }
            Inner::Merged { source, .. } => source.kind(),
            Inner::Query { .. } | Inner::Unexpected { .. } => ErrorKind::Query,
            Inner::Misconfigured { .. } => ErrorKind::Misconfigured,
            Inner::InTransaction { .. } => ErrorKind::InTransaction,
            Inner::InvalidLimit { .. } => ErrorKind::InvalidLimit,
            Inner::InvalidKey { .. } => ErrorKind::InvalidKey,
            Inner::InvalidOption { .. } => ErrorKind::InvalidOption,
        }
    }

    /// Whether the store could not be reached: the only failures that let an
    /// attempt through (fail-open) and count as `unreachable` in the metrics.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Connect | ErrorKind::Timeout)
    }

    /// The SQLSTATE PostgreSQL answered with, if it answered with one.
    pub fn code(&self) -> Option<&SqlState> {
        match &self.0 {
            Inner::Misconfigured { source, .. } => source
                .downcast_ref::<tokio_postgres::Error>()
                .and_then(tokio_postgres::Error::code),
            Inner::ConnectionLost { source, .. }
            | Inner::ServerTimeout { source, .. }
            | Inner::Query { source, .. }
            | Inner::InTransaction { source, .. } => source.code(),
            Inner::Merged { source, .. } => source.code(),
            _ => None,
        }
    }

    pub(crate) fn invalid_limit(name: &str, reason: impl Into<String>) -> Self {
        Error(Inner::InvalidLimit {
            name: name.to_owned(),
            reason: reason.into(),
        })
    }

    pub(crate) fn invalid_option(option: &'static str, reason: impl Into<String>) -> Self {
        Error(Inner::InvalidOption {
            option,
            reason: reason.into(),
        })
    }

    pub(crate) fn invalid_key(reason: &'static str) -> Self {
        Error(Inner::InvalidKey { reason })
    }

    pub(crate) fn abandoned() -> Self {
        Error(Inner::Abandoned)
    }

    pub(crate) fn merged(operation: &'static str, source: std::sync::Arc<Error>) -> Self {
        Error(Inner::Merged { operation, source })
    }

    pub(crate) fn unexpected(operation: &'static str, what: &'static str) -> Self {
        Error(Inner::Unexpected { operation, what })
    }

    /// A connection source's failure: unreachable, unless a PostgreSQL
    /// error in its chain shows a misconfiguration (a refusal with a SQLSTATE
    /// that is not the server going away, an invalid configuration, a failed
    /// authentication).
    pub(crate) fn connect(operation: &'static str, source: BoxError) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*source);
        while let Some(error) = cause {
            if error
                .downcast_ref::<tokio_postgres::Error>()
                .is_some_and(misconfigured)
            {
                return Error(Inner::Misconfigured { operation, source });
            }
            cause = error.source();
        }
        Error(Inner::Connect { operation, source })
    }

    pub(crate) fn timeout(operation: &'static str, budget: Duration) -> Self {
        Error(Inner::Timeout { operation, budget })
    }

    /// Sorts an error from PostgreSQL into "unreachable" (the connection is
    /// gone, the server is going away, or the budget ran out on the server)
    /// and everything else, which is a hard error.
    pub(crate) fn from_postgres(operation: &'static str, source: tokio_postgres::Error) -> Self {
        let inner = match source.code() {
            None if source.is_closed() || io_caused(&source) => {
                Inner::ConnectionLost { operation, source }
            }
            None => Inner::Query { operation, source },
            Some(code)
                if *code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE =>
            {
                Inner::ServerTimeout { operation, source }
            }
            Some(code) if server_going_away(code) => Inner::ConnectionLost { operation, source },
            Some(code)
                if *code == SqlState::INVALID_TRANSACTION_TERMINATION
                    || *code == SqlState::IN_FAILED_SQL_TRANSACTION =>
            {
                Inner::InTransaction { operation, source }
            }
            Some(_) if in_recovery(&source) => Inner::ConnectionLost { operation, source },
            Some(_) => Inner::Query { operation, source },
        };
        Error(inner)
    }
}

/// Whether a connection attempt failed for a reason an outage does not
/// explain. tokio-postgres does not expose its error kinds; its messages for
/// them are stable and are matched here.
fn misconfigured(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        Some(code) => !server_going_away(code) && *code != SqlState::QUERY_CANCELED,
        None => {
            let message = error.to_string();
            [
                "invalid configuration",
                "invalid connection string",
                "authentication error",
            ]
            .iter()
            .any(|kind| message.starts_with(kind))
        }
    }
}

fn io_caused(error: &tokio_postgres::Error) -> bool {
    std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

fn server_going_away(code: &SqlState) -> bool {
    // Connection exceptions, except a protocol violation: that one means the
    // client and server disagree (a mismatched schema or a bug), which
    // must never pass for an unreachable store.
    (code.code().starts_with("08") && *code != SqlState::PROTOCOL_VIOLATION)
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
        // A write refused by a read-only server: a hot standby, or an old
        // primary demoted during a failover. The primary is not here, so
        // the store is unreachable.
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
}

/// Whether a server in recovery (a hot standby, or an old primary demoted
/// during a failover) refused the procedures' `SET TRANSACTION ... READ
/// WRITE`: it answers 0A000 feature_not_supported ("cannot set transaction
/// read-write mode during recovery"), not 25006. That code alone is too
/// broad to mean the primary is not here, so the statement it refused,
/// named in the error's context, narrows it: READ WRITE at the start of a
/// transaction is refused with 0A000 during recovery only.
fn in_recovery(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::FEATURE_NOT_SUPPORTED
            && db.where_().is_some_and(|w| w.contains("SET TRANSACTION"))
    })
}
