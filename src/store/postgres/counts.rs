//! The store's calls on [`Postgres`]: each a statement of [`sql`] and its
//! row read into counts.

use std::time::{Duration, SystemTime};

use snafu::ensure;
use tokio::time::Instant;

use super::Postgres;
use super::deleted;
use crate::clock::{from_micros, micros_since_epoch};
use crate::decide::{Counted, Counting};
use crate::driver::{Failure, Row};
use crate::error::UnexpectedSnafu;
use crate::metric::Operation;
use crate::store::{Asked, sealed, sql};
use crate::{AuditAction, AuditEntry, Error, Limit, LimitConn, Strategy};

impl<C: LimitConn> sealed::Sealed for Postgres<C> {
    type Held = Held<C::Conn>;

    fn commit_wait(held: &Held<C::Conn>) -> Option<Duration> {
        held.commit_wait
    }

    fn local_now(&self) -> SystemTime {
        self.clock.local_now()
    }

    async fn down_before(&self) -> bool {
        self.health.down_before(self.ask_server()).await
    }

    async fn down_after(&self, error: &Error) -> bool {
        if crate::driver::refused_at_transport(error) {
            return true;
        }
        self.health.down(self.ask_server()).await
    }

    async fn count(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        n: u64,
        deadline: Instant,
        held: &mut Held<C::Conn>,
    ) -> Result<Counted, Error> {
        let operation = op.operation();
        held.commit_wait = None;
        // A pinned clock out of bounds is refused before a connection is taken.
        let pinned = self.pinned()?;
        let window = i64::try_from(limit.window_secs()).expect("windows are at most 366 days");
        let previous = limit.strategy() == Strategy::Sliding;
        let max = i64::from(limit.max());
        let lockout = i64::try_from(limit.lockout_secs()).expect("at most a day");
        let row = if op.adds() {
            self.send_on(&mut held.conn, operation, deadline, |budget_ms| {
                sql::Add {
                    key,
                    add: i64::try_from(n).unwrap_or(i64::MAX),
                    window_secs: window,
                    at: pinned,
                    budget_ms,
                    relaxed: self.relaxed,
                    previous,
                    max,
                    lockout_secs: lockout,
                }
                .statement()
            })
            .await?
        } else {
            self.send_on(&mut held.conn, operation, deadline, |budget_ms| {
                sql::Read {
                    key,
                    window_secs: window,
                    at: pinned,
                    budget_ms,
                    previous,
                    max,
                    lockout_secs: lockout,
                }
                .statement()
            })
            .await?
        };
        if !op.adds() {
            let mut one = counted_pairs(&row, operation, 1, true)?;
            return Ok(one.remove(0));
        }
        held.commit_wait = commit_wait(&row);
        let get = |i| {
            row.int8(i)
                .map_err(|e: Failure| e.into_error(operation, false))
        };
        counted(operation, get(2)?, [get(0)?, get(1)?, get(3)?, get(4)?])
    }

    async fn count_many(
        &self,
        op: Counting,
        asked: &[Asked<'_>],
        deadline: Instant,
        held: &mut Held<C::Conn>,
    ) -> Result<Vec<Counted>, Error> {
        let operation = op.operation();
        held.commit_wait = None;
        let pinned = self.pinned()?;
        let pairs = Pairs::of(asked);
        let row = if op.adds() {
            self.send_on(&mut held.conn, operation, deadline, |budget_ms| {
                pairs.added(pinned, budget_ms, self.relaxed).statement()
            })
            .await?
        } else {
            self.send_on(&mut held.conn, operation, deadline, |budget_ms| {
                sql::ReadMany {
                    keys: &pairs.keys,
                    window_secs: &pairs.windows,
                    at: pinned,
                    budget_ms,
                    previous: pairs.sliding.contains(&true),
                    maxes: &pairs.maxes,
                    lockout_secs: &pairs.lockouts,
                }
                .statement()
            })
            .await?
        };
        if op.adds() {
            held.commit_wait = commit_wait(&row);
        }
        counted_pairs(&row, operation, asked.len(), !op.adds())
    }

    async fn count_all_or_none(
        &self,
        asked: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<(Vec<Counted>, bool), Error> {
        let operation = Counting::HIT_ALL_OR_NOTHING.operation();
        let pinned = self.pinned()?;
        let pairs = Pairs::of(asked);
        let row = self
            .send(operation, deadline, |budget_ms| {
                pairs.added(pinned, budget_ms, self.relaxed).all_or_none()
            })
            .await?;
        let counted = counted_pairs(&row, operation, asked.len(), false)?;
        let added = row.boolean(5).map_err(|e| e.into_error(operation, false))?;
        Ok((counted, added))
    }

    async fn take_back(
        &self,
        key: &str,
        window_start: SystemTime,
        n: u64,
        deadline: Instant,
    ) -> Result<u64, Error> {
        let operation = Operation::TakeBack;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::TakeBack {
                    key,
                    window_start: micros_since_epoch(window_start),
                    n: i64::try_from(n).unwrap_or(i64::MAX),
                    budget_ms,
                    relaxed: self.relaxed,
                }
                .statement()
            })
            .await?;
        deleted(&row, Operation::TakeBack)
    }

    async fn refused(
        &self,
        limit: &Limit,
        prefix: &str,
        at_most: usize,
        deadline: Instant,
    ) -> Result<Vec<(String, Counted)>, Error> {
        let operation = Operation::RefusedKeys;
        let pinned = self.pinned()?;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::List {
                    prefix,
                    window_secs: i64::try_from(limit.window_secs()).expect("at most 366 days"),
                    at: pinned,
                    budget_ms,
                    previous: limit.strategy() == Strategy::Sliding,
                    max: i64::from(limit.max()),
                    lockout_secs: i64::try_from(limit.lockout_secs()).expect("at most a day"),
                    at_most: i64::try_from(at_most).unwrap_or(i64::MAX),
                }
                .statement()
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
        let keys: Vec<String> = row.texts(0).map_err(get)?;
        let counts: Vec<i64> = row.int8s(1).map_err(get)?;
        let window_end: i64 = row.int8(2).map_err(get)?;
        let now: i64 = row.int8(3).map_err(get)?;
        let previous: Vec<i64> = row.int8s(4).map_err(get)?;
        let locked_for: Vec<i64> = row.int8s(5).map_err(get)?;
        ensure!(
            [counts.len(), previous.len(), locked_for.len()]
                .iter()
                .all(|&n| n == keys.len())
                && keys.len() <= at_most,
            UnexpectedSnafu {
                operation,
                what: "a listing whose columns disagree, or longer than asked",
            }
        );
        keys.into_iter()
            .zip(counts)
            .zip(previous)
            .zip(locked_for)
            .map(|(((key, count), previous), locked_for)| {
                counted(operation, now, [count, window_end, previous, locked_for])
                    .map(|counted| (key, counted))
            })
            .collect()
    }

    async fn define(&self, limit: &Limit, deadline: Instant) -> Result<(), Error> {
        let limit = limit.defined();
        self.send(Operation::Operator, deadline, |budget_ms| {
            sql::Define {
                name: limit.name(),
                max: i64::from(limit.max()),
                window_secs: i64::try_from(limit.window_secs()).expect("at most 366 days"),
                sliding: limit.strategy() == Strategy::Sliding,
                lockout_secs: i64::try_from(limit.lockout_secs()).expect("at most a day"),
                budget_ms,
            }
            .statement()
        })
        .await
        .map(drop)
    }

    async fn limits(&self, deadline: Instant) -> Result<Vec<Limit>, Error> {
        let operation = Operation::Operator;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::Limits { budget_ms }.statement()
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
        let names: Vec<String> = row.texts(0).map_err(get)?;
        let numbers: Vec<i64> = row.int8s(1).map_err(get)?;
        let bad = || unexpected(operation, "a recorded limit out of bounds");
        ensure!(
            numbers.len() == 4 * names.len(),
            UnexpectedSnafu {
                operation,
                what: "a different number of settings than limits",
            }
        );
        names
            .iter()
            .zip(numbers.chunks_exact(4))
            .map(|(name, settings)| {
                let &[max, window, sliding, lockout] = settings else {
                    return Err(bad());
                };
                let (Ok(max), Ok(window), Ok(lockout)) = (
                    u32::try_from(max),
                    u64::try_from(window),
                    u64::try_from(lockout),
                ) else {
                    return Err(bad());
                };
                let mut builder = Limit::builder(name, max, Duration::from_secs(window));
                if sliding == 1 {
                    builder = builder.strategy(Strategy::Sliding);
                }
                if lockout > 0 {
                    builder = builder.lockout(Duration::from_secs(lockout));
                }
                builder.build().map_err(|_| bad())
            })
            .collect()
    }

    async fn operate(
        &self,
        action: AuditAction,
        key: &str,
        block_for: Duration,
        (by, reason): (&str, &str),
        deadline: Instant,
    ) -> Result<(u64, Option<SystemTime>), Error> {
        let operation = Operation::Operator;
        let at = self.pinned()?;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::Operate {
                    action: action.as_str(),
                    key,
                    block_secs: (action == AuditAction::Block)
                        .then(|| i64::try_from(block_for.as_secs()).unwrap_or(i64::MAX)),
                    at,
                    by,
                    reason,
                    budget_ms,
                }
                .statement()
            })
            .await?;
        let deleted = deleted(&row, operation)?;
        let until = row.int8(1).map_err(|e| e.into_error(operation, false))?;
        let until = (until != 0).then(|| from_micros(until));
        Ok((deleted, until))
    }

    async fn audit(
        &self,
        prefix: &str,
        at_most: usize,
        deadline: Instant,
    ) -> Result<Vec<AuditEntry>, Error> {
        let operation = Operation::Operator;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::Audit {
                    prefix,
                    at_most: i64::try_from(at_most).unwrap_or(i64::MAX),
                    budget_ms,
                }
                .statement()
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
        let texts: Vec<String> = row.texts(0).map_err(get)?;
        let numbers: Vec<i64> = row.int8s(1).map_err(get)?;
        let bad = || unexpected(operation, "an audit whose columns disagree");
        if texts.len() % 4 != 0 || numbers.len() % 3 != 0 || texts.len() / 4 != numbers.len() / 3 {
            return Err(bad());
        }
        texts
            .chunks_exact(4)
            .zip(numbers.chunks_exact(3))
            .map(|(t, n)| {
                Ok(AuditEntry {
                    at: from_micros(n[0]),
                    by: t[0].clone(),
                    action: AuditAction::from_name(&t[1]).ok_or_else(bad)?,
                    stored: t[2].clone(),
                    until: (n[1] != 0).then(|| from_micros(n[1])),
                    windows: u64::try_from(n[2]).ok(),
                    reason: t[3].clone(),
                })
            })
            .collect()
    }

    async fn reset(&self, key: &str, deadline: Instant) -> Result<u64, Error> {
        let operation = Operation::Reset;
        let row = self
            .send(operation, deadline, |budget_ms| {
                sql::Reset {
                    key,
                    budget_ms,
                    relaxed: self.relaxed,
                }
                .statement()
            })
            .await?;
        deleted(&row, Operation::Reset)
    }
}

/// A count as stored. The table's CHECK keeps counts non-negative; were one
/// ever negative, refusing is the safe reading.
fn stored_count(count: i64) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// The arrays of a statement over several pairs, each in the order given.
struct Pairs<'a> {
    keys: Vec<&'a str>,
    windows: Vec<i64>,
    adds: Vec<i64>,
    sliding: Vec<bool>,
    maxes: Vec<i64>,
    lockouts: Vec<i64>,
}

impl<'a> Pairs<'a> {
    fn of(asked: &[Asked<'a>]) -> Self {
        Pairs {
            keys: asked.iter().map(|pair| pair.key).collect(),
            windows: asked
                .iter()
                .map(|pair| i64::try_from(pair.limit.window_secs()).expect("at most 366 days"))
                .collect(),
            adds: asked
                .iter()
                .map(|pair| i64::try_from(pair.n).unwrap_or(i64::MAX))
                .collect(),
            sliding: asked
                .iter()
                .map(|pair| pair.limit.strategy() == Strategy::Sliding)
                .collect(),
            maxes: asked.iter().map(|p| i64::from(p.limit.max())).collect(),
            lockouts: asked
                .iter()
                .map(|p| i64::try_from(p.limit.lockout_secs()).expect("at most a day"))
                .collect(),
        }
    }

    /// The arguments that add each pair's amount.
    fn added(&self, at: Option<i64>, budget_ms: i64, relaxed: bool) -> sql::AddMany<'_> {
        sql::AddMany {
            keys: &self.keys,
            window_secs: &self.windows,
            adds: &self.adds,
            at,
            budget_ms,
            relaxed,
            sliding: &self.sliding,
            maxes: &self.maxes,
            lockout_secs: &self.lockouts,
        }
    }
}

/// A pair's count as the statements answer it, at `now`: its count, its
/// window's end, the previous window's count, and the lockout still to run
/// (0 for none; below 0 an error, never read as no lockout); instants and
/// spans in microseconds.
fn counted(
    operation: Operation,
    now: i64,
    [count, window_end, previous, locked_for]: [i64; 4],
) -> Result<Counted, Error> {
    ensure!(
        locked_for >= 0,
        UnexpectedSnafu {
            operation,
            what: "a lockout that ended before the time it was read at",
        }
    );
    Ok(Counted {
        count: stored_count(count),
        previous: stored_count(previous),
        locked_until: (locked_for > 0).then(|| from_micros(now.saturating_add(locked_for))),
        window_end: from_micros(window_end),
        now: from_micros(now),
    })
}

/// What a run of statements on [`Postgres`] keeps from one to the next
/// ([`Sealed::Held`](sealed::Sealed::Held)).
pub struct Held<T> {
    pub(super) conn: Option<T>,
    commit_wait: Option<Duration>,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            conn: None,
            commit_wait: None,
        }
    }
}

/// How long a write's commit waited: the last column of `add` and
/// `add_many` (`o_commit_us`), if it reads.
fn commit_wait(row: &Row) -> Option<Duration> {
    let micros = row.int8(5).ok()?;
    Some(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
}

/// The counts of a statement over `pairs` pairs, in the order given: a
/// writer's columns, or a reader's one array ([`sql::ReadMany`]).
fn counted_pairs(
    row: &Row,
    operation: Operation,
    pairs: usize,
    reader: bool,
) -> Result<Vec<Counted>, Error> {
    let get = |e: Failure| e.into_error(operation, false);
    let (now, quads): (i64, Vec<[i64; 4]>) = if reader {
        let answer = row.int8s(0).map_err(get)?;
        ensure!(
            answer.len() == 1 + 4 * pairs,
            UnexpectedSnafu {
                operation,
                what: "a different number of counts than pairs asked",
            }
        );
        let quads = answer[1..]
            .chunks_exact(4)
            .map(|q| [q[0], q[1], q[2], q[3]]);
        (answer[0], quads.collect())
    } else {
        let [counts, ends, previous, locked] = [0, 1, 3, 4].map(|i| row.int8s(i));
        let (counts, ends, previous, locked) = (
            counts.map_err(get)?,
            ends.map_err(get)?,
            previous.map_err(get)?,
            locked.map_err(get)?,
        );
        ensure!(
            [ends.len(), previous.len(), locked.len()]
                .iter()
                .all(|&n| n == counts.len()),
            UnexpectedSnafu {
                operation,
                what: "a different number of counts than pairs asked",
            }
        );
        let quads = (0..counts.len()).map(|i| [counts[i], ends[i], previous[i], locked[i]]);
        (row.int8(2).map_err(get)?, quads.collect())
    };
    ensure!(
        quads.len() == pairs,
        UnexpectedSnafu {
            operation,
            what: "a different number of counts than pairs asked",
        }
    );
    quads
        .into_iter()
        .map(|quad| counted(operation, now, quad))
        .collect()
}

/// An answer the crate cannot read: never a guess.
fn unexpected(operation: Operation, what: &'static str) -> Error {
    UnexpectedSnafu { operation, what }.build().into()
}
