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
