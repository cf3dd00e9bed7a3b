IF p_relaxed THEN
    PERFORM set_config('synchronous_commit', 'off', true);
END IF;
