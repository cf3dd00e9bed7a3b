v_window := make_interval(secs => p_window_secs);
v_now := COALESCE(platformkit.platformkit_at(p_at), statement_timestamp());
v_start := date_bin(v_window, v_now, timestamptz '1970-01-01 00:00:00+00');
