    v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);
END
$$;
