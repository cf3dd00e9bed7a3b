//! One statement on a lent [`Session`]: [`call`], the one place a `CALL`
//! is sent, on any driver, with the budget on the server, the cancel and
//! the rollback; and [`deleted`], the count column of a reset, purge or
//! take-back.

use crate::driver::{Row, Session};
use crate::error::AnsweredAfterCancelSnafu;
use crate::operation::Operation;
use crate::store::budget::{self, Budget};
use crate::store::sql::Statement;
use crate::{Error, ErrorKind};

/// Sends one statement on `session` and returns its one row.
///
/// The statement runs in autocommit: a `CALL` whose procedure opens and ends
/// the limiter's own transaction, or a `SELECT` of a reader, which writes
/// nothing. A caller that gives up on the future (the budget) cannot leave
/// the connection inside a transaction: the request is already queued on the
/// connection, and the server finishes it alone.
///
/// The server stops too, as [`Budget`] splits the time: its lock waits end
/// at `lock_timeout` (a hard error), and, on a driver that can cancel
/// (tokio-postgres), a `CALL` still unanswered at `budget.cancel_at` is sent
/// a cancel request (what psql's Ctrl-C sends, over a new connection without
/// TLS; a server that requires TLS refuses it and the lock timeout still
/// holds). The cancel is sent while this call still holds the connection, so
/// it can only reach this `CALL`: through PgBouncer, a client that holds no
/// server connection has nothing to cancel. A cancel this call did not send
/// is a hard error; an answer that comes after this call's cancel is the
/// budget running out, never an acknowledgement (a commit waiting for a
/// synchronous standby is answered when cancelled, without the standby). A
/// driver that cannot cancel (sqlx) sends none: the client gives up at the
/// deadline and the server finishes the `CALL` alone.
///
/// A connection handed over inside the caller's transaction makes the
/// procedure fail before it does anything; that transaction, now aborted, is
/// rolled back so that the connection goes back idle.
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
        // The statement was answered before its cancel reached the server:
        // keep the connection until the cancel has landed, on an idle
        // backend, which ignores it, and not on the next statement.
        let landed = budget
            .cancel_lands
            .max(delivered + budget.rtt / 2 + budget::CANCEL_LANDS);
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
