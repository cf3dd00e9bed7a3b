//! The one error type of the crate. Being refused is a
//! [`Verdict`](crate::Verdict), not an error. Messages never hold a key; the
//! cause is [`std::error::Error::source`], not repeated in `Display`.

use std::time::Duration;

use snafu::Snafu;

use crate::metric::Operation;

mod classify;
mod sqlstate;

use tokio_postgres::error::SqlState;

use self::classify::Fault;
pub(crate) use self::classify::{Reading, not_an_outage};

/// A boxed error from a connection source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the limiter could not give a verdict, or refused a configuration.
/// Opaque: classify it with [`Error::kind`], [`Error::is_unreachable`] and
/// [`Error::code`].
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
///
/// Only [`Connect`](ErrorKind::Connect) and [`Timeout`](ErrorKind::Timeout)
/// are unreachable, the only failures a limit may fail open on;
/// [`Overloaded`](ErrorKind::Overloaded) is shed
/// ([down or overloaded](crate::guide#down-or-overloaded)). A SQLSTATE is
/// read by this table, an exact code first, then its class; anything else
/// is [`Query`](ErrorKind::Query):
///
/// | SQLSTATE | name | kind |
/// |---|---|---|
/// | `08P01` | protocol_violation | Query |
/// | `08` | connection_exception (the class) | Connect |
/// | `57P01` | admin_shutdown | Connect |
/// | `57P02` | crash_shutdown | Connect |
/// | `57P03` | cannot_connect_now | Connect |
/// | `53` | insufficient_resources (the class: connection slots, memory, the lock table) | Overloaded |
/// | `25006` | read_only_sql_transaction | Connect |
/// | `57014` | query_canceled | Overloaded if this call sent the cancel, else Cancelled |
/// | `55P03` | lock_not_available | LockTimeout |
/// | `2D000` | invalid_transaction_termination | InTransaction |
/// | `25P02` | in_failed_sql_transaction | InTransaction |
/// | `PK001` | a session setting the limiter refuses | Misconfigured |
/// | `22023` | invalid_parameter_value | Query |
///
/// A [`migrate`](crate::Postgres::migrate)'s `PK002` and `PK005` are
/// `Query`; `25006` is a standby's ([read replicas](crate::guide#read-replicas)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No connection could be had, or it was lost, and a probe found the
    /// server down (or the latest one had, and the call was not tried).
    /// Unreachable.
    Connect,
    /// The call's budget ran out with no answer, and a probe found the
    /// server down. Unreachable.
    Timeout,
    /// The store is up and could not answer within the budget (a probe
    /// answered, this call's own cancel, or class `53`): the call is shed
    /// ([`Verdict::is_shed`](crate::Verdict::is_shed)), never allowed.
    Overloaded,
    /// PostgreSQL refused the limiter's statement: a missing table or
    /// privilege, a parameter out of bounds.
    Query,
    /// No connection could be had for a reason an outage does not explain
    /// (bad credentials, a database that does not exist), or a session
    /// setting the limiter refuses (PK001,
    /// [the prologue](crate::guide#the-procedures-prologue)).
    Misconfigured,
    /// The connection was lent inside a transaction of the caller's, which
    /// was rolled back, never committed.
    InTransaction,
    /// A lock the statement needed was held past the server's part of the
    /// budget (`55P03`). Never an allow.
    LockTimeout,
    /// PostgreSQL cancelled the statement and this limiter did not ask it
    /// to. Never an allow.
    Cancelled,
    /// A [`Limit`](crate::Limit) that makes no sense.
    InvalidLimit,
    /// A [`Key`](crate::Key) that cannot be built.
    InvalidKey,
    /// An option (a budget, a batch size, a pinned time) that makes no sense.
    InvalidOption,
}

#[derive(Debug, Snafu)]
#[snafu(visibility(pub(crate)))]
pub(crate) enum Inner {
    #[snafu(display("{operation}: the connection source could not provide a connection"))]
    Connect {
        operation: Operation,
        source: BoxError,
    },

    /// A failure a driver reported (see [`Fault`]).
    #[snafu(display("{operation}: {fault}"))]
    Driver {
        operation: Operation,
        fault: Fault,
        code: Option<SqlState>,
        source: BoxError,
    },

    #[snafu(display("{operation}: no answer from PostgreSQL within the budget of {budget:?}"))]
    Timeout {
        operation: Operation,
        budget: Duration,
    },

    /// A call that got no answer, on a server a probe found up.
    #[snafu(display(
        "{operation}: shed: no answer for this call, but PostgreSQL answered a probe of the \
         server (load, or a fault of this call's connection, not an outage)"
    ))]
    Shed {
        operation: Operation,
        source: Box<Error>,
    },

    #[snafu(display(
        "{operation}: not tried: the latest probe found PostgreSQL down (answered at once until \
         a probe finds it up)"
    ))]
    Down { operation: Operation },

    /// An answer after this call's own cancel request: the budget ran out,
    /// whatever the answer says.
    #[snafu(display(
        "{operation}: the answer came after this call's cancel request, at the end of its budget"
    ))]
    AnsweredAfterCancel { operation: Operation },

    #[snafu(display(
        "the shared statement that carried this call's count ended without an answer for it"
    ))]
    Abandoned,

    #[snafu(display("{operation}: the shared statement this call's count went in failed"))]
    Merged {
        operation: Operation,
        source: std::sync::Arc<Error>,
    },

    #[snafu(display("{operation}: PostgreSQL answered unexpectedly: {what}"))]
    Unexpected {
        operation: Operation,
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
            Inner::Connect { .. } | Inner::Down { .. } => ErrorKind::Connect,
            Inner::Driver { fault, .. } => fault.kind(),
            Inner::Timeout { .. } => ErrorKind::Timeout,
            Inner::Shed { .. } | Inner::AnsweredAfterCancel { .. } | Inner::Abandoned => {
                ErrorKind::Overloaded
            }
            Inner::Merged { source, .. } => source.kind(),
            Inner::Unexpected { .. } => ErrorKind::Query,
            Inner::InvalidLimit { .. } => ErrorKind::InvalidLimit,
            Inner::InvalidKey { .. } => ErrorKind::InvalidKey,
            Inner::InvalidOption { .. } => ErrorKind::InvalidOption,
        }
    }

    /// Whether the store could not be reached: the only failures that may
    /// fail open.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Connect | ErrorKind::Timeout)
    }

    /// Whether the store is up and too busy to answer within the budget:
    /// the failures the limiter sheds.
    pub fn is_overloaded(&self) -> bool {
        self.kind() == ErrorKind::Overloaded
    }

    /// An option that makes no sense ([`ErrorKind::InvalidOption`]), for
    /// crates built on this one.
    ///
    /// ```
    /// use platformkit_limit::{Error, ErrorKind};
    ///
    /// let err = Error::invalid_option("secret", "at least 32 bytes");
    /// assert_eq!(err.kind(), ErrorKind::InvalidOption);
    /// assert_eq!(err.to_string(), "invalid option secret: at least 32 bytes");
    /// ```
    pub fn invalid_option(option: &'static str, reason: impl Into<String>) -> Error {
        Error(Inner::InvalidOption {
            option,
            reason: reason.into(),
        })
    }

    /// The SQLSTATE PostgreSQL answered with, if it answered with one,
    /// whatever the driver.
    pub fn code(&self) -> Option<&SqlState> {
        match &self.0 {
            Inner::Driver { code, .. } => code.as_ref(),
            Inner::Merged { source, .. } => source.code(),
            _ => None,
        }
    }
}
