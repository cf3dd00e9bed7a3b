OR p_window_secs IS NULL OR p_window_secs NOT BETWEEN 1 AND platformkit.platformkit_max_window_secs()
OR p_max IS NULL OR p_max NOT BETWEEN 1 AND platformkit.platformkit_max_attempts()
OR p_lockout_secs IS NULL OR p_lockout_secs NOT BETWEEN 0 AND platformkit.platformkit_max_lockout_secs()
