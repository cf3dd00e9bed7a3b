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
