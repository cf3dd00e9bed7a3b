GREATEST(
    -- An earlier window's lockout, still running.
    CASE WHEN {lockout} > 0 THEN
        (SELECT max(x.window_end) + make_interval(secs => {lockout})
         FROM platformkit.platformkit_limits AS x
         WHERE x.key = {key} AND x.window_start < {start} AND x.count >= {max}
           AND x.window_end + make_interval(secs => {lockout}) > v_now
           AND NOT platformkit.platformkit_is_block(x.window_start))
    END,
    -- A block, whatever the limit: through the at_max index.
    (SELECT max(x.window_end) FROM platformkit.platformkit_limits AS x
     WHERE x.key = {key} AND x.at_max AND x.window_end > v_now
       AND platformkit.platformkit_is_block(x.window_start)))
