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
