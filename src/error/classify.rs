//! How a failure becomes an [`Error`]: a driver's error through the
//! SQLSTATE table, a connection source's failure, a budget that ran out;
//! and what the crate asks of an error it made.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::sqlstate::Class;
use super::{BoxError, Error, Inner};
use crate::operation::Operation;

impl Error {
    /// The error of a call whose budget ran out:
    /// [`ErrorKind::Timeout`](super::ErrorKind::Timeout) when the store is
    /// down by what this process heard of it, else
    /// [`ErrorKind::Overloaded`](super::ErrorKind::Overloaded).
    pub(crate) fn out_of_budget(operation: Operation, budget: Duration, down: bool) -> Self {
        if down {
            Error(Inner::Timeout { operation, budget })
        } else {
            Error(Inner::Shed { operation, budget })
        }
    }

    /// Whether this is a budget that ran out (down or overloaded, by what
    /// was heard), as [`Error::out_of_budget`] makes it.
    pub(crate) fn is_out_of_budget(&self) -> bool {
        matches!(&self.0, Inner::Timeout { .. } | Inner::Shed { .. })
    }

    /// Whether this is a statement answered after this call's own cancel
    /// request: it did its work, late.
    pub(crate) fn answered_after_cancel(&self) -> bool {
        matches!(&self.0, Inner::AnsweredAfterCancel { .. })
    }

    /// Whether PostgreSQL answered this (with a SQLSTATE), so that it was up
    /// when the call failed.
    pub(crate) fn answered(&self) -> bool {
        match &self.0 {
            Inner::AnsweredAfterCancel { .. } => true,
            Inner::ConnectionLost { .. } => false,
            _ => self.code().is_some(),
        }
    }

    /// A connection source's failure: unreachable, unless a driver's error
    /// in its chain shows a server that is up and refused (`refused`, with
    /// its SQLSTATE if it has one): overloaded when it is out of a resource
    /// (class `53`), else a misconfiguration (a refusal with a SQLSTATE that
    /// is not the server going away, an invalid configuration, a failed
    /// authentication).
    pub(crate) fn connect(
        operation: Operation,
        source: BoxError,
        refused: Option<Option<SqlState>>,
    ) -> Self {
        match refused {
            Some(Some(code)) if exhausted_code(&code) => Error(Inner::Exhausted {
                operation,
                code: Some(code),
                source,
            }),
            Some(code) => Error(Inner::Misconfigured {
                operation,
                code,
                source,
            }),
            None => Error(Inner::Connect { operation, source }),
        }
    }

    /// Sorts a driver's error, as it reads (`reading`), into "unreachable"
    /// (the connection is gone, the server is going away or is a standby)
    /// and everything else, which is a hard error; see the table in
    /// [`ErrorKind`](super::ErrorKind). A cancel is the budget running out
    /// only when this call sent it (`cancel_sent`).
    pub(crate) fn read(
        operation: Operation,
        reading: Reading,
        source: BoxError,
        cancel_sent: bool,
    ) -> Self {
        let code = match reading {
            Reading::Answered(code) => code,
            Reading::Lost => {
                return Error(Inner::ConnectionLost {
                    operation,
                    code: None,
                    source,
                });
            }
            Reading::Misconfigured => {
                return Error(Inner::Misconfigured {
                    operation,
                    code: None,
                    source,
                });
            }
            Reading::Refused => {
                return Error(Inner::Query {
                    operation,
                    code: None,
                    source,
                });
            }
        };
        let class = Class::of(&code);
        let code = Some(code);
        Error(match class {
            Class::Gone => Inner::ConnectionLost {
                operation,
                code,
                source,
            },
            Class::Exhausted => Inner::Exhausted {
                operation,
                code,
                source,
            },
            Class::Cancelled if cancel_sent => Inner::ServerTimeout {
                operation,
                code,
                source,
            },
            Class::Cancelled => Inner::Cancelled {
                operation,
                code,
                source,
            },
            Class::LockTimeout => Inner::LockTimeout {
                operation,
                code,
                source,
            },
            Class::InTransaction => Inner::InTransaction {
                operation,
                code,
                source,
            },
            Class::Misconfigured => Inner::SessionTimeout {
                operation,
                code,
                source,
            },
            Class::Refused => Inner::Query {
                operation,
                code,
                source,
            },
        })
    }
}

/// What a driver's error says, before the SQLSTATE table reads it.
#[derive(Debug)]
pub(crate) enum Reading {
    /// PostgreSQL answered with this SQLSTATE.
    Answered(SqlState),
    /// No SQLSTATE, and the connection is gone (closed, or an I/O error).
    Lost,
    /// No SQLSTATE, and the driver refused its own configuration.
    #[cfg_attr(
        not(feature = "sqlx"),
        expect(dead_code, reason = "tokio-postgres says so only when connecting")
    )]
    Misconfigured,
    /// No SQLSTATE otherwise: an answer the limiter could not read, a
    /// protocol error. A hard error.
    Refused,
}

/// Whether a SQLSTATE that ended a connection attempt shows a server that
/// is up, so not an outage: anything but the server going away or a
/// cancel. [`Error::connect`] reads the server out of a resource (class
/// `53`: connection slots, which a flood of logins can take, memory) as
/// overloaded, and the rest as a misconfiguration.
pub(crate) fn not_an_outage(code: &SqlState) -> bool {
    !matches!(Class::of(code), Class::Gone | Class::Cancelled)
}

/// Whether a SQLSTATE says the server is out of a resource (connection
/// slots, memory): up, and overloaded.
fn exhausted_code(code: &SqlState) -> bool {
    Class::of(code) == Class::Exhausted
}
