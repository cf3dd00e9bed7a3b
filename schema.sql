-- platformkit-limit: a limit is a row.
--
-- schema.sql is built from schema/limits.sql, each routine's prologue put
-- in from schema/prologue.sql or schema/readers_prologue.sql: edit those,
-- then `PLATFORMKIT_WRITE_SCHEMA=1 cargo test --test suite schema::` (a
-- test fails while the two differ).
--
-- One row per key per window, in the table platformkit.platformkit_limits.
-- Only the limiter writes it, inside its own short system transaction; every
-- other transaction can neither read nor write it (FORCE ROW LEVEL SECURITY,
-- one policy, both directions).
--
-- Everything lives in the schema `platformkit`, which PUBLIC cannot use: a
-- login without the grants below cannot even name the table, so it cannot
-- queue for the table's locks either (PostgreSQL takes some table locks
-- before it checks table privileges, but never before schema USAGE).
--
-- Safe to apply twice. Needs PostgreSQL 14 or newer. Apply it as the role that should own the
-- table (the migration role), as one transaction that stops at the first
-- error (`Postgres::migrate` sends it so; with psql,
-- `psql -1 -v ON_ERROR_STOP=1 -f schema.sql`); then grant the limiter's role
-- what `platformkit_limit::grants(role)` prints:
--
--   GRANT USAGE ON SCHEMA platformkit TO app;
--   GRANT SELECT, INSERT, UPDATE, DELETE ON platformkit.platformkit_limits TO app;
--   GRANT EXECUTE ON ALL ROUTINES IN SCHEMA platformkit TO app;
--
-- (run that again after applying a newer version of this file).
--
-- Bounds. Each bound the Rust side enforces (the budget, the key's length,
-- the window, the max, the lockout, the pinned clock's years) is one
-- IMMUTABLE SQL function of no arguments, below, and every routine checks
-- against that function: a bound changes in one line here and in its Rust
-- constant, and a test holds the two together. Not literals held together
-- by a test (there were 35 copies of 60000 to edit), and not text generated
-- from the Rust constants (SCHEMA is applied with psql too, so this file
-- must be the plain SQL it ships as). It costs nothing at run time: the
-- planner folds each call into its constant when it plans the check (an
-- EXPLAIN of the generic plan shows the constant), and on PostgreSQL 15 a
-- PL/pgSQL IF over the function and one over the literal took the same
-- time, 70 to 105 ns an evaluation over 2,000,000 in either case.
--
-- Versions. platformkit.platformkit_schema_version() returns the version of
-- the schema this file creates, the crate's SCHEMA_VERSION (a test holds the
-- two together). A release that changes anything this file creates raises
-- both by one, in the same commit, with what an install of the version
-- before needs carried forward. Version 1 is what 0.1.0 ships: the layouts
-- before the first release, which no user has, have no upgrade.

-- Replicas that apply this at the same moment (each on its start-up) take
-- turns: two concurrent CREATE SCHEMA IF NOT EXISTS (or CREATE OR REPLACE of
-- one routine) can collide in the catalog. The lock is the transaction's, so
-- it holds when the file goes as one script (one simple-query message, as
-- Postgres::migrate sends it) or inside a migration tool's transaction.
-- Any login may take any advisory lock, so the wait is bounded (the setting
-- platformkit.migrate_lock_wait, 30 s when unset): past it, nothing is
-- applied and the error (PK005) names who holds the key, so that a session
-- holding it can fail a start-up but never hang one.
DO $$
DECLARE
    v_setting pg_catalog.text := pg_catalog.current_setting('platformkit.migrate_lock_wait', true);
    v_wait pg_catalog.interval := CASE
        WHEN v_setting IS NULL OR v_setting OPERATOR(pg_catalog.=) '' THEN '30s'::pg_catalog.interval
        ELSE v_setting::pg_catalog.interval END;
    v_until pg_catalog.timestamptz := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) v_wait;
    v_holders pg_catalog.text;
BEGIN
    -- 31643310761011572, the bytes of 'pklimit'.
    WHILE NOT pg_catalog.pg_try_advisory_xact_lock(31643310761011572) LOOP
        IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) v_until THEN
            SELECT pg_catalog.string_agg(pg_catalog.format('pid %s (role %s)', l.pid, a.usename), ', ')
            INTO v_holders
            FROM pg_catalog.pg_locks AS l
            LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) l.pid
            WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
              AND l.database OPERATOR(pg_catalog.=) (
                  SELECT d.oid FROM pg_catalog.pg_database AS d
                  WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
              AND l.classid OPERATOR(pg_catalog.=) 7367532::pg_catalog.oid
              AND l.objid OPERATOR(pg_catalog.=) 1768778100::pg_catalog.oid
              AND l.objsubid OPERATOR(pg_catalog.=) 1::pg_catalog.int2;
            RAISE EXCEPTION USING
                ERRCODE = 'PK005',
                MESSAGE = pg_catalog.format(
                    'platformkit: the schema''s lock (advisory key 31643310761011572) was held past %s '
                    'by %s: nothing applied; end that session (or REVOKE EXECUTE on the advisory lock '
                    'functions FROM PUBLIC), then apply the schema again',
                    v_wait, COALESCE(v_holders, 'a session that has let it go since'));
        END IF;
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END
$$;

-- A database whose schema is newer than this file's is left as it is: a
-- replica of the release before, starting during a rolling deploy, must not
-- put its routines back over the newer ones. The number is this file's
-- version (the function below; a test holds the two together).
DO $$
DECLARE
    found integer;
BEGIN
    IF pg_catalog.to_regprocedure('platformkit.platformkit_schema_version()') IS NULL THEN
        RETURN; -- a new install, or one from before versions were recorded
    END IF;
    -- EXECUTE: a plain call would be planned, and fail, where the function
    -- does not exist.
    EXECUTE 'SELECT platformkit.platformkit_schema_version()' INTO found;
    IF found > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PK002',
            MESSAGE = pg_catalog.format(
                'platformkit: the database has schema version %s, newer than this file''s, 1: '
                'nothing applied; apply the schema of the newer release', found);
    END IF;
END
$$;

CREATE SCHEMA IF NOT EXISTS platformkit;
REVOKE ALL ON SCHEMA platformkit FROM PUBLIC;

-- The version of this file's schema, the crate's SCHEMA_VERSION: a newcomer,
-- a migration tool or the crate can ask a database which schema it has
-- (`SELECT platformkit.platformkit_schema_version()`). See the top of this
-- file for when it changes.
CREATE OR REPLACE FUNCTION platformkit.platformkit_schema_version() RETURNS integer
    LANGUAGE sql
    IMMUTABLE
    PARALLEL SAFE
RETURN 1;

-- The bounds the Rust side enforces, each written once: the routines below
-- check their parameters against these functions, never against the
-- numbers. Each is an IMMUTABLE SQL function of no arguments, so the
-- planner folds a call into its constant when it plans the check: the
-- check costs what a literal would (see the top of this file). The lower
-- bounds (1, or 0 for the lockout) are written where they are checked.
-- Limiter::MAX_BUDGET, in milliseconds.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_budget_ms() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 60000;
-- The longest stored key, in bytes: Limit::MAX_NAME_BYTES, '|' and
-- Key::MAX_BYTES.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_key_bytes() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 249;
-- Limit::MAX_WINDOW, in seconds (366 days). The table's window check and
-- the column purge_after spell it too: a constraint is the table's, and an
-- install keeps the one it was created with (a test holds them to this).
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_window_secs() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 31622400;
-- Limit::MAX_ATTEMPTS.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_attempts() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000000000;
-- Limit::MAX_LOCKOUT, in seconds.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_lockout_secs() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 86400;
-- Instants cross the wire as integers, microseconds since the Unix epoch.
-- A pinned time (p_at) is from 1900-01-01 on, and before 2200-01-01 (UTC).
CREATE OR REPLACE FUNCTION platformkit.platformkit_min_at() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN -2208988800000000;
CREATE OR REPLACE FUNCTION platformkit.platformkit_end_at() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 7258118400000000;
-- STABLE, as the operators they use are: an IMMUTABLE wrapper would not be
-- inlined into the statements that call it.
CREATE OR REPLACE FUNCTION platformkit.platformkit_at(p_us bigint) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
RETURN timestamptz '1970-01-01 00:00:00+00' OPERATOR(pg_catalog.+) (p_us OPERATOR(pg_catalog.*) interval '1 microsecond');
CREATE OR REPLACE FUNCTION platformkit.platformkit_us(p_at timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
RETURN (extract(epoch FROM p_at) OPERATOR(pg_catalog.*) 1000000)::bigint;
-- Whether a count is at the limit: decide.rs's estimate, the count plus the
-- previous window's weighted by the part of the window still to pass (p_w
-- and p_elapsed in microseconds), at or above p_max. The one place the SQL
-- decides; the agreement tests hold it to decide.rs.
CREATE OR REPLACE FUNCTION platformkit.platformkit_at_max(
    p_count bigint, p_previous bigint, p_w numeric, p_elapsed numeric, p_max bigint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((p_previous::numeric OPERATOR(pg_catalog.*) (p_w OPERATOR(pg_catalog.-) LEAST(GREATEST(p_elapsed, 0), p_w)))
        OPERATOR(pg_catalog.+) (p_count::numeric OPERATOR(pg_catalog.*) p_w))
       OPERATOR(pg_catalog.>=) (p_max::numeric OPERATOR(pg_catalog.*) p_w);

CREATE TABLE IF NOT EXISTS platformkit.platformkit_limits (
    -- The limit's name and the encoded key: 'login|email|alice@example.com'.
    -- Compared byte for byte (collation "C"), whatever the database's
    -- locale: the keys of one limit are then one range of the primary key,
    -- which an operator's listing scans (platformkit_limit_list).
    key          text        COLLATE "C" NOT NULL,
    -- When the window opened, on the database's clock.
    window_start timestamptz NOT NULL,
    -- When the window closes. Limits have windows of different lengths, so
    -- the close cannot be derived from window_start alone; purge needs it to
    -- know when a window may go (the column purge_after and its index) and
    -- to find windows that end far ahead (the index on window_end).
    window_end   timestamptz NOT NULL,
    -- Failures (or asks) counted in the window. Never negative; the
    -- limiter saturates instead of overflowing.
    count        bigint      NOT NULL CHECK (count >= 0),
    -- The moment each window may go, in Unix seconds, for the purge: a day
    -- after it closes, or a window's length after, whichever is later (a
    -- sliding window still reads the window before the current one). A
    -- window that breaks the window check may go a day after it closes.
    -- Generated, so that every row has it however it was written; every
    -- function in it is immutable (the time zone is named), and no stored
    -- row can make it fail: the arithmetic is float8, where an infinite end
    -- gives an infinite moment. A column of its own, not an index
    -- expression: under row-level security only a leakproof comparison of a
    -- column can bound an index scan, and purge's scan must be a range of
    -- its index, so that a batch costs what it deletes, not what the table
    -- holds.
    purge_after double precision GENERATED ALWAYS AS (
        CASE WHEN pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_end))
                  - pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_start)) > 0
              AND pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_end))
                  - pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_start)) <= 31622400
        THEN GREATEST(pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_end)) + 86400,
                      2 * pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_end))
                      - pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_start)))
        ELSE pg_catalog.date_part('epoch', pg_catalog.timezone('UTC', window_end)) + 86400
        END) STORED,
    -- When the row was first written (an update leaves it, so it stays
    -- heap-only): the order of the purge's batches among the rows that may
    -- go at the same moment (see platformkit_limit_purge_from).
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    PRIMARY KEY (key, window_start),
    -- A window purge can always delete: finite, forwards, at most 366 days.
    CONSTRAINT platformkit_limits_window_sane CHECK (
        isfinite(window_start) AND isfinite(window_end)
        AND window_end > window_start
        AND window_end - window_start <= interval '31622400 seconds')
)
-- Leave room on each page so that an update of count stays on the same page
-- and is heap-only (count is in no index): a hot key churns no index.
WITH (fillfactor = 80);

-- What needs the table's strongest lock runs only when it changes something:
-- re-applying this file behind a long reader must not queue every limiter
-- call behind it.
DO $$
DECLARE
    t pg_catalog.regclass := 'platformkit.platformkit_limits'::pg_catalog.regclass;
BEGIN
    -- The purge finds windows that end far ahead by window_end.
    IF pg_catalog.to_regclass('platformkit.platformkit_limits_window_end') IS NULL THEN
        CREATE INDEX platformkit_limits_window_end
            ON platformkit.platformkit_limits (window_end);
    END IF;
    -- The ranges purge's batches read (see platformkit_limit_purge_from).
    IF pg_catalog.to_regclass('platformkit.platformkit_limits_purge_order') IS NULL THEN
        CREATE INDEX platformkit_limits_purge_order
            ON platformkit.platformkit_limits (purge_after, created_at);
    END IF;
    IF NOT (SELECT c.relrowsecurity AND c.relforcerowsecurity
            FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) t) THEN
        ALTER TABLE platformkit.platformkit_limits ENABLE ROW LEVEL SECURITY;
        ALTER TABLE platformkit.platformkit_limits FORCE ROW LEVEL SECURITY;
    END IF;
END
$$;

-- The system switch: on only inside the limiter's own transaction, where the
-- procedures below set it with set_config(..., is_local => true). An exact
-- comparison. Every name in it is schema-qualified, so no object on the
-- caller's path can stand in for the built-ins; it has no SET clause, so
-- PostgreSQL inlines it into the policy instead of calling it (a pinned
-- search_path would cost every statement on the table a settings switch).
CREATE OR REPLACE FUNCTION platformkit.platformkit_is_system() RETURNS boolean
    LANGUAGE sql
    STABLE
    PARALLEL SAFE
AS $$
    SELECT COALESCE(pg_catalog.current_setting('platformkit.system', true)
                        OPERATOR(pg_catalog.=) 'on', false)
$$;

-- One policy for every command, in both directions. The call is wrapped in a
-- scalar subquery so that it is evaluated once per statement, not per row.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_policy
        WHERE polrelid OPERATOR(pg_catalog.=) 'platformkit.platformkit_limits'::pg_catalog.regclass
          AND polname OPERATOR(pg_catalog.=) 'platformkit_limits_system_only'
    ) THEN
        CREATE POLICY platformkit_limits_system_only ON platformkit.platformkit_limits
            FOR ALL
            USING ((SELECT platformkit.platformkit_is_system()))
            WITH CHECK ((SELECT platformkit.platformkit_is_system()));
    END IF;
END
$$;

-- The limiter's operations. Each is called as one statement, in
-- autocommit, its arguments named (`p_key => $1`). The writers are
-- procedures, `CALL platformkit.platformkit_limit_…(…)`, and begin with the
-- same prologue (between `-- prologue` and `-- end of prologue`, written
-- once, in schema/prologue.sql); each then checks its own parameters against the
-- bounds the Rust side enforces (22023 invalid_parameter_value otherwise; a
-- test holds the two to the same numbers), does its one statement, and ends
-- with COMMIT, so that nothing of the limiter's transaction (the switch, the
-- settings, a row lock) outlives the CALL, whoever called it.
--
-- The readers (read, read_many, list) write nothing, so they need no transaction
-- of their own: they are functions, `SELECT
-- platformkit.platformkit_limit_read(…)`, with the search_path pinned and
-- the other settings restored by their SET clauses, the switch turned on for
-- their one read and back when it is done, and their own prologue
-- (schema/readers_prologue.sql). What each step
-- of both prologues is for is described once, in the crate's guide, "The
-- procedures' prologue" (src/guide/calls.md; the module `guide` of the
-- crate's docs).
--
-- In platformkit_limit_add and platformkit_limit_read that statement is
-- written between `-- statement` and `-- end of statement`: the benchmark
-- (benches/limiter/floors.rs) cuts it out of this file, binds the
-- procedure's variables as parameters, and runs it alone, prepared, as the
-- floor the procedure is measured against. It stops if the markers are gone.
--
-- Keys arrive as parameters only. Counts, instants and spans travel as
-- integers, instants in microseconds since the Unix epoch. Time comes from
-- the database's clock unless the caller pins it (p_at, for tests; 1900 to
-- 2200). The window
-- arithmetic adds microsecond intervals and bins from the Unix epoch: the
-- session's TimeZone and DateStyle do not matter.

-- Adds p_add to the key's count in the current window and returns the count,
-- the window's end and the time. The addition saturates at the largest
-- bigint. With p_previous it also returns the previous window's count (for
-- sliding windows); with p_lockout_secs > 0, how long the latest lockout of
-- an earlier window of the key whose count reached p_max (that window's end
-- plus the lockout) still runs, 0 if none.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_add(
    p_key text, p_add bigint, p_window_secs bigint, p_at bigint,
    p_budget_ms bigint, p_relaxed boolean, p_previous boolean,
    p_max bigint, p_lockout_secs bigint,
    INOUT o_count bigint DEFAULT NULL,
    INOUT o_window_end bigint DEFAULT NULL,
    INOUT o_now bigint DEFAULT NULL,
    INOUT o_previous bigint DEFAULT NULL,
    INOUT o_locked_for bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_window pg_catalog.interval;
    v_now pg_catalog.timestamptz;
    v_start pg_catalog.timestamptz;
    v_locked pg_catalog.timestamptz;
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND platformkit.platformkit_max_key_bytes()
       OR p_add IS NULL OR p_add < 1
       OR p_window_secs IS NULL OR p_window_secs NOT BETWEEN 1 AND platformkit.platformkit_max_window_secs()
       OR p_max IS NULL OR p_max NOT BETWEEN 1 AND platformkit.platformkit_max_attempts()
       OR p_lockout_secs IS NULL OR p_lockout_secs NOT BETWEEN 0 AND platformkit.platformkit_max_lockout_secs()
       OR p_previous IS NULL OR p_relaxed IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_window := make_interval(secs => p_window_secs);
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    v_start := date_bin(v_window, v_now, timestamptz '1970-01-01 00:00:00+00');
    -- statement
    INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
    VALUES (p_key, v_start, v_start + v_window, p_add)
    ON CONFLICT (key, window_start) DO UPDATE
        SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
    RETURNING l.count,
        CASE WHEN p_previous THEN
            (SELECT p.count FROM platformkit.platformkit_limits AS p
             WHERE p.key = p_key AND p.window_start = v_start - v_window)
        END,
        CASE WHEN p_lockout_secs > 0 THEN
            (SELECT max(x.window_end) + make_interval(secs => p_lockout_secs)
             FROM platformkit.platformkit_limits AS x
             WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
               AND x.window_end + make_interval(secs => p_lockout_secs) > v_now)
        END
    INTO o_count, o_previous, v_locked;
    -- end of statement
    o_previous := COALESCE(o_previous, 0);
    o_now := platformkit.platformkit_us(v_now);
    o_window_end := platformkit.platformkit_us(v_start + v_window);
    o_locked_for := COALESCE(platformkit.platformkit_us(v_locked) - o_now, 0);
    COMMIT;
END
$$;

-- Adds each pair's amount (p_adds) to the count of each (key, window) pair
-- in one statement: the several limits of one request (per account and per
-- address) in one round trip, or the writes of concurrent calls for
-- different keys, which share one statement and one commit. Rows are
-- upserted in (key, window_start) order, so two calls over the same pairs in
-- any order lock them in the same order and cannot deadlock; a pair given
-- twice adds both amounts. Returns the counts and window ends in the order
-- given.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_add_many(
    p_keys text[], p_window_secs bigint[], p_adds bigint[], p_at bigint,
    p_budget_ms bigint, p_relaxed boolean, p_previous boolean,
    p_maxes bigint[], p_lockout_secs bigint[],
    INOUT o_counts bigint[] DEFAULT NULL,
    INOUT o_window_ends bigint[] DEFAULT NULL,
    INOUT o_now bigint DEFAULT NULL,
    INOUT o_previous bigint[] DEFAULT NULL,
    INOUT o_locked_for bigint[] DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_now pg_catalog.timestamptz;
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- The parameters against the Rust bounds: each array as a whole here,
    -- each key's length where the statement below reads the keys.
    IF p_previous IS NULL OR p_relaxed IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at()
       OR cardinality(p_keys) NOT BETWEEN 1 AND 64
       OR cardinality(p_window_secs) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_adds) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_maxes) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_lockout_secs) IS DISTINCT FROM cardinality(p_keys)
       OR NOT COALESCE(1 <= ALL (p_adds)
                       AND 1 <= ALL (p_window_secs) AND platformkit.platformkit_max_window_secs() >= ALL (p_window_secs)
                       AND 1 <= ALL (p_maxes) AND platformkit.platformkit_max_attempts() >= ALL (p_maxes)
                       AND 0 <= ALL (p_lockout_secs) AND platformkit.platformkit_max_lockout_secs() >= ALL (p_lockout_secs),
                       false) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    o_now := platformkit.platformkit_us(v_now);
    WITH asked AS (
        SELECT t.key, t.ord, t.add, make_interval(secs => t.secs) AS width,
               date_bin(make_interval(secs => t.secs), v_now,
                        timestamptz '1970-01-01 00:00:00+00') AS start
        FROM unnest(p_keys, p_window_secs, p_adds)
             WITH ORDINALITY AS t(key, secs, add, ord)
        -- A key out of bounds is left out here, and refused below.
        WHERE COALESCE(octet_length(t.key) BETWEEN 1 AND platformkit.platformkit_max_key_bytes(), false)
    ), counted AS (
        -- A pair given twice adds both amounts; the sum is numeric, so it
        -- saturates at the largest bigint instead of overflowing.
        INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
        SELECT key, start, max(start + width),
               LEAST(sum(add), 9223372036854775807)::bigint
        FROM asked
        GROUP BY key, start
        ORDER BY key, start
        ON CONFLICT (key, window_start) DO UPDATE
            SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
        RETURNING l.key, l.window_start, l.count
    )
    SELECT array_agg(c.count ORDER BY a.ord),
           array_agg(platformkit.platformkit_us(a.start + a.width) ORDER BY a.ord)
    INTO o_counts, o_window_ends
    FROM asked AS a
    JOIN counted AS c ON c.key = a.key AND c.window_start = a.start;
    IF cardinality(o_counts) IS DISTINCT FROM cardinality(p_keys) THEN
        -- Raised after the upsert: this transaction, and what it wrote, ends here.
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    -- The previous windows (sliding limits) and the lockouts of earlier
    -- windows, read only when a pair needs them: the upsert above wrote
    -- neither. Each pair's window is the one it was counted in.
    IF p_previous OR 0 < ANY (p_lockout_secs) THEN
        SELECT array_agg(
                   CASE WHEN p_previous THEN
                       COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
                                 WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
                   ELSE 0 END
                   ORDER BY a.ord),
               array_agg(
                   CASE WHEN a.lockout > 0 THEN
                       COALESCE(platformkit.platformkit_us(
                           (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                            FROM platformkit.platformkit_limits AS x
                            WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                              AND x.window_end + make_interval(secs => a.lockout) > v_now)) - o_now, 0)
                   ELSE 0 END
                   ORDER BY a.ord)
        INTO o_previous, o_locked_for
        FROM (SELECT t.key, t.ord, t.max, t.lockout, make_interval(secs => t.secs) AS width,
                     platformkit.platformkit_at(t.window_end) - make_interval(secs => t.secs) AS start
              FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs, o_window_ends)
                   WITH ORDINALITY AS t(key, secs, max, lockout, window_end, ord)) AS a;
    ELSE
        o_previous := array_fill(0::bigint, ARRAY[cardinality(p_keys)]);
        o_locked_for := array_fill(0::bigint, ARRAY[cardinality(p_keys)]);
    END IF;
    COMMIT;
END
$$;

-- Adds each pair's amount (p_adds) to the count of each (key, window) pair
-- only if every pair's ask may go ahead, in one statement: an API's
-- per-second and per-day quotas, where a refusal by one must not spend the
-- other. The amounts are added as add_many adds them, in (key,
-- window_start) order (so two calls over the same keys cannot deadlock),
-- inside a block of its own; each pair is then decided on its count under
-- the row lock the addition took, as the limiter decides an ask of its
-- amount (decide.rs, the one decision both stores share): no lockout of an
-- earlier window runs, and the count after the ask less one, plus for a
-- sliding pair (p_sliding) the previous window's count weighted by the
-- part of the last window's length it still overlaps, is below p_max. If
-- any pair refuses, the block is rolled back (PK003, raised and caught
-- here): nothing is added, no row is left, and no lock is held. The keys
-- must differ (each pair is decided by its own count). Returns the counts
-- after the call (those before it when nothing was added), the window
-- ends, the time, the previous windows' counts (0 for a fixed pair), the
-- lockouts, and o_added, whether the amounts were added.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_add_all_or_none(
    p_keys text[], p_window_secs bigint[], p_adds bigint[], p_at bigint,
    p_budget_ms bigint, p_relaxed boolean, p_sliding boolean[],
    p_maxes bigint[], p_lockout_secs bigint[],
    INOUT o_counts bigint[] DEFAULT NULL,
    INOUT o_window_ends bigint[] DEFAULT NULL,
    INOUT o_now bigint DEFAULT NULL,
    INOUT o_previous bigint[] DEFAULT NULL,
    INOUT o_locked_for bigint[] DEFAULT NULL,
    INOUT o_added boolean DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_now pg_catalog.timestamptz;
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- The parameters against the Rust bounds, as add_many checks them, and
    -- each key given once.
    IF p_relaxed IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at()
       OR cardinality(p_keys) NOT BETWEEN 1 AND 64
       OR cardinality(p_window_secs) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_adds) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_sliding) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_maxes) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_lockout_secs) IS DISTINCT FROM cardinality(p_keys)
       OR array_position(p_sliding, NULL) IS NOT NULL
       OR NOT COALESCE(1 <= ALL (p_adds)
                       AND 1 <= ALL (p_window_secs) AND platformkit.platformkit_max_window_secs() >= ALL (p_window_secs)
                       AND 1 <= ALL (p_maxes) AND platformkit.platformkit_max_attempts() >= ALL (p_maxes)
                       AND 0 <= ALL (p_lockout_secs) AND platformkit.platformkit_max_lockout_secs() >= ALL (p_lockout_secs),
                       false)
       OR (SELECT count(DISTINCT k) FROM unnest(p_keys) AS k) <> cardinality(p_keys) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    o_now := platformkit.platformkit_us(v_now);
    -- The amounts added, the rows locked, and each pair decided: all in a
    -- block that a refusal rolls back.
    BEGIN
        WITH asked AS (
            SELECT t.key, t.ord, t.add, make_interval(secs => t.secs) AS width,
                   date_bin(make_interval(secs => t.secs), v_now,
                            timestamptz '1970-01-01 00:00:00+00') AS start
            FROM unnest(p_keys, p_window_secs, p_adds) WITH ORDINALITY AS t(key, secs, add, ord)
            -- A key out of bounds is left out here, and refused below.
            WHERE COALESCE(octet_length(t.key) BETWEEN 1 AND platformkit.platformkit_max_key_bytes(), false)
        ), counted AS (
            INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
            SELECT key, start, start + width, add
            FROM asked
            ORDER BY key, start
            ON CONFLICT (key, window_start) DO UPDATE
                SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
            RETURNING l.key, l.window_start, l.count
        )
        SELECT array_agg(c.count ORDER BY a.ord),
               array_agg(platformkit.platformkit_us(a.start + a.width) ORDER BY a.ord)
        INTO o_counts, o_window_ends
        FROM asked AS a
        JOIN counted AS c ON c.key = a.key AND c.window_start = a.start;
        IF cardinality(o_counts) IS DISTINCT FROM cardinality(p_keys) THEN
            -- Raised after the upsert: this transaction, and what it wrote, ends here.
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
        END IF;
        -- The previous windows and the lockouts of earlier windows, as
        -- add_many reads them; then each pair decided on its count before
        -- its own last unit, by platformkit_at_max.
        SELECT array_agg(d.previous ORDER BY d.ord), array_agg(d.locked_for ORDER BY d.ord),
               bool_and(d.locked_for = 0
                        AND NOT platformkit.platformkit_at_max(d.count - 1, d.previous, d.w,
                                                              o_now - d.start_us, d.max))
        INTO o_previous, o_locked_for, o_added
        FROM (
            SELECT a.ord, a.max, a.count, a.w, a.window_end - a.w AS start_us,
                   CASE WHEN a.sliding THEN
                       COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
                                 WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
                   ELSE 0 END AS previous,
                   CASE WHEN a.lockout > 0 THEN
                       COALESCE(platformkit.platformkit_us(
                           (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                            FROM platformkit.platformkit_limits AS x
                            WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                              AND x.window_end + make_interval(secs => a.lockout) > v_now)) - o_now, 0)
                   ELSE 0 END AS locked_for
            FROM (SELECT t.key, t.ord, t.max, t.lockout, t.sliding, t.count, t.window_end,
                         t.secs::numeric * 1000000 AS w,
                         make_interval(secs => t.secs) AS width,
                         platformkit.platformkit_at(t.window_end) - make_interval(secs => t.secs) AS start
                  FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs, p_sliding,
                              o_counts, o_window_ends)
                       WITH ORDINALITY AS t(key, secs, max, lockout, sliding, count, window_end, ord)) AS a
        ) AS d;
        IF NOT o_added THEN
            RAISE EXCEPTION USING ERRCODE = 'PK003';
        END IF;
    EXCEPTION WHEN SQLSTATE 'PK003' THEN
        -- Rolled back: nothing of the call is left to make durable, so its
        -- commit (the block gave the transaction an id) need not wait for
        -- the WAL flush. The counts before the call: PL/pgSQL's variables
        -- keep what they were given in the block.
        PERFORM set_config('synchronous_commit', 'off', true);
        SELECT array_agg(t.count - LEAST(t.add, t.count) ORDER BY t.ord)
        INTO o_counts
        FROM unnest(o_counts, p_adds) WITH ORDINALITY AS t(count, add, ord);
    END;
    COMMIT;
END
$$;

-- Reads the count of each (key, window) pair; writes nothing. A function,
-- not a procedure: a read needs no transaction of its own (see the readers'
-- prologue above). Its answer is one array of integers, which the server
-- sends cheaper than a row of a function's columns: the time, then for each
-- pair in the order given what add_many answers for it (its count, its
-- window's end, the previous window's count, the lockout still to run).
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_read_many(
    p_keys text[], p_window_secs bigint[], p_at bigint, p_budget_ms bigint,
    p_previous boolean, p_maxes bigint[], p_lockout_secs bigint[],
    OUT o_answer bigint[])
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET row_security = on
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_indexscan = on
SET enable_bitmapscan = off
SET enable_nestloop = on
SET seq_page_cost = 1
SET random_page_cost = 4
SET cpu_tuple_cost = 0.01
SET cpu_index_tuple_cost = 0.005
SET cpu_operator_cost = 0.0025
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_switch pg_catalog.text;
    v_set pg_catalog.text;
    v_now pg_catalog.timestamptz;
    v_now_us pg_catalog.int8;
BEGIN
    -- reader's prologue
    -- Each refusal below is behind a cheaper test that it implies: a call
    -- that no check could refuse pays only for those tests.
    IF pg_catalog.pg_is_in_recovery()
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        IF pg_catalog.pg_is_in_recovery()
           OR (current_setting('transaction_isolation') <> 'read committed'
               AND statement_timestamp() - transaction_timestamp() > interval '100 milliseconds') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
                MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                    THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                    ELSE 'platformkit: a read inside a caller''s REPEATABLE READ or SERIALIZABLE transaction begun over 100 ms ago could see counts that old'
                    END;
        END IF;
    END IF;
    IF p_budget_ms IS NULL OR p_budget_ms NOT BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
       OR current_setting('statement_timeout') <> '0'
       OR COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
       OR current_setting('transaction_deferrable') <> 'off' THEN
        IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
           OR (current_setting('statement_timeout') <> '0'
               AND current_setting('statement_timeout')::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
               AND current_setting('transaction_timeout', true)::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (current_setting('transaction_isolation') = 'serializable'
               AND current_setting('transaction_read_only') = 'on'
               AND current_setting('transaction_deferrable') = 'on') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
                MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                    THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, or a SERIALIZABLE READ ONLY DEFERRABLE transaction'
                    ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                    END;
        END IF;
    END IF;
    v_switch := current_setting('platformkit.system', true);
    -- Assigned rather than PERFORMed, here and where the switch is turned
    -- back: an assignment is evaluated as an expression, a PERFORM runs a query.
    v_set := set_config('platformkit.system', 'on', true);
    v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
    -- end of reader's prologue
    IF p_previous IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at()
       OR cardinality(p_keys) NOT BETWEEN 1 AND 64
       OR cardinality(p_window_secs) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_maxes) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_lockout_secs) IS DISTINCT FROM cardinality(p_keys)
       OR EXISTS (
           SELECT FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs) AS t(key, secs, max, lockout)
           WHERE NOT COALESCE(octet_length(t.key) BETWEEN 1 AND platformkit.platformkit_max_key_bytes()
                              AND t.secs BETWEEN 1 AND platformkit.platformkit_max_window_secs()
                              AND t.max BETWEEN 1 AND platformkit.platformkit_max_attempts()
                              AND t.lockout BETWEEN 0 AND platformkit.platformkit_max_lockout_secs(), false)) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    v_now_us := platformkit.platformkit_us(v_now);
    WITH asked AS (
        SELECT t.key, t.ord, t.max, t.lockout, make_interval(secs => t.secs) AS width,
               date_bin(make_interval(secs => t.secs), v_now,
                        timestamptz '1970-01-01 00:00:00+00') AS start
        FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs)
             WITH ORDINALITY AS t(key, secs, max, lockout, ord)
    )
    -- A correlated subquery per pair: one index probe each, whatever the
    -- planner guesses of the array's length (a join could scan the table).
    SELECT ARRAY[v_now_us] || array_agg(x.v ORDER BY a.ord, x.i)
    INTO o_answer
    FROM asked AS a,
    LATERAL unnest(ARRAY[
        COALESCE((SELECT l.count FROM platformkit.platformkit_limits AS l
                  WHERE l.key = a.key AND l.window_start = a.start), 0),
        platformkit.platformkit_us(a.start + a.width),
        CASE WHEN p_previous THEN
            COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
                      WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
        ELSE 0 END,
        CASE WHEN a.lockout > 0 THEN
            COALESCE(platformkit.platformkit_us(
                (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                 FROM platformkit.platformkit_limits AS x
                 WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                   AND x.window_end + make_interval(secs => a.lockout) > v_now)) - v_now_us, 0)
        ELSE 0 END]) WITH ORDINALITY AS x(v, i);
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- Reads the key's count in the current window; writes nothing. A function,
-- not a procedure (see the readers' prologue above). Answers as read_many
-- does for one pair.
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_read(
    p_key text, p_window_secs bigint, p_at bigint, p_budget_ms bigint,
    p_previous boolean, p_max bigint, p_lockout_secs bigint,
    OUT o_answer bigint[])
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET row_security = on
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_indexscan = on
SET enable_bitmapscan = off
SET enable_nestloop = on
SET seq_page_cost = 1
SET random_page_cost = 4
SET cpu_tuple_cost = 0.01
SET cpu_index_tuple_cost = 0.005
SET cpu_operator_cost = 0.0025
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_switch pg_catalog.text;
    v_set pg_catalog.text;
    v_window pg_catalog.interval;
    v_now pg_catalog.timestamptz;
    v_start pg_catalog.timestamptz;
    v_count pg_catalog.int8;
    v_previous pg_catalog.int8;
    v_locked pg_catalog.timestamptz;
    v_now_us pg_catalog.int8;
BEGIN
    -- reader's prologue
    -- Each refusal below is behind a cheaper test that it implies: a call
    -- that no check could refuse pays only for those tests.
    IF pg_catalog.pg_is_in_recovery()
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        IF pg_catalog.pg_is_in_recovery()
           OR (current_setting('transaction_isolation') <> 'read committed'
               AND statement_timestamp() - transaction_timestamp() > interval '100 milliseconds') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
                MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                    THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                    ELSE 'platformkit: a read inside a caller''s REPEATABLE READ or SERIALIZABLE transaction begun over 100 ms ago could see counts that old'
                    END;
        END IF;
    END IF;
    IF p_budget_ms IS NULL OR p_budget_ms NOT BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
       OR current_setting('statement_timeout') <> '0'
       OR COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
       OR current_setting('transaction_deferrable') <> 'off' THEN
        IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
           OR (current_setting('statement_timeout') <> '0'
               AND current_setting('statement_timeout')::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
               AND current_setting('transaction_timeout', true)::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (current_setting('transaction_isolation') = 'serializable'
               AND current_setting('transaction_read_only') = 'on'
               AND current_setting('transaction_deferrable') = 'on') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
                MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                    THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, or a SERIALIZABLE READ ONLY DEFERRABLE transaction'
                    ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                    END;
        END IF;
    END IF;
    v_switch := current_setting('platformkit.system', true);
    -- Assigned rather than PERFORMed, here and where the switch is turned
    -- back: an assignment is evaluated as an expression, a PERFORM runs a query.
    v_set := set_config('platformkit.system', 'on', true);
    v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
    -- end of reader's prologue
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND platformkit.platformkit_max_key_bytes()
       OR p_window_secs IS NULL OR p_window_secs NOT BETWEEN 1 AND platformkit.platformkit_max_window_secs()
       OR p_max IS NULL OR p_max NOT BETWEEN 1 AND platformkit.platformkit_max_attempts()
       OR p_lockout_secs IS NULL OR p_lockout_secs NOT BETWEEN 0 AND platformkit.platformkit_max_lockout_secs()
       OR p_previous IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_window := make_interval(secs => p_window_secs);
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    v_start := date_bin(v_window, v_now, timestamptz '1970-01-01 00:00:00+00');
    -- statement
    SELECT
        (SELECT l.count FROM platformkit.platformkit_limits AS l
         WHERE l.key = p_key AND l.window_start = v_start),
        CASE WHEN p_previous THEN
            (SELECT p.count FROM platformkit.platformkit_limits AS p
             WHERE p.key = p_key AND p.window_start = v_start - v_window)
        END,
        CASE WHEN p_lockout_secs > 0 THEN
            (SELECT max(x.window_end) + make_interval(secs => p_lockout_secs)
             FROM platformkit.platformkit_limits AS x
             WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
               AND x.window_end + make_interval(secs => p_lockout_secs) > v_now)
        END
    INTO v_count, v_previous, v_locked;
    -- end of statement
    v_now_us := platformkit.platformkit_us(v_now);
    o_answer := ARRAY[v_now_us, COALESCE(v_count, 0), platformkit.platformkit_us(v_start + v_window),
                      COALESCE(v_previous, 0), COALESCE(platformkit.platformkit_us(v_locked) - v_now_us, 0)];
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- Lists the keys under p_prefix (a limit's name and '|') that the limit
-- refuses now, for an operator: the current window's count, or the
-- sliding estimate (p_previous), at p_max, or a lockout of an earlier
-- window running (p_lockout_secs > 0), the same arithmetic as the
-- crate's decision for a check, in exact numeric microseconds. At most
-- p_at_most keys, newest first: by the latest window the key was counted
-- in, then the highest current count, then the key. The scan is one range
-- of the primary key's index, the keys from p_prefix to p_prefix with its
-- '|' made '}' (the next byte): the key column's collation is "C", so the
-- range holds exactly the keys that begin with p_prefix, and no other
-- limit's (login2|... sorts before login|...). Writes nothing: a function
-- (see the readers' prologue above).
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_list(
    p_prefix text, p_window_secs bigint, p_at bigint, p_budget_ms bigint,
    p_previous boolean, p_max bigint, p_lockout_secs bigint, p_at_most bigint,
    OUT o_keys text[],
    OUT o_counts bigint[],
    OUT o_window_end bigint,
    OUT o_now bigint,
    OUT o_previous bigint[],
    OUT o_locked_for bigint[])
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET row_security = on
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_indexscan = on
SET enable_bitmapscan = off
SET enable_nestloop = on
SET seq_page_cost = 1
SET random_page_cost = 4
SET cpu_tuple_cost = 0.01
SET cpu_index_tuple_cost = 0.005
SET cpu_operator_cost = 0.0025
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_switch pg_catalog.text;
    v_set pg_catalog.text;
    v_window pg_catalog.interval;
    v_now pg_catalog.timestamptz;
    v_start pg_catalog.timestamptz;
    v_upper pg_catalog.text;
    v_w pg_catalog.numeric;
BEGIN
    -- reader's prologue
    -- Each refusal below is behind a cheaper test that it implies: a call
    -- that no check could refuse pays only for those tests.
    IF pg_catalog.pg_is_in_recovery()
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        IF pg_catalog.pg_is_in_recovery()
           OR (current_setting('transaction_isolation') <> 'read committed'
               AND statement_timestamp() - transaction_timestamp() > interval '100 milliseconds') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
                MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                    THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                    ELSE 'platformkit: a read inside a caller''s REPEATABLE READ or SERIALIZABLE transaction begun over 100 ms ago could see counts that old'
                    END;
        END IF;
    END IF;
    IF p_budget_ms IS NULL OR p_budget_ms NOT BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
       OR current_setting('statement_timeout') <> '0'
       OR COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
       OR current_setting('transaction_deferrable') <> 'off' THEN
        IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
           OR (current_setting('statement_timeout') <> '0'
               AND current_setting('statement_timeout')::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
               AND current_setting('transaction_timeout', true)::interval
                   <= p_budget_ms * interval '1 millisecond')
           OR (current_setting('transaction_isolation') = 'serializable'
               AND current_setting('transaction_read_only') = 'on'
               AND current_setting('transaction_deferrable') = 'on') THEN
            RAISE EXCEPTION USING
                ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
                MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                    THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, or a SERIALIZABLE READ ONLY DEFERRABLE transaction'
                    ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                    END;
        END IF;
    END IF;
    v_switch := current_setting('platformkit.system', true);
    -- Assigned rather than PERFORMed, here and where the switch is turned
    -- back: an assignment is evaluated as an expression, a PERFORM runs a query.
    v_set := set_config('platformkit.system', 'on', true);
    v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
    -- end of reader's prologue
    IF p_prefix IS NULL OR octet_length(p_prefix) NOT BETWEEN 2 AND 49
       OR right(p_prefix, 1) <> '|'
       OR p_window_secs IS NULL OR p_window_secs NOT BETWEEN 1 AND platformkit.platformkit_max_window_secs()
       OR p_max IS NULL OR p_max NOT BETWEEN 1 AND platformkit.platformkit_max_attempts()
       OR p_lockout_secs IS NULL OR p_lockout_secs NOT BETWEEN 0 AND platformkit.platformkit_max_lockout_secs()
       OR p_at_most IS NULL OR p_at_most NOT BETWEEN 1 AND 1000
       OR p_previous IS NULL
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_window := make_interval(secs => p_window_secs);
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    v_start := date_bin(v_window, v_now, timestamptz '1970-01-01 00:00:00+00');
    o_now := platformkit.platformkit_us(v_now);
    o_window_end := platformkit.platformkit_us(v_start + v_window);
    v_upper := left(p_prefix, -1) || '}';
    v_w := p_window_secs::numeric * 1000000;
    WITH keyed AS (
        SELECT l.key,
               max(l.window_start) AS latest,
               COALESCE(max(l.count) FILTER (WHERE l.window_start = v_start), 0) AS cur,
               CASE WHEN p_previous THEN
                   COALESCE(max(l.count) FILTER (WHERE l.window_start = v_start - v_window), 0)
               ELSE 0 END AS prev,
               CASE WHEN p_lockout_secs > 0 THEN
                   max(l.window_end) FILTER (
                       WHERE l.window_start < v_start AND l.count >= p_max
                         AND l.window_end + make_interval(secs => p_lockout_secs) > v_now)
                   + make_interval(secs => p_lockout_secs)
               END AS locked_until
        FROM platformkit.platformkit_limits AS l
        WHERE l.key >= p_prefix AND l.key < v_upper
        GROUP BY l.key
    ), refused AS (
        SELECT k.key, k.latest, k.cur, k.prev, k.locked_until
        FROM keyed AS k
        WHERE k.locked_until IS NOT NULL
           OR platformkit.platformkit_at_max(k.cur, k.prev, v_w, o_now - (o_window_end - v_w), p_max)
        ORDER BY k.latest DESC, k.cur DESC, k.key
        LIMIT p_at_most
    )
    SELECT COALESCE(array_agg(r.key ORDER BY r.latest DESC, r.cur DESC, r.key), '{}'),
           COALESCE(array_agg(r.cur ORDER BY r.latest DESC, r.cur DESC, r.key), '{}'),
           COALESCE(array_agg(r.prev ORDER BY r.latest DESC, r.cur DESC, r.key), '{}'),
           COALESCE(array_agg(COALESCE(platformkit.platformkit_us(r.locked_until) - o_now, 0)
                              ORDER BY r.latest DESC, r.cur DESC, r.key), '{}')
    INTO o_keys, o_counts, o_previous, o_locked_for
    FROM refused AS r;
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- Takes p_n back from the key's count in the window that starts at
-- p_window_start (a reserved attempt that succeeded), never below zero;
-- returns the count. A window that is gone stays gone.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_take_back(
    p_key text, p_window_start bigint, p_n bigint,
    p_budget_ms bigint, p_relaxed boolean,
    INOUT o_count bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND platformkit.platformkit_max_key_bytes()
       OR p_n IS NULL OR p_n < 1 OR p_relaxed IS NULL
       OR p_window_start IS NULL
       OR p_window_start < platformkit.platformkit_min_at() OR p_window_start >= platformkit.platformkit_end_at() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    UPDATE platformkit.platformkit_limits
        SET count = GREATEST(count - p_n, 0)
        WHERE key = p_key AND window_start = platformkit.platformkit_at(p_window_start)
        RETURNING count INTO o_count;
    o_count := COALESCE(o_count, 0);
    COMMIT;
END
$$;

-- Deletes every window of the key; returns how many went.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_reset(
    p_key text, p_budget_ms bigint, p_relaxed boolean,
    INOUT o_deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND platformkit.platformkit_max_key_bytes() OR p_relaxed IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    DELETE FROM platformkit.platformkit_limits WHERE key = p_key;
    GET DIAGNOSTICS o_deleted = ROW_COUNT;
    COMMIT;
END
$$;

-- Deletes at most p_batch rows whose window closed more than 24 hours ago
-- and more than one window length ago (a sliding window still reads the
-- window before the current one), skipping rows another transaction holds;
-- returns how many went, and where it stopped. Both scans are index ranges
-- (of (purge_after, created_at), and of window_end), so a batch costs what
-- it deletes, however many closed windows must still be kept. A purge's
-- batches go through the rows due in the order of (purge_after,
-- created_at), each starting where the one before stopped (o_after and
-- o_created, in epoch seconds; NULL for the first), so none steps again
-- over the index entries of the rows the batches before it deleted, which
-- stay until a VACUUM (docs/PERFORMANCE.md, "Purge resumes"). A row
-- due behind that place when the purge passed it (one skipped as held, or
-- one written since with a window long closed) is the next purge's. The test
-- is done in epoch seconds (float8), which cannot overflow or fail on any
-- stored row. A row that breaks the window check (which the table
-- refuses) would go a day after it closes, and a row ending more than 367 days from now (a clock
-- pinned far ahead, a direct insert, an infinite end) goes at once.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_purge_from(
    p_batch bigint, p_budget_ms bigint,
    INOUT o_deleted bigint DEFAULT NULL,
    INOUT o_after double precision DEFAULT NULL,
    INOUT o_created double precision DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    -- Where this batch starts, as values the index can start its scan at:
    -- under row-level security only a comparison of a column with plain
    -- values (no COALESCE) bounds an index scan.
    from_after pg_catalog.float8;
    from_created pg_catalog.timestamptz;
BEGIN
    -- prologue
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
                END;
    END IF;
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
            pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('synchronous_commit', 'on', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_indexscan', 'on', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_nestloop', 'on', true),
            pg_catalog.set_config('seq_page_cost', '1', true),
            pg_catalog.set_config('random_page_cost', '4', true),
            pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
            pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
            pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
            pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
            pg_catalog.set_config('jit', 'off', true);
    -- Every lock wait of the call together within the budget: a quarter
    -- each, for the at most four waits of one row's upsert.
    PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('default_transaction_isolation') = 'serializable'
           AND current_setting('default_transaction_read_only') = 'on'
           AND current_setting('default_transaction_deferrable') = 'on')
       OR current_setting('transaction_read_only') <> 'off' THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
    -- end of prologue
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 5000
       OR (o_after IS NULL) <> (o_created IS NULL) OR o_after = 'NaN' OR o_created = 'NaN' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    -- A place past either end of the timestamps (one a far-off created_at
    -- rounds to in float8) starts at that end: never an error.
    from_after := COALESCE(o_after, '-Infinity');
    from_created := CASE WHEN o_created IS NULL OR o_created < -210866803200 THEN '-infinity'
                         WHEN o_created >= 9224318016000 THEN 'infinity'
                         ELSE to_timestamp(o_created) END;
    -- The one plan of the limiter's that reaches rows by their ctid; the
    -- prologue pins the other switches.
    PERFORM pg_catalog.set_config('enable_tidscan', 'on', true);
    -- Each row is deleted by the ctid its locking scan returned: no second
    -- probe of the primary key's index per row, which halved the batch's
    -- rate. The lock is what makes the ctid safe: a row this transaction
    -- holds cannot be updated, deleted or moved by another before the
    -- DELETE, so the DELETE never follows an update chain to a version it
    -- did not lock. (A row whose lock followed an update committed after
    -- the statement's snapshot is locked but not deleted here; a later
    -- purge takes it.) A row a call holds is skipped, not waited for. ONLY:
    -- a ctid names a row of one table, never of a table that inherits.
    WITH due AS (
        -- A range of the index platformkit_limits_purge_order, from where
        -- the batch before stopped (>=: rows may share a place).
        SELECT d.ctid AS place, d.purge_after, d.created_at
        FROM ONLY platformkit.platformkit_limits AS d
        WHERE d.purge_after < date_part('epoch', statement_timestamp())
          AND (d.purge_after, d.created_at) >= (from_after, from_created)
        ORDER BY d.purge_after, d.created_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ), ahead AS (
        -- Windows that end more than 367 days from now, which only a clock
        -- pinned far ahead or a direct insert stores (an infinite end
        -- included): a range of platformkit_limits_window_end.
        SELECT d.ctid AS place FROM ONLY platformkit.platformkit_limits AS d
        WHERE d.window_end > statement_timestamp()
                            + make_interval(secs => platformkit.platformkit_max_window_secs() + 86400)
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM ONLY platformkit.platformkit_limits AS l
        WHERE l.ctid = ANY (ARRAY(SELECT place FROM due UNION ALL SELECT place FROM ahead LIMIT p_batch))
        RETURNING 1
    ), stop AS (
        -- Where the next batch starts: the last row the scan found.
        SELECT s.purge_after, date_part('epoch', s.created_at) AS created FROM due AS s
        ORDER BY s.purge_after DESC, s.created_at DESC
        LIMIT 1
    )
    SELECT (SELECT count(*) FROM gone), COALESCE(stop.purge_after, o_after), COALESCE(stop.created, o_created)
    INTO o_deleted, o_after, o_created
    FROM (SELECT) AS one LEFT JOIN stop ON true;
    COMMIT;
END
$$;

-- Only the roles granted EXECUTE (see the top of this file) may call the
-- limiter's routines; PUBLIC may not.
REVOKE ALL ON ALL ROUTINES IN SCHEMA platformkit FROM PUBLIC;
