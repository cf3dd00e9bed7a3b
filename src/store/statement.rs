//! [`call`], the one place a statement is sent, on any driver, and its
//! [`Budget`], the split of a call's budget between the server and the
//! client; and [`deleted`], the count of a reset, purge or take-back.

use std::time::Duration;

use tokio::time::Instant;

use crate::driver::{Row, Session};
use crate::error::AnsweredAfterCancelSnafu;
use crate::operation::Operation;
use crate::store::sql::Statement;
use crate::{Error, ErrorKind};

/// Sends one statement on `session`, in autocommit, and returns its one
/// row; the server stops within [`Budget`]
/// ([the budget on the server](crate::guide#the-budget-on-the-server)). An
/// answer after this call's own cancel is the budget running out, never an
/// acknowledgement; a connection lent inside a transaction is rolled back.
pub(crate) async fn call<S: Session, const N: usize>(
    session: &mut S,
    operation: Operation,
    statement: Statement<'_, N>,
    budget: Budget,
) -> Result<Row, Error> {
    crate::metric::statement_sent(operation);
    let (answer, cancelled) = session
        .send(statement.sql, &statement.params, budget.cancel_at)
        .await;
    let cancel_sent = cancelled.is_some();
    if let Some(delivered) = cancelled
        && !cancelled_by_it(&answer)
    {
        // Answered before its cancel landed: hold the connection until it
        // lands on an idle backend, not on the next statement.
        let landed = budget
            .cancel_lands
            .max(delivered + budget.rtt / 2 + CANCEL_LANDS);
        tokio::time::sleep_until(landed).await;
    }
    match answer {
        Ok(_) if cancel_sent => AnsweredAfterCancelSnafu { operation }
            .fail()
            .map_err(Error::from),
        Ok(row) => Ok(row),
        Err(e) => {
            let error = e.into_error(operation, cancel_sent);
            if error.kind() == ErrorKind::InTransaction {
                // Best effort: the error says what happened either way.
                session.rollback().await;
            }
            Err(error)
        }
    }
}

/// Whether `answer` is the statement stopped by a cancel (57014).
fn cancelled_by_it(answer: &Result<Row, crate::driver::Failure>) -> bool {
    match answer {
        Ok(_) => false,
        Err(failure) => matches!(
            failure.reading(),
            crate::error::Reading::Answered(code) if *code == tokio_postgres::error::SqlState::QUERY_CANCELED
        ),
    }
}

/// Reads the one count column of a reset, purge or take-back.
pub(crate) fn deleted(row: &Row, operation: Operation) -> Result<u64, Error> {
    let deleted: i64 = row.int8(0).map_err(|e| e.into_error(operation, false))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}

/// How a call's budget is split between the server and the client, on a
/// link whose round trip is about `rtt` (zero before the first answer):
/// [the budget on the server](crate::guide#the-budget-on-the-server).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// The server's part, in whole milliseconds (at least 1).
    pub(crate) server_ms: i64,
    pub(crate) cancel_at: Instant,
    /// The last moment a statement may be sent.
    pub(crate) send_by: Instant,
    /// About the link's round trip, as the split counted it.
    pub(crate) rtt: Duration,
    /// When a cancel request sent at `cancel_at` has surely landed, so it
    /// can no longer reach a later statement on the connection.
    pub(crate) cancel_lands: Instant,
}

/// The most a cancel request is sent ahead of the deadline.
const CANCEL_AHEAD: Duration = Duration::from_millis(100);

/// The least a statement is sent with beyond the round trip: less, and it
/// could only run out of budget on its way.
pub(crate) const LEAST_SERVER: Duration = Duration::from_millis(2);

/// What a server takes, beyond the round trips, to act on a cancel request:
/// its new connection's start.
pub(crate) const CANCEL_LANDS: Duration = Duration::from_millis(2);

impl Budget {
    pub(crate) fn until(deadline: Instant, rtt: Duration) -> Budget {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let ahead = CANCEL_AHEAD.min(left / 10);
        let server = left.saturating_sub(rtt + ahead * 2);
        let cancel_at = deadline
            .checked_sub(ahead + rtt * 2)
            .map_or(now, |at| at.max(now));
        Budget {
            server_ms: i64::try_from(server.as_millis().max(1)).unwrap_or(i64::MAX),
            cancel_at,
            send_by: deadline.checked_sub(ahead + rtt).unwrap_or(now),
            cancel_lands: (cancel_at + rtt * 2 + CANCEL_LANDS).min(deadline),
            rtt,
        }
    }
}
