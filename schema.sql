-- platformkit-limit: a limit is a row. What this creates and why, and the
-- grants: the guide, "The schema" (src/guide/calls.md). Safe to apply twice,
-- as one transaction that stops at the first error. schema.sql is this file
-- with each `-- include:` line made its piece of schema/; after an edit, run
-- `PLATFORMKIT_WRITE_SCHEMA=1 cargo test --all-features --test suite schema::`.
--
-- Versions: platformkit_schema_version() is the crate's SCHEMA_VERSION; a
-- release that changes anything this file creates raises both by one, in one
-- commit. What applying this file again cannot change (a table) goes in an
-- upgrade, schema/upgrades/NNNN.sql (NNNN - 1 to NNNN), applied before it (and
-- by reapplying_the_schema_over_an_install_with_rows_gives_a_fresh_installs_catalog).

-- Replicas applying this at once take turns (concurrent CREATEs collide in
-- the catalog) on a transaction-level lock. Any login may hold an advisory
-- lock, so the wait is bounded (platformkit.migrate_lock_wait, 30 s when
-- unset): past it, nothing is applied and PK005 names the holder.
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

-- A newer schema is left as it is: a replica of the release before, starting
-- during a rolling deploy, must not put its routines back over the newer ones.
DO $$
DECLARE
    found integer;
BEGIN
    IF pg_catalog.to_regprocedure('platformkit.platformkit_schema_version()') IS NULL THEN
        RETURN; -- a new install, or one from before versions were recorded
    END IF;
    -- EXECUTE: a plain call would fail to plan where the function is missing.
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

CREATE OR REPLACE FUNCTION platformkit.platformkit_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1;

-- The bounds the Rust side enforces, each once: every routine checks against
-- these (the planner folds an IMMUTABLE call into its constant), and a test
-- holds each to its Rust constant. The lower bounds are written where checked.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_budget_ms() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 60000; -- Limiter::MAX_BUDGET
-- The longest stored key: Limit::MAX_NAME_BYTES, '|' and Key::MAX_BYTES.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_key_bytes() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 249;
-- Limit::MAX_WINDOW, 366 days. The table's window check and purge_after spell
-- it too: an install keeps its constraints (a test holds them).
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_window_secs() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 31622400;
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_attempts() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1000000000; -- Limit::MAX_ATTEMPTS
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_lockout_secs() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 86400; -- Limit::MAX_LOCKOUT
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_block_secs() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 2592000; -- Limiter::MAX_BLOCK, 30 days
-- Limiter::MAX_AUDIT_BYTES: who did an operator's call, and why.
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_by_bytes() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 200;
CREATE OR REPLACE FUNCTION platformkit.platformkit_max_reason_bytes() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1000;
-- Instants cross the wire as integers, microseconds since the Unix epoch.
-- A pinned time (p_at) is from 1900-01-01 on, and before 2200-01-01 (UTC).
CREATE OR REPLACE FUNCTION platformkit.platformkit_min_at() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN -2208988800000000;
CREATE OR REPLACE FUNCTION platformkit.platformkit_end_at() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 7258118400000000;
-- STABLE like their operators: an IMMUTABLE wrapper would not be inlined.
CREATE OR REPLACE FUNCTION platformkit.platformkit_at(p_us bigint) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
RETURN timestamptz '1970-01-01 00:00:00+00' OPERATOR(pg_catalog.+) (p_us OPERATOR(pg_catalog.*) interval '1 microsecond');
CREATE OR REPLACE FUNCTION platformkit.platformkit_us(p_at timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
RETURN (extract(epoch FROM p_at) OPERATOR(pg_catalog.*) 1000000)::bigint;
-- Whether a count is at the limit: decide.rs's estimate (the count plus the
-- previous window's, weighted by the part of the window still to pass; p_w and
-- p_elapsed in microseconds) reaches p_max. The agreement tests hold the two.
CREATE OR REPLACE FUNCTION platformkit.platformkit_at_max(
    p_count bigint, p_previous bigint, p_w numeric, p_elapsed numeric, p_max bigint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((p_previous::numeric OPERATOR(pg_catalog.*) (p_w OPERATOR(pg_catalog.-) LEAST(GREATEST(p_elapsed, 0), p_w)))
        OPERATOR(pg_catalog.+) (p_count::numeric OPERATOR(pg_catalog.*) p_w))
       OPERATOR(pg_catalog.>=) (p_max::numeric OPERATOR(pg_catalog.*) p_w);

-- Whether a row is a block's (platformkit_limit_operate): only a block's row
-- starts at a time that is not a whole second.
CREATE OR REPLACE FUNCTION platformkit.platformkit_is_block(p_start timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
RETURN pg_catalog.date_part('microseconds', p_start)::pg_catalog.int8 OPERATOR(pg_catalog.%) 1000000
       OPERATOR(pg_catalog.=) 1;

CREATE TABLE IF NOT EXISTS platformkit.platformkit_limits (
    -- Collation "C": a limit's keys are one range (platformkit_limit_list).
    key          text        COLLATE "C" NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    count        bigint      NOT NULL CHECK (count >= 0),
    -- When the row may go, in Unix seconds (the guide, "The schema"). Float8,
    -- so that no stored row, an infinite end included, can make it fail.
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
    -- Orders purge's batches among rows due at once; an update keeps it.
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    -- The guide, "The schema"; a block's row too. Set once a window, so an
    -- update that leaves it stays heap-only.
    at_max      boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (key, window_start),
    -- A window purge can always delete: finite, forwards, at most 366 days.
    CONSTRAINT platformkit_limits_window_sane CHECK (
        isfinite(window_start) AND isfinite(window_end)
        AND window_end > window_start
        AND window_end - window_start <= interval '31622400 seconds')
)
-- Room on each page, so that an update of count (in no index) stays heap-only.
WITH (fillfactor = 80);

-- The guide, "The limits, as the service defines them".
CREATE TABLE IF NOT EXISTS platformkit.platformkit_limit_defs (
    name         text        COLLATE "C" PRIMARY KEY,
    max          bigint      NOT NULL,
    window_secs  bigint      NOT NULL,
    sliding      boolean     NOT NULL,
    lockout_secs bigint      NOT NULL,
    defined_at   timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

-- The guide, "Blocks and the audit".
CREATE TABLE IF NOT EXISTS platformkit.platformkit_limit_audit (
    at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    by      text        NOT NULL,
    action  text        NOT NULL,
    key     text        COLLATE "C" NOT NULL,
    until   timestamptz,
    windows bigint,
    reason  text        NOT NULL
);

-- The switch, on only in the limiter's transactions. Every name qualified, so
-- nothing on the caller's path stands in; no SET clause, so it is inlined.
CREATE OR REPLACE FUNCTION platformkit.platformkit_is_system() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT COALESCE(pg_catalog.current_setting('platformkit.system', true)
                        OPERATOR(pg_catalog.=) 'on', false)
$$;

-- The indexes, and every table under row-level security, forced on its owner
-- too, with one policy, both directions (the scalar subquery runs once per
-- statement). The table's strongest lock only when something changes:
-- re-applying this behind a long reader must not queue every call behind it.
DO $$
DECLARE
    t pg_catalog.text;
    r pg_catalog.regclass;
BEGIN
    IF pg_catalog.to_regclass('platformkit.platformkit_limits_window_end') IS NULL THEN
        CREATE INDEX platformkit_limits_window_end
            ON platformkit.platformkit_limits (window_end);
    END IF;
    IF pg_catalog.to_regclass('platformkit.platformkit_limits_purge_order') IS NULL THEN
        CREATE INDEX platformkit_limits_purge_order
            ON platformkit.platformkit_limits (purge_after, created_at);
    END IF;
    IF pg_catalog.to_regclass('platformkit.platformkit_limits_at_max') IS NULL THEN
        CREATE INDEX platformkit_limits_at_max
            ON platformkit.platformkit_limits (key, window_end) WHERE at_max;
    END IF;
    IF pg_catalog.to_regclass('platformkit.platformkit_limit_audit_at') IS NULL THEN
        CREATE INDEX platformkit_limit_audit_at ON platformkit.platformkit_limit_audit (at);
    END IF;
    FOREACH t IN ARRAY ARRAY['platformkit_limits', 'platformkit_limit_defs', 'platformkit_limit_audit'] LOOP
        r := pg_catalog.to_regclass(pg_catalog.concat('platformkit.', t));
        IF NOT (SELECT c.relrowsecurity AND c.relforcerowsecurity
                FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) r) THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', r);
            EXECUTE pg_catalog.format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', r);
        END IF;
        IF NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_policy
            WHERE polrelid OPERATOR(pg_catalog.=) r
              AND polname OPERATOR(pg_catalog.=) pg_catalog.concat(t, '_system_only')
        ) THEN
            EXECUTE pg_catalog.format(
                'CREATE POLICY %I ON platformkit.%I FOR ALL '
                'USING ((SELECT platformkit.platformkit_is_system())) '
                'WITH CHECK ((SELECT platformkit.platformkit_is_system()))',
                pg_catalog.concat(t, '_system_only'), t);
        END IF;
    END LOOP;
END
$$;

-- The limiter's operations. Prologues: the guide, "The procedures' prologue";
-- answers: src/store/sql.rs. benches/limiter/floors.rs runs the statement of
-- add and of read alone (from `-- statement` to `-- end of statement`).

-- Adds p_add to the key's count in the current window.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_add(
    p_key text, p_add bigint, p_window_secs bigint, p_at bigint,
    p_budget_ms bigint, p_relaxed boolean, p_previous boolean,
    p_max bigint, p_lockout_secs bigint,
    INOUT o_count bigint DEFAULT NULL,
    INOUT o_window_end bigint DEFAULT NULL,
    INOUT o_now bigint DEFAULT NULL,
    INOUT o_previous bigint DEFAULT NULL,
    INOUT o_locked_for bigint DEFAULT NULL,
    INOUT o_commit_us bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_window pg_catalog.interval;
    v_now pg_catalog.timestamptz;
    v_start pg_catalog.timestamptz;
    v_locked pg_catalog.timestamptz;
    v_marked pg_catalog.bool;
    v_committing pg_catalog.timestamptz;
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count, at_max)
    VALUES (p_key, v_start, v_start + v_window, p_add, p_add >= p_max)
    ON CONFLICT (key, window_start) DO UPDATE
        SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
    RETURNING l.count,
        CASE WHEN p_previous THEN
            (SELECT p.count FROM platformkit.platformkit_limits AS p
             WHERE p.key = p_key AND p.window_start = v_start - v_window)
        END,
        GREATEST(
            -- An earlier window's lockout, still running.
            CASE WHEN p_lockout_secs > 0 THEN
                (SELECT max(x.window_end) + make_interval(secs => p_lockout_secs)
                 FROM platformkit.platformkit_limits AS x
                 WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
                   AND x.window_end + make_interval(secs => p_lockout_secs) > v_now
                   AND NOT platformkit.platformkit_is_block(x.window_start))
            END,
            -- A block, whatever the limit: through the at_max index.
            (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
             WHERE x.key = p_key AND x.at_max AND x.window_end > v_now
               AND platformkit.platformkit_is_block(x.window_start))),
        l.at_max
    INTO o_count, o_previous, v_locked, v_marked;
    -- end of statement
    o_previous := COALESCE(o_previous, 0);
    o_now := platformkit.platformkit_us(v_now);
    o_window_end := platformkit.platformkit_us(v_start + v_window);
    o_locked_for := COALESCE(platformkit.platformkit_us(v_locked) - o_now, 0);
    -- At max: the count alone, or with the previous window's weighed in.
    IF NOT v_marked AND (o_count >= p_max OR (o_previous > 0 AND platformkit.platformkit_at_max(
           o_count, o_previous, p_window_secs::numeric * 1000000,
           o_now - platformkit.platformkit_us(v_start), p_max))) THEN
        UPDATE platformkit.platformkit_limits SET at_max = true
        WHERE key = p_key AND window_start = v_start;
    END IF;
    v_committing := clock_timestamp();
    COMMIT;
    -- How long the commit waited (merging's places follow it). Past the
    -- COMMIT the pinned settings are gone: every name here is qualified.
    o_commit_us := platformkit.platformkit_us(pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) platformkit.platformkit_us(v_committing);
END
$$;

-- As add, for 1 to 64 (key, window) pairs in one statement, answering in the
-- order given; a pair given twice adds both amounts.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_add_many(
    p_keys text[], p_window_secs bigint[], p_adds bigint[], p_at bigint,
    p_budget_ms bigint, p_relaxed boolean, p_sliding boolean[],
    p_maxes bigint[], p_lockout_secs bigint[],
    INOUT o_counts bigint[] DEFAULT NULL,
    INOUT o_window_ends bigint[] DEFAULT NULL,
    INOUT o_now bigint DEFAULT NULL,
    INOUT o_previous bigint[] DEFAULT NULL,
    INOUT o_locked_for bigint[] DEFAULT NULL,
    INOUT o_commit_us bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_now pg_catalog.timestamptz;
    v_mark pg_catalog.bool;
    v_committing pg_catalog.timestamptz;
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    -- Each array here; each key's length where the statement reads the keys.
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
                       false) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
    o_now := platformkit.platformkit_us(v_now);
    WITH asked AS (
        SELECT t.key, t.ord, t.add, t.max, t.sliding, make_interval(secs => t.secs) AS width,
               date_bin(make_interval(secs => t.secs), v_now,
                        timestamptz '1970-01-01 00:00:00+00') AS start
        FROM unnest(p_keys, p_window_secs, p_adds, p_maxes, p_sliding)
             WITH ORDINALITY AS t(key, secs, add, max, sliding, ord)
        -- A key out of bounds is left out here, and refused below.
        WHERE COALESCE(octet_length(t.key) BETWEEN 1 AND platformkit.platformkit_max_key_bytes(), false)
    ), counted AS (
        -- In (key, window_start) order, so calls over the same pairs cannot
        -- deadlock. The sum is numeric: it saturates at the largest bigint.
        INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
        SELECT key, start, max(start + width),
               LEAST(sum(add), 9223372036854775807)::bigint
        FROM asked
        GROUP BY key, start
        ORDER BY key, start
        ON CONFLICT (key, window_start) DO UPDATE
            SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
        RETURNING l.key, l.window_start, l.count, l.at_max
    )
    SELECT array_agg(c.count ORDER BY a.ord),
           array_agg(platformkit.platformkit_us(a.start + a.width) ORDER BY a.ord),
           bool_or(NOT c.at_max AND (a.sliding OR c.count >= a.max))
    INTO o_counts, o_window_ends, v_mark
    FROM asked AS a
    JOIN counted AS c ON c.key = a.key AND c.window_start = a.start;
    -- Refused after the upsert: this transaction, and what it wrote, ends here.
    IF cardinality(o_counts) IS DISTINCT FROM cardinality(p_keys) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    -- The previous windows and the lockouts, only when a pair may have one: a
    -- lockout, or a block (a row at max still to end).
    IF true = ANY (p_sliding) OR 0 < ANY (p_lockout_secs) OR EXISTS (
           SELECT 1 FROM platformkit.platformkit_limits AS x
           WHERE x.key = ANY (p_keys) AND x.at_max AND x.window_end > v_now) THEN
        SELECT array_agg(
                   CASE WHEN a.sliding THEN
                       COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
                                 WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
                   ELSE 0 END
                   ORDER BY a.ord),
               array_agg(
                   COALESCE(platformkit.platformkit_us(
                       GREATEST(
                           -- An earlier window's lockout, still running.
                           CASE WHEN a.lockout > 0 THEN
                               (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                                FROM platformkit.platformkit_limits AS x
                                WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                                  AND x.window_end + make_interval(secs => a.lockout) > v_now
                                  AND NOT platformkit.platformkit_is_block(x.window_start))
                           END,
                           -- A block, whatever the limit: through the at_max index.
                           (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
                            WHERE x.key = a.key AND x.at_max AND x.window_end > v_now
                              AND platformkit.platformkit_is_block(x.window_start)))) - o_now, 0)
                   ORDER BY a.ord)
        INTO o_previous, o_locked_for
        FROM (SELECT t.key, t.ord, t.max, t.lockout, t.sliding, make_interval(secs => t.secs) AS width,
                     platformkit.platformkit_at(t.window_end) - make_interval(secs => t.secs) AS start
              FROM unnest(p_keys, p_window_secs, p_maxes, p_lockout_secs, p_sliding, o_window_ends)
                   WITH ORDINALITY AS t(key, secs, max, lockout, sliding, window_end, ord)) AS a;
    ELSE
        o_previous := array_fill(0::bigint, ARRAY[cardinality(p_keys)]);
        o_locked_for := array_fill(0::bigint, ARRAY[cardinality(p_keys)]);
    END IF;
    -- Marks the keys left at their max, as add does, if any may be (v_mark).
    IF v_mark THEN
        UPDATE platformkit.platformkit_limits AS l SET at_max = true
        FROM unnest(p_keys, p_window_secs, p_maxes, o_counts, o_previous, o_window_ends)
             AS t(key, secs, max, count, previous, window_end)
        WHERE platformkit.platformkit_at_max(t.count, t.previous, t.secs::numeric * 1000000,
                                             o_now - (t.window_end - t.secs * 1000000), t.max)
          AND l.key = t.key
          AND l.window_start = platformkit.platformkit_at(t.window_end - t.secs * 1000000)
          AND NOT l.at_max;
    END IF;
    v_committing := clock_timestamp();
    COMMIT;
    -- How long the commit waited (merging's places follow it). Past the
    -- COMMIT the pinned settings are gone: every name here is qualified.
    o_commit_us := platformkit.platformkit_us(pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) platformkit.platformkit_us(v_committing);
END
$$;

-- As add_many, but adds only if every pair's ask may go ahead (the guide,
-- "API quotas"), each decided as decide.rs does, on its count under the row
-- lock the addition took; a refusal rolls the block back (PK003, caught here).
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
    v_mark pg_catalog.bool;
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    -- Each array here; each key's length where the statement reads the keys.
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
                       false) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    IF (SELECT count(DISTINCT k) FROM unnest(p_keys) AS k) <> cardinality(p_keys) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    -- In a block that a refusal rolls back.
    BEGIN
        v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
        o_now := platformkit.platformkit_us(v_now);
        WITH asked AS (
            SELECT t.key, t.ord, t.add, t.max, t.sliding, make_interval(secs => t.secs) AS width,
                   date_bin(make_interval(secs => t.secs), v_now,
                            timestamptz '1970-01-01 00:00:00+00') AS start
            FROM unnest(p_keys, p_window_secs, p_adds, p_maxes, p_sliding)
                 WITH ORDINALITY AS t(key, secs, add, max, sliding, ord)
            -- A key out of bounds is left out here, and refused below.
            WHERE COALESCE(octet_length(t.key) BETWEEN 1 AND platformkit.platformkit_max_key_bytes(), false)
        ), counted AS (
            -- In (key, window_start) order, so calls over the same pairs cannot
            -- deadlock. The sum is numeric: it saturates at the largest bigint.
            INSERT INTO platformkit.platformkit_limits AS l (key, window_start, window_end, count)
            SELECT key, start, max(start + width),
                   LEAST(sum(add), 9223372036854775807)::bigint
            FROM asked
            GROUP BY key, start
            ORDER BY key, start
            ON CONFLICT (key, window_start) DO UPDATE
                SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
            RETURNING l.key, l.window_start, l.count, l.at_max
        )
        SELECT array_agg(c.count ORDER BY a.ord),
               array_agg(platformkit.platformkit_us(a.start + a.width) ORDER BY a.ord),
               bool_or(NOT c.at_max AND (a.sliding OR c.count >= a.max))
        INTO o_counts, o_window_ends, v_mark
        FROM asked AS a
        JOIN counted AS c ON c.key = a.key AND c.window_start = a.start;
        -- Refused after the upsert: this transaction, and what it wrote, ends here.
        IF cardinality(o_counts) IS DISTINCT FROM cardinality(p_keys) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
        END IF;
        -- As add_many reads them; then each pair is decided on its count
        -- before its own last unit.
        SELECT array_agg(d.previous ORDER BY d.ord), array_agg(d.locked_for ORDER BY d.ord),
               bool_and(d.locked_for = 0
                        AND NOT platformkit.platformkit_at_max(d.count - 1, d.previous, d.w,
                                                              o_now - d.start_us, d.max)),
               bool_or(platformkit.platformkit_at_max(d.count, d.previous, d.w,
                                                      o_now - d.start_us, d.max))
        INTO o_previous, o_locked_for, o_added, v_mark
        FROM (
            SELECT a.ord, a.max, a.count, a.w, a.window_end - a.w AS start_us,
                   CASE WHEN a.sliding THEN
                       COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
                                 WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
                   ELSE 0 END
                   AS previous,
                   COALESCE(platformkit.platformkit_us(
                       GREATEST(
                           -- An earlier window's lockout, still running.
                           CASE WHEN a.lockout > 0 THEN
                               (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                                FROM platformkit.platformkit_limits AS x
                                WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                                  AND x.window_end + make_interval(secs => a.lockout) > v_now
                                  AND NOT platformkit.platformkit_is_block(x.window_start))
                           END,
                           -- A block, whatever the limit: through the at_max index.
                           (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
                            WHERE x.key = a.key AND x.at_max AND x.window_end > v_now
                              AND platformkit.platformkit_is_block(x.window_start)))) - o_now, 0) AS locked_for
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
        -- Marks the keys left at their max, as add does, if any may be (v_mark).
        IF v_mark THEN
            UPDATE platformkit.platformkit_limits AS l SET at_max = true
            FROM unnest(p_keys, p_window_secs, p_maxes, o_counts, o_previous, o_window_ends)
                 AS t(key, secs, max, count, previous, window_end)
            WHERE platformkit.platformkit_at_max(t.count, t.previous, t.secs::numeric * 1000000,
                                                 o_now - (t.window_end - t.secs * 1000000), t.max)
              AND l.key = t.key
              AND l.window_start = platformkit.platformkit_at(t.window_end - t.secs * 1000000)
              AND NOT l.at_max;
        END IF;
    EXCEPTION WHEN SQLSTATE 'PK003' THEN
        -- Nothing is left to make durable, so the commit need not wait for the
        -- WAL. The counts before the call: variables keep what the block set.
        PERFORM set_config('synchronous_commit', 'off', true);
        SELECT array_agg(t.count - LEAST(t.add, t.count) ORDER BY t.ord)
        INTO o_counts
        FROM unnest(o_counts, p_adds) WITH ORDINALITY AS t(count, add, ord);
    END;
    COMMIT;
END
$$;

-- Reads each pair's count, writing nothing. One int8[]: the time, then per
-- pair as add_many answers it (count, window end, previous count, lockout).
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
    -- Each refusal is behind a cheaper test it implies, all a good call pays for.
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
    -- Assigned, here and at the end, not PERFORMed: an expression, not a query.
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
    -- A correlated subquery per pair: one index probe each (a join could scan).
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
        COALESCE(platformkit.platformkit_us(
            GREATEST(
                -- An earlier window's lockout, still running.
                CASE WHEN a.lockout > 0 THEN
                    (SELECT max(x.window_end) + make_interval(secs => a.lockout)
                     FROM platformkit.platformkit_limits AS x
                     WHERE x.key = a.key AND x.window_start < a.start AND x.count >= a.max
                       AND x.window_end + make_interval(secs => a.lockout) > v_now
                       AND NOT platformkit.platformkit_is_block(x.window_start))
                END,
                -- A block, whatever the limit: through the at_max index.
                (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
                 WHERE x.key = a.key AND x.at_max AND x.window_end > v_now
                   AND platformkit.platformkit_is_block(x.window_start)))) - v_now_us, 0)]) WITH ORDINALITY AS x(v, i);
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- As read_many, for one key.
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
    -- Each refusal is behind a cheaper test it implies, all a good call pays for.
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
    -- Assigned, here and at the end, not PERFORMed: an expression, not a query.
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
        GREATEST(
            -- An earlier window's lockout, still running.
            CASE WHEN p_lockout_secs > 0 THEN
                (SELECT max(x.window_end) + make_interval(secs => p_lockout_secs)
                 FROM platformkit.platformkit_limits AS x
                 WHERE x.key = p_key AND x.window_start < v_start AND x.count >= p_max
                   AND x.window_end + make_interval(secs => p_lockout_secs) > v_now
                   AND NOT platformkit.platformkit_is_block(x.window_start))
            END,
            -- A block, whatever the limit: through the at_max index.
            (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
             WHERE x.key = p_key AND x.at_max AND x.window_end > v_now
               AND platformkit.platformkit_is_block(x.window_start)))
    INTO v_count, v_previous, v_locked;
    -- end of statement
    v_now_us := platformkit.platformkit_us(v_now);
    o_answer := ARRAY[v_now_us, COALESCE(v_count, 0), platformkit.platformkit_us(v_start + v_window),
                      COALESCE(v_previous, 0), COALESCE(platformkit.platformkit_us(v_locked) - v_now_us, 0)];
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- The keys under p_prefix (a limit's name and '|') that the limit refuses now
-- (the guide, "Who is locked out"): one range of the at_max index, p_prefix to
-- p_prefix with '|' made '}' (collation "C": no other limit's keys fall in it).
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_list(
    p_prefix text, p_window_secs bigint, p_at bigint, p_budget_ms bigint,
    p_previous boolean, p_max bigint, p_lockout_secs bigint, p_at_most bigint,
    OUT o_keys text[], OUT o_counts bigint[], OUT o_window_end bigint,
    OUT o_now bigint, OUT o_previous bigint[], OUT o_locked_for bigint[])
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
    -- Each refusal is behind a cheaper test it implies, all a good call pays for.
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
    -- Assigned, here and at the end, not PERFORMed: an expression, not a query.
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
               GREATEST(
                   max(l.window_end) FILTER (
                       WHERE p_lockout_secs > 0 AND l.window_start < v_start AND l.count >= p_max
                         AND l.window_end + make_interval(secs => p_lockout_secs) > v_now
                         AND NOT platformkit.platformkit_is_block(l.window_start))
                   + make_interval(secs => p_lockout_secs),
                   max(l.window_end) FILTER (
                       WHERE l.window_end > v_now AND platformkit.platformkit_is_block(l.window_start)))
               AS locked_until
        FROM platformkit.platformkit_limits AS l
        WHERE l.key IN (
            -- Keys left at their max in a window that can still refuse: the
            -- current one, the one before, or one whose lockout runs.
            SELECT m.key FROM platformkit.platformkit_limits AS m
            WHERE m.at_max AND m.key >= p_prefix AND m.key < v_upper
              AND m.window_end > v_now - v_window - make_interval(secs => p_lockout_secs))
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

-- Takes p_n back (never below zero); a window gone stays gone.
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
       OR p_window_start < platformkit.platformkit_min_at() - platformkit.platformkit_max_window_secs() * 1000000
       OR p_window_start >= platformkit.platformkit_end_at() THEN
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

-- Records a limit's definition (p_name as LimitBuilder::build allows it);
-- writes nothing when it is recorded.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_define(
    p_name text, p_max bigint, p_window_secs bigint, p_sliding boolean,
    p_lockout_secs bigint, p_budget_ms bigint,
    INOUT o_written boolean DEFAULT NULL)
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.-]{1,48}$'
       OR p_window_secs IS NULL OR p_window_secs NOT BETWEEN 1 AND platformkit.platformkit_max_window_secs()
       OR p_max IS NULL OR p_max NOT BETWEEN 1 AND platformkit.platformkit_max_attempts()
       OR p_lockout_secs IS NULL OR p_lockout_secs NOT BETWEEN 0 AND platformkit.platformkit_max_lockout_secs()
       OR p_sliding IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    INSERT INTO platformkit.platformkit_limit_defs AS d (name, max, window_secs, sliding, lockout_secs)
    VALUES (p_name, p_max, p_window_secs, p_sliding, p_lockout_secs)
    ON CONFLICT (name) DO UPDATE
        SET max = excluded.max, window_secs = excluded.window_secs, sliding = excluded.sliding,
            lockout_secs = excluded.lockout_secs, defined_at = excluded.defined_at
        WHERE (d.max, d.window_secs, d.sliding, d.lockout_secs)
              IS DISTINCT FROM (excluded.max, excluded.window_secs, excluded.sliding, excluded.lockout_secs);
    o_written := FOUND;
    COMMIT;
END
$$;

-- The limits recorded, by name, at most 1,000.
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_defs(
    p_budget_ms bigint, OUT o_names text[], OUT o_numbers bigint[])
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
BEGIN
    -- reader's prologue
    -- Each refusal is behind a cheaper test it implies, all a good call pays for.
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
    -- Assigned, here and at the end, not PERFORMed: an expression, not a query.
    v_set := set_config('platformkit.system', 'on', true);
    v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
    -- end of reader's prologue
    SELECT COALESCE(array_agg(d.name ORDER BY d.name) FILTER (WHERE u.i = 1), '{}'),
           COALESCE(array_agg(u.n ORDER BY d.name, u.i), '{}')
    INTO o_names, o_numbers
    FROM (SELECT * FROM platformkit.platformkit_limit_defs ORDER BY name LIMIT 1000) AS d
    CROSS JOIN LATERAL unnest(ARRAY[d.max, d.window_secs, d.sliding::pg_catalog.int4, d.lockout_secs])
        WITH ORDINALITY AS u(n, i);
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- An operator's action, audited (the guide, "Blocks and the audit"). A block
-- is a row whose start is not a whole second (platformkit_is_block), at the
-- largest count, ending at the block's end (a whole second and 1 µs), which
-- every call reads, whatever the limit's window and lockout.
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_operate(
    p_action text, p_key text, p_for_secs bigint, p_at bigint,
    p_by text, p_reason text, p_budget_ms bigint,
    INOUT o_deleted bigint DEFAULT NULL,
    INOUT o_until bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_end pg_catalog.timestamptz;
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    IF p_action IS NULL OR p_action NOT IN ('block', 'unblock', 'unlock')
       OR p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND platformkit.platformkit_max_key_bytes()
       OR p_by IS NULL OR octet_length(p_by) NOT BETWEEN 1 AND platformkit.platformkit_max_by_bytes()
       OR p_reason IS NULL OR octet_length(p_reason) NOT BETWEEN 1 AND platformkit.platformkit_max_reason_bytes()
       OR p_at < platformkit.platformkit_min_at() OR p_at >= platformkit.platformkit_end_at()
       OR (p_action = 'block' AND (p_for_secs IS NULL OR p_for_secs NOT BETWEEN 1 AND platformkit.platformkit_max_block_secs())) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    -- Two blocks of one key at once would each miss the other's row.
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(p_key, 31643310761011572));
    DELETE FROM platformkit.platformkit_limits
    WHERE key = p_key AND (p_action = 'unlock' OR platformkit.platformkit_is_block(window_start));
    GET DIAGNOSTICS o_deleted = ROW_COUNT;
    IF p_action = 'block' THEN
        v_end := date_trunc('second', COALESCE(platformkit.platformkit_at(p_at), statement_timestamp())
                                      + make_interval(secs => p_for_secs))
                 + interval '1.000001 seconds';
        INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count, at_max)
        VALUES (p_key, v_end - interval '1 second', v_end, 9223372036854775807, true);
        o_until := platformkit.platformkit_us(v_end);
    END IF;
    INSERT INTO platformkit.platformkit_limit_audit (by, action, key, until, windows, reason)
    VALUES (p_by, p_action, p_key, platformkit.platformkit_at(o_until),
            CASE WHEN p_action = 'block' THEN NULL ELSE o_deleted END, p_reason);
    o_until := COALESCE(o_until, 0);
    COMMIT;
END
$$;

-- The audit, newest first, of keys under p_prefix ('' for all).
CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_audit_log(
    p_prefix text, p_at_most bigint, p_budget_ms bigint,
    OUT o_texts text[], OUT o_numbers bigint[])
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
BEGIN
    -- reader's prologue
    -- Each refusal is behind a cheaper test it implies, all a good call pays for.
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
    -- Assigned, here and at the end, not PERFORMed: an expression, not a query.
    v_set := set_config('platformkit.system', 'on', true);
    v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
    -- end of reader's prologue
    IF p_prefix IS NULL OR octet_length(p_prefix) > platformkit.platformkit_max_key_bytes()
       OR p_at_most IS NULL OR p_at_most NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
    END IF;
    WITH e AS (
        SELECT a.*, row_number() OVER (ORDER BY a.at DESC) AS ord
        FROM (SELECT * FROM platformkit.platformkit_limit_audit AS l
              WHERE left(l.key, octet_length(p_prefix)) = p_prefix
              ORDER BY l.at DESC LIMIT p_at_most) AS a
    )
    SELECT (SELECT COALESCE(array_agg(t.v ORDER BY e.ord, t.i), '{}')
            FROM e, unnest(ARRAY[e.by, e.action, e.key, e.reason]) WITH ORDINALITY AS t(v, i)),
           (SELECT COALESCE(array_agg(t.v ORDER BY e.ord, t.i), '{}')
            FROM e, unnest(ARRAY[platformkit.platformkit_us(e.at),
                                 COALESCE(platformkit.platformkit_us(e.until), 0),
                                 COALESCE(e.windows, -1)]) WITH ORDINALITY AS t(v, i))
    INTO o_texts, o_numbers;
    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;

-- Deletes every window of the key but a block (only an operator ends one).
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    DELETE FROM platformkit.platformkit_limits
    WHERE key = p_key AND NOT platformkit.platformkit_is_block(window_start);
    GET DIAGNOSTICS o_deleted = ROW_COUNT;
    COMMIT;
END
$$;

-- Deletes at most p_batch rows due (the guide, "The schema"), skipping held
-- ones, from where the batch before stopped (o_after, o_created, epoch
-- seconds; NULL for the first): docs/PERFORMANCE.md, "Purge resumes".
CREATE OR REPLACE PROCEDURE platformkit.platformkit_limit_purge_from(
    p_batch bigint, p_budget_ms bigint,
    INOUT o_deleted bigint DEFAULT NULL,
    INOUT o_after double precision DEFAULT NULL,
    INOUT o_created double precision DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    -- Plain values: under row-level security only those bound an index scan.
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
    -- A quarter of the budget for each of an upsert's at most four lock waits.
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
    -- A place past either end of the timestamps starts at that end: no error.
    from_after := COALESCE(o_after, '-Infinity');
    from_created := CASE WHEN o_created IS NULL OR o_created < -210866803200 THEN '-infinity'
                         WHEN o_created >= 9224318016000 THEN 'infinity'
                         ELSE to_timestamp(o_created) END;
    -- The limiter's one plan by ctid; the prologue pins the other switches.
    PERFORM pg_catalog.set_config('enable_tidscan', 'on', true);
    -- Each row is deleted by the ctid its locking scan returned, with no second
    -- probe: a locked row cannot be updated, deleted or moved before the
    -- DELETE; one whose lock followed a concurrent update is a later purge's.
    -- ONLY: a ctid names a row of one table, never of one that inherits.
    WITH due AS (
        -- From where the batch before stopped (>=: rows may share a place).
        SELECT d.ctid AS place, d.purge_after, d.created_at
        FROM ONLY platformkit.platformkit_limits AS d
        WHERE d.purge_after < date_part('epoch', statement_timestamp())
          AND (d.purge_after, d.created_at) >= (from_after, from_created)
        ORDER BY d.purge_after, d.created_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ), ahead AS (
        -- Ending over 367 days ahead: a clock pinned far ahead, a direct insert.
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

-- Only the roles granted EXECUTE may call the routines.
REVOKE ALL ON ALL ROUTINES IN SCHEMA platformkit FROM PUBLIC;
