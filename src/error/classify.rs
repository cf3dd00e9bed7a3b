//! How a failure becomes an [`Error`].

use std::fmt;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::sqlstate::Class;
use super::{BoxError, Error, ErrorKind, Inner};
use crate::metric::Operation;

impl Error {
    /// The error of a call whose budget ran out with no answer: unreachable
    /// until a probe finds the server up ([`Error::probed`]).
    pub(crate) fn out_of_budget(operation: Operation, budget: Duration) -> Self {
        Error(Inner::Timeout { operation, budget })
    }

    pub(crate) fn down(operation: Operation) -> Self {
        Error(Inner::Down { operation })
    }

    /// This error once a probe found the server `down` or not: unchanged
    /// if down (or not unreachable), else shed with this as its cause.
    pub(crate) fn probed(self, operation: Operation, down: bool) -> Self {
        if down || !self.is_unreachable() {
            return self;
        }
        Error(Inner::Shed {
            operation,
            source: Box::new(self),
        })
    }

    pub(crate) fn answered_after_cancel(&self) -> bool {
        matches!(&self.0, Inner::AnsweredAfterCancel { .. })
    }

    /// A connection source's failure: unreachable, unless the server was
    /// up and `refused` (with its SQLSTATE, if any): overloaded for class
    /// `53`, else misconfigured.
    pub(crate) fn connect(
        operation: Operation,
        source: BoxError,
        refused: Option<Option<SqlState>>,
    ) -> Self {
        let Some(code) = refused else {
            return Error(Inner::Connect { operation, source });
        };
        let fault = match &code {
            Some(code) if Class::of(code) == Class::Exhausted => Fault::Exhausted,
            _ => Fault::Misconfigured,
        };
        Error(Inner::Driver {
            operation,
            fault,
            code,
            source,
        })
    }

    /// A driver's error, read by the table in [`ErrorKind`]. A cancel is
    /// the budget running out only when this call sent it (`cancel_sent`).
    pub(crate) fn read(
        operation: Operation,
        reading: Reading,
        source: BoxError,
        cancel_sent: bool,
    ) -> Self {
        let (fault, code) = match reading {
            Reading::Answered(code) => (Fault::of(Class::of(&code), cancel_sent), Some(code)),
            Reading::Lost => (Fault::ConnectionLost, None),
            Reading::Misconfigured => (Fault::Misconfigured, None),
            Reading::Refused => (Fault::Query, None),
        };
        Error(Inner::Driver {
            operation,
            fault,
            code,
            source,
        })
    }
}

/// What went wrong in a failure a driver reported: its kind, and its
/// message (the `Display` below says what each variant is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    Misconfigured,
    ConnectionLost,
    Exhausted,
    ServerTimeout,
    LockTimeout,
    Cancelled,
    SessionTimeout,
    Query,
    InTransaction,
}

impl Fault {
    /// How a SQLSTATE's class reads (see [`Error::read`]).
    fn of(class: Class, cancel_sent: bool) -> Self {
        match class {
            Class::Gone => Fault::ConnectionLost,
            Class::Exhausted => Fault::Exhausted,
            Class::Cancelled if cancel_sent => Fault::ServerTimeout,
            Class::Cancelled => Fault::Cancelled,
            Class::LockTimeout => Fault::LockTimeout,
            Class::InTransaction => Fault::InTransaction,
            Class::Misconfigured => Fault::SessionTimeout,
            Class::Refused => Fault::Query,
        }
    }

    pub(super) fn kind(self) -> ErrorKind {
        match self {
            Fault::ConnectionLost => ErrorKind::Connect,
            Fault::Exhausted | Fault::ServerTimeout => ErrorKind::Overloaded,
            Fault::Misconfigured | Fault::SessionTimeout => ErrorKind::Misconfigured,
            Fault::LockTimeout => ErrorKind::LockTimeout,
            Fault::Cancelled => ErrorKind::Cancelled,
            Fault::Query => ErrorKind::Query,
            Fault::InTransaction => ErrorKind::InTransaction,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Misconfigured => {
                "the connection source failed for a reason an outage does not explain"
            }
            Fault::ConnectionLost => "the connection to PostgreSQL failed or was lost",
            Fault::Exhausted => "PostgreSQL is out of a resource (connection slots, memory)",
            Fault::ServerTimeout => {
                "PostgreSQL stopped the statement at this call's cancel request"
            }
            Fault::LockTimeout => "a lock the statement needed was held past the server's budget",
            Fault::Cancelled => {
                "PostgreSQL cancelled the statement, and this limiter did not ask it to"
            }
            Fault::SessionTimeout => {
                "a setting of the session would stop or hold the limiter's call \
                 (a timeout no longer than its budget, or a read-only or deferrable transaction)"
            }
            Fault::Query => "PostgreSQL refused the limiter's statement",
            Fault::InTransaction => {
                "the connection was handed over inside a transaction; \
                 the limiter needs an idle connection and rolled that transaction back"
            }
        })
    }
}

/// What a driver's error says, before the SQLSTATE table reads it.
#[derive(Clone, Debug)]
pub(crate) enum Reading {
    /// PostgreSQL answered with this SQLSTATE.
    Answered(SqlState),
    /// No SQLSTATE, and the connection is gone (closed, or an I/O error).
    Lost,
    /// No SQLSTATE, and the driver refused its own configuration.
    #[cfg_attr(
        not(any(feature = "sqlx", feature = "sqlx-09")),
        expect(dead_code, reason = "tokio-postgres says so only when connecting")
    )]
    Misconfigured,
    /// No SQLSTATE otherwise: a hard error.
    Refused,
}

/// Whether a SQLSTATE that ended a connection attempt shows a server that
/// is up: anything but the server going away or a cancel.
pub(crate) fn not_an_outage(code: &SqlState) -> bool {
    !matches!(Class::of(code), Class::Gone | Class::Cancelled)
}
