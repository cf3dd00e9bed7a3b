-- platformkit-limit: a limit is a row.
--
-- One row per key per window. Only the limiter writes it, inside its own
-- short system transaction; every other transaction can neither read nor
-- write it (FORCE ROW LEVEL SECURITY, one policy, both directions).
--
-- Safe to apply twice. Needs PostgreSQL 14 or newer (date_bin).
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

-- The system switch: on only inside the limiter's own transaction, where it
-- is set with set_config(..., is_local => true). An exact comparison; the
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
