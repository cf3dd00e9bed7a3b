//! # How the limiter works
//!
//! This module holds no items: it is the design of the crate, written once.
//! The docs of each type and method say what that item does and link here
//! for the why.
//!
//! - [One call's path](#one-calls-path), from `failed` to the row and back
//! - [The procedures' prologue](#the-procedures-prologue), the limiter's own
//!   short transaction
//! - [The schema](#the-schema): the table, row-level security, purge
//! - [The refusal cache](#the-refusal-cache) and [merging](#merging), the
//!   two defences under attack
//! - [Windows](#windows): fixed and sliding
//! - [Fail-open](#fail-open): what happens when the database is gone
//! - [Behind a tower layer](#behind-a-tower-layer): the layer's choices
//! - [Drivers](#drivers): tokio-postgres and sqlx, and what sqlx cannot do
//! - [In a service](#in-a-service): the steps for your own app
//!
//! Outside the crate docs: each promise with the test that keeps it
//! ([docs/GUARANTEES.md]), the benchmark figures ([docs/PERFORMANCE.md]),
//! who is trusted with what ([docs/THREAT_MODEL.md]) and the modules of the
//! source ([docs/ARCHITECTURE.md]).
//!
//! [docs/GUARANTEES.md]: https://github.com/platformkit/platformkit-limit/blob/main/docs/GUARANTEES.md
//! [docs/PERFORMANCE.md]: https://github.com/platformkit/platformkit-limit/blob/main/docs/PERFORMANCE.md
//! [docs/THREAT_MODEL.md]: https://github.com/platformkit/platformkit-limit/blob/main/docs/THREAT_MODEL.md
//! [docs/ARCHITECTURE.md]: https://github.com/platformkit/platformkit-limit/blob/main/docs/ARCHITECTURE.md
//!
//! # One call's path
//!
//! Take `limiter.failed(&login, &alice)` over [`Postgres`]:
//!
//! 1. **The stored key.** The limiter puts the limit's name in front of the
//!    key's encoding: `login|email|alice@example.com`. The same [`Key`] under
//!    two limits is two counters.
//! 2. **The refusal cache.** If this key is being flooded and the store
//!    refused it within the last TTL, that refusal is the answer, with no
//!    round trip ([below](#the-refusal-cache)).
//! 3. **The budget.** From here on everything, getting a connection
//!    included, ends within the limiter's budget (2 seconds unless set with
//!    [`LimiterBuilder::budget`]).
//! 4. **Merging.** If a statement for this key is already in flight from
//!    this process, the call joins the next one instead of sending its own
//!    ([below](#merging)).
//! 5. **A connection.** The store asks your [`LimitConn`] for one
//!    connection: a pool's, the request's own, or a new one from a
//!    [`tokio_postgres::Config`]; a tokio-postgres client or an sqlx
//!    connection ([drivers](#drivers)). The crate keeps no pool and no
//!    connection between calls.
//! 6. **One statement.** It sends one `CALL` of one of the limiter's
//!    procedures from [`SCHEMA`]
//!    (`CALL platformkit.platformkit_limit_add(p_key => $1, …)`), in
//!    autocommit, with the key as a bind parameter: one message, one network
//!    round trip, and plans the server caches per connection. (sqlx
//!    prepares the statement first, once per connection: one more round
//!    trip, the first time.)
//! 7. **The procedure** opens the limiter's own short system transaction
//!    with [the prologue](#the-procedures-prologue), checks its parameters
//!    and runs its one statement: an upsert for `failed`, `hit` and
//!    `reserve`, a read for `check`, a delete for `reset`, an update for a
//!    permit's take-back. The window comes from the database's clock. It ends
//!    with its own `COMMIT`.
//! 8. **The verdict.** The procedure returns counts: the window's count, the
//!    previous window's (for a sliding limit), the end of a lockout, the
//!    window's end and the time. One pure function turns counts into a
//!    [`Verdict`]; [`Memory`] uses the same function, so the two stores cannot
//!    drift apart.
//! 9. **After.** A refusal of a flooded key goes into the refusal cache. If
//!    the store could not be reached, the limit decides ([fail-open]); any
//!    other failure is an [`Error`]. The call is counted in the
//!    [metrics](crate::metric).
//!
//! The connection goes back to your source idle, outside any transaction.
//!
//! `check` before an attempt and `failed` after it race: a thousand
//! concurrent requests all pass the check before the first failure is
//! written. [`Limiter::reserve`] counts the attempt in the same statement
//! that decides. The several-limits calls ([`Limiter::check_all`] and its
//! siblings) send one statement for all their pairs.
//!
//! ## The budget on the server
//!
//! The budget left when the `CALL` is sent is split in three, so that the
//! server stops before the client gives up. With `a` a tenth of what is left
//! (at most 100 ms):
//!
//! ```text
//! |--------- server: left - 2a ---------|-- a --|-- a --|
//! sent                           lock_timeout  cancel  deadline
//! ```
//!
//! 1. The procedure sets the server's part as `lock_timeout`. A lock held by
//!    another session past it ends the call with SQLSTATE 55P03: the server
//!    answered, so it is not down, and the call is an
//!    [`ErrorKind::LockTimeout`] error, never an allow.
//! 2. A `CALL` still unanswered at the cancel mark is sent a cancel request,
//!    the one psql's Ctrl-C sends, while the limiter still holds the
//!    connection, so it can only reach this call. The server stops (57014),
//!    and since this call sent the cancel, the store counts as unreachable
//!    ([`ErrorKind::Timeout`]). A cancel the limiter did not send is
//!    [`ErrorKind::Cancelled`], never an allow. (A `statement_timeout`
//!    cannot do this job: a procedure cannot re-arm its own statement's
//!    timer.)
//! 3. If the deadline comes anyway, the request is already on its way: the
//!    server finishes or cancels it alone, and the connection goes back
//!    outside any transaction.
//!
//! The cancel request goes over a new connection without TLS: a server that
//! accepts only TLS refuses it, and then `lock_timeout` alone bounds the call
//! on the server. sqlx sends no cancel request at all ([drivers](#drivers)).
//!
//! ## Why procedures
//!
//! The alternative, an explicit `BEGIN`, a `SET LOCAL` for the switch, the
//! statement and `COMMIT`, even pipelined into one round trip, is several
//! protocol messages and a statement planned afresh on every call. The
//! procedures need no special privilege to create: the switch is set inside
//! their body, not with a `SET` clause on a custom parameter (which
//! PostgreSQL 15 refuses to ordinary roles without a grant).
//!
//! # The procedures' prologue
//!
//! Every procedure in [`SCHEMA`] (the writers: add, add-many, take-back,
//! reset, purge) begins the same way, between the comments `-- prologue`
//! and `-- end of prologue`. Each writes the prologue out rather than
//! calling a shared one: a nested `CALL` would cost every call a little
//! more.
//!
//! 1. **Refuse inside a transaction that has written** (SQLSTATE 2D000): a
//!    `DO` block, a caller's procedure, or an extended-protocol pipeline
//!    before its Sync. Refuse on a standby (SQLSTATE 25006, which counts as
//!    unreachable: the primary is not where the connection source pointed).
//! 2. **`COMMIT`**, which ends the `CALL`'s implicit transaction and starts
//!    the limiter's own. PostgreSQL refuses it inside a transaction block of
//!    the caller's, with the same 2D000. Either way the limiter never commits
//!    a caller's work: a connection handed over inside the caller's
//!    transaction is an [`ErrorKind::InTransaction`] error, that transaction
//!    is rolled back so the connection goes back idle, and nothing of it is
//!    committed.
//! 3. **`SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE`**,
//!    whatever the session's defaults (a serializable default would make
//!    concurrent upserts fail).
//! 4. **One `PERFORM` of five `set_config(…, true)` calls**, each for this
//!    transaction only, the first before any expression is evaluated:
//!    - `search_path` to `pg_catalog, pg_temp`, so that nothing the caller,
//!      its `"$user"` schema, a writable `public` or `pg_temp` holds can
//!      stand in for a built-in (and the table is always named with its
//!      schema);
//!    - `platformkit.system` to `on`: the system switch that the table's
//!      row-level security policy asks for;
//!    - `lock_timeout` to the server's part of the budget, in milliseconds;
//!    - `row_security` to `on`;
//!    - `plan_cache_mode` to `force_generic_plan`, so that the procedure's
//!      statements are planned once per connection rather than on every
//!      call.
//! 5. **Check the budget** (1 to 60,000 ms, [`Limiter::MAX_BUDGET`]; SQLSTATE 22023
//!    otherwise) and refuse (SQLSTATE PK001, [`ErrorKind::Misconfigured`])
//!    when the session's `statement_timeout` or `transaction_timeout` is no
//!    longer than the budget: the server would cancel the call before the
//!    limiter gives up on it, and a cancel the limiter did not send is never
//!    an outage. A refusal rolls the transaction back, and the settings of
//!    step 4 with it.
//!
//! After the prologue, the procedures that write set `synchronous_commit` to
//! `off` for their transaction when the store has
//! [relaxed durability](crate::Postgres::with_relaxed_durability). Then each
//! procedure checks its parameters against the bounds the Rust side
//! enforces (SQLSTATE 22023 otherwise), runs its one statement and ends with
//! `COMMIT`: nothing of the limiter's transaction (the switch, the settings,
//! a row lock) outlives the `CALL`, whoever called it.
//!
//! ## The readers
//!
//! `check` and `check_all` write nothing, so they need no transaction of
//! their own, and skip what it costs (two commits and a transaction start):
//! their statement is `SELECT * FROM platformkit.platformkit_limit_read(…)`
//! (or `_read_many`), a function that runs in whatever transaction the
//! connection is in. Its `SET` clauses pin the `search_path` and restore
//! `lock_timeout`, `row_security` and `plan_cache_mode` when it returns; its
//! own prologue (between `-- reader's prologue` and
//! `-- end of reader's prologue`) refuses on a standby (25006), checks the
//! budget and the session's timeouts as above, and refuses (2D000,
//! [`ErrorKind::InTransaction`]) a read inside a caller's REPEATABLE READ or
//! SERIALIZABLE transaction that began more than 100 ms before it, whose
//! snapshot could hold counts that old; then it turns the switch on, and
//! turns it back when its one read is done. A read inside a caller's READ
//! COMMITTED transaction sees the current counts and leaves that transaction
//! as it was (an error in the read aborts it, as any failed statement does).
//!
//! The session's other settings cannot break it: its isolation level,
//! read-only default, `TimeZone`, `DateStyle`, `search_path` and
//! `row_security` are overridden or do not matter (the window arithmetic
//! adds microsecond intervals and bins from the Unix epoch).
//!
//! # The schema
//!
//! [`SCHEMA`] (the file `schema.sql`) is a script safe to apply twice: put it
//! in your migrations, applied as the role that should own the table.
//! PostgreSQL 14 or newer. Everything lives in the schema `platformkit`,
//! which PUBLIC cannot use: a login without the grants cannot even name the
//! table. It creates:
//!
//! - `platformkit.platformkit_limits(key text, window_start timestamptz,
//!   window_end timestamptz, count bigint)`, primary key
//!   `(key, window_start)`: one row per key per window. `window_end` is there
//!   because limits have windows of different lengths and purge must know
//!   when each closed; a check keeps every window finite, forwards and at
//!   most 366 days long;
//! - the index on `window_end` that purge scans;
//! - `platformkit.platformkit_is_system()`:
//!   `current_setting('platformkit.system', true) = 'on'`, with a pinned
//!   `search_path`;
//! - `ENABLE` and `FORCE ROW LEVEL SECURITY`, and one policy for every
//!   command, `USING` and `WITH CHECK` both `platformkit_is_system()`: an
//!   ordinary transaction can neither read nor write limits;
//! - the limiter's procedures, one per operation.
//!
//! Applied over the earlier layout (everything in `public`), it moves the
//! table with its rows and drops the old procedures. Then give the role the
//! limiter connects as what [`grants`] prints: `USAGE` on the schema,
//! `SELECT, INSERT, UPDATE, DELETE` on the table and `EXECUTE` on the
//! procedures (again after applying a newer version). Owning the table is
//! fine: `FORCE` applies the policy to the owner too.
//!
//! [`purge`] deletes the rows whose window closed more than a day ago and
//! more than one window length ago (a sliding window still reads the window
//! before the current one), in batches, each its own short system
//! transaction, skipping rows a limiter call holds. It also deletes any row
//! no limit could have written (one stored before the table's check
//! existed), so no stored row can make it fail. Run it hourly from your
//! sweep job, or let [`PurgeTask`] run it in a tokio task.
//!
//! # The refusal cache
//!
//! Under a credential-stuffing run most attempts are at keys already
//! refused. Answering them in process keeps the attacker's load off the
//! shared database, which is what keeps the limiter reachable. So for a key
//! being flooded with attempts, this process answers "refused" itself, and
//! asks the store about the key again at most once per TTL.
//!
//! - **Only for flooded keys.** It engages for a key once the store has
//!   refused it [`Limiter::FLOOD_REFUSALS`] (3) times within [`Limiter::FLOOD_SPAN`] (1
//!   second) through this limiter, and stays engaged while refusals of the
//!   key (the store's or its own) keep coming that fast. A single refusal is
//!   never cached: a user refused once or twice has every call asked of the
//!   store.
//! - **Stale for at most a TTL.** An answer from the cache is a refusal the
//!   store gave to a call that asked at most the TTL earlier
//!   ([`Limiter::DEFAULT_REFUSAL_TTL`], 1 second; set with
//!   [`LimiterBuilder::refusal_ttl`]), or, while one call is refreshing it, at
//!   most the TTL and that call's round trip earlier; and never past the
//!   moment the store said the key reopens. So a `reset` made through
//!   another replica (support unlocking a user) is seen here by the next
//!   call for a key that is not flooded, and for a flooded key by the first
//!   call that starts once the TTL has run out. A `reset`, or a successful
//!   [`Permit`], through this limiter clears the key's entry at once.
//! - **At most one statement per flooded key per TTL.** When the TTL runs
//!   out while the key is still refused, exactly one call refreshes the
//!   refusal from the store while the others are still answered from the
//!   cache; refreshes start at least a TTL apart, so a flood of `T` seconds
//!   costs each flooded key at most `T / TTL + 1` statements per replica
//!   (with the default TTL, about one a second), plus the 3 refusals that
//!   engaged it and the calls already on their way to the store when the
//!   third came back. A refreshing call that is dropped frees its claim at
//!   once, and one never polled again frees it a budget after it began, so
//!   no call can pin the cache; while the store is unreachable, the refresh
//!   is tried once per budget.
//! - **It can never allow.** It holds only refusals the store gave, and
//!   answers only "refused".
//! - **Not counted.** Refused attempts answered here are not counted in the
//!   database. With a fixed window that changes no verdict; with a sliding
//!   window or a lockout it would only have prolonged the refusal.
//! - **Bounded.** At most [`Limiter::DEFAULT_REFUSAL_CACHE_KEYS`] keys by default
//!   ([`LimiterBuilder::refusal_cache`] sets another bound,
//!   [`LimiterBuilder::no_refusal_cache`] turns it off), evicted by
//!   [quick_cache](https://docs.rs/quick_cache)'s S3-FIFO policy.
//! - `check`, `failed`, `hit` and `reserve` read and fill it; the
//!   several-limits calls neither read nor fill it.
//!
//! The metrics show the load it saves: `platformkit_limit_calls_total`
//! counts the refusals it answered with `source="cache"`, and
//! `platformkit_limit_statements_total` counts the statements actually sent
//! (see [`metric`](crate::metric)).
//!
//! # Merging
//!
//! Concurrent `failed`, `hit` and `reserve` calls for the same key in one
//! process share one statement that adds their number at once.
//!
//! The first caller for a key sends its statement at once, alone: merging
//! adds no wait. Callers that arrive while it is in flight queue up; when it
//! returns, the first of them sends one statement for the whole queue,
//! adding its length, and each caller gets its own position's count: the
//! store's new count minus the callers after it. So `hit` still lets exactly
//! as many through as the limit leaves, and every count is written. Only
//! calls for the same stored key merge: a caller never waits on another
//! key's statement.
//!
//! Under a hot key (credential stuffing at one account) this turns a row
//! lock held through each commit, one caller at a time, into one lock and
//! one commit per batch. On by default; [`LimiterBuilder::no_merging`] turns
//! it off, and every call then sends its own statement.
//!
//! # Windows
//!
//! Each limit counts in fixed windows (the default) or with a sliding
//! estimate ([`Strategy::Sliding`]). Windows start at whole multiples of the
//! window's length since the Unix epoch, on the database's clock, so every
//! replica agrees on when a window opens and closes. Both strategies keep one
//! row per key per window and send one statement per call.
//!
//! | strategy | counts | the most let through in an instant | in any interval of length L ≤ W |
//! |---|---|---|---|
//! | fixed | the current window | `max` | **2 × `max`**, for any L ≥ 1 s: `max` just before an edge and `max` just after |
//! | sliding | the current window plus the previous one weighted by how much of it still overlaps the last W | `max` | ⌈`max` × (1 + L/W)⌉ |
//!
//! An attacker that asks exactly when an ask would pass, in bursts either
//! side of edges at many offsets and in steady streams, gets at most this
//! many through in any interval of L seconds, with `max` 10 and W 60 s:
//!
//! | L (s) | 0 | 1 | 2 | 5 | 10 | 15 | 20 | 30 | 45 | 60 |
//! |---|---|---|---|---|---|---|---|---|---|---|
//! | fixed | 10 | 20 | 20 | 20 | 20 | 20 | 20 | 20 | 20 | 20 |
//! | sliding | 10 | 11 | 11 | 11 | 12 | 13 | 14 | 15 | 18 | 20 |
//!
//! The same edge, with `max` 3:
//!
//! ```
//! use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory, Strategy};
//! use std::time::{Duration, UNIX_EPOCH};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let window = Duration::from_secs(60);
//! // One second before a window's edge.
//! let clock = ManualClock::new(UNIX_EPOCH + window * 30_000_000 - Duration::from_secs(1));
//! let limiter = Limiter::new(Memory::new().with_clock(clock.clone()));
//! let fixed = Limit::new("fixed", 3, window)?;
//! let sliding = Limit::builder("sliding", 3, window)
//!     .strategy(Strategy::Sliding)
//!     .build()?;
//! let key = Key::opaque("victim");
//! for limit in [&fixed, &sliding] {
//!     for _ in 0..3 {
//!         assert!(limiter.hit(limit, &key).await?.is_allowed());
//!     }
//! }
//!
//! clock.advance(Duration::from_secs(2)); // one second past the edge
//! // The fixed window starts again from zero: 6 asks in 2 seconds.
//! for _ in 0..3 {
//!     assert!(limiter.hit(&fixed, &key).await?.is_allowed());
//! }
//! // The sliding estimate still weighs the last window at 59/60: one more
//! // ask fits (4 in 2 seconds, ⌈3 × (1 + 2/60)⌉), the next does not.
//! assert!(limiter.hit(&sliding, &key).await?.is_allowed());
//! assert!(limiter.hit(&sliding, &key).await?.is_refused());
//! # Ok::<(), platformkit_limit::Error>(())
//! # }).unwrap();
//! ```
//!
//! A refused sliding verdict's
//! [`retry_after`](crate::Verdict::retry_after) is the first moment the
//! estimate falls below `max`, not the window's end. Purge keeps a row until
//! its window closed a day ago and one window length ago, so a sliding
//! window always finds the window before it.
//!
//! A lockout ([`Limit::lockout`]) keeps a key refused for a while after the
//! end of a window in which it reached `max`. It is read from that window's
//! own row, so one row per key per window still holds.
//!
//! # Fail-open
//!
//! When the store cannot be reached within the budget, the limit's
//! [`WhenUnreachable`] decides: by default the attempt is allowed without a
//! count. Whatever the choice, the verdict says so
//! ([`Verdict::is_unreachable`], and [`Verdict::unreachable`] for the cause),
//! the call is counted with `outcome="unreachable"`, and with the `tracing`
//! feature a warning event names the limit, the operation and the cause
//! (never the key).
//!
//! Unreachable means [`ErrorKind::Connect`] or [`ErrorKind::Timeout`]: the
//! connection source failed, the connection was refused or lost, the server
//! is shutting down, full or a standby, or the budget ran out (waiting for a
//! connection, or for an answer the limiter then cancelled). Everything else
//! is a hard [`Error`], never a silent allow: a missing table, a missing
//! privilege, a row-level security denial, a lock another session held past
//! the server's part of the budget, a cancel the limiter did not send, a
//! connection inside a transaction, a session timeout shorter than the
//! budget, and a connection source that fails for a reason an outage does
//! not explain. [`ErrorKind`]'s docs hold the table of SQLSTATEs. A `reset`
//! allows nothing and refuses nothing, so there unreachable is an error too.
//!
//! Fail-open gives whoever can make the database unreachable attempts
//! without a count while it lasts. Alert on `outcome="unreachable"` (the
//! repository's `contrib/prometheus/alerts.yml` pages on any in 5 minutes),
//! and choose [`WhenUnreachable::Refuse`] or
//! [`WhenUnreachable::CountLocally`] for the limits where that is worse than
//! locking users out.
//!
//! # Behind a tower layer
//!
//! With the `tower` feature, `LimitLayer` puts the limiter in front of any
//! `http` service (axum, tonic, hyper), so handlers stay free of it. Each
//! rule is a limit and a key function over the request head. The body is
//! never read, so a key only the body holds (a login form's account) stays
//! in the handler, with [`Limiter::reserve`]. A key function that returns
//! `None` exempts the request from its rule.
//!
//! - `hit` counts every request (API quotas). `attempt` reserves the request
//!   before the service runs and takes it back when the response says it
//!   succeeded: only failures count, without the race between `check` and
//!   `failed`.
//! - Every rule that gives a key is decided in one statement
//!   ([`Limiter::hit_all`], [`Limiter::reserve_all`]); a success in
//!   `attempt` mode adds one take-back per limit.
//! - A refusal by a count answers 429 with `Retry-After`. A refusal with no
//!   count (the store unreachable, the limit [`WhenUnreachable::Refuse`])
//!   answers 503, and a hard error 500: never a silent allow, as in
//!   [fail-open]. The caller may replace each answer; the layer still adds
//!   `Retry-After` to a refusal.
//! - The `RateLimit-Policy` and `RateLimit` fields of the IETF draft are
//!   sent only for the limits the layer is told to advertise: on a
//!   per-account limit they would tell an attacker how many guesses are
//!   left. The key is never sent.
//! - The client's address is what the deployment resolved (axum's
//!   `ConnectInfo`, or a `ClientIp` your own middleware sets), never
//!   `X-Forwarded-For` read by the layer: any client can write that header.
//!   A per-address rule answers 500 to a request with no address rather
//!   than let it through unlimited.
//!
//! `LimitLayer`'s docs show both modes; `ClientIp`'s say why the layer
//! leaves proxies to the deployment.
//!
//! # Drivers
//!
//! A [`LimitConn`] lends a [`Session`]: a connection the limiter can send
//! its statement on. Whatever the driver, a call is the same statement, with
//! the same bind parameters and the same budget; its answer is read the same
//! way, and its errors go through the same SQLSTATE table ([`ErrorKind`]).
//!
//! | | tokio-postgres | sqlx (feature `sqlx`) |
//! |---|---|---|
//! | connection sources | anything that derefs to a `Client`: a closure's guard, [`Connected`] ([`Config`](tokio_postgres::Config), [`Connect`]), deadpool, bb8 | `sqlx::PgPool`; [`SqlxConn`] around a `PoolConnection<Postgres>`, a held `PgConnection` or a `&mut PgConnection` |
//! | the statement | one unnamed Parse, Bind, Execute and Sync: one round trip, nothing prepared that outlives it | sqlx's own: prepared once per connection as a named statement and cached, then one round trip per call |
//! | near the deadline | a cancel request stops the `CALL` on the server | no cancel request: the client gives up at the deadline |
//! | PgBouncer, transaction mode | any version | 1.21 or newer, with `max_prepared_statements` set (the default from 1.24) |
//!
//! **What sqlx cannot do: cancel.** sqlx keeps the backend's cancel key to
//! itself, so the limiter has nothing to send a cancel request with. The
//! server's part of the budget still bounds every lock wait: a row lock held
//! past it is [`ErrorKind::LockTimeout`] on either driver. A `CALL` slow for
//! another reason (a saturated disk, a synchronous standby that does not
//! answer) goes on after the limiter gave up at the deadline, and that
//! means three things:
//!
//! - the verdict says unreachable ([`ErrorKind::Timeout`], with no
//!   SQLSTATE), and the limit's [`WhenUnreachable`] applies, but the `CALL`
//!   may still commit: the count it carried then lands after all, and the
//!   next call sees it. An answer after the deadline cannot be told from no
//!   answer; the limiter never takes it as a verdict.
//! - the connection is busy until the `CALL` ends: the next statement on it
//!   waits (the pool's `PoolConnection` tests it before taking it back,
//!   which waits too).
//! - a commit waiting for a synchronous standby is never acknowledged: the
//!   limiter gave up on it, as it does when tokio-postgres cancels one.
//!
//! **sqlx through PgBouncer.** sqlx prepares every statement it binds as a
//! named statement, the limiter's as well as the service's own. Only a
//! PgBouncer that carries named prepared statements from one server
//! connection to the next (1.21 or newer, `max_prepared_statements` above
//! zero) can pass them on; through an older one, two sqlx clients of one
//! server connection collide on a statement's name, and the limiter's call
//! is a hard error ([`ErrorKind::Query`], SQLSTATE 42P05 or 26000), never an
//! allow. The tokio-postgres driver prepares nothing and works through any
//! PgBouncer.
//!
//! **Two things sqlx's pool does.** It pings a connection before lending it
//! unless `test_before_acquire(false)`: a round trip of the pool's, before
//! the limiter's. And it retries a refused connection until its own
//! `acquire_timeout`, so a server that does not listen is unreachable as a
//! [`ErrorKind::Timeout`] at the end of the limiter's budget rather than a
//! [`ErrorKind::Connect`] at once.
//!
//! The repository's `tests/drivers.rs` runs each behaviour test, written
//! once, on both drivers; `examples/sqlx_login.rs` is a login over a
//! service's own `PgPool`.
//!
//! # In a service
//!
//! 1. Apply [`SCHEMA`] in your migrations, and run what [`grants`] prints
//!    for the limiter's role.
//! 2. Build one `Limiter::new(Postgres::new(pool.clone()))` at start-up and
//!    share it in your state. Pools are sources behind cargo features
//!    (`deadpool`, `bb8`, `sqlx`); the pool's wait counts against the call's
//!    budget, so an exhausted pool is an unreachable store once the budget
//!    is spent, never a hang.
//! 3. Make each [`Limit`] once.
//! 4. In the handler, `check` before the expensive work and `failed` after a
//!    failure (or [`Limiter::reserve`] before it), and answer a refused
//!    verdict with 429 and a `Retry-After` of
//!    [`retry_after_secs`](crate::Verdict::retry_after_secs); or, for keys
//!    the request head holds, put a [tower layer](#behind-a-tower-layer) in
//!    front of the routes.
//! 5. Install a Prometheus recorder, give the duration histogram buckets,
//!    and alert on `outcome="unreachable"`.
//! 6. Run [`purge`] hourly, or start a [`PurgeTask`].
//!
//! The repository's `examples/axum_sqlx.rs` is a complete axum service
//! doing steps 1 to 6 over an sqlx pool, the limits in a layer:
//! `cargo run --example axum_sqlx --features sqlx,axum`.
//! `examples/axum_login.rs` calls the limiter in the handler, over deadpool.
//!
//! [fail-open]: #fail-open
//! [`Limiter::DEFAULT_REFUSAL_CACHE_KEYS`]: crate::Limiter::DEFAULT_REFUSAL_CACHE_KEYS
//! [`Limiter::DEFAULT_REFUSAL_TTL`]: crate::Limiter::DEFAULT_REFUSAL_TTL
//! [`Limiter::FLOOD_REFUSALS`]: crate::Limiter::FLOOD_REFUSALS
//! [`Limiter::FLOOD_SPAN`]: crate::Limiter::FLOOD_SPAN
//! [`LimiterBuilder::refusal_ttl`]: crate::LimiterBuilder::refusal_ttl
//! [`Error`]: crate::Error
//! [`ErrorKind::InTransaction`]: crate::ErrorKind::InTransaction
//! [`ErrorKind::Misconfigured`]: crate::ErrorKind::Misconfigured
//! [`Key`]: crate::Key
//! [`Limit`]: crate::Limit
//! [`Limit::lockout`]: crate::Limit::lockout
//! [`Strategy::Sliding`]: crate::Strategy::Sliding
//! [`LimitConn`]: crate::LimitConn
//! [`Session`]: crate::Session
//! [`Connected`]: crate::Connected
//! [`Connect`]: crate::Connect
//! [`SqlxConn`]: crate::SqlxConn
//! [`ErrorKind::Query`]: crate::ErrorKind::Query
//! [`Limiter::check_all`]: crate::Limiter::check_all
//! [`Limiter::hit_all`]: crate::Limiter::hit_all
//! [`Limiter::reserve_all`]: crate::Limiter::reserve_all
//! [`Limiter::reserve`]: crate::Limiter::reserve
//! [`LimiterBuilder::budget`]: crate::LimiterBuilder::budget
//! [`LimiterBuilder::refusal_cache`]: crate::LimiterBuilder::refusal_cache
//! [`LimiterBuilder::no_merging`]: crate::LimiterBuilder::no_merging
//! [`LimiterBuilder::no_refusal_cache`]: crate::LimiterBuilder::no_refusal_cache
//! [`Memory`]: crate::Memory
//! [`Permit`]: crate::Permit
//! [`PurgeTask`]: crate::PurgeTask
//! [`SCHEMA`]: crate::SCHEMA
//! [`Verdict`]: crate::Verdict
//! [`Verdict::is_unreachable`]: crate::Verdict::is_unreachable
//! [`Verdict::unreachable`]: crate::Verdict::unreachable
//! [`WhenUnreachable`]: crate::WhenUnreachable
//! [`WhenUnreachable::CountLocally`]: crate::WhenUnreachable::CountLocally
//! [`WhenUnreachable::Refuse`]: crate::WhenUnreachable::Refuse
//! [`Postgres`]: crate::Postgres
//! [`ErrorKind`]: crate::ErrorKind
//! [`ErrorKind::Connect`]: crate::ErrorKind::Connect
//! [`ErrorKind::Timeout`]: crate::ErrorKind::Timeout
//! [`ErrorKind::LockTimeout`]: crate::ErrorKind::LockTimeout
//! [`ErrorKind::Cancelled`]: crate::ErrorKind::Cancelled
//! [`Limiter::MAX_BUDGET`]: crate::Limiter::MAX_BUDGET
//! [`grants`]: crate::grants
//! [`purge`]: crate::purge
