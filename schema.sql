-- platformkit-limit: a limit is a row.
--
-- One row per key per window. Only the limiter writes it, inside its own
-- short system transaction; every other transaction can neither read nor
-- write it (FORCE ROW LEVEL SECURITY, one policy, both directions).
--
-- Safe to apply twice. Needs PostgreSQL 14 or newer (date_bin, procedures
-- with OUT parameters).
-- Apply it as the role that should own the table (the migration role); the
-- limiter connects as any role with SELECT, INSERT, UPDATE and DELETE on it.

CREATE TABLE IF NOT EXISTS platformkit_limits (
    -- The limit's name and the encoded key: 'login|email|alice@example.com'.
    key          text        NOT NULL,
    -- When the window opened, on the database's clock.
    window_start timestamptz NOT NULL,
    -- When the window closes. Limits have windows of different lengths, so
    -- the close cannot be derived from window_start alone; purge needs it to
    -- find windows that closed more than a day ago, and the index below
    -- serves exactly that.
    window_end   timestamptz NOT NULL,
    -- Failures (or asks) counted in the window. Never negative; the
    -- limiter saturates instead of overflowing.
    count        bigint      NOT NULL CHECK (count >= 0),
    PRIMARY KEY (key, window_start)
)
-- Leave room on each page so that an update of count stays on the same page
-- and is heap-only (count is in no index): a hot key churns no index.
WITH (fillfactor = 80);

-- The purge scans by window_end.
CREATE INDEX IF NOT EXISTS platformkit_limits_window_end
    ON platformkit_limits (window_end);

-- The system switch: on only inside the limiter's own transaction, where the
-- procedures below set it with set_config(..., is_local => true). An exact comparison; the
-- search_path is pinned so that no object on the caller's path can stand in
-- for the built-ins.
CREATE OR REPLACE FUNCTION platformkit_is_system() RETURNS boolean
    LANGUAGE sql
    STABLE
    PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT COALESCE(current_setting('platformkit.system', true) = 'on', false)
$$;

ALTER TABLE platformkit_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE platformkit_limits FORCE ROW LEVEL SECURITY;

-- One policy for every command, in both directions. The call is wrapped in a
-- scalar subquery so that it is evaluated once per statement, not per row.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_policy
        WHERE polrelid = 'platformkit_limits'::regclass
          AND polname = 'platformkit_limits_system_only'
    ) THEN
        CREATE POLICY platformkit_limits_system_only ON platformkit_limits
            FOR ALL
            USING ((SELECT platformkit_is_system()))
            WITH CHECK ((SELECT platformkit_is_system()));
    END IF;
END
$$;

-- The limiter's operations. Each is called as one statement,
-- `CALL platformkit_limit_…(…)`, in autocommit: one message, one round
-- trip, and plans the server caches. Each begins the same way:
--
--   COMMIT: ends the implicit transaction of the CALL and starts the
--     limiter's own. Inside a transaction block of the caller's, PostgreSQL
--     refuses it (2D000 invalid_transaction_termination): the limiter never
--     joins, commits or leaks into a caller's transaction.
--   SET TRANSACTION: READ COMMITTED and READ WRITE, whatever the session's
--     defaults (a serializable default would make concurrent upserts fail).
--   set_config(…, true): the system switch, the budget as lock_timeout,
--     row_security on, for this transaction only. The transaction ends when
--     the CALL does, and the settings with it.
--
-- Each procedure writes this prologue out rather than calling a shared one:
-- a nested CALL would cost every call a little more.
--
-- Keys arrive as parameters only. Time comes from the database's clock
-- unless the caller pins it (p_at, for tests). The window arithmetic adds
-- microsecond intervals and bins from the Unix epoch: the session's TimeZone
-- and DateStyle do not matter.

-- Adds p_add to the key's count in the current window and returns the count,
-- the window's end and the time. The addition saturates at the largest
-- bigint. With p_previous it also returns the previous window's count (for
-- sliding windows); with p_lockout_secs > 0, the latest lockout of an
-- earlier window of the key whose count reached p_max: that window's end
-- plus the lockout, if still to come.
CREATE OR REPLACE PROCEDURE platformkit_limit_add(
    p_key text, p_add bigint, p_window_secs bigint, p_at timestamptz,
    p_budget_ms bigint, p_relaxed boolean, p_previous boolean,
    p_max bigint, p_lockout_secs bigint,
    INOUT o_count bigint DEFAULT NULL,
    INOUT o_window_end timestamptz DEFAULT NULL,
    INOUT o_now timestamptz DEFAULT NULL,
    INOUT o_previous bigint DEFAULT NULL,
    INOUT o_locked_until timestamptz DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_window interval := p_window_secs * interval '1 second';
    v_start timestamptz;
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    IF p_relaxed THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    o_now := COALESCE(p_at, pg_catalog.statement_timestamp());
    v_start := pg_catalog.date_bin(v_window, o_now, timestamptz '1970-01-01 00:00:00+00');
    INSERT INTO platformkit_limits AS l (key, window_start, window_end, count)
    VALUES (p_key, v_start, v_start + v_window, p_add)
    ON CONFLICT (key, window_start) DO UPDATE
        SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
    RETURNING l.count, l.window_start + v_window,
        CASE WHEN p_previous THEN
            (SELECT p.count FROM platformkit_limits AS p
             WHERE p.key = p_key AND p.window_start = v_start - v_window)
        END,
        CASE WHEN p_lockout_secs > 0 THEN
            (SELECT max(x.window_end) + p_lockout_secs * interval '1 second'
             FROM platformkit_limits AS x
             WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
               AND x.window_end + p_lockout_secs * interval '1 second' > o_now)
        END
    INTO o_count, o_window_end, o_previous, o_locked_until;
    o_previous := COALESCE(o_previous, 0);
END
$$;

-- Adds p_add to the count of each (key, window) pair in one statement: the
-- several limits of one request (per account and per address) in one round
-- trip. Rows are upserted in (key, window_start) order, so two calls over the
-- same pairs in any order lock them in the same order and cannot deadlock;
-- a pair given twice counts twice. Returns the counts and window ends in the
-- order given.
CREATE OR REPLACE PROCEDURE platformkit_limit_add_many(
    p_keys text[], p_window_secs bigint[], p_add bigint, p_at timestamptz,
    p_budget_ms bigint, p_relaxed boolean, p_previous boolean,
    p_maxes bigint[], p_lockout_secs bigint[],
    INOUT o_counts bigint[] DEFAULT NULL,
    INOUT o_window_ends timestamptz[] DEFAULT NULL,
    INOUT o_now timestamptz DEFAULT NULL,
    INOUT o_previous bigint[] DEFAULT NULL,
    INOUT o_locked_until timestamptz[] DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    IF p_relaxed THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    o_now := COALESCE(p_at, pg_catalog.statement_timestamp());
    WITH asked AS (
        SELECT t.key, t.ord, t.max, t.lockout, t.secs * interval '1 second' AS width,
               pg_catalog.date_bin(t.secs * interval '1 second', o_now,
                                   timestamptz '1970-01-01 00:00:00+00') AS start
        FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs)
             WITH ORDINALITY AS t(key, secs, max, lockout, ord)
    ), counted AS (
        INSERT INTO platformkit_limits AS l (key, window_start, window_end, count)
        SELECT key, start, max(start + width), LEAST(p_add * count(*), 9223372036854775807)
        FROM asked
        GROUP BY key, start
        ORDER BY key, start
        ON CONFLICT (key, window_start) DO UPDATE
            SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
        RETURNING l.key, l.window_start, l.count
    )
    SELECT pg_catalog.array_agg(c.count ORDER BY a.ord),
           pg_catalog.array_agg(a.start + a.width ORDER BY a.ord),
           pg_catalog.array_agg(
               CASE WHEN p_previous THEN
                   COALESCE((SELECT p.count FROM platformkit_limits AS p
                             WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
               ELSE 0 END
               ORDER BY a.ord),
           pg_catalog.array_agg(
               CASE WHEN a.lockout > 0 THEN
                   (SELECT max(x.window_end) + a.lockout * interval '1 second'
                    FROM platformkit_limits AS x
                    WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                      AND x.window_end + a.lockout * interval '1 second' > o_now)
               END
               ORDER BY a.ord)
    INTO o_counts, o_window_ends, o_previous, o_locked_until
    FROM asked AS a
    JOIN counted AS c ON c.key = a.key AND c.window_start = a.start;
END
$$;

-- Reads the count of each (key, window) pair; writes nothing.
CREATE OR REPLACE PROCEDURE platformkit_limit_read_many(
    p_keys text[], p_window_secs bigint[], p_at timestamptz, p_budget_ms bigint,
    p_previous boolean, p_maxes bigint[], p_lockout_secs bigint[],
    INOUT o_counts bigint[] DEFAULT NULL,
    INOUT o_window_ends timestamptz[] DEFAULT NULL,
    INOUT o_now timestamptz DEFAULT NULL,
    INOUT o_previous bigint[] DEFAULT NULL,
    INOUT o_locked_until timestamptz[] DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    o_now := COALESCE(p_at, pg_catalog.statement_timestamp());
    WITH asked AS (
        SELECT t.key, t.ord, t.max, t.lockout, t.secs * interval '1 second' AS width,
               pg_catalog.date_bin(t.secs * interval '1 second', o_now,
                                   timestamptz '1970-01-01 00:00:00+00') AS start
        FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs)
             WITH ORDINALITY AS t(key, secs, max, lockout, ord)
    )
    -- A correlated subquery per pair: one index probe each, whatever the
    -- planner guesses of the array's length (a join could scan the table).
    SELECT pg_catalog.array_agg(
               COALESCE((SELECT l.count FROM platformkit_limits AS l
                         WHERE l.key = a.key AND l.window_start = a.start), 0)
               ORDER BY a.ord),
           pg_catalog.array_agg(a.start + a.width ORDER BY a.ord),
           pg_catalog.array_agg(
               CASE WHEN p_previous THEN
                   COALESCE((SELECT p.count FROM platformkit_limits AS p
                             WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
               ELSE 0 END
               ORDER BY a.ord),
           pg_catalog.array_agg(
               CASE WHEN a.lockout > 0 THEN
                   (SELECT max(x.window_end) + a.lockout * interval '1 second'
                    FROM platformkit_limits AS x
                    WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                      AND x.window_end + a.lockout * interval '1 second' > o_now)
               END
               ORDER BY a.ord)
    INTO o_counts, o_window_ends, o_previous, o_locked_until
    FROM asked AS a;
END
$$;

-- Reads the key's count in the current window; writes nothing.
CREATE OR REPLACE PROCEDURE platformkit_limit_read(
    p_key text, p_window_secs bigint, p_at timestamptz, p_budget_ms bigint,
    p_previous boolean, p_max bigint, p_lockout_secs bigint,
    INOUT o_count bigint DEFAULT NULL,
    INOUT o_window_end timestamptz DEFAULT NULL,
    INOUT o_now timestamptz DEFAULT NULL,
    INOUT o_previous bigint DEFAULT NULL,
    INOUT o_locked_until timestamptz DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_window interval := p_window_secs * interval '1 second';
    v_start timestamptz;
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    o_now := COALESCE(p_at, pg_catalog.statement_timestamp());
    v_start := pg_catalog.date_bin(v_window, o_now, timestamptz '1970-01-01 00:00:00+00');
    o_window_end := v_start + v_window;
    SELECT
        (SELECT l.count FROM platformkit_limits AS l
         WHERE l.key = p_key AND l.window_start = v_start),
        CASE WHEN p_previous THEN
            (SELECT p.count FROM platformkit_limits AS p
             WHERE p.key = p_key AND p.window_start = v_start - v_window)
        END,
        CASE WHEN p_lockout_secs > 0 THEN
            (SELECT max(x.window_end) + p_lockout_secs * interval '1 second'
             FROM platformkit_limits AS x
             WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
               AND x.window_end + p_lockout_secs * interval '1 second' > o_now)
        END
    INTO o_count, o_previous, o_locked_until;
    o_count := COALESCE(o_count, 0);
    o_previous := COALESCE(o_previous, 0);
END
$$;

-- Takes p_n back from the key's count in the window that starts at
-- p_window_start (a reserved attempt that succeeded), never below zero;
-- returns the count. A window that is gone stays gone.
CREATE OR REPLACE PROCEDURE platformkit_limit_take_back(
    p_key text, p_window_start timestamptz, p_n bigint,
    p_budget_ms bigint, p_relaxed boolean,
    INOUT o_count bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    IF p_relaxed THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    UPDATE platformkit_limits
        SET count = GREATEST(count - p_n, 0)
        WHERE key = p_key AND window_start = p_window_start
        RETURNING count INTO o_count;
    o_count := COALESCE(o_count, 0);
END
$$;

-- Deletes every window of the key; returns how many went.
CREATE OR REPLACE PROCEDURE platformkit_limit_reset(
    p_key text, p_budget_ms bigint, p_relaxed boolean,
    INOUT o_deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    IF p_relaxed THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    DELETE FROM platformkit_limits WHERE key = p_key;
    GET DIAGNOSTICS o_deleted = ROW_COUNT;
END
$$;

-- Deletes at most p_batch rows whose window closed more than 24 hours ago
-- and more than one window length ago (a sliding window still reads the
-- window before the current one), skipping rows another transaction holds;
-- returns how many went.
CREATE OR REPLACE PROCEDURE platformkit_limit_purge(
    p_batch bigint, p_budget_ms bigint,
    INOUT o_deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
BEGIN
    COMMIT;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
    PERFORM pg_catalog.set_config('platformkit.system', 'on', true),
            pg_catalog.set_config('lock_timeout', p_budget_ms::text, true),
            pg_catalog.set_config('row_security', 'on', true),
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
    DELETE FROM platformkit_limits AS l
    USING (
        SELECT d.key, d.window_start FROM platformkit_limits AS d
        WHERE d.window_end < pg_catalog.statement_timestamp() - interval '24 hours'
          AND d.window_end < pg_catalog.statement_timestamp() - (d.window_end - d.window_start)
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ) AS doomed
    WHERE l.key = doomed.key AND l.window_start = doomed.window_start;
    GET DIAGNOSTICS o_deleted = ROW_COUNT;
END
$$;

