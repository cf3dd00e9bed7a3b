GREATEST(
    -- An earlier window's lockout, still running.
    CASE WHEN {4} > 0 THEN
        (SELECT max(x.window_end) + make_interval(secs => {4})
         FROM platformkit.platformkit_limits AS x
         WHERE x.key = {1} AND x.window_start < {2} AND x.count >= {3}
           AND x.window_end + make_interval(secs => {4}) > v_now
           AND NOT platformkit.platformkit_is_block(x.window_start))
    END,
    -- A block, whatever the limit: through the at_max index.
    (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
     WHERE x.key = {1} AND x.at_max AND x.window_end > v_now
       AND platformkit.platformkit_is_block(x.window_start)))
